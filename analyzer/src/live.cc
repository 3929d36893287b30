#include "megascope/analyzer/live.h"

#include <nlohmann/json.hpp>
#include <set>

#include "megascope/tracer/http_client.h"

namespace megascope::analyzer {

using tracer::HttpGet;

Result<HangInput> LoadFromAgents(const std::vector<std::string>& urls, int attempt,
                                 const std::string& token, bool stacks) {
  std::vector<std::pair<std::string, tracer::Dump>> dumps;
  for (std::string url : urls) {
    while (!url.empty() && url.back() == '/') url.pop_back();
    ASSIGN_OR_RETURN(std::string state, HttpGet(url + "/state", 5000, token));
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(state);
    } catch (const std::exception& e) {
      return DataLoss(url + "/state is not JSON: " + e.what());
    }
    std::set<int> seen;
    for (const auto& r : j.value("ranks", nlohmann::json::array())) {
      const int rank = r["rank"];
      if (attempt >= 0 && r.value("attempt", -1) != attempt) continue;
      if (!seen.insert(rank).second) continue;
      std::string src = url + "/stacks/" + std::to_string(rank);
      auto asked = stacks ? HttpGet(src, 8000, token) : Result<std::string>(NotFound(""));
      if (!asked.ok()) src = url + "/dump/" + std::to_string(rank);
      ASSIGN_OR_RETURN(std::string body, asked.ok() ? asked : HttpGet(src, 5000, token));
      ASSIGN_OR_RETURN(tracer::Dump d, tracer::ParseDump(body, src));
      dumps.emplace_back(src, std::move(d));
    }
  }
  return MakeHangInput(std::move(dumps));
}

}  // namespace megascope::analyzer
