// The eviction policy (DESIGN.md section 8), as code with its own tests: a verdict's kind, cause,
// confidence and persistence decide what the controller does. Pure: a verdict and what is known
// about it in, a decision out; the controller carries it out and records it with the evidence.
//
//   kind/cause                            action
//   hang rank_dead | rank_not_joined      evict the root nodes (a process that is gone is certain)
//   hang link_stall                       self-check both ends; evict the one that fails
//   hang op_mismatch | order_mismatch |   restart in place (software, not a machine)
//        unknown
//   slow compute_straggler                evict when it held in `straggler_windows` analyses in a
//                                         row with confidence >= check_confidence; else alert
//   slow comm_straggler | link_slow       self-check (the bandwidth test decides), same persistence
//   slow stage_imbalance                  alert only: every replica of the stage is slow; evicting
//                                         a machine cannot help
//   faulty_machine                        self-check the suspect at confidence >= check_confidence
//                                         (it stays when it passes: the verdict is not confirmed);
//                                         alert below
//   healthy, anything unknown             alert only (an unknown kind is reported, never acted on)
//
// The detector's verdicts already need their continuity window (a single excursion shorter than
// it never becomes one), and the controller evicts the machine, never its pipeline group.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "megascope/tracer/verdict.h"

namespace megascope::controller {

// FORMATS.md section 2's kinds and causes.
enum class VerdictKind { kHang, kSlow, kFaultyMachine, kHealthy, kOther };
enum class Cause {
  kRankDead,
  kRankNotJoined,
  kOpMismatch,
  kLinkStall,
  kOrderMismatch,
  kUnknown,
  kComputeStraggler,
  kCommStraggler,
  kLinkSlow,
  kStageImbalance,
  kOther,  // a cause this build does not know (a newer analyzer), or a detector metric
};
VerdictKind ParseVerdictKind(std::string_view kind);
Cause ParseCause(std::string_view cause);

enum class Action { kAlert, kRestartInPlace, kSelfCheck, kEvict };
std::string_view Name(Action a);  // alert, restart_in_place, self_check, evict

struct PolicyOptions {
  double check_confidence = 0.6;  // below: alert only
  int straggler_windows = 2;      // straggler analyses in a row naming the rank before acting
};

struct Decision {
  Action action = Action::kAlert;
  std::vector<std::string> nodes;  // whom the action is for
  std::string reason;              // why, in words (logged and recorded)
};

// `repeats`: how many analyses in a row (this one included) named the same cause and node.
// `passed_before`: the suspect already passed a self-check for this cause in this run; it stays,
// and the verdict is an alert (a self-check that passed once is not re-run for the same evidence).
Decision Decide(const Verdict& v, int repeats, const PolicyOptions& options = {},
                bool passed_before = false);

}  // namespace megascope::controller
