// Online input for the detector: turns an agent's /metrics page (Prometheus text exposition
// format) into samples, one per (node, metric). Per-rank series of a node are averaged.
#pragma once

#include <string_view>
#include <vector>

#include "megascope/detector/samples.h"

namespace megascope::detector {

// Parses `text` scraped at `time_s`. A sample's machine is its `node` label (samples without one
// are skipped); its metric is the family name without the "megascope_" prefix. Histogram and
// summary series (_bucket, _sum, _count) are skipped. Errors name the line.
Result<std::vector<Sample>> ParsePrometheusText(std::string_view text, double time_s);

}  // namespace megascope::detector
