// The eviction policy (docs/architecture.md section 8), as code with its own tests: a verdict's
// kind, cause, confidence and persistence decide what the controller does. Pure: a verdict and what
// is known about it in, a decision out; the controller carries it out and records it with the
// evidence.
//
//   kind/cause                            action
//   hang rank_dead | rank_not_joined      evict the root nodes (a process that is gone is certain)
//   hang link_stall                       self-check both ends; evict the one that fails
//   hang op_mismatch | order_mismatch |   restart in place (software, not a machine)
//        unknown
//   slow compute_straggler                held in `straggler_windows` analyses in a row with
//                                         confidence >= check_confidence: evict when its compute
//                                         convicts it (named by its compute at confidence >=
//                                         convict_confidence in `straggler_windows` of the
//                                         streak's analyses in a row); else self-check, and a
//                                         node that passes stays until its compute convicts it
//   slow comm_straggler                   self-check (the bandwidth test decides), same persistence
//   slow compute + comm_straggler         one streak (the analyses in a row named the node both
//        (one streak, mixed)              ways): self-check (failed GEMM: a compute straggler;
//                                         failed bandwidth: a comm straggler; passed: it stays),
//                                         unless its compute convicts it: evicted as a compute
//                                         straggler; same persistence
//   slow link_slow                        self-check, same persistence
//   slow stage_imbalance                  alert only: every replica of the stage is slow; evicting
//                                         a machine cannot help
//   faulty_machine (level faulty)         self-check the machine at confidence >= check_confidence
//                                         (it stays when it passes: the verdict is not confirmed);
//                                         alert below
//   faulty_machine (level suspect)        alert only: no hard error, no harm to the job, no
//                                         lasting agreement of two metric families
//   monitoring_gap, shared_component      alert only: an exporter stopped, or a rack, switch or
//                                         PDU moved several machines at once; none is blamed
//   job_error                             stop: the job's own input or code failed (a data file,
//                                         the config, a job name in use, a failure that followed
//                                         the job to a fresh node or that every node met at once
//                                         in the same words): every machine would fail the
//                                         same way, so nothing is evicted and a person is told
//                                         what failed and where
//   healthy, anything unknown             alert only (an unknown kind is reported, never acted on)
//
// The detector's verdicts already need their continuity window (a single excursion shorter than
// it never becomes one), and the controller evicts the machine, never its pipeline group.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "megascope/tracer/verdict.h"

namespace megascope::controller {

enum class Action { kAlert, kRestartInPlace, kSelfCheck, kEvict, kStop };
std::string_view Name(Action a);  // alert, restart_in_place, self_check, evict, stop

struct PolicyOptions {
  double check_confidence = 0.6;  // below: alert only
  int straggler_windows = 2;      // straggler analyses in a row naming the rank before acting
  // A compute straggler verdict this confident (slow in at least this share of the window's
  // steps) is strong enough to convict without a self-check. Below it, the node may be a healthy
  // one on cores shared with something else: a share of 5 of 8 steps is what noise gave a healthy
  // node on a loaded 2-core machine, a node slowed 1.5x gave 6-8 of 8.
  double convict_confidence = 0.75;
};

struct Decision {
  Action action = Action::kAlert;
  std::vector<std::string> nodes;  // whom the action is for
  std::string reason;              // why, in words (logged and recorded)
  // kEvict: the cause the eviction is recorded under when it is not the verdict's (a streak its
  // compute convicts is a compute straggler's, whatever named it last).
  std::string evict_as;
};

// What the analyses in a row said of the verdict's nodes. A rank that computes longer than its
// peers also arrives last at their collectives: in a window where its compute excess falls short
// of the analyzer's bar in too many steps, the same slow rank is named a comm_straggler instead.
// A rank whose network is slow may, the other way round, be named by its compute in a window
// where noise pushes its compute just over the bar. So compute and comm stragglers of the same
// nodes make one streak. Its compute verdicts convict the node only when they are strong (a
// compute straggler's GEMM may pass a self-check on shared cores at 1.5x slower, so a strong
// compute record needs no check); weak ones, or a streak named both ways, are self-checked, and
// the check says which it is.
// A compute or a comm straggler: one cause to a streak and to a passed self-check (a node named
// both ways in a row is one suspect; the self-check says which it is).
inline bool IsStraggler(Cause c) {
  return c == Cause::kComputeStraggler || c == Cause::kCommStraggler;
}

struct Streak {
  int repeats = 1;     // analyses in a row (this one included) that named the nodes
  int by_compute = 0;  // ... of which named them compute_straggler
  int by_comm = 0;     // ... of which named them comm_straggler
  // The confidences of the streak's compute_straggler verdicts, oldest first (the last 64).
  std::vector<double> compute_confidence{};
};

// How many of the streak's compute verdicts, counted back from its newest, are at or above `bar`
// in a row (a comm verdict between them neither breaks nor adds to the run). No exception for the
// window the slowdown began in: a spare that just joined on loaded cores was named at 0.625, then
// 0.75 twice, and would have been evicted (the slowed node it replaced: 0.625, then 0.875).
int StrongComputeRun(const Streak& streak, double bar);

// The streaks of successive straggler analyses (the controller's online watch): Next() takes one
// analysis's slow verdicts and returns each one's streak, in order. A suspect that an analysis
// does not name loses its streak.
class StragglerStreaks {
 public:
  std::vector<Streak> Next(const std::vector<Verdict>& verdicts);
  void Reset() { streaks_.clear(); }

 private:
  std::map<std::string, Streak> streaks_;  // cause (compute or comm: "straggler") | nodes
};

// `passed_before`: the suspect already passed a self-check for this cause in this run; it stays,
// and the verdict is an alert (a self-check that passed once is not re-run for the same evidence).
Decision Decide(const Verdict& v, const Streak& streak, const PolicyOptions& options = {},
                bool passed_before = false);

}  // namespace megascope::controller
