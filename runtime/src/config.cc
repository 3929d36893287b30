#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>

#include "megascope/runtime/train.h"

namespace megascope::runtime {

Result<Fault> ParseFault(const std::string& spec) {
  const auto colon = spec.find(':');
  Fault f;
  f.kind = spec.substr(0, colon);
  if (f.kind != "crash" && f.kind != "hang" && f.kind != "stall-send" && f.kind != "slow") {
    return InvalidArgument("fault '" + spec + "': kind must be crash, hang, stall-send or slow");
  }
  if (colon == std::string::npos)
    return InvalidArgument("fault '" + spec + "' needs rank=R,step=S");
  std::stringstream ss(spec.substr(colon + 1));
  for (std::string kv; std::getline(ss, kv, ',');) {
    const auto eq = kv.find('=');
    const std::string key = kv.substr(0, eq),
                      value = eq == std::string::npos ? "" : kv.substr(eq + 1);
    try {
      if (key == "rank")
        f.rank = std::stoi(value);
      else if (key == "step")
        f.step = std::stoll(value);
      else if (key == "seconds")
        f.seconds = std::stod(value);
      else if (key == "factor")
        f.factor = std::stod(value);
      else
        return InvalidArgument("fault '" + spec + "': unknown field '" + key + "'");
    } catch (const std::exception&) {
      return InvalidArgument("fault '" + spec + "': '" + value + "' is not a number");
    }
  }
  if (f.rank < 0) return InvalidArgument("fault '" + spec + "' needs rank=R");
  if (f.kind == "slow" && f.seconds <= 0 && f.factor <= 1)
    return InvalidArgument("fault '" + spec + "' needs seconds=X > 0 or factor=F > 1");
  return f;
}

std::string TrainConfig::ValidateLayout() const {
  if (layout.dp < 1 || layout.tp < 1 || layout.pp < 1) return "dp, tp and pp must be >= 1";
  if (layout.dp > 65536 || layout.tp > 65536 || layout.pp > 65536 ||
      static_cast<int64_t>(layout.dp) * layout.tp * layout.pp > (1 << 20))
    return "the world (dp x tp x pp) is larger than 1,048,576 ranks";
  const int world = layout.world();
  if (nodes < 1 || nodes > world)
    return "--nodes must be between 1 and the world size " + std::to_string(world);
  if (world % nodes != 0)
    return "world size " + std::to_string(world) + " is not divisible by --nodes " +
           std::to_string(nodes);
  if (!node_names.empty() && static_cast<int>(node_names.size()) != nodes)
    return "node_names does not list --nodes names";
  return "";
}

std::string TrainConfig::Validate() const {
  if (std::string m = ValidateLayout(); !m.empty()) return m;
  const int world = layout.world();
  if (std::string m = model.Validate(layout); !m.empty()) return m;
  if (global_batch % layout.dp != 0)
    return "global batch " + std::to_string(global_batch) + " is not divisible by dp";
  if ((global_batch / layout.dp) % microbatches != 0) {
    return "per-replica batch " + std::to_string(global_batch / layout.dp) +
           " is not divisible by " + std::to_string(microbatches) + " microbatches";
  }
  if (steps < 1 || lr <= 0 || microbatches < 1)
    return "--steps, --lr and --microbatches must be positive";
  for (const Fault& f : faults) {
    if (f.rank >= world)
      return "fault rank " + std::to_string(f.rank) + " is outside world size " +
             std::to_string(world);
  }
  if (run_dir.empty()) return "--run-dir is required";
  if (data.empty()) return "--data is required";
  return "";
}

std::vector<std::string> TrainConfig::NodeNames() const {
  if (!node_names.empty()) return node_names;
  std::vector<std::string> out;
  out.reserve(static_cast<size_t>(std::max(nodes, 0)));
  for (int k = 0; k < nodes; ++k) out.push_back("node" + std::to_string(k));
  return out;
}
std::string TrainConfig::NodeOf(int rank) const {
  return NodeNames()[static_cast<size_t>(rank / (layout.world() / nodes))];
}
int TrainConfig::LocalRankOf(int rank) const { return rank % (layout.world() / nodes); }

std::string TrainConfig::ToJson() const {
  nlohmann::ordered_json j;
  j["format"] = "megascope-run";
  j["version"] = 1;
  j["job"] = job;
  j["attempt"] = attempt;
  j["data"] = data;
  j["shm_dir"] = shm_dir;
  j["layout"] = {{"dp", layout.dp},         {"tp", layout.tp}, {"pp", layout.pp},
                 {"world", layout.world()}, {"nodes", nodes},  {"node_names", NodeNames()}};
  j["model"] = {{"layers", model.layers}, {"heads", model.heads},
                {"width", model.width},   {"seq", model.seq},
                {"vocab", model.vocab},   {"parallel_block", model.parallel_block},
                {"seed", model.seed}};
  j["train"] = {{"global_batch", global_batch},
                {"microbatches", microbatches},
                {"steps", steps},
                {"lr", lr},
                {"min_lr", min_lr},
                {"warmup", warmup},
                {"grad_clip", grad_clip},
                {"weight_decay", weight_decay},
                {"checkpoint_every", checkpoint_every},
                {"timeout_ms", timeout_ms},
                {"trace", trace},
                {"memory_snapshots", memory_snapshots}};
  if (resume_set)
    j["resume"] = {{"step", resume.step}, {"source", resume.source}, {"files", resume.files}};
  nlohmann::ordered_json faults_j = nlohmann::ordered_json::array();
  for (const Fault& f : faults)
    faults_j.push_back({{"kind", f.kind},
                        {"rank", f.rank},
                        {"step", f.step},
                        {"seconds", f.seconds},
                        {"factor", f.factor}});
  j["faults"] = faults_j;
  nlohmann::ordered_json ranks = nlohmann::ordered_json::array();
  for (int r = 0; r < layout.world(); ++r) {
    const tracer::Coords c = layout.CoordsOf(r);
    ranks.push_back({{"rank", r},
                     {"node", NodeOf(r)},
                     {"local_rank", LocalRankOf(r)},
                     {"dp", c.dp},
                     {"pp", c.pp},
                     {"tp", c.tp}});
  }
  j["ranks"] = ranks;
  nlohmann::ordered_json agents_j = nlohmann::ordered_json::array();
  for (const auto& [node, port] : agent_ports) {
    agents_j.push_back(
        {{"node", node}, {"port", port}, {"url", "http://127.0.0.1:" + std::to_string(port)}});
  }
  j["agents"] = agents_j;
  return j.dump(1) + "\n";
}

Result<TrainConfig> TrainConfig::FromJson(const std::string& text, const std::string& source) {
  try {
    auto j = nlohmann::json::parse(text);
    if (j.value("format", "") != "megascope-run" || j.value("version", 0) != 1) {
      return InvalidArgument(source + " is not a megascope run.json of version 1");
    }
    TrainConfig c;
    c.job = j.at("job");
    c.attempt = j.at("attempt");
    c.data = j.at("data");
    c.shm_dir = j.at("shm_dir");
    c.layout = {j.at("layout").at("dp"), j.at("layout").at("tp"), j.at("layout").at("pp")};
    c.nodes = j.at("layout").at("nodes");
    c.node_names = j.at("layout").value("node_names", std::vector<std::string>{});
    const auto& m = j.at("model");
    c.model = {m.at("layers"), m.at("heads"),          m.at("width"), m.at("seq"),
               m.at("vocab"),  m.at("parallel_block"), m.at("seed")};
    const auto& t = j.at("train");
    c.global_batch = t.at("global_batch");
    c.microbatches = t.at("microbatches");
    c.steps = t.at("steps");
    c.lr = t.at("lr");
    c.min_lr = t.at("min_lr");
    c.warmup = t.at("warmup");
    c.grad_clip = t.at("grad_clip");
    c.weight_decay = t.at("weight_decay");
    c.checkpoint_every = t.at("checkpoint_every");
    c.timeout_ms = t.at("timeout_ms");
    c.trace = t.value("trace", true);
    c.memory_snapshots = t.value("memory_snapshots", false);
    if (j.contains("resume")) {
      c.resume_set = true;
      c.resume.step = j.at("resume").at("step");
      c.resume.source = j.at("resume").at("source");
      c.resume.files = j.at("resume").at("files").get<std::vector<std::string>>();
    }
    for (const auto& f : j.at("faults"))
      c.faults.push_back(
          {f.at("kind"), f.at("rank"), f.at("step"), f.at("seconds"), f.value("factor", 0.0)});
    for (const auto& a : j.value("agents", nlohmann::json::array()))
      c.agent_ports.emplace_back(a.at("node"), a.at("port"));
    // What the rest of the tree indexes by: a run.json that disagrees with itself is refused here.
    if (std::string problem = c.ValidateLayout(); !problem.empty())
      return InvalidArgument(source + ": " + problem);
    bool finite = std::isfinite(c.lr) && std::isfinite(c.min_lr) && std::isfinite(c.grad_clip) &&
                  std::isfinite(c.weight_decay);
    for (const Fault& f : c.faults)
      finite = finite && std::isfinite(f.seconds) && std::isfinite(f.factor);
    if (!finite) return InvalidArgument(source + ": a number is out of range (not finite)");
    return c;
  } catch (const std::exception& e) {
    return InvalidArgument(source + ": " + e.what());
  }
}

}  // namespace megascope::runtime
