// Faults injected into the real processes of a launch (`--inject KIND:key=value,...`):
//   crash | hang | stall-send | slow   into a rank: node=N (its first rank) or rank=R, at=STEP
//                                      (slow also seconds=X of extra compute per step)
//   kill-agent                         SIGKILL a node's agent: node=N, at=STEP or at=SECONDSs
//   corrupt-checkpoint                 flip a byte in the newest saved state (every memory copy of
//                                      rank 0 and the newest disk checkpoint) before the next
//                                      restart
//   degrade                            node=N runs slowed by factor=F (default 3): its self-check
//   fails
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "megascope/tracer/status.h"

namespace megascope::controller {

enum class FaultKind { kCrash, kHang, kStallSend, kSlow, kKillAgent, kCorruptCheckpoint, kDegrade };
std::string_view Name(FaultKind kind);
// Faults the worker itself carries out (given to it in run.json).
bool IsWorkerFault(FaultKind kind);

struct Injection {
  FaultKind kind = FaultKind::kCrash;
  std::string spec;  // as given
  std::string node;  // "" : by rank
  int rank = -1;
  int64_t at_step = -1;
  double at_seconds = -1;  // since the launch started
  double seconds = 0;      // slow: extra compute per step
  double factor = 3;       // degrade
  bool fired = false;
  int planned_rank = -1;  // the rank it was given to in the current attempt
};

// Parses one --inject value; errors say what is wrong with it.
Result<Injection> ParseInjection(const std::string& spec);

}  // namespace megascope::controller
