#include "megascope/analyzer/live.h"

#include <nlohmann/json.hpp>
#include <set>

#include "megascope/tracer/http_client.h"
#include "megascope/tracer/parallel.h"

namespace megascope::analyzer {
namespace {

using tracer::HttpGet;
// A rank's view as the live input keeps it: its ops indexed and its entries dropped (the index is
// all the analysis reads of them, and 100,000 ranks' entries are 2 GB).
Status Add(std::string source, tracer::Dump d, const std::shared_ptr<tracer::Arena>& arena,
           HangInputBuilder* input) {
  RankView v;
  v.source = std::move(source);
  v.ops = IndexOps(d, arena);
  d.snapshot.entries = std::vector<tracer::FlightEntry>();  // freed (`= {}` keeps the capacity)
  v.dump = std::move(d);
  return input->Add(std::move(v));
}

// One agent's ranks in one answer: every rank's dump in the binary dump stream, indexed as it
// arrives.
Status AllFromAgent(const std::string& url, int attempt, const std::string& token,
                    HangInputBuilder* input) {
  std::string src = url + "/dumps?form=binary";
  if (attempt >= 0) src += "&attempt=" + std::to_string(attempt);
  tracer::DumpStreamReader reader(src);
  const auto arena = std::make_shared<tracer::Arena>();  // this node's ranks' indices
  const auto on_dump = [&](tracer::Dump d) {
    return Add(src + " dump " + std::to_string(reader.dumps()), std::move(d), arena, input);
  };
  RETURN_IF_ERROR(tracer::HttpGetStream(
      src, 60000, token, [&](std::string_view data) { return reader.Feed(data, on_dump); }));
  return reader.Finish();
}

// One agent's ranks one by one, from its /state: each rank is asked for its own dump with every
// thread's stack, and the ring's dump is read for a rank that does not answer.
Status StacksFromAgent(const std::string& url, int attempt, const std::string& token,
                       HangInputBuilder* input) {
  ASSIGN_OR_RETURN(std::string state, HttpGet(url + "/state", 5000, token));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(state);
  } catch (const std::exception& e) {
    return DataLoss(url + "/state is not JSON: " + e.what());
  }
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
    RETURN_IF_ERROR(Add(src, std::move(d), nullptr, input));
  }
  return Status::Ok();
}

}  // namespace

Result<HangInput> LoadFromAgents(const std::vector<std::string>& urls, int attempt,
                                 const std::string& token, bool stacks) {
  // The agents are asked side by side (a job of 12,500 nodes has as many); each answers for its
  // own ranks in turn.
  HangInputBuilder input;
  std::vector<Status> got(urls.size());
  tracer::ParallelFor(urls.size(), 32, [&](size_t i) {
    std::string url = urls[i];
    while (!url.empty() && url.back() == '/') url.pop_back();
    got[i] = stacks ? StacksFromAgent(url, attempt, token, &input)
                    : AllFromAgent(url, attempt, token, &input);
  });
  for (const Status& s : got)
    RETURN_IF_ERROR(s);  // the first agent in the caller's order that failed
  return std::move(input).Finish();
}

}  // namespace megascope::analyzer
