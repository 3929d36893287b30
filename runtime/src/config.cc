#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "megascope/kernels/kernels.h"
#include "megascope/runtime/train.h"
#include "megascope/tracer/json_fields.h"

namespace megascope::runtime {

namespace {
// "crash, hang, ..., slow-checkpoint": what a fault's kind may be.
std::string FaultKinds() {
  std::string out;
  for (const std::string_view n : launch::kWorkerFaultNames)
    out += (out.empty() ? "" : ", ") + std::string(n);
  return out;
}
}  // namespace

Result<Fault> ParseFault(const std::string& spec) {
  const auto colon = spec.find(':');
  Fault f;
  const std::optional<launch::WorkerFaultKind> kind =
      launch::ParseWorkerFaultKind(spec.substr(0, colon));
  if (!kind) {
    return InvalidArgument("fault '" + spec + "': kind must be one of " + FaultKinds());
  }
  f.kind = *kind;
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
  if (f.kind == launch::WorkerFaultKind::kSlow && f.seconds <= 0 && f.factor <= 1)
    return InvalidArgument("fault '" + spec + "' needs seconds=X > 0 or factor=F > 1");
  if (f.kind == launch::WorkerFaultKind::kSlowCheckpoint && f.seconds <= 0)
    return InvalidArgument("fault '" + spec + "' needs seconds=X > 0");
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
  if (steps < 1 || lr <= 0 || microbatches < 1 || global_batch < 1)
    return "--steps, --lr, --batch and --microbatches must be positive";
  if (global_batch % layout.dp != 0)
    return "global batch " + std::to_string(global_batch) + " is not divisible by dp";
  if ((global_batch / layout.dp) % microbatches != 0) {
    return "per-replica batch " + std::to_string(global_batch / layout.dp) +
           " is not divisible by " + std::to_string(microbatches) + " microbatches";
  }
  if (kernels::Backend b; !kernels::ParseBackend(device, &b))
    return "--device must be cpu or cuda, not '" + device + "'";
  if (device == "cuda" && !kernels::CudaCompiledIn())
    return "--device cuda: this megascope was built without CUDA (build it with the cuda preset: "
           "cmake --preset cuda && cmake --build --preset cuda)";
  if (cuda_device < 0) return "--cuda-device must be a device ordinal (0, 1, ...)";
  if (comm != "gloo" && comm != "nccl") return "--comm must be gloo or nccl, not '" + comm + "'";
  if (comm == "nccl" && device != "cuda")
    return "--comm nccl needs --device cuda (NCCL moves device memory)";
  for (const Fault& f : faults) {
    if (f.kind == launch::WorkerFaultKind::kStallSend && comm == "nccl")
      return "--fault stall-send stalls a Gloo send: it needs --comm gloo";
  }
  if (trace_alternate < 0) return "--trace-alternate must be 0 (off) or a number of steps";
  if (keep_checkpoints < 0) return "--keep-checkpoints must be 0 (keep every one) or more";
  if (trace_alternate > 0 && !trace) return "--trace-alternate and --no-trace exclude each other";
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
                {"keep_checkpoints", keep_checkpoints},
                {"timeout_ms", timeout_ms},
                {"device", device},
                {"cuda_device", cuda_device},
                {"comm", comm},
                {"trace", trace},
                {"trace_alternate", trace_alternate},
                {"memory_snapshots", memory_snapshots}};
  if (resume_set)
    j["resume"] = {{"step", resume.step}, {"source", resume.source}, {"files", resume.files}};
  nlohmann::ordered_json faults_j = nlohmann::ordered_json::array();
  for (const Fault& f : faults)
    faults_j.push_back({{"kind", launch::Name(f.kind)},
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
    auto addr = agent_addrs.find(node);
    const std::string host = addr == agent_addrs.end() ? "127.0.0.1" : addr->second;
    agents_j.push_back(
        {{"node", node}, {"port", port}, {"url", "http://" + host + ":" + std::to_string(port)}});
  }
  j["agents"] = agents_j;
  return j.dump(1) + "\n";
}

namespace {

using tracer::JsonFields;
constexpr int64_t kMaxInt = std::numeric_limits<int>::max();

Status ReadLayout(const JsonFields& top, const std::string& source, TrainConfig& c) {
  ASSIGN_OR_RETURN(JsonFields l, top.Sub("layout"));
  ASSIGN_OR_RETURN(c.layout.dp, l.IntIn("dp", 1, 65536));
  ASSIGN_OR_RETURN(c.layout.tp, l.IntIn("tp", 1, 65536));
  ASSIGN_OR_RETURN(c.layout.pp, l.IntIn("pp", 1, 65536));
  ASSIGN_OR_RETURN(c.nodes, l.IntIn("nodes", 1, kMaxInt));
  if (l.Has("node_names")) {
    ASSIGN_OR_RETURN(const nlohmann::json* names, l.Array("node_names"));
    for (const auto& n : *names) {
      if (!n.is_string()) return InvalidArgument(source + ": layout: node_names must be strings");
      c.node_names.push_back(n.get<std::string>());
    }
  }
  return Status::Ok();
}

Status ReadModel(const JsonFields& top, TrainConfig& c) {
  ASSIGN_OR_RETURN(JsonFields m, top.Sub("model"));
  ASSIGN_OR_RETURN(c.model.layers, m.IntIn("layers", 1, kMaxInt));
  ASSIGN_OR_RETURN(c.model.heads, m.IntIn("heads", 1, kMaxInt));
  ASSIGN_OR_RETURN(c.model.width, m.IntIn("width", 1, kMaxInt));
  ASSIGN_OR_RETURN(c.model.seq, m.IntIn("seq", 1, kMaxInt));
  ASSIGN_OR_RETURN(c.model.vocab, m.IntIn("vocab", 2, kMaxInt));
  ASSIGN_OR_RETURN(c.model.parallel_block, m.Bool("parallel_block"));
  ASSIGN_OR_RETURN(c.model.seed, m.Int("seed"));
  return Status::Ok();
}

// The fields added since the first run.json, each with the default a run.json without it meant.
Status ReadTrainOptional(const JsonFields& t, const std::string& source, TrainConfig& c) {
  if (t.Has("device")) {  // absent before the CUDA backend: cpu
    ASSIGN_OR_RETURN(c.device, t.Str("device"));
    if (kernels::Backend b; !kernels::ParseBackend(c.device, &b))
      return InvalidArgument(source + ": train.device: '" + c.device +
                             "' is not a device this megascope knows (cpu, cuda)");
  }
  if (t.Has("cuda_device")) {
    ASSIGN_OR_RETURN(c.cuda_device, t.IntIn("cuda_device", 0, kMaxInt));
  }
  if (t.Has("comm")) {  // absent before NCCL: gloo
    ASSIGN_OR_RETURN(c.comm, t.Str("comm"));
    if (c.comm != "gloo" && c.comm != "nccl")
      return InvalidArgument(source + ": train.comm: '" + c.comm +
                             "' is not a transport this megascope knows (gloo, nccl)");
  }
  if (t.Has("trace")) {
    ASSIGN_OR_RETURN(c.trace, t.Bool("trace"));
  }
  if (t.Has("trace_alternate")) {
    ASSIGN_OR_RETURN(c.trace_alternate, t.IntIn("trace_alternate", 0, kMaxInt));
  }
  if (t.Has("keep_checkpoints")) {  // absent before checkpoints rotated: every one kept
    ASSIGN_OR_RETURN(c.keep_checkpoints, t.IntIn("keep_checkpoints", 0, kMaxInt));
  } else {
    c.keep_checkpoints = 0;
  }
  if (t.Has("memory_snapshots")) {
    ASSIGN_OR_RETURN(c.memory_snapshots, t.Bool("memory_snapshots"));
  }
  return Status::Ok();
}

Status ReadTrain(const JsonFields& top, const std::string& source, TrainConfig& c) {
  ASSIGN_OR_RETURN(JsonFields t, top.Sub("train"));
  ASSIGN_OR_RETURN(c.global_batch, t.IntIn("global_batch", 1, kMaxInt));
  ASSIGN_OR_RETURN(c.microbatches, t.IntIn("microbatches", 1, kMaxInt));
  ASSIGN_OR_RETURN(c.steps, t.IntIn("steps", 1, std::numeric_limits<int64_t>::max()));
  ASSIGN_OR_RETURN(double lr, t.Number("lr", true));
  ASSIGN_OR_RETURN(double min_lr, t.Number("min_lr", true));
  ASSIGN_OR_RETURN(c.warmup, t.IntIn("warmup", 0, kMaxInt));
  ASSIGN_OR_RETURN(double grad_clip, t.Number("grad_clip", true));
  ASSIGN_OR_RETURN(double weight_decay, t.Number("weight_decay", true));
  c.lr = static_cast<float>(lr);
  c.min_lr = static_cast<float>(min_lr);
  c.grad_clip = static_cast<float>(grad_clip);
  c.weight_decay = static_cast<float>(weight_decay);
  ASSIGN_OR_RETURN(c.checkpoint_every, t.IntIn("checkpoint_every", 0, kMaxInt));
  ASSIGN_OR_RETURN(c.timeout_ms, t.IntIn("timeout_ms", 1, kMaxInt));
  return ReadTrainOptional(t, source, c);
}

Status ReadResume(const JsonFields& top, const std::string& source, TrainConfig& c) {
  if (!top.Has("resume")) return Status::Ok();
  ASSIGN_OR_RETURN(JsonFields r, top.Sub("resume"));
  c.resume_set = true;
  ASSIGN_OR_RETURN(c.resume.step, r.IntIn("step", -1, std::numeric_limits<int64_t>::max()));
  ASSIGN_OR_RETURN(c.resume.source, r.Str("source"));
  ASSIGN_OR_RETURN(const nlohmann::json* files, r.Array("files"));
  for (const auto& f : *files) {
    if (!f.is_string()) return InvalidArgument(source + ": resume: files must be strings");
    c.resume.files.push_back(f.get<std::string>());
  }
  return Status::Ok();
}

Status ReadFaults(const JsonFields& top, const std::string& source, TrainConfig& c) {
  ASSIGN_OR_RETURN(const nlohmann::json* faults, top.Array("faults"));
  for (size_t i = 0; i < faults->size(); ++i) {
    const JsonFields f((*faults)[i], source + ": faults[" + std::to_string(i) + "]");
    Fault fault;
    ASSIGN_OR_RETURN(const std::string kind, f.Str("kind"));
    const std::optional<launch::WorkerFaultKind> k = launch::ParseWorkerFaultKind(kind);
    if (!k)  // written by another build: the fault it asks for cannot be carried out
      return InvalidArgument(source + ": faults[" + std::to_string(i) + "]: unknown kind '" + kind +
                             "' (" + FaultKinds() + ")");
    fault.kind = *k;
    ASSIGN_OR_RETURN(fault.rank, f.IntIn("rank", -1, kMaxInt));
    ASSIGN_OR_RETURN(fault.step, f.Int("step"));
    ASSIGN_OR_RETURN(fault.seconds, f.Number("seconds"));
    if (f.Has("factor")) {
      ASSIGN_OR_RETURN(fault.factor, f.Number("factor"));
    }
    c.faults.push_back(fault);
  }
  return Status::Ok();
}

// Each node's agent: its port, and its address where it is not loopback (http://HOST:PORT).
Status ReadAgents(const JsonFields& top, const std::string& source, TrainConfig& c) {
  if (!top.Has("agents")) return Status::Ok();
  ASSIGN_OR_RETURN(const nlohmann::json* agents, top.Array("agents"));
  for (size_t i = 0; i < agents->size(); ++i) {
    const JsonFields a((*agents)[i], source + ": agents[" + std::to_string(i) + "]");
    ASSIGN_OR_RETURN(std::string node, a.Str("node"));
    ASSIGN_OR_RETURN(int64_t port, a.IntIn("port", 0, 65535));
    if (a.Has("url")) {
      ASSIGN_OR_RETURN(std::string url, a.Str("url"));
      const size_t from = url.find("://"), colon = url.rfind(':');
      if (from == std::string::npos || colon <= from + 3)
        return InvalidArgument(source + ": agents[" + std::to_string(i) + "].url: '" + url +
                               "' is not http://HOST:PORT");
      if (std::string host = url.substr(from + 3, colon - from - 3); host != "127.0.0.1")
        c.agent_addrs[node] = std::move(host);
    }
    c.agent_ports.emplace_back(std::move(node), static_cast<int>(port));
  }
  return Status::Ok();
}

}  // namespace

Result<TrainConfig> TrainConfig::FromJson(const std::string& text, const std::string& source) {
  auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument(source + " is not JSON");
  const nlohmann::json& root = j;
  const auto format = root.is_object() ? root.find("format") : root.end();
  if (format == root.end() || !format->is_string() || *format != "megascope-run")
    return InvalidArgument(source + " is not a megascope run.json");
  const auto version = root.find("version");
  if (version == root.end() || !version->is_number_integer() || *version != 1) {
    return InvalidArgument(source + " has run.json version " +
                           (version == root.end() ? std::string("(none)") : version->dump()) +
                           "; this build reads version 1");
  }
  const JsonFields top(root, source);
  TrainConfig c;
  ASSIGN_OR_RETURN(c.job, top.Str("job"));
  ASSIGN_OR_RETURN(c.attempt, top.IntIn("attempt", 0, kMaxInt));
  ASSIGN_OR_RETURN(c.data, top.Str("data"));
  ASSIGN_OR_RETURN(c.shm_dir, top.Str("shm_dir"));
  RETURN_IF_ERROR(ReadLayout(top, source, c));
  RETURN_IF_ERROR(ReadModel(top, c));
  RETURN_IF_ERROR(ReadTrain(top, source, c));
  RETURN_IF_ERROR(ReadResume(top, source, c));
  RETURN_IF_ERROR(ReadFaults(top, source, c));
  RETURN_IF_ERROR(ReadAgents(top, source, c));
  // What the rest of the tree indexes by: a run.json that disagrees with itself is refused here.
  if (std::string problem = c.ValidateLayout(); !problem.empty())
    return InvalidArgument(source + ": " + problem);
  return c;
}

}  // namespace megascope::runtime
