// The run's agents as Prometheus file-based service discovery reads them (file_sd_configs):
// RUN_DIR/prometheus_targets.json, rewritten atomically whenever an agent starts somewhere else (a
// spare joins, an agent is restarted on a new port), so a Prometheus pointed at the file follows
// the job across restarts (a static target list goes stale at the first one).
#pragma once

#include <string>
#include <vector>

#include "megascope/tracer/run_layout.h"
#include "megascope/tracer/status.h"

namespace megascope::launch {

struct ScrapeTarget {
  std::string node;
  std::string host;  // where the agent listens
  int port = 0;
};

// [{"targets": ["HOST:PORT"], "labels": {"megascope_node": NODE}}, ...] in node order.
std::string ScrapeTargetsJson(const std::vector<ScrapeTarget>& targets);
Status WriteScrapeTargets(const RunLayout& layout, const std::vector<ScrapeTarget>& targets);

}  // namespace megascope::launch
