// PyTorch Flight Recorder import: its JSON dumps become megascope dumps, so PyTorch users get
// root causes from the same analysis (field names from PyTorch's
// torch/distributed/flight_recorder).
#include "megascope/analyzer/pytorch.h"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "megascope/analyzer/hang.h"
#include "megascope/analyzer/pickle.h"
#include "megascope/tracer/file_util.h"

namespace megascope::analyzer {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
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

// A dump converted: the megascope dump, and what PyTorch recorded of each collective (keyed by
// the dump's group index, as group names may still change: LoadPyTorch makes them unique).
struct Converted {
  tracer::Dump dump;
  PyTorchRank rank;
  std::vector<std::pair<std::pair<int, int64_t>, PyTorchOp>> collectives;  // (group, seq) -> op
  std::vector<std::pair<size_t, PyTorchOp>> transfers;  // index in dump's entries -> op
};

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

Result<Converted> Convert(const json& j, const std::string& file, int rank_hint, int world_hint,
                          bool first_form = false) {
  if (j.is_array()) {
    if (rank_hint < 0)
      return InvalidArgument(file +
                             ": a first-recorder dump (a bare list of entries) says no rank, and "
                             "no digits end the file name");
    return Convert(FromFirstRecorder(j, std::max(world_hint, rank_hint + 1)), file, rank_hint, -1,
                   /*first_form=*/true);
  }
  Converted out;
  tracer::Dump& d = out.dump;
  auto& s = d.snapshot;
  if (!j.is_object() || !j.contains("pg_config") ||
      (!j.contains("entries") && !j.contains("pg_status"))) {
    return InvalidArgument(
        file +
        ": not a PyTorch Flight Recorder dump (needs 'pg_config', and 'entries' or 'pg_status')");
  }
  // Versions 1.x (PyTorch 2.2-2.3) and 2.x (2.4 on, 2.10 in PyTorch 2.9) share the fields read
  // here; a new major version may change their meaning.
  if (j.contains("version")) {
    const std::string v =
        j["version"].is_string() ? j["version"].get<std::string>() : j["version"].dump();
    if (v.empty() || (v[0] != '1' && v[0] != '2') || (v.size() > 1 && v[1] != '.'))
      return InvalidArgument(file + ": Flight Recorder format version " + v +
                             " is not one this reader knows (1.x and 2.x)");
    out.rank.version = v;
  }
  const int64_t rank64 = j.contains("rank") ? IntOf(j["rank"], -1) : rank_hint;
  if (rank64 >= (1 << 24))
    return InvalidArgument(file + ": rank " + std::to_string(rank64) + " is out of range");
  const int rank = static_cast<int>(rank64);
  if (rank < 0)
    return InvalidArgument(
        file + ": cannot tell the rank (no 'rank' field, no digits ending the file name)");
  s.info.rank = rank;
  s.info.job = "pytorch";
  s.info.node = j.contains("hostname") && j["hostname"].is_string()
                    ? j["hostname"].get<std::string>()
                    : "unknown";
  s.info.coords = {-1, -1, -1};         // PyTorch's dump does not say
  std::map<std::string, int> group_of;  // pg name -> index
  int world = rank + 1;
  for (const auto& [key, pg] : j["pg_config"].items()) {
    tracer::GroupInfo g;
    g.name = pg.value("name", key);
    g.kind = pg.value("desc", "pg");
    out.rank.pg_desc[g.name] = g.kind;
    if (g.kind.size() > 7) g.kind = g.kind.substr(0, 7);
    const std::vector<int32_t> ranks = ParseRanks(pg.value("ranks", json::array()));
    g.ranks.assign(ranks.begin(), ranks.end());
    for (int r : g.ranks) world = std::max(world, r + 1);
    group_of[g.name] = static_cast<int>(s.groups.size());
    s.groups.push_back(std::move(g));
  }
  s.info.world_size = world;
  // Per converted entry: whether it is p2p and the sequence number PyTorch gave it.
  struct Raw {
    bool p2p;
    int64_t seq;
    bool closed;  // a collective block whose closing entry has come
  };
  std::vector<Raw> raw;
  std::map<std::tuple<int, int, int>, uint64_t> p2p_seq;  // (group, peer, send?) -> next
  // The collective block each group is in: its index in s.entries and out.collectives.
  std::map<int, std::pair<size_t, size_t>> open_block;
  std::map<int, bool> last_was_p2p;  // group -> its newest entry so far was a send or recv
  int64_t latest = 0;
  int64_t open_timeout_ms = 0;  // the longest timeout of the ops still open
  uint64_t id = 0;              // entries read
  uint64_t issued = 0;          // entries kept
  bool first_entry = true;
  const json no_entries = json::array();
  const json& entries = j.contains("entries") ? j["entries"] : no_entries;
  for (const auto& e : entries) {
    std::string pg;
    if (e.contains("process_group") && e["process_group"].is_array() &&
        !e["process_group"].empty()) {
      pg = e["process_group"][0].get<std::string>();
    } else if (e.contains("pg_id")) {
      pg = e["pg_id"].is_string() ? e["pg_id"].get<std::string>()
                                  : std::to_string(IntOf(e["pg_id"], -1));
    }
    const std::string where = "entries[" + std::to_string(id) + "]";
    ++id;
    if (first_entry) {  // a ring that dropped its oldest entries starts past record 0
      out.rank.wrapped = IntOf(e.value("record_id", json(0)), 0) > 0;
      first_entry = false;
    }
    auto git = group_of.find(pg);
    if (git == group_of.end()) {  // its members are unknown: the entry cannot be placed
      d.unknown_values.push_back({where,
                                  first_form ? "process group (a first-recorder dump names only "
                                               "the default group's members)"
                                             : "process group (not in pg_config)",
                                  pg});
      continue;
    }
    const int group = git->second;
    const std::string profiling = e.value("profiling_name", "");
    PyTorchOp rec = OpRecord(e, profiling);
    // Recorders before 2.5 write no is_p2p: a send or recv is, and so is the closing entry of a
    // block of them (batch_isend_irecv), which follows one in its group.
    const bool closes_transfers = IsCoalescedClosing(rec.type) && last_was_p2p[group];
    const bool is_p2p = e.contains("is_p2p") && e["is_p2p"].is_boolean()
                            ? e["is_p2p"].get<bool>()
                            : rec.type == "send" || rec.type == "recv" || closes_transfers;
    const int64_t raw_seq = is_p2p ? rec.p2p_seq_id : rec.collective_seq_id;
    std::string st;
    OpState state = StateOf(e, &st);
    if (state == OpState::kUnknown) d.unknown_values.push_back({where, "state", st});
    const int64_t created = Ns(e, "time_created_ns"), started = Ns(e, "time_discovered_started_ns"),
                  completed = Ns(e, "time_discovered_completed_ns");
    latest = std::max({latest, created, started, completed});
    const auto timeout_ms = static_cast<int32_t>(
        std::clamp<int64_t>(IntOf(e.value("timeout_ms", json(0)), 0), 0, tracer::kMaxTimeoutMs));

    if (IsCoalescedClosing(rec.type)) {
      // A coalesced block ends: its members (before it, same group, same p2p or collective
      // sequence number; utils.py find_coalesced_group_with_non_p2p) take its state and times.
      if (state == OpState::kUnknown) state = OpState::kEnqueued;
      if (is_p2p) {
        for (size_t k = s.entries.size(); k-- > 0;) {
          tracer::FlightEntry& m = s.entries[k];
          if (m.group != group || !raw[k].p2p || raw[k].seq != raw_seq) {
            if (m.group == group) break;  // the block is contiguous within its group
            continue;
          }
          if (m.state == OpState::kEnqueued) m.state = state;
          if (m.started_at_ns == 0) m.started_at_ns = started;
          if (m.completed_at_ns == 0) m.completed_at_ns = completed;
        }
        continue;
      }
      auto ob = open_block.find(group);
      if (ob != open_block.end() && raw[ob->second.first].seq == raw_seq &&
          !raw[ob->second.first].closed) {
        tracer::FlightEntry& b = s.entries[ob->second.first];
        b.state = state;
        b.started_at_ns = started;
        b.completed_at_ns = completed;
        if (timeout_ms > 0) b.timeout_ms = timeout_ms;
        raw[ob->second.first].closed = true;
        PyTorchOp& block = out.collectives[ob->second.second].second;
        if (block.members.empty()) {  // the block's first member was recorded as an op
          PyTorchOp first = std::move(block);
          block = PyTorchOp{};
          block.members.push_back(std::move(first));
        }
        std::vector<PyTorchOp> members = std::move(block.members);
        block = std::move(rec);
        block.members = std::move(members);
        continue;
      }
      // A closing entry whose members are gone (the ring dropped them): an op of its own.
    }
    tracer::FlightEntry f;
    f.group = group;
    const OpType op = OpOfType(rec.type);
    if (!KnownType(rec.type) && op == OpType::kUnknown)
      d.unknown_values.push_back({where, "op", profiling});
    int peer = -1;
    if (op == OpType::kSend || op == OpType::kRecv) {
      const int local = PeerOf(profiling);
      std::vector<int32_t> sorted = s.groups[group].ranks.ToVector();
      std::sort(sorted.begin(), sorted.end());
      if (local < 0 || (!sorted.empty() && local >= static_cast<int>(sorted.size()))) {
        d.unknown_values.push_back({where, "profiling_name peer", profiling});
        continue;
      }
      peer = sorted.empty() ? local : sorted[local];
    }
    const std::string dt = rec.input_dtypes.empty() ? "Float" : rec.input_dtypes[0];
    f.dtype = DTypeOf(dt);
    if (f.dtype == DType::kUnknown) d.unknown_values.push_back({where, "input_dtypes", dt});
    f.bytes = Elements(rec.input_sizes.empty() ? std::vector<std::vector<int64_t>>{{}}
                                               : rec.input_sizes) *
              tracer::DTypeSize(f.dtype);
    f.state = state;
    f.timeout_ms = timeout_ms;
    f.enqueued_at_ns = created;
    f.started_at_ns = started;
    f.completed_at_ns = completed;
    if (state != OpState::kCompleted)
      open_timeout_ms =
          std::max(open_timeout_ms, timeout_ms > 0 ? int64_t{timeout_ms} : kDefaultTimeoutMs);
    // The stack that issued the op the rank is stuck at (its oldest open one): grouped across
    // ranks like our own dumps' stacks (analyzer/stacks.h).
    if (d.stacks.empty() && state != OpState::kCompleted && !rec.frames.empty())
      d.stacks.push_back({s.info.pid, "issued its oldest open op", rec.frames});
    if (is_p2p || op == OpType::kSend || op == OpType::kRecv) {
      f.op = op == OpType::kSend || op == OpType::kRecv ? op : OpType::kUnknown;
      f.peer = peer;
      if (!tracer::IsP2P(f.op)) continue;  // a p2p entry of no known direction: cannot be matched
      f.seq = p2p_seq[{group, peer, f.op == OpType::kSend}]++;
      f.id = ++issued;
      out.transfers.emplace_back(s.entries.size(), std::move(rec));
      s.entries.push_back(f);
      raw.push_back({true, raw_seq, false});
      last_was_p2p[group] = true;
      continue;
    }
    // A collective. Members of one coalesced block share its sequence number (ProcessGroupNCCL
    // bumps it once a block): they become one op, whose state the closing entry gives.
    auto ob = open_block.find(group);
    if (ob != open_block.end() && raw[ob->second.first].seq == raw_seq && raw_seq >= 0 &&
        !raw[ob->second.first].closed) {
      tracer::FlightEntry& b = s.entries[ob->second.first];
      if (b.op != op) b.op = OpType::kUnknown;  // a block of mixed ops
      b.bytes += f.bytes;
      PyTorchOp& block = out.collectives[ob->second.second].second;
      if (block.members.empty()) {
        PyTorchOp first = std::move(block);
        block = PyTorchOp{};
        block.type = "coalesced";  // until its closing entry names it
        block.profiling_name = first.backend + (first.backend.empty() ? "" : ":") + "coalesced";
        block.backend = first.backend;
        block.collective_seq_id = first.collective_seq_id;
        block.members.push_back(std::move(first));
      }
      block.members.push_back(std::move(rec));
      continue;
    }
    f.op = op;
    f.seq = static_cast<uint64_t>(std::max<int64_t>(raw_seq, 0));
    f.id = ++issued;
    open_block[group] = {s.entries.size(), out.collectives.size()};
    s.entries.push_back(f);
    raw.push_back({false, raw_seq, IsCoalescedClosing(rec.type)});
    last_was_p2p[group] = false;
    out.collectives.emplace_back(std::make_pair(group, static_cast<int64_t>(f.seq)),
                                 std::move(rec));
  }
  if (!j.contains("entries")) {
    // A dump without collectives (includeCollectives=False): each group's pg_status counters are
    // the evidence. Entries of unknown op stand for them: the last completed collective, then
    // every one enqueued after it (started up to last_started), so sequence numbers still tell
    // who has not joined.
    for (const auto& [key, st] : j["pg_status"].items()) {
      auto git = group_of.find(key);
      if (git == group_of.end()) {
        d.unknown_values.push_back({"pg_status", "process group", key});
        continue;
      }
      const int64_t enq = IntOf(st.value("last_enqueued_collective", json(-1)), -1);
      const int64_t started = IntOf(st.value("last_started_collective", json(-1)), -1);
      const int64_t done = IntOf(st.value("last_completed_collective", json(-1)), -1);
      for (int64_t seq = std::max<int64_t>(done, 1); seq <= enq && seq <= done + 64; ++seq) {
        tracer::FlightEntry f;
        f.id = ++issued;
        f.group = git->second;
        f.seq = static_cast<uint64_t>(seq);
        f.op = OpType::kUnknown;
        f.dtype = DType::kUnknown;
        f.state = seq <= done      ? OpState::kCompleted
                  : seq <= started ? OpState::kStarted
                                   : OpState::kEnqueued;
        s.entries.push_back(f);
      }
    }
  }
  struct stat stt {};
  const int64_t mtime = ::stat(file.c_str(), &stt) == 0
                            ? stt.st_mtim.tv_sec * 1'000'000'000LL + stt.st_mtim.tv_nsec
                            : 0;
  // Written when the watchdog fired: the file's time, unless the file was copied since (its time
  // is then far past the point where every open op had timed out, which is when PyTorch dumps).
  d.dumped_at_ns = std::max(latest, mtime);
  // Overflow-checked: the times are whatever the file holds (a fuzzer found latest near INT64_MAX).
  int64_t timed_out = 0, copied_after = 0;
  const bool fits = !__builtin_mul_overflow(open_timeout_ms, int64_t{1'000'000}, &timed_out) &&
                    !__builtin_add_overflow(latest, timed_out, &timed_out) &&
                    !__builtin_add_overflow(timed_out, int64_t{600'000'000'000}, &copied_after);
  if (fits && open_timeout_ms > 0 && latest > 0 && mtime > copied_after) {
    d.dumped_at_ns = timed_out;
    out.rank.dated_by_timeout = true;
  }
  d.alive = true;
  d.oldest_open_blocks = true;  // NCCL runs the queued ops in order
  return out;
}

Result<Converted> ParseConverted(std::string_view text, const std::string& source, int rank_hint,
                                 int world_hint) {
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
    return Convert(j, source, rank_hint, world_hint);
  } catch (const std::exception& e) {  // a field of an unexpected type or range
    return InvalidArgument(source + ": not a readable PyTorch Flight Recorder dump (" + e.what() +
                           ")");
  }
}

// Where a ring dropped its oldest entries, a rank cannot count its transfers with a peer from the
// first one, and two ranks' counts no longer meet (utils.py align_trace_from_beginning aligns
// collectives by record id for the same reason). Both sides' transfers of a pair complete in the
// same order, so each pair's are numbered from where they stop completing: the first open one on
// either side gets the same number, the larger of the two sides' counts of completed ones before
// it (so that the oldest one either ring still holds is #0).
void NumberTransfersFromTheirFirstOpen(const std::vector<tracer::Dump*>& dumps) {
  using Pair = std::tuple<std::string, int32_t, int32_t>;  // group, sender, receiver
  struct Run {
    Pair pair;
    std::vector<tracer::FlightEntry*> ops;
    size_t first_open = 0;
  };
  std::vector<Run> runs;
  std::map<Pair, size_t> base;
  for (tracer::Dump* d : dumps) {
    const int32_t self = d->snapshot.info.rank;
    std::map<std::tuple<int32_t, int32_t, bool>, std::vector<tracer::FlightEntry*>> mine;
    for (tracer::FlightEntry& e : d->snapshot.entries) {
      if (tracer::IsP2P(e.op)) mine[{e.group, e.peer, e.op == OpType::kSend}].push_back(&e);
    }
    for (auto& [key, ops] : mine) {
      const auto& [group, peer, send] = key;
      Run run{{d->snapshot.groups[group].name, send ? self : peer, send ? peer : self},
              std::move(ops),
              0};
      while (run.first_open < run.ops.size() &&
             run.ops[run.first_open]->state == OpState::kCompleted)
        ++run.first_open;
      base[run.pair] = std::max(base[run.pair], run.first_open);
      runs.push_back(std::move(run));
    }
  }
  for (Run& run : runs) {
    for (size_t i = 0; i < run.ops.size(); ++i)
      run.ops[i]->seq = base[run.pair] + i - run.first_open;
  }
}

}  // namespace

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

Result<PyTorchInput> LoadPyTorch(const std::string& dir) {
  if (!fs::is_directory(dir)) return NotFound(dir + " is not a directory");
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_regular_file()) files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  static const std::regex kTrailingRank(R"((\d+)(\.json)?$)");
  // A file that is not a readable dump (a log beside them, a truncated write) is left out with a
  // warning; its rank then reads as missing, which the analysis handles.
  std::vector<std::string> skipped;
  auto rank_in_name = [](const std::string& f) {
    std::smatch m;
    const std::string name = fs::path(f).filename().string();
    return std::regex_search(name, m, kTrailingRank) && m[1].length() < 9 ? std::stoi(m[1]) : -1;
  };
  // The world as the files' names count it: what a dump that does not say its world is read with.
  int world_hint = 0;
  for (const auto& f : files) world_hint = std::max(world_hint, rank_in_name(f) + 1);
  std::vector<std::pair<std::string, Converted>> read;
  for (const auto& f : files) {
    auto text = tracer::ReadFile(f);
    auto c = text.ok() ? ParseConverted(*text, f, rank_in_name(f), world_hint)
                       : Result<Converted>(text.status());
    if (!c.ok()) {
      skipped.push_back(c.status().message());
      continue;
    }
    read.emplace_back(f, std::move(*c));
  }
  if (read.empty() && !skipped.empty())
    return InvalidArgument("no readable PyTorch Flight Recorder dump in " + dir + ": " +
                           skipped.front());
  if (read.empty()) return NotFound("no PyTorch Flight Recorder dumps in " + dir);
  // A group name is local to a rank: split_group and DeviceMesh give different groups of ranks
  // the same name. Where one name means different members, the members become part of its name.
  std::map<std::string, std::set<std::vector<int32_t>>> members;
  for (const auto& [f, c] : read) {
    for (const auto& g : c.dump.snapshot.groups) members[g.name].insert(g.ranks.ToVector());
  }
  bool wrapped = false;
  for (auto& [f, c] : read) {
    wrapped |= c.rank.wrapped;
    for (auto& g : c.dump.snapshot.groups) {
      if (members[g.name].size() < 2) continue;
      std::string list;
      for (int32_t r : g.ranks) list += (list.empty() ? "" : ",") + std::to_string(r);
      const std::string renamed = g.name + "[" + list + "]";
      if (auto it = c.rank.pg_desc.find(g.name); it != c.rank.pg_desc.end())
        c.rank.pg_desc[renamed] = it->second;
      g.name = renamed;
    }
  }
  if (wrapped) {
    std::vector<tracer::Dump*> all;
    all.reserve(read.size());
    for (auto& [f, c] : read) all.push_back(&c.dump);
    NumberTransfersFromTheirFirstOpen(all);
  }
  std::vector<std::pair<std::string, tracer::Dump>> dumps;
  std::vector<std::pair<int, PyTorchRank>> extra;
  for (auto& [f, c] : read) {
    const auto& groups = c.dump.snapshot.groups;
    for (auto& [key, op] : c.collectives)
      c.rank.collectives[{groups[key.first].name, key.second}] = std::move(op);
    for (auto& [at, op] : c.transfers) {
      const tracer::FlightEntry& e = c.dump.snapshot.entries[at];
      c.rank.transfers[{groups[e.group].name, e.peer, e.op == OpType::kSend,
                        static_cast<int64_t>(e.seq)}] = std::move(op);
    }
    extra.emplace_back(c.dump.snapshot.info.rank, std::move(c.rank));
    dumps.emplace_back(f, std::move(c.dump));
  }
  PyTorchInput in;
  ASSIGN_OR_RETURN(in.hang, MakeHangInput(std::move(dumps)));
  for (const std::string& why : skipped) in.hang.warnings.push_back("left out: " + why);
  in.ranks.resize(in.hang.ranks.size());
  for (auto& [r, x] : extra) {
    if (r >= 0 && r < static_cast<int>(in.ranks.size())) in.ranks[r] = std::move(x);
  }
  return in;
}

Result<HangInput> LoadPyTorchDumps(const std::string& dir) {
  ASSIGN_OR_RETURN(PyTorchInput in, LoadPyTorch(dir));
  return std::move(in.hang);
}

}  // namespace megascope::analyzer
