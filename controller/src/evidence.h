// Online evidence of machine faults that do not stop a job (private to the controller): the
// detector fed every tick from the agents' /metrics pages, and the straggler analysis over the
// recent steps the agents compute from their trace databases. Both reuse the engines of `megascope
// detect` and `analyze slow` as they are; this file only turns live sources into their inputs.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "megascope/analyzer/slow.h"
#include "megascope/analyzer/window.h"
#include "megascope/controller/fleet.h"
#include "megascope/controller/policy.h"
#include "megascope/detector/detector.h"
#include "megascope/tracer/clickhouse.h"
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

// Where a straggler window's parts come from: each node's agent computes its ranks' part over its
// own trace.db (GET /window), so the watch never opens every node's database. A node whose agent
// does not answer (gone, an older agent) is read from its trace.db here when this machine has it
// (one machine, a shared run directory); otherwise the window waits for it, or is analysed
// without it once `anyway` (the node is named).
class StragglerWatch {
 public:
  struct Finding {
    Verdict verdict;
    // Analyses in a row (this one included) that named the same cause and nodes, a compute or
    // comm straggler counting as one cause (policy.h's Streak).
    Streak streak;
  };
  // Straggler analysis over steps [first, last] of `attempt` on `nodes`, once the spans of all
  // `world` ranks through `last` are stored: nullopt while some are not (their agents are still
  // storing them), unless `anyway` (a rank that stays behind: its agent may be gone). While it
  // waits, each agent answers only how far its ranks are stored, reading only what was stored
  // since it was last asked (analyzer::WindowServer).
  Result<std::optional<std::vector<Finding>>> Analyze(Fleet& fleet,
                                                      const std::vector<std::string>& nodes,
                                                      const std::string& token,
                                                      const std::string& run_dir, int attempt,
                                                      int64_t first, int64_t last, int world,
                                                      bool anyway, analyzer::SlowOptions options);
  // Reads windows from the fleet's store first (analyzer::LoadSlowInputFromStore): one statement
  // a part instead of a part from every agent. When the store fails, the agents' parts as
  // without it (missing() says why).
  void UseStore(const tracer::StoreUrl& url, std::string job);
  // The nodes the last analysis went without ("node: why"), for the log.
  const std::vector<std::string>& missing() const { return missing_; }
  // Whether the last window analysed was read from the store.
  bool from_store() const { return from_store_; }
  void Reset() { streaks_.Reset(); }

 private:
  // Every node's part of the window, from its agent or its database; false: some part is not
  // there yet.
  bool Gather(Fleet& fleet, const std::vector<std::string>& nodes, const std::string& token,
              const std::string& run_dir, const analyzer::WindowQuery& q,
              std::map<std::string, analyzer::WindowPart>* parts);

  StragglerStreaks streaks_;
  std::unique_ptr<tracer::ClickHouse> store_;
  bool from_store_ = false;
  std::string job_;
  std::map<std::string, std::unique_ptr<analyzer::WindowServer>> local_;  // by trace.db path
  std::vector<std::string> missing_;
};

}  // namespace megascope::controller
