// 3D-parallel timelines (MegaScale's): a run's spans and collectives as Chrome trace-event JSON
// (opens in Perfetto and chrome://tracing) -- one process per node, one thread per rank labelled
// with its coords and sorted (pp, dp, tp), its asynchronous sends on threads of their own so that
// slices nest, clock offsets applied, timestamps relative to otherData.base_ns, ops still open as
// slices of category "open", flow arrows from each pipeline send to its recv bound to their
// slices -- and the same data inside the self-contained HTML viewer of dashboards/timeline/.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "megascope/analyzer/query.h"

namespace megascope::analyzer {

struct TimelineOptions {
  int64_t first_step = 0;
  int64_t last_step = std::numeric_limits<int64_t>::max();
  std::vector<int32_t> highlight_ranks;  // e.g. a verdict's root ranks
  std::string title = "megascope timeline";
};

struct TimelineStats {
  int64_t spans = 0, flows = 0, ranks = 0;
  int64_t open = 0;  // ops still open when last seen (a hang), drawn as slices of category "open"
};

// The trace-event JSON of the chosen steps.
Result<std::string> TimelineJson(RunDatabase& db, const TimelineOptions& options,
                                 TimelineStats* stats = nullptr);
// The HTML viewer with `trace_json` inside.
std::string TimelineHtml(const std::string& trace_json, const TimelineOptions& options);

}  // namespace megascope::analyzer
