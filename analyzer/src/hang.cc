#include "megascope/analyzer/hang.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include "format.h"
#include "megascope/analyzer/stacks.h"
#include "megascope/tracer/enum_names.h"
#include "megascope/tracer/file_util.h"
#include "megascope/tracer/parallel.h"
#include "megascope/tracer/run_layout.h"

namespace megascope::analyzer {
namespace {

// a - b, saturated: the times of a dump are whatever its writer put there (a fuzzer found an
// overflow in the time an op had waited).
int64_t Minus(int64_t a, int64_t b) {
  int64_t r = 0;
  if (!__builtin_sub_overflow(a, b, &r)) return r;
  return b < 0 ? std::numeric_limits<int64_t>::max() : std::numeric_limits<int64_t>::min();
}

namespace fs = std::filesystem;
using tracer::FlightEntry;
using tracer::OpState;
using tracer::OpType;
using Collective = RankOps::Collective;
using Transfer = RankOps::Transfer;

template <typename Op>  // a FlightEntry or a Collective
bool IsOpen(const Op& e) {
  return e.state != OpState::kCompleted;
}

// What every member of a collective must agree on: op, size and dtype -- but not the size of an
// all-to-all, whose per-rank splits may legally differ.
std::tuple<int, uint64_t, int> Signature(const Collective& e) {
  return {static_cast<int>(e.op), e.op == OpType::kAlltoall ? 0 : e.bytes,
          static_cast<int>(e.dtype)};
}

std::string OpName(const FlightEntry& e, std::string_view group) {
  std::string s =
      std::string(tracer::Name(e.op)) + " #" + std::to_string(e.seq) + " in " + std::string(group);
  if (e.peer >= 0)
    s += (e.op == OpType::kSend ? " to rank " : " from rank ") + std::to_string(e.peer);
  return s;
}

// Sorts [first, last) by `key` and keeps, of elements with equal keys, the last (the newest: the
// input is in issue order). Returns the end of the kept ones.
template <typename It, typename Key>
It KeepNewest(It first, It last, const Key& key) {
  auto less = [&](const auto& a, const auto& b) { return key(a) < key(b); };
  if (!std::is_sorted(first, last, less)) std::stable_sort(first, last, less);
  It out = first;
  for (It i = first; i != last; ++i) {
    if (std::next(i) == last || key(*std::next(i)) != key(*i)) *out++ = *i;
  }
  return out;
}

// The rank's index of its group `name` (of two of one name, the later), -1 if it has none.
int32_t GroupOf(const RankOps& ops, const std::vector<tracer::GroupInfo>& groups,
                std::string_view name) {
  auto it = std::lower_bound(ops.by_name.begin(), ops.by_name.end(), name,
                             [&](int32_t g, std::string_view n) { return groups[g].name < n; });
  return it != ops.by_name.end() && groups[*it].name == name ? *it : -1;
}

// One rank in the analysis: its dump, the index of its ops, and where it waits. A group is named
// by its name: ranks number their groups each in their own order.
struct Rank {
  int id = 0;
  bool present = false, alive = false;
  const tracer::Dump* dump = nullptr;
  const RankOps* ops = nullptr;
  std::string source;
  int64_t offset = 0;  // clock offset to rank 0
  const FlightEntry* blocking = nullptr;
  std::string_view blocking_group;
  int32_t blocking_index = -1;  // of blocking_group

  int32_t GroupOf(std::string_view name) const {
    return analyzer::GroupOf(*ops, dump->snapshot.groups, name);
  }
  // Ranks that never issued anything in a group still count as having issued nothing (-1).
  int64_t LastColl(std::string_view group) const {
    const int32_t g = GroupOf(group);
    return g < 0 ? -1 : ops->last_coll[g];
  }
  // The rank's collective `seq` in `group`, and the one it issued before it in that group.
  std::pair<const Collective*, const Collective*> CollAt(std::string_view group,
                                                         int64_t seq) const {
    const int32_t g = GroupOf(group);
    if (g < 0) return {nullptr, nullptr};
    const auto first = ops->colls.begin() + ops->coll_start[g],
               last = ops->colls.begin() + ops->coll_start[g + 1];
    auto it = std::lower_bound(first, last, seq,
                               [](const Collective& c, int64_t s) { return c.seq < s; });
    if (it == last || it->seq != seq) return {nullptr, nullptr};
    return {&*it, it != first ? &*std::prev(it) : nullptr};
  }
  const Transfer* Find(const RankOps::Array<Transfer>& in, std::string_view group, int peer,
                       int64_t seq) const {
    const int32_t g = GroupOf(group);
    if (g < 0) return nullptr;
    const auto key = std::make_tuple(g, peer, seq);
    auto it = std::lower_bound(in.begin(), in.end(), key, [](const Transfer& a, const auto& k) {
      return std::make_tuple(a.group, a.peer, a.seq) < k;
    });
    if (it == in.end() || std::make_tuple(it->group, it->peer, it->seq) != key) return nullptr;
    return &*it;
  }
  // How many transfers of `in` (sends or recvs) it issued with `peer` in `group`: one past the
  // newest seq.
  int64_t Issued(const RankOps::Array<Transfer>& in, std::string_view group, int peer) const {
    const int32_t g = GroupOf(group);
    if (g < 0) return 0;
    auto it = std::upper_bound(
        in.begin(), in.end(), std::make_pair(g, peer),
        [](const auto& k, const Transfer& a) { return k < std::make_pair(a.group, a.peer); });
    if (it == in.begin() || std::prev(it)->group != g || std::prev(it)->peer != peer) return 0;
    const int64_t newest = std::prev(it)->seq;
    return newest < 0 ? 0 : (newest == INT64_MAX ? newest : newest + 1);
  }

  const std::string& GroupName(const FlightEntry& e) const {
    return dump->snapshot.groups[e.group].name;
  }
  std::string Describe() const {
    if (!present) return "rank " + std::to_string(id) + " (no dump)";
    const auto& i = dump->snapshot.info;
    // An imported dump (PyTorch's) may know neither the host nor the coordinates.
    std::string where = i.node.empty() || i.node == "unknown" ? "" : i.node;
    if (i.coords.dp >= 0 && i.coords.pp >= 0 && i.coords.tp >= 0) {
      where += (where.empty() ? "" : ", ") + std::string("dp=") + std::to_string(i.coords.dp) +
               " pp=" + std::to_string(i.coords.pp) + " tp=" + std::to_string(i.coords.tp);
    }
    return "rank " + std::to_string(id) + (where.empty() ? "" : " (" + where + ")");
  }
  std::string Doing(int64_t now) const {
    if (!present) return "no flight recorder";
    const auto& hb = dump->snapshot.heartbeat;
    if (hb.updated_at_ns == 0 && ops->newest) {  // a recorder without heartbeats
      const FlightEntry& e = *ops->newest;
      return "the newest op it recorded is " + OpName(e, GroupName(e)) + ", " +
             std::string(tracer::Name(e.state));
    }
    std::string s = "its last heartbeat says " + std::string(tracer::Name(hb.phase)) + " of step " +
                    std::to_string(hb.step);
    if (hb.updated_at_ns > 0)
      s += " (" + Fmt("%.1f", static_cast<double>(now - (hb.updated_at_ns - offset)) / 1e9) +
           " s ago)";
    return s;
  }
};

// megascope's rule for the members of a collective: op, size and dtype must agree (an op or dtype
// this build does not know, from a newer writer, is no evidence). The largest agreeing set is the
// norm and everyone outside it departs; of two sets as large, the one whose members took another
// path than their own previous op in the group departs (one rank against one).
MemberComparison CompareSignatures(const std::vector<Rank>& ranks, std::string_view group,
                                   int64_t seq, const std::vector<int>& members) {
  using Sig = std::tuple<int, uint64_t, int>;
  std::map<Sig, std::vector<int>> by_sig;
  for (int m : members) {
    const Collective* own = ranks[m].CollAt(group, seq).first;
    if (own != nullptr && own->op != OpType::kUnknown && own->dtype != tracer::DType::kUnknown)
      by_sig[Signature(*own)].push_back(m);
  }
  MemberComparison out;
  if (by_sig.size() < 2) return out;
  std::map<Sig, int> departs;  // signature -> its members that depart from their own past
  for (const auto& [sig, who] : by_sig) {
    for (int m : who) {
      const Collective* prev = ranks[m].CollAt(group, seq).second;
      if (prev != nullptr && Signature(*prev) != sig) ++departs[sig];
    }
  }
  auto norm = std::max_element(by_sig.begin(), by_sig.end(), [&](const auto& a, const auto& c) {
    if (a.second.size() != c.second.size()) return a.second.size() < c.second.size();
    return departs[a.first] > departs[c.first];
  });
  auto text = [](const Sig& s) {
    return std::string(tracer::Name(static_cast<OpType>(std::get<0>(s)))) + " of " +
           std::to_string(std::get<1>(s)) + " bytes " +
           std::string(tracer::Name(static_cast<tracer::DType>(std::get<2>(s))));
  };
  out.expected = text(norm->first);
  for (const auto& [sig, who] : by_sig) {
    if (sig == norm->first) continue;
    if (out.odd.empty()) {
      out.found = text(sig);
      out.kind = std::get<0>(sig) != std::get<0>(norm->first)   ? MismatchKind::kType
                 : std::get<1>(sig) != std::get<1>(norm->first) ? MismatchKind::kSize
                                                                : MismatchKind::kDtype;
    }
    out.odd.insert(out.odd.end(), who.begin(), who.end());
  }
  std::sort(out.odd.begin(), out.odd.end());
  return out;
}

}  // namespace

std::string_view Name(MismatchKind k) {
  static constexpr std::array<std::string_view, 4> kNames = {
      "COLLECTIVE_TYPE_MISMATCH", "SIZE_OR_SYNTAX_MISMATCH", "COLLECTIVE_DTYPE_MISMATCH",
      "COLLECTIVE_STATE_MISMATCH"};
  return tracer::NameFrom(kNames, k);
}

RankOps IndexOps(const tracer::Dump& dump, const std::shared_ptr<tracer::Arena>& arena) {
  RankOps o;
  const tracer::ArenaAllocator<void> in(arena);
  o.colls = RankOps::Array<Collective>(in);
  o.sends = RankOps::Array<Transfer>(in);
  o.recvs = RankOps::Array<Transfer>(in);
  o.history = RankOps::Array<int32_t>(in);
  const auto& groups = dump.snapshot.groups;
  const auto& entries = dump.snapshot.entries;
  const auto n_groups = static_cast<int32_t>(groups.size());
  // Entries name groups by position; two groups of one name are one (the later one's members).
  o.by_name.resize(groups.size());
  std::iota(o.by_name.begin(), o.by_name.end(), 0);
  o.by_name.erase(KeepNewest(o.by_name.begin(), o.by_name.end(),
                             [&](int32_t g) -> std::string_view { return groups[g].name; }),
                  o.by_name.end());
  std::vector<int32_t> canon(groups.size());
  for (int32_t g = 0; g < n_groups; ++g) canon[g] = GroupOf(o, groups, groups[g].name);

  o.last_coll.assign(groups.size(), -1);
  o.coll_start.assign(groups.size() + 1, 0);
  size_t n_colls = 0, n_sends = 0;
  for (const FlightEntry& e : entries) {
    n_colls += !tracer::IsP2P(e.op);
    n_sends += e.op == OpType::kSend;
  }
  o.history.reserve(n_colls);
  o.sends.reserve(n_sends);
  o.recvs.reserve(entries.size() - n_colls - n_sends);
  const FlightEntry* blocking = nullptr;
  for (const FlightEntry& e : entries) {
    const int32_t g = canon[e.group];
    const auto seq = static_cast<int64_t>(e.seq);
    if (tracer::IsP2P(e.op)) {
      const bool send = e.op == OpType::kSend;
      (send ? o.sends : o.recvs)
          .push_back({g, e.peer, seq, e.bytes, send ? e.bytes_sent : e.bytes_received, IsOpen(e)});
    } else {
      ++o.coll_start[g + 1];
      o.last_coll[g] = std::max(o.last_coll[g], seq);
      o.history.push_back(g);
    }
    o.in_op |= e.state == OpState::kEnqueued || e.state == OpState::kStarted;
    // Entries are in issue order: the newest open op is where a rank's thread waits; behind a
    // device queue (NCCL), the oldest open op is the one everything after it waits for.
    if (IsOpen(e) && (blocking == nullptr || !dump.oldest_open_blocks)) {
      blocking = &e;
      o.blocking_group = g;
      o.history_at_blocking = o.history.size();  // the collectives issued up to it
    }
  }
  if (blocking != nullptr) o.blocking = *blocking;
  if (!entries.empty()) o.newest = entries.back();
  // Collectives bucketed by group (issue order kept within one), then by seq within a group where
  // the recorder's order is not already that; of a seq recorded twice the newest is kept.
  for (int32_t g = 0; g < n_groups; ++g) o.coll_start[g + 1] += o.coll_start[g];
  std::vector<uint32_t> at(n_colls);  // positions in `entries`
  std::vector<uint32_t> next(o.coll_start.begin(), o.coll_start.end() - 1);
  for (uint32_t i = 0; i < entries.size(); ++i) {
    if (!tracer::IsP2P(entries[i].op)) at[next[canon[entries[i].group]]++] = i;
  }
  uint32_t kept = 0;
  for (int32_t g = 0; g < n_groups; ++g) {
    const auto first = at.begin() + o.coll_start[g];
    const auto last = KeepNewest(first, at.begin() + o.coll_start[g + 1],
                                 [&](uint32_t i) { return static_cast<int64_t>(entries[i].seq); });
    if (o.coll_start[g] != kept) std::copy(first, last, at.begin() + kept);
    o.coll_start[g] = kept;
    kept += static_cast<uint32_t>(last - first);
  }
  o.coll_start[n_groups] = kept;
  o.colls.reserve(kept);
  for (uint32_t k = 0; k < kept; ++k) {
    const FlightEntry& e = entries[at[k]];
    RankOps::Collective& c = o.colls.emplace_back();
    c.seq = static_cast<int64_t>(e.seq);
    c.bytes = e.bytes;
    c.op = e.op;
    c.dtype = e.dtype;
    c.state = e.state;
    if (e.bytes_sent >= 0 && static_cast<uint64_t>(e.bytes_sent) == e.bytes) {
      c.sent = RankOps::kSentAll;
    } else if (e.bytes_sent >= 0) {
      c.sent = static_cast<int32_t>(o.partial_sent.size());
      o.partial_sent.push_back(e.bytes_sent);
    }
  }
  auto transfer_key = [](const RankOps::Transfer& t) {
    return std::make_tuple(t.group, t.peer, t.seq);
  };
  o.sends.erase(KeepNewest(o.sends.begin(), o.sends.end(), transfer_key), o.sends.end());
  o.recvs.erase(KeepNewest(o.recvs.begin(), o.recvs.end(), transfer_key), o.recvs.end());
  return o;
}

Status HangInputBuilder::Add(RankView view) {
  const tracer::RankInfo& info = view.dump.snapshot.info;
  std::lock_guard<std::mutex> lock(mu_);
  if (in_.world_size == 0) {
    in_.world_size = info.world_size;
    in_.ranks.resize(in_.world_size);
  } else if (info.world_size != in_.world_size) {
    return InvalidArgument(view.source + ": world_size " + std::to_string(info.world_size) +
                           " disagrees with " + std::to_string(in_.world_size) +
                           " in the other dumps");
  }
  RankView& v = in_.ranks[info.rank];
  // Of two dumps of a rank the newer is kept; of two as new, the first by source (whatever order
  // they arrive in).
  if (v.present && std::make_pair(-v.dump.dumped_at_ns, std::string_view(v.source)) <=
                       std::make_pair(-view.dump.dumped_at_ns, std::string_view(view.source)))
    return Status::Ok();
  v = std::move(view);
  v.present = true;
  return Status::Ok();
}

Result<HangInput> HangInputBuilder::Finish() && {
  std::lock_guard<std::mutex> lock(mu_);
  if (in_.world_size == 0) return InvalidArgument("no flight-recorder dumps to analyse");
  // group -> its members in the first rank's dump that has it, and that dump's source
  std::map<std::string_view, std::pair<const tracer::RankList*, const std::string*>> membership;
  for (const RankView& v : in_.ranks) {
    if (!v.present) continue;
    for (const auto& g : v.dump.snapshot.groups) {
      auto [it, added] = membership.try_emplace(g.name, &g.ranks, &v.source);
      if (!added && *it->second.first != g.ranks) {
        return InvalidArgument("group '" + g.name + "' has different members in " + v.source +
                               " and " + *it->second.second);
      }
    }
  }
  // Unknown values (a newer writer's phase, op, state or dtype): once per field and value.
  struct Seen {
    int dumps = 0;
    std::string first;
  };
  std::map<std::pair<std::string, std::string>, Seen> unknown;
  for (const RankView& v : in_.ranks) {
    std::set<std::pair<std::string, std::string>> here;
    for (const tracer::UnknownValue& u : v.dump.unknown_values) {
      Seen& s = unknown[{u.field, u.value}];
      if (s.first.empty()) s.first = v.source + ": " + u.where;
      if (here.insert({u.field, u.value}).second) ++s.dumps;
    }
  }
  for (const auto& [key, s] : unknown) {
    in_.warnings.push_back("unknown " + key.first + " '" + key.second + "' in " +
                           std::to_string(s.dumps) + (s.dumps == 1 ? " dump" : " dumps") +
                           " (first: " + s.first + "): read as unknown, the analysis goes on");
  }
  return std::move(in_);
}

Result<HangInput> MakeHangInput(std::vector<std::pair<std::string, tracer::Dump>> dumps) {
  std::vector<RankOps> ops(dumps.size());
  tracer::ParallelFor(dumps.size(), std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 8),
                      [&](size_t i) { ops[i] = IndexOps(dumps[i].second); });
  HangInputBuilder builder;
  for (size_t i = 0; i < dumps.size(); ++i) {  // in the caller's order: its first error is named
    RankView v;
    v.source = std::move(dumps[i].first);
    v.dump = std::move(dumps[i].second);
    v.ops = std::move(ops[i]);
    RETURN_IF_ERROR(builder.Add(std::move(v)));
  }
  return std::move(builder).Finish();
}

namespace {

// `path` itself, or for a run directory its newest dumps/attempt_*.
Result<std::string> DumpDirectoryOf(const std::string& path) {
  if (!fs::is_directory(path)) return NotFound(path + " is not a directory");
  const RunLayout layout(path);
  if (!fs::is_directory(layout.dumps_root())) return path;
  int best = -1;
  for (const auto& e : fs::directory_iterator(layout.dumps_root())) {
    const std::string n = e.path().filename().string();
    if (n.rfind("attempt_", 0) == 0) best = std::max(best, std::atoi(n.c_str() + 8));
  }
  if (best < 0) return NotFound(layout.dumps_root() + " holds no attempt_* directory");
  return layout.dumps(best);
}

}  // namespace

Result<std::optional<IncidentThresholds>> ReadIncidentThresholds(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string dir, DumpDirectoryOf(path));
  const std::string file = dir + "/" + kIncidentFile;
  if (!fs::exists(file)) return std::optional<IncidentThresholds>();
  ASSIGN_OR_RETURN(const std::string text, tracer::ReadFile(file));
  const auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || j.value("format", "") != "megascope-incident")
    return InvalidArgument(file + ": not a megascope incident file");
  if (!j.contains("version") || !j["version"].is_number_integer() || j["version"] != 1)
    return InvalidArgument(file + ": incident file version " +
                           (j.contains("version") ? j["version"].dump() : "(none)") +
                           " is not one this build knows (1)");
  IncidentThresholds t;
  t.source = file;
  t.trigger = j.value("trigger", "");
  auto seconds = [&](const char* key, double fallback) {
    return j.contains(key) && j[key].is_number() && j[key].get<double>() > 0 ? j[key].get<double>()
                                                                             : fallback;
  };
  t.options.min_wait_s = seconds("min_wait_s", t.options.min_wait_s);
  t.options.stale_heartbeat_s = seconds("stale_heartbeat_s", t.options.stale_heartbeat_s);
  return std::optional<IncidentThresholds>(std::move(t));
}

Status WriteIncidentThresholds(const std::string& dir, const std::string& trigger,
                               const std::string& detail, int attempt, const HangOptions& options) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  const nlohmann::ordered_json j = {{"format", "megascope-incident"},
                                    {"version", 1},
                                    {"trigger", trigger},
                                    {"detail", detail},
                                    {"attempt", attempt},
                                    {"min_wait_s", options.min_wait_s},
                                    {"stale_heartbeat_s", options.stale_heartbeat_s}};
  return tracer::WriteFileAtomic(dir + "/" + kIncidentFile, j.dump(1) + "\n");
}

Result<HangInput> LoadDumpDirectory(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string dir, DumpDirectoryOf(path));
  std::vector<std::pair<std::string, tracer::Dump>> dumps;
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() == ".json" && e.path().filename() != kIncidentFile)
      files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) return NotFound("no flight-recorder dumps (*.json) in " + dir);
  // Read and parsed on every core: a 12,288-rank job's directory is about a gigabyte.
  std::vector<std::optional<Result<tracer::Dump>>> read(files.size());
  tracer::ParallelFor(files.size(), std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 8),
                      [&](size_t i) { read[i] = tracer::ReadDumpFile(files[i]); });
  dumps.reserve(files.size());
  // A bad file (cut short, malformed, not JSON) is named and skipped: its rank counts as one that
  // left no dump, and the others are analysed. A dump of another format or a newer version is an
  // error (another reader or a newer megascope reads it), and so is a directory with none readable.
  std::vector<std::string> skipped;
  for (size_t i = 0; i < files.size(); ++i) {
    if (!read[i]->ok() && read[i]->status().code() == StatusCode::kFailedPrecondition)
      return read[i]->status();
    if (!read[i]->ok()) {
      skipped.push_back(read[i]->status().message() + ": skipped, its rank counts as one that " +
                        "left no dump");
      continue;
    }
    dumps.emplace_back(std::move(files[i]), std::move(*read[i]).value());
  }
  if (dumps.empty()) {
    return read.front()->status().WithContext("no dump of " + dir + " could be read (" +
                                              std::to_string(files.size()) + " file(s))");
  }
  ASSIGN_OR_RETURN(HangInput in, MakeHangInput(std::move(dumps)));
  in.warnings.insert(in.warnings.begin(), skipped.begin(), skipped.end());
  return in;
}

std::vector<Verdict> AnalyzeHang(const HangInput& in, const HangOptions& opt,
                                 std::vector<WaitEdge>* wait_for) {
  const int n = in.world_size;
  std::vector<Rank> ranks(n);
  for (int r = 0; r < n; ++r) {
    Rank& R = ranks[r];
    R.id = r;
    const RankView& v = in.ranks[r];
    if (!v.present) continue;
    R.present = true;
    R.alive = v.dump.alive;
    R.dump = &v.dump;
    R.ops = &v.ops;
    R.source = v.source;
    R.offset = v.dump.snapshot.info.clock_offset_ns;
    if (v.ops.blocking) {
      R.blocking = &*v.ops.blocking;
      R.blocking_index = v.ops.blocking_group;
      R.blocking_group = v.dump.snapshot.groups[R.blocking_index].name;
    }
  }
  int64_t now = 0;
  for (const Rank& R : ranks) {
    if (R.present) now = std::max(now, Minus(R.dump->dumped_at_ns, R.offset));
  }

  std::vector<WaitEdge> waits;
  std::map<int, std::set<int>> edges;
  struct Mismatch {
    std::string group;
    int64_t seq;
    MemberComparison how;
  };
  std::vector<Mismatch> mismatches;
  // A stalled link: its ends, the transfer or collective it stalled in, and what moved.
  struct Link {
    int sender, receiver;
    std::string group;
    int64_t seq;
    OpType op;
    uint64_t bytes;
    int64_t sent, received;  // -1: unknown
  };
  std::vector<Link> links;
  std::set<int> waiting;
  // Members that issued an op their peers' devices started, while theirs never did: a device
  // stuck in something else (with timing on, PyTorch's `started` of a kernel that began).
  std::set<int> not_started;
  struct CollectiveState {
    std::vector<int> missing;      // members that have not issued it
    std::vector<int> behind;       // members that issued it behind an older open op of their own
    std::vector<int> completed;    // members for whom it completed
    std::vector<int> not_started;  // members whose device never started it while others' did
    MemberComparison comparison;   // how the members that issued it compare
    bool reported = false;         // its mismatch is in `mismatches`
  };
  std::map<std::pair<std::string_view, int64_t>, CollectiveState> collectives;
  const auto compare = [&](std::string_view group, int64_t seq, const std::vector<int>& members) {
    return opt.matcher ? opt.matcher(group, seq, members)
                       : CompareSignatures(ranks, group, seq, members);
  };
  // Who has and has not issued `key`'s collective, of `members`, and how those that did compare.
  // Every member waiting in the same (group, seq) shares the answer, so it is worked out once.
  auto state_of = [&](const std::pair<std::string_view, int64_t>& key,
                      const tracer::RankList& members) -> const CollectiveState& {
    auto cached = collectives.find(key);
    if (cached != collectives.end()) return cached->second;
    CollectiveState cs;
    std::vector<int> issued, enqueued;
    int started = 0;
    for (int m : members) {
      if (m < 0 || m >= n) continue;
      const Rank& M = ranks[m];
      if (!M.present || M.LastColl(key.first) < key.second) {
        cs.missing.push_back(m);
        continue;
      }
      const Collective* own = M.CollAt(key.first, key.second).first;
      if (own == nullptr) continue;
      issued.push_back(m);
      // Issued, but queued on its device behind an older op of its own that has not finished:
      // it cannot join this one before that one.
      if (M.dump->oldest_open_blocks && M.blocking != nullptr &&
          (M.blocking_group != key.first || M.blocking->seq != static_cast<uint64_t>(key.second)) &&
          IsOpen(*own))
        cs.behind.push_back(m);
      // Finished on a member while others still wait in it: the others' data from that member
      // stopped on the way (a collective's stalled link).
      if (own->state == OpState::kCompleted) cs.completed.push_back(m);
      // Behind a device queue, `started` says the device began the op (PyTorch with timing on).
      if (M.dump->oldest_open_blocks && own->state == OpState::kEnqueued) enqueued.push_back(m);
      started += own->state == OpState::kStarted;
    }
    cs.comparison = compare(key.first, key.second, issued);
    if (cs.missing.empty() && cs.completed.empty() && started > 0 &&
        cs.comparison.states_compared && cs.comparison.odd.empty()) {
      for (int m : enqueued) {  // not behind an older op of its own: its device is elsewhere
        if (std::find(cs.behind.begin(), cs.behind.end(), m) == cs.behind.end())
          cs.not_started.push_back(m);
      }
    }
    return collectives.emplace(key, std::move(cs)).first->second;
  };
  int64_t onset = 0;
  bool failed_seen = false;

  for (Rank& R : ranks) {
    if (!R.present || R.blocking == nullptr) continue;
    const FlightEntry& b = *R.blocking;
    const int64_t start = Minus(b.started_at_ns ? b.started_at_ns : b.enqueued_at_ns, R.offset);
    const int64_t end = b.state == OpState::kFailed && b.completed_at_ns
                            ? Minus(b.completed_at_ns, R.offset)
                            : Minus(R.dump->dumped_at_ns, R.offset);
    // An op without times (rebuilt from a PyTorch dump's pg_status counters) has waited at least
    // as long as the dump says it hung; it sets no onset.
    const bool timed = b.started_at_ns != 0 || b.enqueued_at_ns != 0;
    const double waited = timed ? static_cast<double>(Minus(end, start)) / 1e9 : opt.min_wait_s;
    failed_seen |= b.state == OpState::kFailed;
    const tracer::RankList& members = R.dump->snapshot.groups[R.blocking_index].ranks;
    const bool p2p = tracer::IsP2P(b.op);
    // Still working: open for less than the wait that makes a hang, or less than the op's own
    // timeout when that is shorter (a job with a 1-s collective timeout hangs after 1 s) --
    // unless it waits on a rank that is gone without a dump.
    const double min_wait = b.timeout_ms > 0
                                ? std::min(opt.min_wait_s, static_cast<double>(b.timeout_ms) / 1e3)
                                : opt.min_wait_s;
    if (b.state != OpState::kFailed && waited < min_wait) {
      bool on_absent = false;
      if (opt.absent_is_gone && p2p) {
        on_absent = b.peer >= 0 && b.peer < n && !ranks[b.peer].present;
      } else if (opt.absent_is_gone) {
        for (int m : members) on_absent |= m >= 0 && m < n && !ranks[m].present;
      }
      if (!on_absent) continue;
    }
    const auto key = std::make_pair(R.blocking_group, static_cast<int64_t>(b.seq));
    const CollectiveState* cs = p2p ? nullptr : &state_of(key, members);
    // Completed by a member, in a collective whose members' states its writer does not compare:
    // the op moves.
    if (cs != nullptr && !cs->comparison.states_compared && !cs->completed.empty()) continue;
    waiting.insert(R.id);
    if (timed) onset = onset == 0 ? start : std::min(onset, start);
    const std::string what = OpName(b, R.blocking_group);
    auto wait_on = [&](int m) {
      edges[R.id].insert(m);
      waits.push_back({R.id, m, what, waited});
    };
    if (p2p) {
      const int p = b.peer;
      if (p < 0 || p >= n) continue;
      const Rank& P = ranks[p];
      const bool recv = b.op == OpType::kRecv;
      if (!P.present) {
        wait_on(p);
        continue;
      }
      const int64_t counterpart = recv ? P.Issued(P.ops->sends, R.blocking_group, R.id)
                                       : P.Issued(P.ops->recvs, R.blocking_group, R.id);
      if (counterpart < static_cast<int64_t>(b.seq) + 1) {
        wait_on(p);  // the peer has not reached its side of this transfer
        continue;
      }
      const Transfer* other = P.Find(recv ? P.ops->sends : P.ops->recvs, R.blocking_group, R.id,
                                     static_cast<int64_t>(b.seq));
      // Posted but open, queued on the peer's device behind an older op of its own that has not
      // finished: the peer cannot reach it before that one.
      const bool peer_at_it = P.blocking != nullptr && tracer::IsP2P(P.blocking->op) &&
                              P.blocking->peer == R.id && P.blocking_group == R.blocking_group &&
                              P.blocking->seq == b.seq;
      if (P.dump->oldest_open_blocks && other != nullptr && other->open && !peer_at_it) {
        wait_on(p);
        continue;
      }
      // Both sides posted: the bytes did not make it across.
      Link l{recv ? p : R.id,
             recv ? R.id : p,
             std::string(R.blocking_group),
             static_cast<int64_t>(b.seq),
             b.op,
             b.bytes,
             -1,
             -1};
      if (recv) {
        l.sent = other ? other->moved : -1;
        l.received = b.bytes_received;
      } else {
        l.sent = b.bytes_sent;
        if (other != nullptr) {  // the receiving side's view of the transfer
          l.op = OpType::kRecv;
          l.bytes = other->bytes;
          l.received = other->moved;
        }
      }
      bool known = false;
      for (const Link& x : links) known |= x.sender == l.sender && x.receiver == l.receiver;
      if (!known) links.push_back(l);
      continue;
    }
    // A collective: who has not issued this sequence number, and who issued something else.
    for (int m : cs->missing) {
      if (m != R.id) wait_on(m);
    }
    // Members that issued something else explain the wait; a completed member beside them is no
    // stalled link, nor is one whose writer does not compare states.
    const bool matched = cs->comparison.odd.empty();
    if (cs->missing.empty() && matched && cs->comparison.states_compared) {
      for (int m : cs->completed) {
        if (m == R.id) continue;
        const Collective* sent = ranks[m].CollAt(key.first, key.second).first;
        Link l{m,    R.id,    std::string(R.blocking_group),  key.second,
               b.op, b.bytes, ranks[m].ops->BytesSent(*sent), b.bytes_received};
        bool known = false;
        for (const Link& x : links)
          known |= (x.sender == m && x.receiver == R.id) || (x.sender == R.id && x.receiver == m);
        if (!known) links.push_back(l);
      }
    }
    for (int m : cs->behind) {
      if (m != R.id) wait_on(m);
    }
    for (int m : cs->not_started) {
      not_started.insert(m);
      if (m != R.id) wait_on(m);
    }
    if (matched || cs->reported) continue;
    collectives[key].reported = true;
    mismatches.push_back({std::string(R.blocking_group), key.second, cs->comparison});
  }

  std::vector<Verdict> out;
  const int64_t detected = now;
  auto base = [&](Cause cause) {
    Verdict v;
    v.kind = VerdictKind::kHang;
    v.cause = Name(cause);
    v.detected_at_ns = detected;
    v.onset_at_ns = onset;
    return v;
  };
  auto node_of = [&](int r) {
    return ranks[r].present ? ranks[r].dump->snapshot.info.node : std::string("?");
  };
  std::map<int, std::vector<int>> waited_by;  // target -> ranks waiting on it
  for (const WaitEdge& x : waits) waited_by[x.to].push_back(x.from);
  // Everyone who waits on `roots`, directly or through others (iterative: chains can be long).
  auto waiters_of = [&](const std::set<int>& roots) {
    std::set<int> w;
    std::vector<int> todo(roots.begin(), roots.end());
    while (!todo.empty()) {
      const int t = todo.back();
      todo.pop_back();
      auto it = waited_by.find(t);
      if (it == waited_by.end()) continue;
      for (int from : it->second) {
        if (!roots.count(from) && w.insert(from).second) todo.push_back(from);
      }
    }
    return std::vector<int>(w.begin(), w.end());
  };
  auto wait_lines = [&](int root) {
    std::string s;
    int shown = 0, total = 0;
    for (const WaitEdge& x : waits) {
      if (x.to != root) continue;
      ++total;
      if (shown++ < 4)
        s += (s.empty() ? "" : "; ") + ranks[x.from].Describe() + " waits in " + x.what + " for " +
             Fmt("%.1f s", x.seconds);
    }
    if (total > shown) s += "; and " + std::to_string(total - shown) + " more";
    return s;
  };
  std::set<int> explained;
  // A stalled link between the ends `from` -> `to`, at `e` (a transfer, or a collective) in
  // `group`: the fields every link_stall verdict shares.
  auto link_verdict = [&](int from, int to, int64_t seq, OpType op, std::string_view group,
                          double confidence) {
    Verdict v = base(Cause::kLinkStall);
    v.root_ranks = {from, to};
    v.root_nodes = {node_of(from), node_of(to)};
    v.group = group;
    v.seq = seq;
    v.op = tracer::IsP2P(op) ? "send" : std::string(tracer::Name(op));
    v.waiting_ranks = waiters_of({from, to});
    v.confidence = confidence;
    return v;
  };

  // 1. Different ops at the same sequence number: the odd ones out, and everyone stuck in it.
  for (const Mismatch& m : mismatches) {
    Verdict v = base(Cause::kOpMismatch);
    const std::vector<int>& odd = m.how.odd;
    std::set<int> roots(odd.begin(), odd.end());
    for (int r : odd) {
      v.root_ranks.push_back(r);
      v.root_nodes.push_back(node_of(r));
      explained.insert(r);
    }
    v.group = m.group;
    v.seq = m.seq;
    const Collective* found = ranks[odd[0]].CollAt(m.group, m.seq).first;
    v.op = found != nullptr ? std::string(tracer::Name(found->op)) : "";
    std::set<int> behind;
    for (int w : waiters_of(roots)) behind.insert(w);
    for (int r : waiting) {
      if (!roots.count(r) && ranks[r].blocking_group == m.group &&
          static_cast<int64_t>(ranks[r].blocking->seq) == m.seq)
        behind.insert(r);
    }
    v.waiting_ranks.assign(behind.begin(), behind.end());
    v.mismatch = std::string(Name(m.how.kind));
    v.confidence = 0.95;
    std::string who;
    for (size_t i = 0; i < odd.size() && i < 4; ++i)
      who += (i ? (i + 1 == odd.size() ? " and " : ", ") : "") + ranks[odd[i]].Describe();
    if (odd.size() > 4) who += " and " + std::to_string(odd.size() - 4) + " more";
    v.explanation = who + " issued " + m.how.found + " as #" + std::to_string(m.seq) + " in " +
                    m.group + " where " + (odd.size() == 1 ? "its" : "their") + " peers issued " +
                    m.how.expected + " (" + std::string(Name(m.how.kind)) +
                    "): a different code path.";
    v.evidence.push_back("group " + m.group + " seq " + std::to_string(m.seq) + ": expected " +
                         m.how.expected + ", found " + m.how.found);
    out.push_back(std::move(v));
  }
  // A rank whose process exists but whose heartbeat stopped while its peers' beat on is frozen
  // (SIGSTOP, uninterruptible sleep, a stuck driver call): its transfers stop because it does, so
  // it is a root itself (step 3), never one end of a stalled link.
  int64_t freshest = 0;
  for (const Rank& R : ranks) {
    if (R.present)
      freshest = std::max(freshest, Minus(R.dump->snapshot.heartbeat.updated_at_ns, R.offset));
  }
  auto heartbeat_lag = [&](int r) {
    return Minus(freshest, Minus(ranks[r].dump->snapshot.heartbeat.updated_at_ns, ranks[r].offset));
  };
  std::set<int> frozen;
  for (int r = 0; r < n; ++r) {
    if (ranks[r].present && ranks[r].alive &&
        heartbeat_lag(r) > static_cast<int64_t>(opt.stale_heartbeat_s * 1e9))
      frozen.insert(r);
  }
  // 2. Stalled links: both sides posted, the data stopped.
  for (const Link& l : links) {
    if (frozen.count(l.sender) || frozen.count(l.receiver)) continue;
    const bool p2p = tracer::IsP2P(l.op);
    Verdict v = link_verdict(l.sender, l.receiver, l.seq, l.op, l.group, 0.85);
    if (!p2p) v.mismatch = std::string(Name(MismatchKind::kState));  // completed on one, not both
    auto bytes = [](int64_t b) { return b < 0 ? std::string("unknown") : std::to_string(b); };
    const std::string sent = bytes(l.sent), got = bytes(l.received);
    const std::string suspect =
        " Suspect the link between " + node_of(l.sender) + " and " + node_of(l.receiver) + ".";
    v.explanation =
        p2p ? "the transfer #" + std::to_string(l.seq) + " in " + l.group + " from " +
                  ranks[l.sender].Describe() + " to " + ranks[l.receiver].Describe() +
                  " stalled: both sides joined, " + sent + " of " + std::to_string(l.bytes) +
                  " bytes sent and " + got + " received." + suspect
            : ranks[l.sender].Describe() + " completed " + v.op + " #" + std::to_string(l.seq) +
                  " in " + l.group + " but " + ranks[l.receiver].Describe() +
                  " still waits in it: its data stopped on the way." + suspect;
    v.evidence.push_back("bytes_sent=" + sent + " bytes_received=" + got + " of " +
                         std::to_string(l.bytes));
    if (!v.waiting_ranks.empty())
      v.evidence.push_back(std::to_string(v.waiting_ranks.size()) + " ranks wait behind it");
    explained.insert(l.sender);
    explained.insert(l.receiver);
    out.push_back(std::move(v));
  }
  // 3. The ranks at the end of the wait-for edges, and the frozen ones wherever they wait.
  // Follow the edges from every waiting rank to the ranks that wait on nobody.
  std::set<int> sinks;
  {
    std::vector<char> seen(n, 0);
    std::vector<int> todo(waiting.begin(), waiting.end());
    while (!todo.empty()) {
      const int r = todo.back();
      todo.pop_back();
      if (seen[r]) continue;
      seen[r] = 1;
      auto it = edges.find(r);
      if (it == edges.end() || it->second.empty()) {
        sinks.insert(r);
        continue;
      }
      for (int m : it->second) todo.push_back(m);
    }
  }
  sinks.insert(frozen.begin(), frozen.end());
  std::map<Cause, std::vector<int>> by_cause;
  std::vector<std::pair<int, int>> crawling;  // (rank, peer): a transfer moving too slowly
  std::map<int, std::string> why;
  for (int r : sinks) {
    // Explained already, or itself stuck in an op every peer joined (a link or an unknown case)
    // -- unless its device never started what its peers' devices did.
    if (explained.count(r) || (waiting.count(r) && !not_started.count(r) && !frozen.count(r)))
      continue;
    const Rank& R = ranks[r];
    Cause cause = Cause::kRankNotJoined;
    if (!R.present) {
      cause = Cause::kRankDead;
      why[r] = "left no flight recorder";
    } else if (!R.alive) {
      cause = Cause::kRankDead;
      why[r] = "its process is gone";
    } else if (frozen.count(r)) {
      cause = Cause::kRankDead;
      why[r] = "its process exists but is frozen: its heartbeat is " +
               Fmt("%.0f", static_cast<double>(heartbeat_lag(r)) / 1e9) +
               " s older than its peers'";
    }
    // Alive, and not stuck in compute: moving a transfer whose other side is posted, on another
    // host, just not for long enough to count as a wait. Its data crawls over the link (a lossy
    // link retransmitting, a link far below its rate): the link is the root, not the rank.
    if (cause == Cause::kRankNotJoined && R.blocking != nullptr && !not_started.count(r)) {
      const FlightEntry& b = *R.blocking;
      int peer = -1;  // the other side, on another host, that has posted its part
      if (tracer::IsP2P(b.op)) {
        const int p = b.peer;
        if (p >= 0 && p < n && ranks[p].present && node_of(p) != node_of(r)) {
          const bool recv = b.op == OpType::kRecv;
          const Rank& P = ranks[p];
          const int64_t counterpart = recv ? P.Issued(P.ops->sends, R.blocking_group, r)
                                           : P.Issued(P.ops->recvs, R.blocking_group, r);
          if (counterpart >= static_cast<int64_t>(b.seq) + 1) peer = p;
        }
      } else {
        // A collective every member has issued, with a member on another host.
        bool all = true;
        for (int m : R.dump->snapshot.groups[R.blocking_index].ranks) {
          if (m < 0 || m >= n || !ranks[m].present ||
              ranks[m].LastColl(R.blocking_group) < static_cast<int64_t>(b.seq)) {
            all = false;
          } else if (peer < 0 && node_of(m) != node_of(r)) {
            peer = m;
          }
        }
        if (!all) peer = -1;
      }
      if (peer >= 0) {
        crawling.push_back({r, peer});
        continue;
      }
    }
    by_cause[cause].push_back(r);
  }
  for (const auto& [r, p] : crawling) {
    bool known = false;  // the other side of the same crawling transfer
    for (const auto& [r2, p2] : crawling) known |= r2 == p && p2 == r && r2 < r;
    if (known) continue;
    const Rank& R = ranks[r];
    const FlightEntry& b = *R.blocking;
    const bool p2p = tracer::IsP2P(b.op);
    const bool recv = b.op == OpType::kRecv;
    const auto seq = static_cast<int64_t>(b.seq);
    Verdict v = recv || !p2p ? link_verdict(p, r, seq, b.op, R.blocking_group, 0.7)
                             : link_verdict(r, p, seq, b.op, R.blocking_group, 0.7);
    const std::string doing =
        p2p ? std::string(recv ? "receiving #" : "sending #") + std::to_string(b.seq) + " in " +
                  std::string(R.blocking_group) + (recv ? " from " : " to ") + ranks[p].Describe() +
                  ", both sides posted"
            : "in " + OpName(b, R.blocking_group) + ", which every member has joined, with " +
                  ranks[p].Describe();
    v.explanation = R.Describe() + " is not stuck in compute: it is " + doing +
                    ", while the job stopped advancing: the data crawls. " +
                    "Suspect the link between " + v.root_nodes[0] + " and " + v.root_nodes[1] +
                    ". Waiting on it: " + wait_lines(r) + ".";
    v.evidence.push_back("open " + OpName(b, R.blocking_group) + ", " + R.Doing(now));
    out.push_back(std::move(v));
  }
  // A rank that has not joined, alive, on a host at one end of a stalled link is behind because of
  // that link (its last transfer over it crawled): it is evidence of the link, not a root.
  if (auto nj = by_cause.find(Cause::kRankNotJoined); nj != by_cause.end()) {
    std::vector<int> kept;
    for (int r : nj->second) {
      Verdict* link = nullptr;
      for (Verdict& v : out) {
        if (ParseCause(v.cause) == Cause::kLinkStall &&
            std::find(v.root_nodes.begin(), v.root_nodes.end(), node_of(r)) != v.root_nodes.end())
          link = &v;
      }
      if (link == nullptr) {
        kept.push_back(r);
        continue;
      }
      link->evidence.push_back(ranks[r].Describe() + " has not joined what its peers wait in (" +
                               wait_lines(r) + "): it is behind the same link");
      for (int w : waiters_of({r})) {
        if (std::find(link->waiting_ranks.begin(), link->waiting_ranks.end(), w) ==
            link->waiting_ranks.end())
          link->waiting_ranks.push_back(w);
      }
      std::sort(link->waiting_ranks.begin(), link->waiting_ranks.end());
    }
    if (kept.empty())
      by_cause.erase(nj);
    else
      nj->second = kept;
  }
  for (const auto& [cause, roots] : by_cause) {
    Verdict v = base(cause);
    std::set<int> root_set(roots.begin(), roots.end());
    std::string text;
    for (int r : roots) {
      v.root_ranks.push_back(r);
      v.root_nodes.push_back(node_of(r));
      const Rank& R = ranks[r];
      // What the others wait for from this rank.
      // What the others wait for from this rank: the same collective, or its side of a transfer.
      std::string awaited;
      for (const WaitEdge& x : waits) {
        if (x.to != r) continue;
        const FlightEntry& w = *ranks[x.from].blocking;
        const std::string g(ranks[x.from].blocking_group);
        if (w.op == OpType::kRecv)
          awaited =
              "send #" + std::to_string(w.seq) + " in " + g + " to rank " + std::to_string(x.from);
        else if (w.op == OpType::kSend)
          awaited = "recv #" + std::to_string(w.seq) + " in " + g + " from rank " +
                    std::to_string(x.from);
        else
          awaited = OpName(w, g);
        break;
      }
      if (v.group.empty()) {
        for (const WaitEdge& x : waits) {
          if (x.to != r) continue;
          const Rank& W = ranks[x.from];
          v.group = W.blocking_group;
          v.seq = static_cast<int64_t>(W.blocking->seq);
          v.op = std::string(tracer::Name(W.blocking->op));
          break;
        }
      }
      if (!text.empty()) text += " ";
      if (cause == Cause::kRankDead) {
        text += R.Describe() + " is dead: " + why[r] + (R.present ? "; " + R.Doing(now) : "") + ".";
      } else if (not_started.count(r)) {
        text += R.Describe() + " issued " + OpName(*R.blocking, R.blocking_group) +
                " but its device never started it, while its peers' devices did: the device is "
                "stuck in work of its own before it; " +
                R.Doing(now) + ".";
        v.mismatch = std::string(Name(MismatchKind::kState));
      } else {
        text += R.Describe() + " is alive but never issued " + awaited + "; " + R.Doing(now) + ".";
      }
      text += " Waiting on it: " + wait_lines(r) + ".";
      v.evidence.push_back(R.Describe() + (R.present ? " from " + R.source : ""));
    }
    v.waiting_ranks = waiters_of(root_set);
    v.confidence = cause == Cause::kRankDead ? 0.95 : 0.9;
    v.explanation = text;
    out.push_back(std::move(v));
  }
  // 4. Nothing moves, every rank waits where its own period says it should, and every stuck op
  // that crosses hosts crosses the link of one host (or of one pair): that link carries nothing --
  // a dead link seen from the ops (no transfer recorded partial progress to show it). Ranks behind
  // it wait in different groups, which would otherwise read as a cycle of mismatched order.
  // `at_sinks`: only the ranks whose wait leads nowhere -- in a collective every member joined,
  // that still does not finish. Everyone else waits on them (transitively), so only their ops say
  // where the stall is; a joined collective that stops across hosts is the link's doing, whatever
  // order the ranks behind it wait in.
  auto dead_link = [&](bool at_sinks) -> bool {
    std::optional<std::set<std::string>> common;
    std::vector<int> stuck;
    for (int r : waiting) {
      if (at_sinks && (!sinks.count(r) || explained.count(r))) continue;
      const Rank& R = ranks[r];
      if (R.blocking == nullptr) continue;
      std::set<std::string> hosts = {node_of(r)};
      if (tracer::IsP2P(R.blocking->op)) {
        if (R.blocking->peer >= 0 && R.blocking->peer < n) hosts.insert(node_of(R.blocking->peer));
      } else {
        for (int m : R.dump->snapshot.groups[R.blocking_index].ranks) {
          if (m >= 0 && m < n) hosts.insert(node_of(m));
        }
      }
      if (hosts.size() < 2) continue;  // inside one host: no link crossed
      stuck.push_back(r);
      if (!common) {
        common = hosts;
      } else {
        std::set<std::string> both;
        std::set_intersection(common->begin(), common->end(), hosts.begin(), hosts.end(),
                              std::inserter(both, both.end()));
        common = std::move(both);
      }
    }
    if (common && !common->empty() && common->size() <= 2 && stuck.size() >= 2) {
      Verdict v = base(Cause::kLinkStall);
      std::string where;
      for (const std::string& h : *common) {
        for (int r : stuck) {
          if (node_of(r) == h) {
            v.root_ranks.push_back(r);
            v.root_nodes.push_back(h);
            break;
          }
        }
        where += (where.empty() ? "" : " and ") + h;
      }
      if (!v.root_ranks.empty()) {
        for (int r : waiting) {
          if (std::find(v.root_ranks.begin(), v.root_ranks.end(), r) == v.root_ranks.end())
            v.waiting_ranks.push_back(r);
        }
        const Rank& first = ranks[stuck[0]];
        v.group = first.blocking_group;
        v.seq = static_cast<int64_t>(first.blocking->seq);
        v.op = std::string(tracer::Name(first.blocking->op));
        v.confidence = 0.7;
        v.explanation =
            std::to_string(stuck.size()) + " ranks wait in ops across hosts that every member " +
            (at_sinks ? "joined (every other waiting rank waits on them)" : "joined or waits for") +
            ", and every one of those ops crosses the link of " + where +
            ": nothing moves over it. Suspect " +
            (common->size() == 1 ? "the link of " + where : "the link between " + where) + ".";
        v.evidence.push_back(std::to_string(stuck.size()) + " stuck cross-host ops, all via " +
                             where);
        out.push_back(std::move(v));
      }
    }
    return !out.empty();
  };
  // 5. Ranks waiting on each other in a cycle: someone issued collectives in another order --
  // unless the waits end in joined collectives that stopped across one link (a lossy link makes
  // every rank wait somewhere, in an order a short history can take for a deviation).
  if (out.empty() && !waits.empty()) dead_link(/*at_sinks=*/true);
  if (out.empty() && !waits.empty()) {
    std::vector<int> deviators;
    std::string text;
    for (int r : waiting) {
      const Rank& R = ranks[r];
      if (R.blocking == nullptr || tracer::IsP2P(R.blocking->op)) continue;
      // Training is periodic: what did this rank do one period ago at this point?
      // What it issued before its blocking op (behind a device queue, later ops follow it).
      const RankOps::Array<int32_t>& all = R.ops->history;
      std::vector<int32_t> h(all.begin(),
                             all.begin() + static_cast<std::ptrdiff_t>(
                                               std::min(R.ops->history_at_blocking, all.size())));
      if (!h.empty() && h.back() == R.blocking_index) h.pop_back();
      const size_t len = h.size();
      // The period: the smallest P for which the whole recorded history repeats itself.
      for (size_t p = 1; p <= std::min<size_t>(256, len / 2); ++p) {
        bool periodic = true;
        for (size_t i = p; i < len && periodic; ++i) periodic = h[i] == h[i - p];
        if (!periodic) continue;
        if (h[len - p] != R.blocking_index) {
          const std::string& expected = R.dump->snapshot.groups[h[len - p]].name;
          deviators.push_back(r);
          text += R.Describe() + " issued " + OpName(*R.blocking, R.blocking_group) +
                  " where its own pattern expects a collective in " + expected + " next. ";
        }
        break;
      }
    }
    // A history too short to show the job's period (the first iterations) makes every rank look
    // like a deviator: that names no one.
    size_t considered = 0;
    for (int r : waiting) {
      considered += ranks[r].blocking != nullptr && !tracer::IsP2P(ranks[r].blocking->op);
    }
    if (!deviators.empty() && deviators.size() == considered) {
      deviators.clear();
      text.clear();
    }
    if (deviators.empty() && !dead_link(false)) {
      // No periodic history (a deadlock in the first iterations): the ranks stuck in the group
      // fewer of the cycle's ranks are stuck in took the other order. With no smaller side
      // (one rank against one), nobody is named: the cycle is reported as unknown with its ranks.
      std::map<std::string, std::vector<int>> stuck_in;
      for (int r : waiting) {
        const Rank& R = ranks[r];
        if (R.blocking != nullptr && !tracer::IsP2P(R.blocking->op))
          stuck_in[std::string(R.blocking_group)].push_back(r);
      }
      if (stuck_in.size() > 1) {
        size_t fewest = SIZE_MAX;
        for (const auto& [g, who] : stuck_in) fewest = std::min(fewest, who.size());
        for (const auto& [g, who] : stuck_in) {
          if (who.size() != fewest) continue;
          for (int r : who) {
            deviators.push_back(r);
            text += ranks[r].Describe() + " waits in " +
                    OpName(*ranks[r].blocking, ranks[r].blocking_group) + ", while " +
                    std::to_string(waiting.size() - who.size()) +
                    " of the ranks it waits with wait in another group first. ";
          }
        }
        if (deviators.size() == waiting.size()) deviators.clear();  // no side is smaller
      }
    }
    if (!deviators.empty()) {
      Verdict v = base(Cause::kOrderMismatch);
      std::set<int> roots(deviators.begin(), deviators.end());
      for (int r : deviators) {
        v.root_ranks.push_back(r);
        v.root_nodes.push_back(node_of(r));
      }
      v.waiting_ranks = waiters_of(roots);
      for (int r : waiting) {
        if (!roots.count(r) &&
            std::find(v.waiting_ranks.begin(), v.waiting_ranks.end(), r) == v.waiting_ranks.end()) {
          v.waiting_ranks.push_back(r);
        }
      }
      std::sort(v.waiting_ranks.begin(), v.waiting_ranks.end());
      v.group = ranks[deviators[0]].blocking_group;
      v.seq = static_cast<int64_t>(ranks[deviators[0]].blocking->seq);
      v.op = std::string(tracer::Name(ranks[deviators[0]].blocking->op));
      v.confidence = 0.8;
      v.explanation = text + "Ranks wait on each other in a cycle.";
      out.push_back(std::move(v));
    }
  }
  if (out.empty() && waits.empty()) dead_link(false);  // everyone joined everything
  if (out.empty() && (!waits.empty() || !waiting.empty() || failed_seen)) {
    Verdict v = base(Cause::kUnknown);
    for (int r : waiting) v.waiting_ranks.push_back(r);
    v.confidence = 0.3;
    v.explanation = std::to_string(waiting.size()) + " ranks have waited longer than " +
                    Fmt("%.0f", opt.min_wait_s) +
                    " s, but every member joined their ops and no transfer shows partial progress.";
    for (int r : waiting) {
      v.evidence.push_back(ranks[r].Describe() + " in " +
                           OpName(*ranks[r].blocking, ranks[r].blocking_group));
      if (v.evidence.size() >= 8) break;
    }
    out.push_back(std::move(v));
  }
  if (out.empty()) {
    Verdict v;
    v.kind = VerdictKind::kHealthy;
    v.detected_at_ns = detected;
    v.confidence = 0.9;
    v.explanation = "no rank has waited longer than " + Fmt("%.0f", opt.min_wait_s) +
                    " s in an operation; nothing is hung.";
    out.push_back(std::move(v));
  }
  // Where the blocked ops' data waits, when the writer could tell (NCCL's proxy steps): on the
  // rank's own GPU, or on its peer and the network.
  for (Verdict& v : out) {
    if (v.kind != VerdictKind::kHang) continue;
    std::vector<int> who(v.root_ranks.begin(), v.root_ranks.end());
    who.insert(who.end(), v.waiting_ranks.begin(), v.waiting_ranks.end());
    int said = 0;
    for (int r : who) {
      if (r < 0 || r >= n || ranks[r].blocking == nullptr || said >= 4) continue;
      const tracer::WaitSide w = ranks[r].blocking->waiting_on;
      if (w != tracer::WaitSide::kGpu && w != tracer::WaitSide::kNetwork) continue;
      ++said;
      v.evidence.push_back(ranks[r].Describe() + " in " +
                           OpName(*ranks[r].blocking, ranks[r].blocking_group) +
                           (w == tracer::WaitSide::kGpu
                                ? ": its data waits on its own GPU (NCCL proxy step)"
                                : ": its data waits on the network side, for its peer or the "
                                  "link (NCCL proxy step)"));
    }
  }
  // What the ranks' stacks say, beside the wait-for graph: the rank doing what no other does.
  if (const std::string odd = OddStackEvidence(in, GroupByStack(in)); !odd.empty()) {
    for (Verdict& v : out) {
      if (v.kind == VerdictKind::kHang) v.evidence.push_back(odd);
    }
  }
  if (wait_for != nullptr) *wait_for = std::move(waits);
  return out;
}

std::string FormatHangReport(const std::vector<Verdict>& verdicts) {
  std::string out;
  for (const Verdict& v : verdicts) {
    if (v.kind == VerdictKind::kHealthy) {
      out += "healthy: " + v.explanation + "\n";
      continue;
    }
    std::string roots;
    for (size_t i = 0; i < v.root_ranks.size(); ++i) {
      roots += (i ? ", " : "") + std::to_string(v.root_ranks[i]) + " (" + v.root_nodes[i] + ")";
    }
    out += "HANG  cause: " + v.cause + (roots.empty() ? "" : "   root: rank " + roots) + "\n";
    if (!v.group.empty())
      out += "  at: " + v.op + " #" + std::to_string(v.seq) + " in " + v.group + "\n";
    out += "  " + v.explanation + "\n";
    if (!v.waiting_ranks.empty())
      out += "  ranks waiting behind it: " + std::to_string(v.waiting_ranks.size()) + "\n";
    if (!v.mismatch.empty()) out += "  mismatch: " + v.mismatch + "\n";
    for (const std::string& e : v.evidence) {
      if (e.rfind("stacks: ", 0) == 0) out += "  " + e + "\n";
      if (e.rfind("pytorch: ", 0) == 0) out += "  " + e.substr(9) + "\n";  // as PyTorch says it
    }
  }
  return out;
}

}  // namespace megascope::analyzer
