// PyTorch Flight Recorder import: its JSON dumps become megascope dumps, so PyTorch users get
// root causes from the same analysis (field names from PyTorch's
// torch/distributed/flight_recorder).
#include "megascope/analyzer/pytorch.h"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <set>
#include <sstream>

#include "megascope/analyzer/hang.h"
#include "megascope/analyzer/pickle.h"
#include "megascope/tracer/file_util.h"
#include "pytorch_convert.h"

namespace megascope::analyzer {
namespace {

using nlohmann::json;
using pytorch_internal::Converted;
using pytorch_internal::ParseConverted;
using tracer::DType;
using tracer::OpState;
using tracer::OpType;

int64_t IntOf(const json& v, int64_t fallback);
// ProcessGroupNCCL's default collective timeout (10 minutes), for recorders that do not write one.
constexpr int64_t kDefaultTimeoutMs = 600'000;

std::vector<int32_t> ParseRanks(const json& v) {
  std::vector<int32_t> out;
  if (v.is_array()) {
    for (const auto& r : v) {
      const int64_t x = IntOf(r, -1);
      if (x >= 0 && x < (1 << 24)) out.push_back(static_cast<int32_t>(x));
    }
    return out;
  }
  if (v.is_string()) {  // PyTorch writes the list as a string: "[0, 1, 2]"
    static const std::regex kInt(R"(\d+)");
    const std::string s = v;
    for (auto it = std::sregex_iterator(s.begin(), s.end(), kInt); it != std::sregex_iterator();
         ++it) {
      if (it->length() < 8) out.push_back(std::stoi(it->str()));  // longer: not a rank
    }
  }
  return out;
}

// c10's ScalarType names as the recorder writes them; others (float8 kinds, complex) read as
// unknown and are reported.
DType DTypeOf(const std::string& s) {
  // c10::toString(ScalarType) as the recorder writes it, and torch's Python names (float32), which
  // PyTorch's own analysis tests write.
  static const std::map<std::string, DType> kNames = {
      {"Float", DType::kF32},     {"float32", DType::kF32},   {"float", DType::kF32},
      {"BFloat16", DType::kBf16}, {"bfloat16", DType::kBf16}, {"Half", DType::kF16},
      {"float16", DType::kF16},   {"Double", DType::kF64},    {"float64", DType::kF64},
      {"Int", DType::kI32},       {"Int32", DType::kI32},     {"int32", DType::kI32},
      {"Long", DType::kI64},      {"Int64", DType::kI64},     {"int64", DType::kI64},
      {"Byte", DType::kU8},       {"Bool", DType::kU8},       {"Char", DType::kU8},
      {"uint8", DType::kU8},      {"bool", DType::kU8},       {"int8", DType::kU8},
      {"Short", DType::kU16},     {"int16", DType::kU16}};
  auto it = kNames.find(s);
  return it == kNames.end() ? DType::kUnknown : it->second;
}

// An integer however the recorder wrote it (an integer, a float, a string); `fallback` when it is
// none of those or out of range.
int64_t IntOf(const json& v, int64_t fallback) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    return u > static_cast<uint64_t>(INT64_MAX) ? fallback : static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    const double d = v.get<double>();
    return std::isfinite(d) && std::fabs(d) < 9.2e18 ? static_cast<int64_t>(d) : fallback;
  }
  if (v.is_string()) {
    try {
      return std::stoll(v.get<std::string>());
    } catch (...) {
    }
  }
  return fallback;
}

// A profiling name's backend and type: "nccl:all_reduce" -> "nccl", "allreduce"; "nccl:send 0->1"
// -> "send". Types are compared without case or underscores, so a backend that spells them
// "AllReduce" or "allreduce" reads as PyTorch's "all_reduce". Any backend is read (gloo, xccl,
// nccl2, ones not yet known): only the type says what the op is.
void SplitName(const std::string& name, std::string* backend, std::string* type) {
  const size_t colon = name.find(':');
  *backend = colon == std::string::npos ? "" : name.substr(0, colon);
  const std::string rest = colon == std::string::npos ? name : name.substr(colon + 1);
  type->clear();
  for (unsigned char c : rest.substr(0, rest.find(' '))) {
    if (std::isalnum(c)) *type += static_cast<char>(std::tolower(c));  // "nccl2::AllReduce" too
  }
}

// The types PyTorch's recorder writes (types.py COLLECTIVES and P2P, and the closing "coalesced"
// entry), as SplitName spells them; any other is kept as an op of unknown kind and reported once.
bool KnownType(const std::string& type) {
  static const std::set<std::string> kKnown = {"broadcast",
                                               "broadcastoop",
                                               "reduce",
                                               "reduceoop",
                                               "allgather",
                                               "allgathersingle",
                                               "allgatherv",
                                               "allreduce",
                                               "allgatherbase",
                                               "allgatherintotensorcoalesced",
                                               "reducescatter",
                                               "reducescattersingle",
                                               "reducescatterv",
                                               "reducescattertensorcoalesced",
                                               "reducescatterbase",
                                               "gather",
                                               "scatter",
                                               "alltoall",
                                               "alltoallsingle",
                                               "alltoallvsingle",
                                               "allreducebarrier",
                                               "barrier",
                                               "split",
                                               "newwindow",
                                               "allreducecoalesced",
                                               "allgathercoalesced",
                                               "reducescattercoalesced",
                                               "coalesced",
                                               "send",
                                               "recv"};
  return kKnown.count(type) > 0;
}

// A type as megascope's op. gather and scatter have no megascope op name (docs/formats.md):
// unknown, ordered by seq, never compared by the generic rule.
OpType OpOfType(const std::string& n) {
  if (n == "send") return OpType::kSend;
  if (n == "recv") return OpType::kRecv;
  if (n.find("alltoall") != std::string::npos) return OpType::kAlltoall;
  if (n.find("reducescatter") != std::string::npos) return OpType::kReduceScatter;
  if (n.find("allgather") != std::string::npos) return OpType::kAllgather;
  if (n.find("gather") != std::string::npos || n.find("scatter") != std::string::npos)
    return OpType::kUnknown;
  if (n.find("allreduce") != std::string::npos) return OpType::kAllreduce;
  if (n.find("broadcast") != std::string::npos) return OpType::kBroadcast;
  if (n.find("barrier") != std::string::npos) return OpType::kBarrier;
  if (n.find("reduce") != std::string::npos) return OpType::kReduce;
  return OpType::kUnknown;
}

// "send 0->1" / "recv 1<-0": the peer, as a rank local to the op's group (its index in the
// group's sorted ranks, as ProcessGroupNCCL numbers them and tools/flight_recorder maps them back);
// -1 if the name has none.
int PeerOf(const std::string& name) {
  static const std::regex kP2P(R"((send|recv)\s+(\d+)\s*(->|<-)\s*(\d+))");
  std::smatch m;
  if (!std::regex_search(name, m, kP2P) || m[4].length() > 8) return -1;
  return std::stoi(m[4]);  // send self->dst, recv self<-src
}

int64_t Ns(const json& e, const char* key) {
  auto it = e.find(key);
  return it == e.end() ? 0 : IntOf(*it, 0);
}

// States: scheduled, started (only with timing enabled), completed. A recorder that marks only
// `retired` (the watchdog saw the work finish) is read as completed. `raw` gets the text.
OpState StateOf(const json& e, std::string* raw) {
  const bool retired = e.value("retired", false);
  *raw = e.value("state", retired ? "completed" : "scheduled");
  if (*raw == "completed" || retired) return OpState::kCompleted;
  if (*raw == "started") return OpState::kStarted;
  if (*raw == "scheduled") return OpState::kEnqueued;
  return OpState::kUnknown;
}

// The first recorder's dump (PyTorch 2.2's NCCLTraceBuffer::dump, before the dump had a version):
// a bare list of entries {pg_id, seq_id, profiling_name, time_created_us, input_sizes,
// output_sizes, state, retired, frames}; no pg_config, rank or timeout. Rewritten as the later
// form. Only the default group (pg_id 0, the first process group every rank makes) has known
// members, the world; a subgroup's pg_id counts the groups each rank itself made (a rank outside a
// new_group makes none), so the same id may mean different groups on different ranks, and its
// entries are left out as unknown.
json FromFirstRecorder(const json& list, int world) {
  json ranks = json::array();
  for (int r = 0; r < world; ++r) ranks.push_back(r);
  json out = {{"pg_config", {{"0", {{"name", "0"}, {"desc", "default_pg"}, {"ranks", ranks}}}}},
              {"entries", json::array()}};
  for (const auto& e : list) {
    if (!e.is_object()) continue;
    json x = e;
    if (e.contains("time_created_us")) {  // saturated: the value is whatever the file holds
      const int64_t us = IntOf(e["time_created_us"], 0);
      constexpr int64_t kMax = std::numeric_limits<int64_t>::max() / 1000;
      x["time_created_ns"] = std::clamp(us, -kMax, kMax) * 1000;
    }
    out["entries"].push_back(std::move(x));
  }
  return out;
}

std::vector<std::vector<int64_t>> SizesOf(const json& e, const char* key) {
  std::vector<std::vector<int64_t>> out;
  auto it = e.find(key);
  if (it == e.end() || !it->is_array()) return out;
  for (const auto& t : *it) {
    std::vector<int64_t> dims;
    if (t.is_array()) {
      for (const auto& d : t) dims.push_back(IntOf(d, 0));
    }
    out.push_back(std::move(dims));
  }
  return out;
}

std::vector<std::string> StringsOf(const json& e, const char* key) {
  std::vector<std::string> out;
  auto it = e.find(key);
  if (it == e.end()) return out;
  if (it->is_string()) return {it->get<std::string>()};  // a writer that wrote one dtype bare
  if (!it->is_array()) return out;
  for (const auto& x : *it) out.push_back(x.is_string() ? x.get<std::string>() : x.dump());
  return out;
}

// What PyTorch recorded of entry `e`.
PyTorchOp OpRecord(const json& e, const std::string& profiling) {
  PyTorchOp op;
  op.profiling_name = profiling;
  SplitName(profiling, &op.backend, &op.type);
  op.input_sizes = SizesOf(e, "input_sizes");
  op.output_sizes = SizesOf(e, "output_sizes");
  op.input_dtypes = StringsOf(e, "input_dtypes");
  op.output_dtypes = StringsOf(e, "output_dtypes");
  if (e.contains("state") && e["state"].is_string()) op.state = e["state"].get<std::string>();
  if (e.contains("duration_ms") && e["duration_ms"].is_number())
    op.duration_ms = e["duration_ms"].get<double>();
  op.stack_id = IntOf(e.value("stack_id", json(-1)), -1);
  op.record_id = IntOf(e.value("record_id", json(-1)), -1);
  op.collective_seq_id = IntOf(
      e.contains("collective_seq_id") ? e["collective_seq_id"] : e.value("seq_id", json(-1)), -1);
  op.p2p_seq_id = IntOf(e.value("p2p_seq_id", json(-1)), -1);
  if (e.contains("frames") && e["frames"].is_array()) {
    for (const auto& fr : e["frames"]) {
      if (!fr.is_object()) continue;
      auto text = [&](const char* k) {
        return fr.contains(k) && fr[k].is_string() ? fr[k].get<std::string>() : std::string("?");
      };
      op.frames.push_back(text("name") + " at " + text("filename") + ":" +
                          std::to_string(IntOf(fr.value("line", json(0)), 0)));
      if (op.frames.size() >= 32) break;
    }
  }
  return op;
}

// Elements of every tensor of `sizes` (an empty shape is a scalar: one element).
uint64_t Elements(const std::vector<std::vector<int64_t>>& sizes) {
  uint64_t total = 0;
  for (const auto& dims : sizes) {
    uint64_t n = 1;
    for (int64_t d : dims) n *= static_cast<uint64_t>(std::clamp<int64_t>(d, 0, 1LL << 40));
    total += n;
  }
  return total;
}

// One PyTorch dump turned into a megascope dump, a phase at a time: the header (version, rank,
// process groups), every entry, the pg_status counters of a dump without entries, and the time it
// was written.
class Converter {
 public:
  Converter(const std::string& file, bool first_form, int ft_group_world_size = 0,
            int world_hint = 0)
      : file_(file), first_form_(first_form), ft_(ft_group_world_size), world_hint_(world_hint) {}

  Result<Converted> Run(const json& j, int rank_hint) && {
    if (!j.is_object() || !j.contains("pg_config") ||
        (!j.contains("entries") && !j.contains("pg_status"))) {
      return InvalidArgument(
          file_ +
          ": not a PyTorch Flight Recorder dump (needs 'pg_config', and 'entries' or 'pg_status')");
    }
    RETURN_IF_ERROR(Header(j, rank_hint));
    const json no_entries = json::array();
    if (j.contains("entries")) NameTheUnnamedGroup(j["entries"]);
    const json& entries = j.contains("entries") ? j["entries"] : no_entries;
    // A ring that dropped its oldest entries starts past record 0.
    out_.rank.wrapped = entries.is_array() && !entries.empty() && entries[0].is_object() &&
                        IntOf(entries[0].value("record_id", json(0)), 0) > 0;
    const std::vector<bool> stale = EarlierInstances(entries);
    uint64_t id = 0;  // entries read
    for (const auto& e : entries) {
      if (!stale[id]) Entry(e, id);
      ++id;
    }
    if (!j.contains("entries")) FromPgStatus(j["pg_status"]);
    Date();
    d_.alive = true;
    d_.oldest_open_blocks = true;  // NCCL runs the queued ops in order
    return std::move(out_);
  }

 private:
  // What one entry says, read once.
  struct Fields {
    std::string where, profiling;
    int group = -1;
    PyTorchOp rec;
    bool is_p2p = false;
    int64_t raw_seq = -1;
    OpState state = OpState::kUnknown;
    int64_t created = 0, started = 0, completed = 0;
    int32_t timeout_ms = 0;
  };
  // Per converted entry: whether it is p2p and the sequence number PyTorch gave it.
  struct Raw {
    bool p2p;
    int64_t seq;
    bool closed;  // a collective block whose closing entry has come
  };

  // Versions 1.x (PyTorch 2.2-2.3) and 2.x (2.4 on, 2.10 in PyTorch 2.9) share the fields read
  // here; a new major version may change their meaning.
  Status Header(const json& j, int rank_hint) {
    if (j.contains("version")) {
      const std::string v =
          j["version"].is_string() ? j["version"].get<std::string>() : j["version"].dump();
      if (v.empty() || (v[0] != '1' && v[0] != '2') || (v.size() > 1 && v[1] != '.'))
        return InvalidArgument(file_ + ": Flight Recorder format version " + v +
                               " is not one this reader knows (1.x and 2.x)");
      out_.rank.version = v;
    }
    const int64_t rank64 = j.contains("rank") ? IntOf(j["rank"], -1) : rank_hint;
    if (rank64 >= (1 << 24))
      return InvalidArgument(file_ + ": rank " + std::to_string(rank64) + " is out of range");
    const int rank = static_cast<int>(rank64);
    if (rank < 0)
      return InvalidArgument(
          file_ + ": cannot tell the rank (no 'rank' field, no digits ending the file name)");
    s_.info.rank = rank;
    s_.info.job = "pytorch";
    s_.info.node = j.contains("hostname") && j["hostname"].is_string()
                       ? j["hostname"].get<std::string>()
                       : "unknown";
    s_.info.coords = {-1, -1, -1};  // PyTorch's dump does not say
    int world = rank + 1;
    for (const auto& [key, pg] : j["pg_config"].items()) {
      tracer::GroupInfo g;
      g.name = pg.value("name", key);
      Describe(&g, pg.value("desc", "pg"));
      std::vector<int32_t> ranks = ParseRanks(pg.value("ranks", json::array()));
      if (ft_ > 0 && pg.value("desc", "") == "default_pg") {  // torchft: the replica's ranks
        for (int32_t& r : ranks) r += rank / ft_ * ft_;
      }
      g.ranks.assign(ranks.begin(), ranks.end());
      for (int r : g.ranks) world = std::max(world, r + 1);
      group_of_[g.name] = static_cast<int>(s_.groups.size());
      s_.groups.push_back(std::move(g));
    }
    // torchft: a dump knows its own replica; the job's world is the replicas' together.
    if (ft_ > 0) world = std::max(world, world_hint_);
    s_.info.world_size = world;
    return Status::Ok();
  }

  // A group's description (desc): kept whole for the evidence, its first 7 characters as the
  // group's kind.
  void Describe(tracer::GroupInfo* g, const std::string& desc) {
    out_.rank.pg_desc[g->name] = desc;
    g->kind = desc.substr(0, 7);
  }

  // The group name an entry gives ("" when it gives none).
  static std::string GroupName(const json& e) {
    if (e.contains("process_group") && e["process_group"].is_array() &&
        !e["process_group"].empty() && e["process_group"][0].is_string())
      return e["process_group"][0].get<std::string>();
    if (e.contains("pg_id"))
      return e["pg_id"].is_string() ? e["pg_id"].get<std::string>()
                                    : std::to_string(IntOf(e["pg_id"], -1));
    return "";
  }

  // PyTorch's Gloo backend gives the recorder its group's members before the group has a name:
  // its dumps (seen from 2.11, tests/data/pytorch/real) hold pg_config {"": {"name": "", "desc":
  // "", "ranks": ...}} while the entries name the group ("0", "default_pg"). When the dump has
  // exactly one such unnamed group and its entries name exactly one group pg_config lacks, that is
  // the unnamed group; anything less certain is left to GroupOfEntry's warning.
  void NameTheUnnamedGroup(const json& entries) {
    auto unnamed = group_of_.find("");
    if (unnamed == group_of_.end() || !entries.is_array()) return;
    std::set<std::string> missing;
    for (const auto& e : entries) {
      if (!e.is_object()) continue;
      const std::string pg = GroupName(e);
      if (!pg.empty() && group_of_.count(pg) == 0) missing.insert(pg);
    }
    if (missing.size() != 1) return;
    const std::string& pg = *missing.begin();
    const int g = unnamed->second;
    group_of_.erase(unnamed);
    group_of_[pg] = g;
    s_.groups[g].name = pg;
    out_.rank.pg_desc.erase("");
    for (const auto& e : entries) {
      if (e.is_object() && e.contains("process_group") && e["process_group"].is_array() &&
          e["process_group"].size() > 1 && e["process_group"][1].is_string()) {
        Describe(&s_.groups[g], e["process_group"][1].get<std::string>());
        break;
      }
    }
  }

  // An in-process restart (torchft, a job's own abort and retry) creates a process group again
  // under the same name: ProcessGroupNCCL gives every instance a new uid (an entry's pg_id) while
  // pg_config is keyed by the name, and unless FlightRecorder::reset_all ran, the aborted
  // instance's entries stay in the ring, their sequence numbers overlapping the live one's. The
  // live instance of a name is the one of its newest entry (the highest record_id); the entries of
  // the others are stale (true at their index) and counted in out_.stale.
  std::vector<bool> EarlierInstances(const json& entries) {
    std::vector<bool> stale(entries.size(), false);
    if (first_form_) return stale;  // pg_id is the group's only name there
    std::map<std::string, std::pair<int64_t, int64_t>> live;  // name -> (record_id, pg_id)
    auto instance = [](const json& e, std::string* name, int64_t* pg_id) {
      if (!e.is_object() || !e.contains("pg_id") || !e.contains("process_group") ||
          !e["process_group"].is_array() || e["process_group"].empty() ||
          !e["process_group"][0].is_string())
        return false;
      *name = e["process_group"][0].get<std::string>();
      *pg_id = IntOf(e["pg_id"], -1);
      return *pg_id >= 0;
    };
    std::string name;
    int64_t pg_id = -1;
    int64_t at = 0;
    for (const auto& e : entries) {
      const int64_t record = IntOf(e.is_object() ? e.value("record_id", json(at)) : json(at), at);
      ++at;
      if (!instance(e, &name, &pg_id)) continue;
      auto [it, fresh] = live.try_emplace(name, record, pg_id);
      if (!fresh && record >= it->second.first) it->second = {record, pg_id};
    }
    size_t i = 0;
    for (const auto& e : entries) {
      if (instance(e, &name, &pg_id) && pg_id != live[name].second) {
        stale[i] = true;
        ++out_.stale[name];
      }
      ++i;
    }
    return stale;
  }

  // The index of entry `e`'s process group, -1 (reported) when pg_config does not have it.
  int GroupOfEntry(const json& e, const std::string& where) {
    const std::string pg = GroupName(e);
    auto git = group_of_.find(pg);
    if (git != group_of_.end()) return git->second;
    // Its members are unknown: the entry cannot be placed.
    d_.unknown_values.push_back({where,
                                 first_form_ ? "process group (a first-recorder dump names only "
                                               "the default group's members)"
                                             : "process group (not in pg_config)",
                                 pg});
    return -1;
  }

  void Entry(const json& e, uint64_t id) {
    Fields f;
    f.where = "entries[" + std::to_string(id) + "]";
    f.group = GroupOfEntry(e, f.where);
    if (f.group < 0) return;
    f.profiling = e.value("profiling_name", "");
    f.rec = OpRecord(e, f.profiling);
    // Recorders before 2.5 write no is_p2p: a send or recv is, and so is the closing entry of a
    // block of them (batch_isend_irecv), which follows one in its group.
    const bool closes_transfers = IsCoalescedClosing(f.rec.type) && last_was_p2p_[f.group];
    f.is_p2p = e.contains("is_p2p") && e["is_p2p"].is_boolean()
                   ? e["is_p2p"].get<bool>()
                   : f.rec.type == "send" || f.rec.type == "recv" || closes_transfers;
    f.raw_seq = f.is_p2p ? f.rec.p2p_seq_id : f.rec.collective_seq_id;
    std::string st;
    f.state = StateOf(e, &st);
    if (f.state == OpState::kUnknown) d_.unknown_values.push_back({f.where, "state", st});
    f.created = Ns(e, "time_created_ns");
    f.started = Ns(e, "time_discovered_started_ns");
    f.completed = Ns(e, "time_discovered_completed_ns");
    latest_ = std::max({latest_, f.created, f.started, f.completed});
    f.timeout_ms = static_cast<int32_t>(
        std::clamp<int64_t>(IntOf(e.value("timeout_ms", json(0)), 0), 0, tracer::kMaxTimeoutMs));
    if (IsCoalescedClosing(f.rec.type)) {
      if (f.state == OpState::kUnknown) f.state = OpState::kEnqueued;
      if (CloseBlock(f)) return;
      // A closing entry whose members are gone (the ring dropped them): an op of its own.
    }
    auto entry = MakeEntry(f);
    if (!entry) return;
    if (f.is_p2p || tracer::IsP2P(entry->op)) return AddTransfer(f, *entry);
    if (JoinBlock(f, *entry)) return;
    AddCollective(f, *entry);
  }

  // A coalesced block ends: its members (before it, same group, same p2p or collective sequence
  // number; utils.py find_coalesced_group_with_non_p2p) take its state and times. False if the
  // block of collectives it closes is not there.
  bool CloseBlock(Fields& f) {
    if (f.is_p2p) {
      for (size_t k = s_.entries.size(); k-- > 0;) {
        tracer::FlightEntry& m = s_.entries[k];
        if (m.group != f.group || !raw_[k].p2p || raw_[k].seq != f.raw_seq) {
          if (m.group == f.group) break;  // the block is contiguous within its group
          continue;
        }
        if (m.state == OpState::kEnqueued) m.state = f.state;
        if (m.started_at_ns == 0) m.started_at_ns = f.started;
        if (m.completed_at_ns == 0) m.completed_at_ns = f.completed;
      }
      return true;
    }
    auto ob = open_block_.find(f.group);
    if (ob == open_block_.end() || raw_[ob->second.first].seq != f.raw_seq ||
        raw_[ob->second.first].closed)
      return false;
    tracer::FlightEntry& b = s_.entries[ob->second.first];
    b.state = f.state;
    b.started_at_ns = f.started;
    b.completed_at_ns = f.completed;
    if (f.timeout_ms > 0) b.timeout_ms = f.timeout_ms;
    raw_[ob->second.first].closed = true;
    PyTorchOp& block = out_.collectives[ob->second.second].second;
    if (block.members.empty()) {  // the block's first member was recorded as an op
      PyTorchOp first = std::move(block);
      block = PyTorchOp{};
      block.members.push_back(std::move(first));
    }
    std::vector<PyTorchOp> members = std::move(block.members);
    block = std::move(f.rec);
    block.members = std::move(members);
    return true;
  }

  // The megascope entry for `f` (op, peer, dtype, size, state, times); none for a transfer whose
  // peer cannot be told (reported).
  std::optional<tracer::FlightEntry> MakeEntry(const Fields& f) {
    tracer::FlightEntry e;
    e.group = f.group;
    const OpType op = OpOfType(f.rec.type);
    if (!KnownType(f.rec.type) && op == OpType::kUnknown)
      d_.unknown_values.push_back({f.where, "op", f.profiling});
    if (op == OpType::kSend || op == OpType::kRecv) {
      const int local = PeerOf(f.profiling);
      std::vector<int32_t> sorted = s_.groups[f.group].ranks.ToVector();
      std::sort(sorted.begin(), sorted.end());
      if (local < 0 || (!sorted.empty() && local >= static_cast<int>(sorted.size()))) {
        d_.unknown_values.push_back({f.where, "profiling_name peer", f.profiling});
        return std::nullopt;
      }
      e.peer = sorted.empty() ? local : sorted[local];
    }
    e.op = op;
    const std::string dt = f.rec.input_dtypes.empty() ? "Float" : f.rec.input_dtypes[0];
    e.dtype = DTypeOf(dt);
    if (e.dtype == DType::kUnknown) d_.unknown_values.push_back({f.where, "input_dtypes", dt});
    e.bytes = Elements(f.rec.input_sizes.empty() ? std::vector<std::vector<int64_t>>{{}}
                                                 : f.rec.input_sizes) *
              tracer::DTypeSize(e.dtype);
    e.state = f.state;
    e.timeout_ms = f.timeout_ms;
    e.enqueued_at_ns = f.created;
    e.started_at_ns = f.started;
    e.completed_at_ns = f.completed;
    if (f.state != OpState::kCompleted)
      open_timeout_ms_ =
          std::max(open_timeout_ms_, f.timeout_ms > 0 ? int64_t{f.timeout_ms} : kDefaultTimeoutMs);
    // The stack that issued the op the rank is stuck at (its oldest open one): grouped across
    // ranks like our own dumps' stacks (analyzer/stacks.h).
    if (d_.stacks.empty() && f.state != OpState::kCompleted && !f.rec.frames.empty())
      d_.stacks.push_back({s_.info.pid, "issued its oldest open op", f.rec.frames});
    return e;
  }

  void AddTransfer(Fields& f, tracer::FlightEntry& e) {
    if (!tracer::IsP2P(e.op)) return;  // a p2p entry of no known direction: cannot be matched
    e.seq = p2p_seq_[{f.group, e.peer, e.op == OpType::kSend}]++;
    e.id = ++issued_;
    out_.transfers.emplace_back(s_.entries.size(), std::move(f.rec));
    s_.entries.push_back(e);
    raw_.push_back({true, f.raw_seq, false});
    last_was_p2p_[f.group] = true;
  }

  // Members of one coalesced block share its sequence number (ProcessGroupNCCL bumps it once a
  // block): they become one op, whose state the closing entry gives. False if `f` opens none.
  bool JoinBlock(Fields& f, const tracer::FlightEntry& e) {
    auto ob = open_block_.find(f.group);
    if (ob == open_block_.end() || raw_[ob->second.first].seq != f.raw_seq || f.raw_seq < 0 ||
        raw_[ob->second.first].closed)
      return false;
    tracer::FlightEntry& b = s_.entries[ob->second.first];
    if (b.op != e.op) b.op = OpType::kUnknown;  // a block of mixed ops
    b.bytes += e.bytes;
    PyTorchOp& block = out_.collectives[ob->second.second].second;
    if (block.members.empty()) {
      PyTorchOp first = std::move(block);
      block = PyTorchOp{};
      block.type = "coalesced";  // until its closing entry names it
      block.profiling_name = first.backend + (first.backend.empty() ? "" : ":") + "coalesced";
      block.backend = first.backend;
      block.collective_seq_id = first.collective_seq_id;
      block.members.push_back(std::move(first));
    }
    block.members.push_back(std::move(f.rec));
    return true;
  }

  void AddCollective(Fields& f, tracer::FlightEntry& e) {
    e.seq = static_cast<uint64_t>(std::max<int64_t>(f.raw_seq, 0));
    e.id = ++issued_;
    open_block_[f.group] = {s_.entries.size(), out_.collectives.size()};
    s_.entries.push_back(e);
    raw_.push_back({false, f.raw_seq, IsCoalescedClosing(f.rec.type)});
    last_was_p2p_[f.group] = false;
    out_.collectives.emplace_back(std::make_pair(f.group, static_cast<int64_t>(e.seq)),
                                  std::move(f.rec));
  }

  // A dump without collectives (includeCollectives=False): each group's pg_status counters are
  // the evidence. Entries of unknown op stand for them: the last completed collective, then every
  // one enqueued after it (started up to last_started), so sequence numbers still tell who has
  // not joined.
  void FromPgStatus(const json& pg_status) {
    for (const auto& [key, st] : pg_status.items()) {
      auto git = group_of_.find(key);
      if (git == group_of_.end()) {
        d_.unknown_values.push_back({"pg_status", "process group", key});
        continue;
      }
      const int64_t enq = IntOf(st.value("last_enqueued_collective", json(-1)), -1);
      const int64_t started = IntOf(st.value("last_started_collective", json(-1)), -1);
      const int64_t done = IntOf(st.value("last_completed_collective", json(-1)), -1);
      for (int64_t seq = std::max<int64_t>(done, 1); seq <= enq && seq <= done + 64; ++seq) {
        tracer::FlightEntry f;
        f.id = ++issued_;
        f.group = git->second;
        f.seq = static_cast<uint64_t>(seq);
        f.op = OpType::kUnknown;
        f.dtype = DType::kUnknown;
        f.state = seq <= done      ? OpState::kCompleted
                  : seq <= started ? OpState::kStarted
                                   : OpState::kEnqueued;
        s_.entries.push_back(f);
      }
    }
  }

  // Written when the watchdog fired: the file's time, unless the file was copied since (its time
  // is then far past the point where every open op had timed out, which is when PyTorch dumps).
  void Date() {
    struct stat stt {};
    const int64_t mtime = ::stat(file_.c_str(), &stt) == 0
                              ? stt.st_mtim.tv_sec * 1'000'000'000LL + stt.st_mtim.tv_nsec
                              : 0;
    d_.dumped_at_ns = std::max(latest_, mtime);
    // Overflow-checked: the times are whatever the file holds (a fuzzer found latest near
    // INT64_MAX).
    int64_t timed_out = 0, copied_after = 0;
    const bool fits = !__builtin_mul_overflow(open_timeout_ms_, int64_t{1'000'000}, &timed_out) &&
                      !__builtin_add_overflow(latest_, timed_out, &timed_out) &&
                      !__builtin_add_overflow(timed_out, int64_t{600'000'000'000}, &copied_after);
    if (fits && open_timeout_ms_ > 0 && latest_ > 0 && mtime > copied_after) {
      d_.dumped_at_ns = timed_out;
      out_.rank.dated_by_timeout = true;
    }
  }

  const std::string& file_;
  const bool first_form_;
  const int ft_;          // PyTorchLoadOptions::ft_group_world_size
  const int world_hint_;  // the world as the files' names count it
  Converted out_;
  tracer::Dump& d_ = out_.dump;
  tracer::RankSnapshot& s_ = out_.dump.snapshot;
  std::map<std::string, int> group_of_;  // pg name -> index
  std::vector<Raw> raw_;
  std::map<std::tuple<int, int, int>, uint64_t> p2p_seq_;  // (group, peer, send?) -> next
  // The collective block each group is in: its index in s_.entries and out_.collectives.
  std::map<int, std::pair<size_t, size_t>> open_block_;
  std::map<int, bool> last_was_p2p_;  // group -> its newest entry so far was a send or recv
  int64_t latest_ = 0;
  int64_t open_timeout_ms_ = 0;  // the longest timeout of the ops still open
  uint64_t issued_ = 0;          // entries kept
};

Result<Converted> Convert(const json& j, const std::string& file, int rank_hint, int world_hint,
                          int ft = 0) {
  if (!j.is_array()) return Converter(file, /*first_form=*/false, ft, world_hint).Run(j, rank_hint);
  if (rank_hint < 0)
    return InvalidArgument(file +
                           ": a first-recorder dump (a bare list of entries) says no rank, and "
                           "no digits end the file name");
  return Converter(file, /*first_form=*/true)
      .Run(FromFirstRecorder(j, std::max(world_hint, rank_hint + 1)), rank_hint);
}

}  // namespace

namespace pytorch_internal {

Result<Converted> ParseConverted(std::string_view text, const std::string& source, int rank_hint,
                                 int world_hint, int ft) {
  json j;
  if (LooksLikePickle(text)) {  // what TORCH_NCCL_DUMP_ON_TIMEOUT writes
    auto p = ReadPickle(text);
    if (!p.ok()) return InvalidArgument(source + ": " + p.status().message());
    j = std::move(*p);
  } else {
    j = json::parse(text, nullptr, false);
    if (j.is_discarded())
      return InvalidArgument(source + ": neither JSON nor a pickle (PyTorch's two dump forms)");
  }
  try {
    return Convert(j, source, rank_hint, world_hint, ft);
  } catch (const std::exception& e) {  // a field of an unexpected type or range
    return InvalidArgument(source + ": not a readable PyTorch Flight Recorder dump (" + e.what() +
                           ")");
  }
}

}  // namespace pytorch_internal

// ProcessGroupNCCL::endCoalescing records the closing entry with the block's events after its
// members, which have none; types.py Op.match compares it by type only. The *_coalesced names of
// single ops (allreduce_coalesced, all_gather_into_tensor_coalesced,
// reduce_scatter_tensor_coalesced) are ops, not closings.
bool IsCoalescedClosing(std::string_view type) {
  return type == "coalesced" || type == "allgathercoalesced" || type == "reducescattercoalesced";
}

Result<tracer::Dump> ParsePyTorchDump(std::string_view text, const std::string& source,
                                      int rank_hint, int world_hint) {
  ASSIGN_OR_RETURN(Converted c, ParseConverted(text, source, rank_hint, world_hint));
  return std::move(c.dump);
}

}  // namespace megascope::analyzer
