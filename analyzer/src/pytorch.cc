// PyTorch Flight Recorder import: its JSON dumps become megascope dumps, so PyTorch users get
// root causes from the same analysis (NOTES.md lists the field names).
#include <sys/stat.h>

#include <algorithm>
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
  if (s == "Float") return DType::kF32;
  if (s == "BFloat16") return DType::kBf16;
  if (s == "Half") return DType::kF16;
  if (s == "Double") return DType::kF64;
  if (s == "Int" || s == "Int32") return DType::kI32;
  if (s == "Long" || s == "Int64") return DType::kI64;
  if (s == "Byte" || s == "Bool" || s == "Char") return DType::kU8;
  if (s == "Short") return DType::kU16;
  return DType::kUnknown;
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

// "nccl:all_reduce" -> allreduce; "nccl:send 0->1" / "nccl:recv 1<-0" carry the peer, as a rank
// local to the op's group (its index in the group's sorted ranks, as ProcessGroupNCCL numbers
// them and tools/flight_recorder maps them back).
bool OpOf(const std::string& name, OpType* op, int* peer) {
  std::string n = name.substr(name.find(':') == std::string::npos ? 0 : name.find(':') + 1);
  *peer = -1;
  static const std::regex kP2P(R"((send|recv)\s+(\d+)\s*(->|<-)\s*(\d+))");
  std::smatch m;
  if (std::regex_search(n, m, kP2P)) {
    *op = m[1] == "send" ? OpType::kSend : OpType::kRecv;
    if (m[4].length() > 8) return false;
    *peer = std::stoi(m[4]);  // send self->dst, recv self<-src
    return true;
  }
  n = n.substr(0, n.find(' '));
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return std::tolower(c); });
  if (n.find("all_to_all") != std::string::npos || n.find("alltoall") != std::string::npos)
    *op = OpType::kAlltoall;
  else if (n.find("reduce_scatter") != std::string::npos)
    *op = OpType::kReduceScatter;
  else if (n.find("all_gather") != std::string::npos || n.find("allgather") != std::string::npos)
    *op = OpType::kAllgather;
  else if (n.find("gather") != std::string::npos || n.find("scatter") != std::string::npos)
    *op = OpType::kUnknown;  // no megascope op name (FORMATS.md): ordered by seq, never compared
  else if (n.find("all_reduce") != std::string::npos || n.find("allreduce") != std::string::npos)
    *op = OpType::kAllreduce;
  else if (n.find("broadcast") != std::string::npos)
    *op = OpType::kBroadcast;
  else if (n.find("barrier") != std::string::npos)
    *op = OpType::kBarrier;
  else if (n.find("reduce") != std::string::npos)
    *op = OpType::kReduce;
  else
    return false;
  return true;
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

// The closing entry of a coalesced block gives its state and times to the members before it
// (same group, same p2p or collective sequence number) that never had events of their own.
template <typename Raw>
void PropagateCoalesced(const json& closing, int group, bool p2p, int64_t seq,
                        const std::vector<Raw>& raw, std::vector<tracer::FlightEntry>* entries) {
  std::string st;
  OpState state = StateOf(closing, &st);
  if (state == OpState::kUnknown) state = OpState::kEnqueued;
  for (size_t k = entries->size(); k-- > 0;) {
    tracer::FlightEntry& m = (*entries)[k];
    if (m.group != group || raw[k].p2p != p2p || raw[k].seq != seq) {
      if (m.group == group) break;  // the block is contiguous within its group
      continue;
    }
    if (m.state == OpState::kEnqueued) m.state = state;
    if (m.started_at_ns == 0) m.started_at_ns = Ns(closing, "time_discovered_started_ns");
    if (m.completed_at_ns == 0) m.completed_at_ns = Ns(closing, "time_discovered_completed_ns");
  }
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

Result<tracer::Dump> Convert(const json& j, const std::string& file, int rank_hint, int world_hint,
                             bool first_form = false) {
  if (j.is_array()) {
    if (rank_hint < 0)
      return InvalidArgument(file +
                             ": a first-recorder dump (a bare list of entries) says no rank, and "
                             "no digits end the file name");
    return Convert(FromFirstRecorder(j, std::max(world_hint, rank_hint + 1)), file, rank_hint, -1,
                   /*first_form=*/true);
  }
  tracer::Dump d;
  auto& s = d.snapshot;
  if (!j.is_object() || !j.contains("pg_config") ||
      (!j.contains("entries") && !j.contains("pg_status"))) {
    return InvalidArgument(
        file +
        ": not a PyTorch Flight Recorder dump (needs 'pg_config', and 'entries' or 'pg_status')");
  }
  // Versions 1.x (PyTorch 2.2-2.3) and 2.x (2.4 on) share the fields read here; a new major
  // version may change their meaning.
  if (j.contains("version")) {
    const std::string v =
        j["version"].is_string() ? j["version"].get<std::string>() : j["version"].dump();
    if (v.empty() || (v[0] != '1' && v[0] != '2') || (v.size() > 1 && v[1] != '.'))
      return InvalidArgument(file + ": Flight Recorder format version " + v +
                             " is not one this reader knows (1.x and 2.x)");
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
    if (g.kind.size() > 7) g.kind = g.kind.substr(0, 7);
    const std::vector<int32_t> ranks = ParseRanks(pg.value("ranks", json::array()));
    g.ranks.assign(ranks.begin(), ranks.end());
    for (int r : g.ranks) world = std::max(world, r + 1);
    group_of[g.name] = static_cast<int>(s.groups.size());
    s.groups.push_back(std::move(g));
  }
  s.info.world_size = world;
  std::map<std::tuple<int, int, int>, uint64_t> p2p_seq;  // (group, peer, send?) -> next
  // Coalesced ops: the members are recorded without events (forever "scheduled") and the closing
  // "nccl:coalesced" entry, of the same group and sequence number, carries their state.
  struct Raw {
    bool p2p;
    int64_t seq;
  };
  std::vector<Raw> raw;  // per converted entry
  int64_t latest = 0;
  int64_t open_timeout_ms = 0;  // the longest timeout of the ops still open
  uint64_t id = 0;
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
    auto git = group_of.find(pg);
    if (git == group_of.end()) {  // its members are unknown: the entry cannot be placed
      d.unknown_values.push_back({"entries[" + std::to_string(id) + "]",
                                  first_form ? "process group (a first-recorder dump names only "
                                               "the default group's members)"
                                             : "process group (not in pg_config)",
                                  pg});
      ++id;
      continue;
    }
    tracer::FlightEntry f;
    f.id = ++id;
    f.group = git->second;
    const std::string where = "entries[" + std::to_string(id - 1) + "]";
    const std::string profiling = e.value("profiling_name", "");
    const bool is_p2p = e.contains("is_p2p") && e["is_p2p"].is_boolean()
                            ? e["is_p2p"].get<bool>()
                            : profiling.find("send") != std::string::npos ||
                                  profiling.find("recv") != std::string::npos;
    const int64_t raw_seq =
        IntOf(is_p2p ? e.value("p2p_seq_id", json(-1))
                     : e.value("collective_seq_id", e.value("seq_id", json(-1))),
              -1);
    if (profiling.size() >= 9 && profiling.compare(profiling.size() - 9, 9, "coalesced") == 0 &&
        profiling.find("_coalesced") == std::string::npos) {
      PropagateCoalesced(e, f.group, is_p2p, raw_seq, raw, &s.entries);
      continue;
    }
    int peer = -1;
    if (!OpOf(profiling, &f.op, &peer)) continue;  // not a communication op
    if (peer >= 0) {
      std::vector<int32_t> sorted = s.groups[f.group].ranks.ToVector();
      std::sort(sorted.begin(), sorted.end());
      if (!sorted.empty() && peer >= static_cast<int>(sorted.size())) {
        d.unknown_values.push_back({where, "profiling_name peer", profiling});
        continue;
      }
      f.peer = sorted.empty() ? peer : sorted[peer];
    }
    if (tracer::IsP2P(f.op)) {
      f.seq = p2p_seq[{f.group, peer, f.op == OpType::kSend}]++;
    } else {
      // collective_seq_id since 2.3's recorder; "seq_id" in the 1.x schema.
      f.seq = static_cast<uint64_t>(IntOf(
          e.contains("collective_seq_id") ? e["collective_seq_id"] : e.value("seq_id", json(0)),
          0));
    }
    const std::string dt = e.contains("input_dtypes") && !e["input_dtypes"].empty()
                               ? e["input_dtypes"][0].get<std::string>()
                               : "Float";
    f.dtype = DTypeOf(dt);
    if (f.dtype == DType::kUnknown) d.unknown_values.push_back({where, "input_dtypes", dt});
    uint64_t elems = 1;
    if (e.contains("input_sizes") && !e["input_sizes"].empty()) {
      for (const auto& d : e["input_sizes"][0])
        elems *= static_cast<uint64_t>(std::max<int64_t>(0, IntOf(d, 0)));
    }
    f.bytes = elems * tracer::DTypeSize(f.dtype);
    std::string st;
    f.state = StateOf(e, &st);
    if (f.state == OpState::kUnknown) d.unknown_values.push_back({where, "state", st});
    f.timeout_ms = static_cast<int32_t>(
        std::clamp<int64_t>(IntOf(e.value("timeout_ms", json(0)), 0), 0, tracer::kMaxTimeoutMs));
    f.enqueued_at_ns = Ns(e, "time_created_ns");
    f.started_at_ns = Ns(e, "time_discovered_started_ns");
    f.completed_at_ns = Ns(e, "time_discovered_completed_ns");
    latest = std::max({latest, f.enqueued_at_ns, f.started_at_ns, f.completed_at_ns});
    if (f.state != OpState::kCompleted)
      open_timeout_ms =
          std::max(open_timeout_ms, f.timeout_ms > 0 ? int64_t{f.timeout_ms} : kDefaultTimeoutMs);
    s.entries.push_back(f);
    raw.push_back({is_p2p, raw_seq});
    // The stack that issued the op the rank is stuck at (its oldest open one): grouped across
    // ranks like our own dumps' stacks (analyzer/stacks.h).
    if (d.stacks.empty() && f.state != OpState::kCompleted && e.contains("frames") &&
        e["frames"].is_array()) {
      tracer::ThreadStack t{s.info.pid, "issued its oldest open op", {}};
      for (const auto& fr : e["frames"]) {
        if (!fr.is_object()) continue;
        auto text = [&](const char* k) {
          return fr.contains(k) && fr[k].is_string() ? fr[k].get<std::string>() : std::string("?");
        };
        t.frames.push_back(text("name") + " at " + text("filename") + ":" +
                           std::to_string(IntOf(fr.value("line", json(0)), 0)));
      }
      if (!t.frames.empty()) d.stacks.push_back(std::move(t));
    }
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
        f.id = ++id;
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
  if (fits && open_timeout_ms > 0 && latest > 0 && mtime > copied_after) d.dumped_at_ns = timed_out;
  d.alive = true;
  d.oldest_open_blocks = true;  // NCCL runs the queued ops in order
  return d;
}

}  // namespace

Result<tracer::Dump> ParsePyTorchDump(std::string_view text, const std::string& source,
                                      int rank_hint, int world_hint) {
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

Result<HangInput> LoadPyTorchDumps(const std::string& dir) {
  if (!fs::is_directory(dir)) return NotFound(dir + " is not a directory");
  std::vector<std::pair<std::string, tracer::Dump>> dumps;
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
  for (const auto& f : files) {
    auto text = tracer::ReadFile(f);
    const int hint = rank_in_name(f);
    auto d = text.ok() ? ParsePyTorchDump(*text, f, hint, world_hint)
                       : Result<tracer::Dump>(text.status());
    if (!d.ok()) {
      skipped.push_back(d.status().message());
      continue;
    }
    dumps.emplace_back(f, std::move(*d));
  }
  if (dumps.empty() && !skipped.empty())
    return InvalidArgument("no readable PyTorch Flight Recorder dump in " + dir + ": " +
                           skipped.front());
  if (dumps.empty()) return NotFound("no PyTorch Flight Recorder dumps in " + dir);
  // A group name is local to a rank: split_group and DeviceMesh give different groups of ranks
  // the same name. Where one name means different members, the members become part of its name.
  std::map<std::string, std::set<std::vector<int32_t>>> members;
  for (const auto& [f, d] : dumps) {
    for (const auto& g : d.snapshot.groups) members[g.name].insert(g.ranks.ToVector());
  }
  for (auto& [f, d] : dumps) {
    for (auto& g : d.snapshot.groups) {
      if (members[g.name].size() < 2) continue;
      std::string list;
      for (int32_t r : g.ranks) list += (list.empty() ? "" : ",") + std::to_string(r);
      g.name += "[" + list + "]";
    }
  }
  ASSIGN_OR_RETURN(HangInput in, MakeHangInput(std::move(dumps)));
  for (const std::string& why : skipped) in.warnings.push_back("left out: " + why);
  return in;
}

}  // namespace megascope::analyzer
