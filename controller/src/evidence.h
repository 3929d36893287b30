// Online evidence of machine faults that do not stop a job (private to the controller): the
// detector fed every tick from the agents' /metrics pages, and the straggler analysis over the
// trace databases' recent steps. Both reuse the engines of `megascope detect` and `analyze slow`
// as they are; this file only turns live sources into their inputs.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "megascope/analyzer/slow.h"
#include "megascope/controller/policy.h"
#include "megascope/detector/detector.h"
#include "megascope/tracer/status.h"
#include "megascope/tracer/verdict.h"

namespace megascope::controller {

// One round of /metrics pages, as the detector's input.
struct MetricsRound {
  std::vector<detector::Sample> samples;          // the registry's detector inputs, per node
  std::map<std::string, std::string> peer_group;  // node -> its pipeline stages ("pp=0")
  std::vector<std::string> errors;                // pages that could not be read
};
// `pages`: node -> its /metrics text. A node's peers are the nodes holding the same pipeline
// stages (from the `pp` labels of its ranks' series): machines doing the same work.
MetricsRound ParseMetricsRound(const std::map<std::string, std::string>& pages, double now_s);

// Error counters of one /metrics page (the errors family, summed per metric).
std::map<std::string, double> ErrorCounters(const std::string& page);

class OnlineDetector {
 public:
  explicit OnlineDetector(const detector::DetectorConfig& config);
  // Feeds one round; returns the verdicts it completed (data time: the samples' wall time).
  std::vector<Verdict> Add(const MetricsRound& round);
  const detector::Detector& detector() const { return det_; }

 private:
  detector::Detector det_;
  detector::Stream stream_;
};

class StragglerWatch {
 public:
  struct Finding {
    Verdict verdict;
    // Analyses in a row (this one included) that named the same cause and nodes, a compute or
    // comm straggler counting as one cause (policy.h's Streak).
    Streak streak;
  };
  // Straggler analysis over steps [first, last] of `attempt`, once the spans of all `world` ranks
  // through `last` are in the trace databases: nullopt while some are not (their agents are still
  // storing them), unless `anyway` (a rank that stays behind: its agent may be gone). While it
  // waits, each call reads only what was stored since the last (analyzer::StoredSteps).
  Result<std::optional<std::vector<Finding>>> Analyze(const std::string& run_dir, int attempt,
                                                      int64_t first, int64_t last, int world,
                                                      bool anyway, analyzer::SlowOptions options);
  void Reset() { streaks_.Reset(); }

 private:
  StragglerStreaks streaks_;
  std::optional<analyzer::StoredSteps> stored_;
};

}  // namespace megascope::controller
