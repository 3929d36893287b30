#include "megascope/launch/attempt_plan.h"

#include <nlohmann/json.hpp>

namespace megascope::launch {

Result<std::string> RunJsonForAttempt(std::string_view run_json, const AttemptPlan& plan) {
  using json = nlohmann::ordered_json;
  json j = json::parse(run_json, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("layout") || !j["layout"].is_object() || !j.contains("ranks") ||
      !j["ranks"].is_array())
    return InvalidArgument(
        "the job's run.json is not a megascope run configuration (no layout "
        "or ranks)");
  json& layout = j["layout"];
  const int world = layout.value("world", 0), nodes = layout.value("nodes", 0);
  if (world <= 0 || nodes <= 0 || world % nodes != 0 || static_cast<int>(plan.nodes.size()) < nodes)
    return InvalidArgument("the job's run.json: a world of " + std::to_string(world) + " on " +
                           std::to_string(nodes) + " nodes cannot take an attempt on " +
                           std::to_string(plan.nodes.size()) + " nodes");
  j["attempt"] = plan.attempt;
  layout["node_names"] = plan.nodes;
  const int per_node = world / nodes;
  for (json& r : j["ranks"]) {
    const int rank = r.value("rank", -1);
    if (rank >= 0 && rank < world) r["node"] = plan.nodes[static_cast<size_t>(rank / per_node)];
  }
  if (plan.resume_set)
    j["resume"] = {
        {"step", plan.resume.step}, {"source", plan.resume.source}, {"files", plan.resume.files}};
  else
    j.erase("resume");
  json faults = json::array();
  for (const WorkerFault& f : plan.faults)
    faults.push_back({{"kind", Name(f.kind)},
                      {"rank", f.rank},
                      {"step", f.step},
                      {"seconds", f.seconds},
                      {"factor", f.factor}});
  j["faults"] = faults;
  json agents = json::array();
  for (const auto& [node, port] : plan.agent_ports) {
    const auto addr = plan.agent_addrs.find(node);
    const std::string host = addr == plan.agent_addrs.end() ? "127.0.0.1" : addr->second;
    agents.push_back(
        {{"node", node}, {"port", port}, {"url", "http://" + host + ":" + std::to_string(port)}});
  }
  j["agents"] = agents;
  return j.dump(1) + "\n";
}

}  // namespace megascope::launch
