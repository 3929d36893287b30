// PyTorch Flight Recorder import: its JSON dumps become megascope dumps, so PyTorch users get
// root causes from the same analysis (NOTES.md lists the field names).
#include <sys/stat.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "megascope/analyzer/hang.h"
#include "megascope/tracer/file_util.h"

namespace megascope::analyzer {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using tracer::DType;
using tracer::OpState;
using tracer::OpType;

int64_t IntOf(const json& v, int64_t fallback);

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

// "nccl:all_reduce" -> allreduce; "nccl:send 0->1" / "nccl:recv 1<-0" carry the peer.
bool OpOf(const std::string& name, int self, OpType* op, int* peer) {
  std::string n = name.substr(name.find(':') == std::string::npos ? 0 : name.find(':') + 1);
  *peer = -1;
  static const std::regex kP2P(R"((send|recv)\s+(\d+)\s*(->|<-)\s*(\d+))");
  std::smatch m;
  if (std::regex_search(n, m, kP2P)) {
    *op = m[1] == "send" ? OpType::kSend : OpType::kRecv;
    if (m[2].length() > 8 || m[4].length() > 8) return false;
    const int a = std::stoi(m[2]), b = std::stoi(m[4]);
    *peer = a == self ? b : a;
    return true;
  }
  n = n.substr(0, n.find(' '));
  if (n.find("all_reduce") != std::string::npos || n == "allreduce")
    *op = OpType::kAllreduce;
  else if (n.find("reduce_scatter") != std::string::npos)
    *op = OpType::kReduceScatter;
  else if (n.find("all_gather") != std::string::npos || n.find("allgather") != std::string::npos)
    *op = OpType::kAllgather;
  else if (n.find("broadcast") != std::string::npos)
    *op = OpType::kBroadcast;
  else if (n.find("barrier") != std::string::npos)
    *op = OpType::kBarrier;
  else if (n.find("all_to_all") != std::string::npos || n.find("alltoall") != std::string::npos)
    *op = OpType::kAlltoall;
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

Result<tracer::Dump> Convert(const json& j, const std::string& file, int rank_hint) {
  tracer::Dump d;
  auto& s = d.snapshot;
  if (!j.is_object() || !j.contains("pg_config") ||
      (!j.contains("entries") && !j.contains("pg_status"))) {
    return InvalidArgument(
        file +
        ": not a PyTorch Flight Recorder dump (needs 'pg_config', and 'entries' or 'pg_status')");
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
  s.info.node = j.value("hostname", "unknown");
  std::map<std::string, int> group_of;  // pg name -> index
  int world = rank + 1;
  for (const auto& [key, pg] : j["pg_config"].items()) {
    tracer::GroupInfo g;
    g.name = pg.value("name", key);
    g.kind = pg.value("desc", "pg");
    if (g.kind.size() > 7) g.kind = g.kind.substr(0, 7);
    g.ranks = ParseRanks(pg.value("ranks", json::array()));
    for (int r : g.ranks) world = std::max(world, r + 1);
    group_of[g.name] = static_cast<int>(s.groups.size());
    s.groups.push_back(std::move(g));
  }
  s.info.world_size = world;
  std::map<std::tuple<int, int, int>, uint64_t> p2p_seq;  // (group, peer, send?) -> next
  int64_t latest = 0;
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
    if (git == group_of.end())
      return InvalidArgument(file + ": entry " + std::to_string(id) + " names process group '" +
                             pg + "', not in pg_config");
    tracer::FlightEntry f;
    f.id = ++id;
    f.group = git->second;
    int peer = -1;
    if (!OpOf(e.value("profiling_name", ""), rank, &f.op, &peer))
      continue;  // not a communication op
    f.peer = peer;
    const std::string where = "entries[" + std::to_string(id - 1) + "]";
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
    // States: scheduled, started (only with timing enabled), completed. A recorder that marks
    // only `retired` (the watchdog saw the work finish) is read as completed.
    const bool retired = e.value("retired", false);
    const std::string st = e.value("state", retired ? "completed" : "scheduled");
    if (st == "completed" || retired) {
      f.state = OpState::kCompleted;
    } else if (st == "started") {
      f.state = OpState::kStarted;
    } else if (st == "scheduled") {
      f.state = OpState::kEnqueued;
    } else {
      f.state = OpState::kUnknown;
      d.unknown_values.push_back({where, "state", st});
    }
    f.timeout_ms = IntOf(e.value("timeout_ms", json(0)), 0);
    f.enqueued_at_ns = Ns(e, "time_created_ns");
    f.started_at_ns = Ns(e, "time_discovered_started_ns");
    f.completed_at_ns = Ns(e, "time_discovered_completed_ns");
    latest = std::max({latest, f.enqueued_at_ns, f.started_at_ns, f.completed_at_ns});
    s.entries.push_back(f);
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
  d.dumped_at_ns = std::max(latest, mtime);  // written when the watchdog fired
  d.alive = true;
  return d;
}

}  // namespace

Result<tracer::Dump> ParsePyTorchDump(std::string_view text, const std::string& source,
                                      int rank_hint) {
  const json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) {
    return InvalidArgument(source +
                           ": malformed JSON (pickled dumps must be converted to JSON first)");
  }
  try {
    return Convert(j, source, rank_hint);
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
  for (const auto& f : files) {
    ASSIGN_OR_RETURN(const std::string text, tracer::ReadFile(f));
    std::smatch m;
    const std::string name = fs::path(f).filename().string();
    int hint = -1;
    if (std::regex_search(name, m, kTrailingRank) && m[1].length() < 9) hint = std::stoi(m[1]);
    ASSIGN_OR_RETURN(tracer::Dump d, ParsePyTorchDump(text, f, hint));
    dumps.emplace_back(f, std::move(d));
  }
  if (dumps.empty()) return NotFound("no PyTorch Flight Recorder dumps in " + dir);
  // A group name is local to a rank: split_group and DeviceMesh give different groups of ranks
  // the same name. Where one name means different members, the members become part of its name.
  std::map<std::string, std::set<std::vector<int32_t>>> members;
  for (const auto& [f, d] : dumps) {
    for (const auto& g : d.snapshot.groups) members[g.name].insert(g.ranks);
  }
  for (auto& [f, d] : dumps) {
    for (auto& g : d.snapshot.groups) {
      if (members[g.name].size() < 2) continue;
      std::string list;
      for (int32_t r : g.ranks) list += (list.empty() ? "" : ",") + std::to_string(r);
      g.name += "[" + list + "]";
    }
  }
  return MakeHangInput(std::move(dumps));
}

}  // namespace megascope::analyzer
