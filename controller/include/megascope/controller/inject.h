// Faults injected into the real processes of a launch (`--inject KIND:key=value,...`):
//   crash | hang | stall-send          into a rank: node=N (its first rank) or rank=R, at=STEP
//   slow                               into every rank of node=N, of pipeline stage pp=S, or rank=R
//                                      from at=STEP on: seconds=X of extra compute per step and/or
//                                      factor=F (each step's work takes F times as long)
//   metric                             node=N's agent reads a failing host metric (through its
//                                      /proc seam) from at=STEP or at=SECONDSs, for seconds=D (0:
//                                      to the end): what=nic-errors (receive errors climb 200/s) or
//                                      what=memory (memory in use +40 %)
//   link                               node=N's network to its peers fails from at=STEP or
//                                      at=SECONDSs, for seconds=D (0: to the end):
//                                      kind=slow (rate=MB/s, default 10), kind=loss (loss=P % of
//                                      packets dropped each way, default 30) or kind=down. On a
//                                      node with its own host (--hosts) the host's backend link
//                                      really fails (net_fault.h); elsewhere only kind=slow
//                                      exists, through the link seam (launch/link_seam.h)
//   kill-agent                         SIGKILL a node's agent: node=N, at=STEP or at=SECONDSs
//   corrupt-checkpoint                 flip a byte in the newest saved state (every memory copy of
//                                      rank 0 and the newest disk checkpoint) before the next
//                                      restart
//   degrade                            node=N runs slowed by factor=F (default 3): its self-check
//   fails
// A fault of a rank aimed at node=N fires once; with `persist` the node stays broken: the fault
// fires again in every attempt the node is part of (from at=STEP, or the attempt's first step if
// it resumes later), until the node is evicted, as a real broken machine would.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "megascope/launch/worker_fault.h"
#include "megascope/tracer/status.h"

namespace megascope::controller {

enum class FaultKind {
  kCrash,
  kHang,
  kFreeze,  // the rank's process stops (SIGSTOP), heartbeat included
  kStallSend,
  kSlow,
  kKillAgent,
  kCorruptCheckpoint,
  kDegrade,
  kMetric,
  kLink
};
std::string_view Name(FaultKind kind);

// What a link fault does: FORMATS-style spellings "slow", "loss", "down".
enum class LinkFaultKind { kSlow, kLoss, kDown };
std::string_view Name(LinkFaultKind kind);
// Faults the worker itself carries out (given to it in run.json): the worker's kind of each.
std::optional<launch::WorkerFaultKind> WorkerFaultOf(FaultKind kind);
bool IsWorkerFault(FaultKind kind);

struct Injection {
  FaultKind kind = FaultKind::kCrash;
  std::string spec;  // as given
  std::string node;  // "" : by rank
  int rank = -1;
  int pp = -1;  // slow: every rank of this pipeline stage
  int64_t at_step = -1;
  double at_seconds = -1;  // since the launch started
  double seconds = 0;      // slow: extra compute per step; metric: how long (0: to the end)
  double factor = 0;       // degrade (default 3), slow
  std::string what;        // metric: nic-errors | memory
  LinkFaultKind link = LinkFaultKind::kSlow;
  double rate_mbps = 0;  // link slow: the shaped rate
  double loss_pct = 0;   // link loss: packets dropped each way
  bool persist = false;  // fires again in every attempt while its node is in the job
  bool fired = false;
  int planned_rank = -1;  // the rank it was given to in the current attempt
};

// Parses one --inject value; errors say what is wrong with it.
Result<Injection> ParseInjection(const std::string& spec);

// The injection a worker's announcement that a fault fired (its kind, rank and step) is about:
// the unfired worker fault of that kind planned for that rank whose step is the latest at or
// before `step` (a slow fault fires at the first step it reaches, later than its own when the
// attempt resumed past it; two crashes of one rank are two injections, each fired on its own);
// nullptr when none is.
Injection* FiredInjection(std::vector<Injection>& injections, launch::WorkerFaultKind kind,
                          int rank, int64_t step);

}  // namespace megascope::controller
