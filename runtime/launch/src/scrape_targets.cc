#include "megascope/launch/scrape_targets.h"

#include <nlohmann/json.hpp>

#include "megascope/tracer/file_util.h"

namespace megascope::launch {

std::string ScrapeTargetsJson(const std::vector<ScrapeTarget>& targets) {
  nlohmann::ordered_json groups = nlohmann::ordered_json::array();
  for (const ScrapeTarget& t : targets) {
    groups.push_back({{"targets", {t.host + ":" + std::to_string(t.port)}},
                      {"labels", {{"megascope_node", t.node}}}});
  }
  return groups.dump(1) + "\n";
}

Status WriteScrapeTargets(const RunLayout& layout, const std::vector<ScrapeTarget>& targets) {
  return tracer::WriteFileAtomic(layout.prometheus_targets(), ScrapeTargetsJson(targets));
}

}  // namespace megascope::launch
