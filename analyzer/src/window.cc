#include "megascope/analyzer/window.h"

#include <charconv>
#include <nlohmann/json.hpp>

#include "agent_answer.h"

namespace megascope::analyzer {
namespace {

using nlohmann::json;

json RowsJson(const SlowInput& in) {
  json ranks = json::array(), steps = json::array(), ops = json::array(), groups = json::array();
  for (const auto& [rank, m] : in.ranks)
    ranks.push_back({rank, m.node, m.dp, m.pp, m.tp, m.clock_offset_ns});
  for (const SlowInput::Step& s : in.steps)
    steps.push_back({s.rank, s.attempt, s.step, s.wall, s.compute, s.comm, s.data});
  std::map<std::string, int> group_ids;  // group names are sent once
  for (const SlowInput::Op& op : in.ops) {
    auto [at, fresh] = group_ids.try_emplace(op.grp, static_cast<int>(group_ids.size()));
    if (fresh) groups.push_back(op.grp);
    ops.push_back({at->second, op.seq, op.rank, op.enqueued, op.completed, op.bytes, op.p2p});
  }
  return {{"ranks", std::move(ranks)},
          {"steps", std::move(steps)},
          {"groups", std::move(groups)},
          {"ops", std::move(ops)}};
}

void ReadRows(const json& j, SlowInput* in) {
  for (const json& r : j.at("ranks"))
    in->ranks[r.at(0).get<int>()] = {r.at(1).get<std::string>(), r.at(2).get<int>(),
                                     r.at(3).get<int>(), r.at(4).get<int>(),
                                     r.at(5).get<int64_t>()};
  in->steps.reserve(j.at("steps").size());
  for (const json& s : j.at("steps"))
    in->steps.push_back({s.at(0).get<int>(), s.at(1).get<int64_t>(), s.at(2).get<int64_t>(),
                         s.at(3).get<double>(), s.at(4).get<double>(), s.at(5).get<double>(),
                         s.at(6).get<double>()});
  const json& groups = j.at("groups");
  in->ops.reserve(j.at("ops").size());
  for (const json& o : j.at("ops"))
    in->ops.push_back({groups.at(o.at(0).get<size_t>()).get<std::string>(), o.at(1).get<int64_t>(),
                       o.at(2).get<int>(), o.at(3).get<int64_t>(), o.at(4).get<int64_t>(),
                       o.at(5).get<int64_t>(), o.at(6).get<bool>()});
}

}  // namespace

Result<WindowQuery> ParseWindowQuery(std::string_view query) {
  WindowQuery q;
  bool from = false, to = false, attempt = false;
  for (const auto& [key, value] : answer::Fields(query)) {
    if (key == "attempt" || key == "from" || key == "to") {
      ASSIGN_OR_RETURN(const int64_t v, answer::Integer("window query", key, value));
      if (key == "attempt") {
        if (v < 0 || v > INT32_MAX) return InvalidArgument("window query: attempt out of range");
        q.attempt = static_cast<int>(v);
        attempt = true;
      } else {
        (key == "from" ? q.first_step : q.last_step) = v;
        (key == "from" ? from : to) = true;
      }
    } else if (key == "anyway") {
      q.anyway = value == "1" || value == "true";
    } else {
      return InvalidArgument("window query: unknown field '" + std::string(key) +
                             "' (use attempt=A&from=F&to=T[&anyway=1])");
    }
  }
  if (!attempt || !from || !to)
    return InvalidArgument(
        "window query: attempt, from and to are all needed "
        "(attempt=A&from=F&to=T[&anyway=1])");
  if (q.last_step < q.first_step)
    return InvalidArgument("window query: to (" + std::to_string(q.last_step) +
                           ") is before from (" + std::to_string(q.first_step) + ")");
  return q;
}

std::string WindowPath(const WindowQuery& q) {
  return "/window?attempt=" + std::to_string(q.attempt) + "&from=" + std::to_string(q.first_step) +
         "&to=" + std::to_string(q.last_step) + (q.anyway ? "&anyway=1" : "");
}

std::string WindowPartJson(const WindowPart& part) {
  json through = json::array();
  for (const auto& [rank, step] : part.through) through.push_back({rank, step});
  json j = {{"version", WindowPart::kVersion},
            {"node", part.node},
            {"through", std::move(through)},
            {"has_rows", part.has_rows}};
  if (part.has_rows) j.update(RowsJson(part.input));
  return j.dump() + "\n";
}

Result<WindowPart> ParseWindowPart(std::string_view text) {
  ASSIGN_OR_RETURN(const json j, answer::ReadVersioned(text, "/window", WindowPart::kVersion));
  WindowPart part;
  try {
    part.node = j.at("node").get<std::string>();
    for (const json& t : j.at("through")) part.through[t.at(0).get<int>()] = t.at(1).get<int64_t>();
    part.has_rows = j.at("has_rows").get<bool>();
    if (part.has_rows) ReadRows(j, &part.input);
  } catch (const json::exception& e) {
    return DataLoss("a malformed /window answer" +
                    (part.node.empty() ? std::string() : " from " + part.node) + ": " + e.what());
  }
  return part;
}

int RanksThrough(const std::map<std::string, WindowPart>& parts, int64_t last) {
  int n = 0;
  for (const auto& [node, part] : parts) {
    for (const auto& [rank, step] : part.through) n += step >= last ? 1 : 0;
  }
  return n;
}

WindowServer::WindowServer(std::string run_dir, std::string node)
    : run_dir_(std::move(run_dir)), node_(std::move(node)), stored_(run_dir_, node_) {}

Result<WindowPart> WindowServer::Part(const WindowQuery& q) {
  std::lock_guard<std::mutex> lock(mu_);
  WindowPart part;
  part.node = node_;
  RETURN_IF_ERROR(stored_.Refresh());
  part.through = stored_.Through(q.attempt);
  bool complete = !part.through.empty();
  for (const auto& [rank, step] : part.through) complete &= step >= q.last_step;
  if (!complete && !q.anyway) return part;
  part.has_rows = true;
  if (part.through.empty()) return part;  // nothing stored of the attempt yet
  ASSIGN_OR_RETURN(auto db,
                   RunDatabase::Open(run_dir_, {q.attempt, q.first_step, q.last_step, node_}));
  SlowOptions o;
  o.attempt = q.attempt;
  o.first_step = q.first_step;
  o.last_step = q.last_step;
  ASSIGN_OR_RETURN(part.input, LoadSlowInput(*db, o));
  return part;
}

std::pair<int, std::string> WindowServer::Serve(std::string_view query) {
  auto q = ParseWindowQuery(query);
  if (!q.ok()) return {400, answer::ErrorJson(q.status().message())};
  auto part = Part(*q);
  if (!part.ok()) return {503, answer::ErrorJson(node_ + ": " + part.status().message())};
  return {200, WindowPartJson(*part)};
}

}  // namespace megascope::analyzer
