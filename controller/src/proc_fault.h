// The `metric` fault (inject.h): a node's agent samples a /proc tree of its own (the agent's
// --proc-root seam, given through MEGASCOPE_PROC_ROOT), which mirrors the machine's /proc and, once
// the fault fires, reports a failing metric: NIC receive errors climbing at 200 a second, or 40 %
// more memory in use. A thread of its own keeps the files fresh (every 100 ms), so the failing
// metric goes on failing while the controller is busy (a self-check runs synchronously).
#pragma once

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "megascope/tracer/status.h"

namespace megascope::controller {

class ProcFault {
 public:
  // `dir` becomes the fake /proc root; `what` is nic-errors or memory; `seconds` 0 lasts forever.
  ProcFault(std::string dir, std::string what, double seconds, std::string real_proc = "/proc");
  ~ProcFault();
  Status Start();  // writes the tree once (healthy) and starts refreshing it
  void Fire();     // from now on the metric fails (for `seconds`)
  const std::string& dir() const { return dir_; }
  // Rewrites the files once (the thread calls it; tests call it directly).
  Status Refresh();

 private:
  std::string dir_, what_, real_;
  double seconds_;
  std::atomic<int64_t> fired_ns_{0};  // steady ns of Fire(); 0: not fired
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace megascope::controller
