// The self-check a node passes before it joins a job (MegaScale's idea): a GEMM throughput test
// and a collective bandwidth test with a healthy neighbour (two processes, Gloo over TCP, a fresh
// FileStore rendezvous in `dir`). Each process prints a JSON line {"rank", "gemm_gflops"} once
// its GEMMs are done, then {"rank", "gemm_gflops", "allreduce_gbps"} as the last line of a check
// that finished; the controller compares them with the figures of
// nodes known to be healthy. A node's injected slowdown (MEGASCOPE_INJECT_SLOWDOWN=F, the fault
// seam the launcher sets for a degraded node) stretches both tests by F, as stolen CPU would.
#pragma once

#include <functional>
#include <string>

#include "megascope/tracer/status.h"

namespace megascope::runtime {

struct SelfCheckOptions {
  std::string dir;  // rendezvous directory shared by the two processes
  int rank = 0;     // 0 or 1
  int world = 2;
  double gemm_seconds = 0.3;  // how long to run GEMMs
  size_t allreduce_bytes = 4 << 20;
  int allreduce_iters = 8;
  int timeout_ms = 15000;
  // Connecting to the neighbour, counted from when both processes are there (each marks itself
  // in `dir` and waits for the other, up to twice this): a healthy link connects in milliseconds,
  // so one that cannot within this is dead or drops packets (a lost SYN is retried after 1 s), and
  // the check fails now instead of at timeout_ms. Any one all-reduce may take twice this.
  int connect_timeout_ms = 1500;
  // The all-reduce bandwidth the caller will accept (GB/s; 0: any). All-reduces that move under
  // half of it -- their bytes not done in the time they take at that rate, 0.5 s at least -- fail
  // the check at once instead of crawling on (exit_when_stalled).
  double min_allreduce_gbps = 0;
  // A process of its own (`megascope self-check`): exits (code 1, saying so) when connecting to
  // the neighbour or any one all-reduce with it takes longer than its deadline above, or the
  // all-reduces fall under their floor. Gloo does
  // not give up a connect while SYNs go unanswered (about 15 s where a link drops every packet),
  // and a lossy link crawls; either moves nothing a healthy link would in that time. Off for a
  // caller in a process of its own work (it cannot be stopped mid-call).
  bool exit_when_stalled = false;
  // Called with the GEMM figure once it is measured, before the neighbour is reached: a check that
  // then fails on its link has still said that its compute held (`megascope self-check` prints it).
  std::function<void(double gemm_gflops)> on_gemm;
};

struct SelfCheckResult {
  double gemm_gflops = 0;
  double allreduce_gbps = 0;
};

// Removes the rings of self-checks that left them in `dir` when they were killed
// (megascope.selfcheck-<pid>.*, their process gone): shared memory is RAM on a node. Returns
// how many it removed. RunSelfCheck calls it on /dev/shm before it makes its own.
int RemoveStaleSelfCheckRings(const std::string& dir);

Result<SelfCheckResult> RunSelfCheck(const SelfCheckOptions& options);

}  // namespace megascope::runtime
