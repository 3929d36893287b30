#include "megascope/analyzer/live.h"

#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "megascope/tracer/http_client.h"
#include "parallel.h"

namespace megascope::analyzer {
namespace {

using tracer::HttpGet;
using Dumps = std::vector<std::pair<std::string, tracer::Dump>>;

// One agent's ranks in one answer: every rank's dump in the binary dump stream, read as it arrives.
Result<Dumps> AllFromAgent(const std::string& url, int attempt, const std::string& token) {
  std::string src = url + "/dumps?form=binary";
  if (attempt >= 0) src += "&attempt=" + std::to_string(attempt);
  Dumps dumps;
  tracer::DumpStreamReader reader(src);
  const auto on_dump = [&](tracer::Dump d) -> Status {
    dumps.emplace_back(src + " dump " + std::to_string(reader.dumps()), std::move(d));
    return Status::Ok();
  };
  RETURN_IF_ERROR(tracer::HttpGetStream(
      src, 60000, token, [&](std::string_view data) { return reader.Feed(data, on_dump); }));
  RETURN_IF_ERROR(reader.Finish());
  return dumps;
}

// One agent's ranks one by one, from its /state: each rank is asked for its own dump with every
// thread's stack, and the ring's dump is read for a rank that does not answer.
Result<Dumps> StacksFromAgent(const std::string& url, int attempt, const std::string& token) {
  ASSIGN_OR_RETURN(std::string state, HttpGet(url + "/state", 5000, token));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(state);
  } catch (const std::exception& e) {
    return DataLoss(url + "/state is not JSON: " + e.what());
  }
  Dumps dumps;
  std::set<int> seen;
  for (const auto& r : j.value("ranks", nlohmann::json::array())) {
    if (!r.is_object() || !r.contains("rank") || !r["rank"].is_number_integer())
      return DataLoss(url + "/state lists a rank without a rank number");
    const int rank = r["rank"].get<int>();
    const auto a = r.find("attempt");
    if (attempt >= 0 && (a == r.end() || !a->is_number_integer() || a->get<int>() != attempt))
      continue;
    if (!seen.insert(rank).second) continue;
    std::string src = url + "/stacks/" + std::to_string(rank);
    auto asked = HttpGet(src, 8000, token);
    if (!asked.ok()) src = url + "/dump/" + std::to_string(rank);
    ASSIGN_OR_RETURN(std::string body, asked.ok() ? asked : HttpGet(src, 5000, token));
    ASSIGN_OR_RETURN(tracer::Dump d, tracer::ParseDump(body, src));
    dumps.emplace_back(src, std::move(d));
  }
  return dumps;
}

}  // namespace

Result<HangInput> LoadFromAgents(const std::vector<std::string>& urls, int attempt,
                                 const std::string& token, bool stacks) {
  // The agents are asked side by side (a job of 12,500 nodes has as many); each answers for its
  // own ranks in turn.
  std::vector<std::optional<Result<Dumps>>> got(urls.size());
  ParallelFor(urls.size(), 32, [&](size_t i) {
    std::string url = urls[i];
    while (!url.empty() && url.back() == '/') url.pop_back();
    got[i] = stacks ? StacksFromAgent(url, attempt, token) : AllFromAgent(url, attempt, token);
  });
  Dumps dumps;
  for (auto& g : got) {
    if (!g->ok()) return g->status();  // the first agent in the caller's order that failed
    for (auto& d : **g) dumps.push_back(std::move(d));
  }
  return MakeHangInput(std::move(dumps));
}

}  // namespace megascope::analyzer
