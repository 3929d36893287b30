// Slowdown analysis (MegaScale): per step, each rank's compute time against its peers at the same
// (pp, tp) -- persistent compute stragglers -- and, at every collective, the last rank to arrive,
// with the waiting it caused the others summed per rank -- communication stragglers -- plus the
// pipeline bubble share; and slow links: groups whose collectives take longer than the same
// collectives of other groups once everyone has arrived, localised to the host they share
// (`link_slow`). Verdicts of kind "slow" carry the cost in seconds per step. A pipeline
// stage whose every replica computes longer than the other stages is a `stage_imbalance` (the model
// or the layout, not a machine: the controller reports it and evicts nothing).
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "megascope/analyzer/query.h"
#include "megascope/tracer/verdict.h"

namespace megascope::analyzer {

struct SlowOptions {
  int64_t first_step = 0;
  int64_t last_step = std::numeric_limits<int64_t>::max();
  double compute_ratio = 1.2;     // compute this much above its peers' median makes a step slow
  double persistent_share = 0.6;  // ...in at least this share of the steps
  double min_cost_s = 0.005;      // ignore stragglers costing less per step
  double link_ratio = 2.5;  // a group's collectives this many times slower than the fastest group
                            // of their kind (once all members arrived) cross a slow link
  double link_min_step_share = 0.10;  // ... when that costs at least this share of a step
  int min_peers = 1;  // ranks at the same (pp, tp) a rank is compared with, at least
  int attempt = -1;   // only this attempt of a `megascope launch` run (-1: every attempt)
};

struct SlowReport {
  std::vector<Verdict> verdicts;  // kind "slow", or one "healthy"
  double bubble_share = 0;        // of step time, averaged
  double mean_step_s = 0;
  int64_t steps = 0;
  // "thresholds: steps A..B of ...; ...": what decided, also the last evidence of every verdict.
  std::string thresholds;
};

// What a straggler analysis reads of a window of steps, and nothing else: the analysis is pure
// over it. Loaded from trace databases (LoadSlowInput) or merged from the parts each node's agent
// computes over its own trace.db (window.h): a part holds its node's ranks, parts merge.
struct SlowInput {
  struct Rank {
    std::string node;
    int dp = 0, pp = 0, tp = 0;
    int64_t clock_offset_ns = 0;  // the rank's clock minus the common clock
  };
  // One rank's step, ns (per_rank of PerRankStepCte; a step run again after a restart is another
  // row, of its attempt).
  struct Step {
    int rank = 0;
    int64_t attempt = 0, step = 0;
    double wall = 0, compute = 0, comm = 0, data = 0;
  };
  // An op the rank enqueued while its steps of the window ran, on the rank's own clock.
  struct Op {
    std::string grp;
    int64_t seq = 0;
    int rank = 0;
    int64_t enqueued = 0, completed = 0, bytes = 0;
    bool p2p = false;
  };
  std::map<int, Rank> ranks;
  std::vector<Step> steps;
  std::vector<Op> ops;
  // Adds another node's part (its ranks' rows; a rank already here keeps its row).
  void Merge(SlowInput&& part);
};
// The window `options` names (steps, attempt) of the databases. Every rank's ops are those it
// enqueued between its first span's start and last span's end in the window (its own clock).
Result<SlowInput> LoadSlowInput(RunDatabase& db, const SlowOptions& options);
Result<SlowReport> AnalyzeSlow(const SlowInput& input, const SlowOptions& options = {});
// LoadSlowInput, then AnalyzeSlow.
Result<SlowReport> AnalyzeSlow(RunDatabase& db, const SlowOptions& options = {});
// The options a verdict's `thresholds` were decided with (as AnalyzeSlow writes them), over
// `defaults` for what it does not say.
SlowOptions SlowOptionsFrom(const std::map<std::string, double>& thresholds,
                            SlowOptions defaults = {});
// How far each rank's spans are stored in a run's trace databases (RUN/nodes/*/trace.db), for a
// watcher that waits until a window of steps is stored before reading it: the agents store what
// their ranks record a moment later, each at its own pace, and a window read before every rank's
// end of it is stored misses the newest steps of some ranks. Each Refresh reads only the span rows
// stored since the last one (by rowid), one node's database at a time over a connection kept
// open, so polling costs what was stored since, not a copy of the run (as RunDatabase::Open makes
// once a run has more nodes than SQLite attaches at once).
class StoredSteps {
 public:
  // Every node of the run, or only `node` (an agent's own database).
  explicit StoredSteps(std::string run_dir, std::string node = "");
  ~StoredSteps();
  StoredSteps(StoredSteps&&) noexcept;
  StoredSteps& operator=(StoredSteps&&) noexcept;
  // Reads what was stored since the last call; a node whose database cannot be read is an error
  // naming it (what was read before is kept).
  Status Refresh();
  // Ranks of `attempt` (-1: of any) with spans of step `step` or a later one, as of the last
  // Refresh.
  int RanksThrough(int attempt, int64_t step) const;
  // Each rank of `attempt` with spans stored: its newest stored step, as of the last Refresh.
  std::map<int, int64_t> Through(int attempt) const;

 private:
  struct Node;
  std::string run_dir_, node_;
  std::map<std::string, std::unique_ptr<Node>> nodes_;  // by trace.db path
  std::map<std::pair<int, int>, int64_t> last_step_;    // (attempt, rank) -> newest stored step
};
std::string FormatSlowReport(const SlowReport& report);

}  // namespace megascope::analyzer
