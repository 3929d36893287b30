// The link fault seam: a node whose network to its peers is slow, in real processes without a
// network of its own. Every process of the node (its ranks and its self-checks) carries
// MEGASCOPE_LINK_SEAM=FILE; while FILE holds a fault, the Gloo communicator holds back each op's
// outgoing data by bytes / rate before the op starts, as a NIC shaped to `rate` would deliver it
// late. The rank does not compute longer: it reaches every collective late and its peers wait for
// it (a communication straggler), and its all-reduce bandwidth in a self-check falls to about the
// rate. Real link faults (tc, nft, link down in network namespaces) replace the seam on a testbed.
//
// FILE is one line, "rate_mbps=R until_ns=T" (T: wall-clock ns, 0: no end), or empty: healthy.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "megascope/tracer/status.h"

namespace megascope::launch {

constexpr const char* kLinkSeamEnv = "MEGASCOPE_LINK_SEAM";

struct LinkFault {
  double rate_mbps = 0;  // 0: healthy
  int64_t until_ns = 0;  // wall-clock end; 0: no end
};

// Writes the fault (atomically); a default LinkFault clears it.
Status WriteLinkFault(const std::string& path, const LinkFault& fault);
// Parses the file's text; empty text is healthy. Errors name the bad field.
Result<LinkFault> ParseLinkFault(const std::string& text);

// What a process obeys: the file named by MEGASCOPE_LINK_SEAM, re-read at most every 200 ms.
class LinkSeam {
 public:
  LinkSeam();  // from the environment; inert when the variable is unset
  explicit LinkSeam(std::string path) : path_(std::move(path)) {}
  // The delay for `bytes` leaving now (0 when healthy or when the fault has ended).
  std::chrono::nanoseconds DelayFor(size_t bytes);
  // Sleeps DelayFor(bytes).
  void Hold(size_t bytes);

 private:
  std::string path_;
  LinkFault fault_;
  std::chrono::steady_clock::time_point next_read_{};
  bool warned_ = false;
};

}  // namespace megascope::launch
