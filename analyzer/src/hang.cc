#include "megascope/analyzer/hang.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iterator>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include "format.h"
#include "megascope/analyzer/stacks.h"
#include "parallel.h"

namespace megascope::analyzer {
namespace {

namespace fs = std::filesystem;
using tracer::FlightEntry;
using tracer::OpState;
using tracer::OpType;

bool IsOpen(const FlightEntry& e) { return e.state != OpState::kCompleted; }

// What every member of a collective must agree on: op, size and dtype -- but not the size of an
// all-to-all, whose per-rank splits may legally differ.
std::tuple<int, uint64_t, int> Signature(const FlightEntry& e) {
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

// A map built once and then only read: a sorted vector (a rank's entries are hundreds of
// insertions; 12,288 ranks' are millions). Of a key added twice, the last value is kept.
template <typename K, typename V>
class SortedMap {
 public:
  using const_iterator = typename std::vector<std::pair<K, V>>::const_iterator;
  void Add(const K& k, V v) { items_.emplace_back(k, v); }
  void Seal() {
    std::stable_sort(items_.begin(), items_.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    auto last = std::unique(items_.rbegin(), items_.rend(),
                            [](const auto& a, const auto& b) { return a.first == b.first; });
    items_.erase(items_.begin(), last.base());
  }
  const_iterator Begin() const { return items_.begin(); }
  const_iterator End() const { return items_.end(); }
  const_iterator Find(const K& k) const {
    auto it = std::lower_bound(items_.begin(), items_.end(), k,
                               [](const auto& a, const K& b) { return a.first < b; });
    return it != items_.end() && it->first == k ? it : items_.end();
  }
  const V& At(const K& k) const {
    auto it = Find(k);
    if (it == End()) throw std::out_of_range("SortedMap::At");
    return it->second;
  }

 private:
  std::vector<std::pair<K, V>> items_;
};

// Everything the analysis needs of one rank, indexed.
struct Rank {
  int id = 0;
  bool present = false, alive = false;
  const tracer::Dump* dump = nullptr;
  std::string source;
  int64_t offset = 0;  // clock offset to rank 0
  // Keys view the group names of `dump` (alive as long as the input).
  std::map<std::string_view, const tracer::GroupInfo*> groups;
  std::map<std::string_view, int64_t> last_coll;  // group -> max collective seq issued
  SortedMap<std::pair<std::string_view, int64_t>, const FlightEntry*> coll;
  SortedMap<std::tuple<std::string_view, int, int64_t>, const FlightEntry*> sends,
      recvs;  // (group, peer, seq)
  std::map<std::pair<std::string_view, int>, int64_t> sends_issued,
      recvs_issued;                       // (group, peer) -> count
  std::vector<std::string_view> history;  // group names of collectives, in issue order
  const FlightEntry* blocking = nullptr;
  std::string_view blocking_group;
  size_t history_at_blocking = 0;

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
    if (hb.updated_at_ns == 0 &&
        !dump->snapshot.entries.empty()) {  // a recorder without heartbeats
      const FlightEntry& e = dump->snapshot.entries.back();
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

struct Wait {
  int from, to;
  std::string what;  // the op `from` is in
  double seconds;
};

}  // namespace

Result<HangInput> MakeHangInput(std::vector<std::pair<std::string, tracer::Dump>> dumps) {
  if (dumps.empty()) return InvalidArgument("no flight-recorder dumps to analyse");
  HangInput in;
  std::map<std::string, std::pair<tracer::RankList, std::string>>
      membership;  // group -> ranks, first source
  for (auto& [source, d] : dumps) {
    const auto& info = d.snapshot.info;
    if (in.world_size != 0 && info.world_size != in.world_size) {
      return InvalidArgument(source + ": world_size " + std::to_string(info.world_size) +
                             " disagrees with " + std::to_string(in.world_size) +
                             " in the other dumps");
    }
    in.world_size = info.world_size;
    for (const auto& g : d.snapshot.groups) {
      auto [it, added] = membership.try_emplace(g.name, g.ranks, source);
      if (!added && it->second.first != g.ranks) {
        return InvalidArgument("group '" + g.name + "' has different members in " + source +
                               " and " + it->second.second);
      }
    }
  }
  // Unknown values (a newer writer's phase, op, state or dtype): once per field and value.
  struct Seen {
    int dumps = 0;
    std::string first;
  };
  std::map<std::pair<std::string, std::string>, Seen> unknown;
  for (const auto& [source, d] : dumps) {
    std::set<std::pair<std::string, std::string>> here;
    for (const tracer::UnknownValue& u : d.unknown_values) {
      Seen& s = unknown[{u.field, u.value}];
      if (s.first.empty()) s.first = source + ": " + u.where;
      if (here.insert({u.field, u.value}).second) ++s.dumps;
    }
  }
  for (const auto& [key, s] : unknown) {
    in.warnings.push_back("unknown " + key.first + " '" + key.second + "' in " +
                          std::to_string(s.dumps) + (s.dumps == 1 ? " dump" : " dumps") +
                          " (first: " + s.first + "): read as unknown, the analysis goes on");
  }
  in.ranks.resize(in.world_size);
  for (auto& entry : dumps) {
    RankView& v = in.ranks[entry.second.snapshot.info.rank];
    if (v.present && v.dump.dumped_at_ns >= entry.second.dumped_at_ns)
      continue;  // keep the newest dump of a rank
    v.present = true;
    v.source = std::move(entry.first);
    v.dump = std::move(entry.second);
  }
  return in;
}

Result<HangInput> LoadDumpDirectory(const std::string& path) {
  if (!fs::is_directory(path)) return NotFound(path + " is not a directory");
  std::string dir = path;
  if (fs::is_directory(path + "/dumps")) {  // a run directory: its newest attempt
    int best = -1;
    for (const auto& e : fs::directory_iterator(path + "/dumps")) {
      const std::string n = e.path().filename().string();
      if (n.rfind("attempt_", 0) == 0) best = std::max(best, std::atoi(n.c_str() + 8));
    }
    if (best < 0) return NotFound(path + "/dumps holds no attempt_* directory");
    dir = path + "/dumps/attempt_" + std::to_string(best);
  }
  std::vector<std::pair<std::string, tracer::Dump>> dumps;
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() == ".json") files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) return NotFound("no flight-recorder dumps (*.json) in " + dir);
  // Read and parsed on every core: a 12,288-rank job's directory is about a gigabyte.
  std::vector<std::optional<Result<tracer::Dump>>> read(files.size());
  ParallelFor(files.size(), std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 8),
              [&](size_t i) { read[i] = tracer::ReadDumpFile(files[i]); });
  dumps.reserve(files.size());
  for (size_t i = 0; i < files.size(); ++i) {
    if (!read[i]->ok()) return read[i]->status();  // the first bad file in name order
    dumps.emplace_back(std::move(files[i]), std::move(*read[i]).value());
  }
  return MakeHangInput(std::move(dumps));
}

std::vector<Verdict> AnalyzeHang(const HangInput& in, const HangOptions& opt) {
  const int n = in.world_size;
  std::vector<Rank> ranks(n);
  int64_t now = 0;
  for (int r = 0; r < n; ++r) {
    Rank& R = ranks[r];
    R.id = r;
    const RankView& v = in.ranks[r];
    if (!v.present) continue;
    R.present = true;
    R.alive = v.dump.alive;
    R.dump = &v.dump;
    R.source = v.source;
    R.offset = v.dump.snapshot.info.clock_offset_ns;
    now = std::max(now, v.dump.dumped_at_ns - R.offset);
    for (const auto& g : v.dump.snapshot.groups) R.groups[g.name] = &g;
    for (const FlightEntry& e : v.dump.snapshot.entries) {
      const std::string& g = R.GroupName(e);
      if (e.op == OpType::kSend) {
        R.sends.Add({g, e.peer, static_cast<int64_t>(e.seq)}, &e);
        auto& c = R.sends_issued[{g, e.peer}];
        c = std::max(c, static_cast<int64_t>(e.seq) + 1);
      } else if (e.op == OpType::kRecv) {
        R.recvs.Add({g, e.peer, static_cast<int64_t>(e.seq)}, &e);
        auto& c = R.recvs_issued[{g, e.peer}];
        c = std::max(c, static_cast<int64_t>(e.seq) + 1);
      } else {
        R.coll.Add({g, static_cast<int64_t>(e.seq)}, &e);
        auto [it, added] = R.last_coll.try_emplace(g, static_cast<int64_t>(e.seq));
        if (!added) it->second = std::max(it->second, static_cast<int64_t>(e.seq));
        R.history.push_back(g);
      }
      // Entries are in issue order: the newest open op is where a rank's thread waits; behind a
      // device queue (NCCL), the oldest open op is the one everything after it waits for.
      if (IsOpen(e) && (R.blocking == nullptr || !R.dump->oldest_open_blocks)) {
        R.blocking = &e;
        R.blocking_group = g;
        R.history_at_blocking = R.history.size();  // the collectives issued up to it
      }
    }
    R.coll.Seal();
    R.sends.Seal();
    R.recvs.Seal();
  }
  // Ranks that never issued anything in a group still count as having issued nothing (-1).
  auto last_coll = [&](const Rank& R, std::string_view g) {
    auto it = R.last_coll.find(g);
    return it == R.last_coll.end() ? int64_t{-1} : it->second;
  };
  auto issued = [](const std::map<std::pair<std::string_view, int>, int64_t>& m, std::string_view g,
                   int peer) {
    auto it = m.find({g, peer});
    return it == m.end() ? int64_t{0} : it->second;
  };

  std::vector<Wait> waits;
  std::map<int, std::set<int>> edges;
  struct Mismatch {
    std::string group;
    int64_t seq;
    std::vector<int> ranks;  // the odd ones out
    std::string expected, found;
  };
  std::vector<Mismatch> mismatches;
  struct Link {
    int sender, receiver;
    const FlightEntry *send, *recv;
    std::string group;
  };
  std::vector<Link> links;
  std::set<int> waiting;
  struct CollectiveState {
    std::vector<int> missing;    // members that have not issued it
    std::vector<int> behind;     // members that issued it behind an older open op of their own
    std::vector<int> completed;  // members for whom it completed
    std::map<std::tuple<int, uint64_t, int>, std::vector<int>>
        signatures;  // (op, bytes, dtype) -> members
    bool examined = false;
  };
  std::map<std::pair<std::string_view, int64_t>, CollectiveState> collectives;
  int64_t onset = 0;
  bool failed_seen = false;

  for (Rank& R : ranks) {
    if (!R.present || R.blocking == nullptr) continue;
    const FlightEntry& b = *R.blocking;
    const int64_t start = (b.started_at_ns ? b.started_at_ns : b.enqueued_at_ns) - R.offset;
    const int64_t end = b.state == OpState::kFailed && b.completed_at_ns
                            ? b.completed_at_ns - R.offset
                            : R.dump->dumped_at_ns - R.offset;
    // An op without times (rebuilt from a PyTorch dump's pg_status counters) has waited at least
    // as long as the dump says it hung; it sets no onset.
    const bool timed = b.started_at_ns != 0 || b.enqueued_at_ns != 0;
    const double waited = timed ? static_cast<double>(end - start) / 1e9 : opt.min_wait_s;
    failed_seen |= b.state == OpState::kFailed;
    // Still working: open for less than the wait that makes a hang, or less than the op's own
    // timeout when that is shorter (a job with a 1-s collective timeout hangs after 1 s).
    const double min_wait = b.timeout_ms > 0
                                ? std::min(opt.min_wait_s, static_cast<double>(b.timeout_ms) / 1e3)
                                : opt.min_wait_s;
    if (b.state != OpState::kFailed && waited < min_wait) continue;
    waiting.insert(R.id);
    if (timed) onset = onset == 0 ? start : std::min(onset, start);
    const std::string what = OpName(b, R.blocking_group);
    auto wait_on = [&](int m) {
      edges[R.id].insert(m);
      waits.push_back({R.id, m, what, waited});
    };
    auto git = R.groups.find(R.blocking_group);
    if (git == R.groups.end()) continue;
    const auto& members = git->second->ranks;
    if (tracer::IsP2P(b.op)) {
      const int p = b.peer;
      if (p < 0 || p >= n) continue;
      const Rank& P = ranks[p];
      const bool recv = b.op == OpType::kRecv;
      if (!P.present) {
        wait_on(p);
        continue;
      }
      const int64_t counterpart = recv ? issued(P.sends_issued, R.blocking_group, R.id)
                                       : issued(P.recvs_issued, R.blocking_group, R.id);
      if (counterpart < static_cast<int64_t>(b.seq) + 1) {
        wait_on(p);  // the peer has not reached its side of this transfer
        continue;
      }
      // Both sides posted: the bytes did not make it across.
      const auto& other = recv ? P.sends : P.recvs;
      auto it = other.Find({R.blocking_group, R.id, static_cast<int64_t>(b.seq)});
      const FlightEntry* oe = it == other.End() ? nullptr : it->second;
      Link l{recv ? p : R.id, recv ? R.id : p, recv ? oe : &b, recv ? &b : oe,
             std::string(R.blocking_group)};
      bool known = false;
      for (const Link& x : links) known |= x.sender == l.sender && x.receiver == l.receiver;
      if (!known) links.push_back(l);
      continue;
    }
    // A collective: who has not issued this sequence number, and who issued something else. Every
    // member waiting in the same (group, seq) shares the answer, so it is worked out once.
    const auto key = std::make_pair(R.blocking_group, static_cast<int64_t>(b.seq));
    auto cached = collectives.find(key);
    if (cached == collectives.end()) {
      CollectiveState cs;
      for (int m : members) {
        if (m < 0 || m >= n) continue;
        const Rank& M = ranks[m];
        if (!M.present || last_coll(M, R.blocking_group) < static_cast<int64_t>(b.seq)) {
          cs.missing.push_back(m);
          continue;
        }
        // Issued, but queued on its device behind an older op of its own that has not finished:
        // it cannot join this one before that one.
        if (M.dump->oldest_open_blocks && M.blocking != nullptr &&
            (M.blocking_group != R.blocking_group ||
             M.blocking->seq != static_cast<uint64_t>(b.seq))) {
          auto own = M.coll.Find(key);
          if (own != M.coll.End() && IsOpen(*own->second)) cs.behind.push_back(m);
        }
        auto it = M.coll.Find(key);
        // Finished on a member while others still wait in it: the others' data from that member
        // stopped on the way (a collective's stalled link).
        if (it != M.coll.End() && it->second->state == OpState::kCompleted)
          cs.completed.push_back(m);
        // An op or dtype this build does not know (a newer writer) is no evidence of a mismatch.
        if (it != M.coll.End() && it->second->op != OpType::kUnknown &&
            it->second->dtype != tracer::DType::kUnknown) {
          const FlightEntry& e = *it->second;
          cs.signatures[Signature(e)].push_back(m);
        }
      }
      cached = collectives.emplace(key, std::move(cs)).first;
    }
    for (int m : cached->second.missing) {
      if (m != R.id) wait_on(m);
    }
    if (cached->second.missing.empty()) {
      for (int m : cached->second.completed) {
        if (m == R.id) continue;
        Link l{m, R.id, ranks[m].coll.At(key), &b, std::string(R.blocking_group)};
        bool known = false;
        for (const Link& x : links)
          known |= (x.sender == m && x.receiver == R.id) || (x.sender == R.id && x.receiver == m);
        if (!known) links.push_back(l);
      }
    }
    for (int m : cached->second.behind) {
      if (m != R.id) wait_on(m);
    }
    if (cached->second.examined) continue;
    cached->second.examined = true;
    const auto& signatures = cached->second.signatures;
    if (signatures.size() > 1) {
      // Who departs: a rank whose op here differs from its own previous op in this group (it took
      // another code path); failing that, the minority.
      std::map<std::tuple<int, uint64_t, int>, int>
          departs;  // signature -> members departing from their past
      for (const auto& [sig, who] : signatures) {
        for (int m : who) {
          const Rank& M = ranks[m];
          auto it = M.coll.Find({R.blocking_group, static_cast<int64_t>(b.seq)});
          if (it == M.coll.Begin() || it == M.coll.End()) continue;
          auto prev = std::prev(it);
          if (prev->first.first == R.blocking_group && Signature(*prev->second) != sig)
            ++departs[sig];
        }
      }
      auto majority =
          std::max_element(signatures.begin(), signatures.end(), [&](const auto& a, const auto& c) {
            if (departs[a.first] != departs[c.first]) return departs[a.first] > departs[c.first];
            return a.second.size() < c.second.size();
          });
      auto sig_text = [](const std::tuple<int, uint64_t, int>& s) {
        return std::string(tracer::Name(static_cast<OpType>(std::get<0>(s)))) + " of " +
               std::to_string(std::get<1>(s)) + " bytes " +
               std::string(tracer::Name(static_cast<tracer::DType>(std::get<2>(s))));
      };
      for (const auto& [sig, who] : signatures) {
        if (sig == majority->first) continue;
        bool known = false;
        for (const Mismatch& x : mismatches)
          known |= x.group == R.blocking_group && x.seq == static_cast<int64_t>(b.seq);
        if (!known)
          mismatches.push_back({std::string(R.blocking_group), static_cast<int64_t>(b.seq), who,
                                sig_text(majority->first), sig_text(sig)});
      }
    }
  }

  std::vector<Verdict> out;
  const int64_t detected = now;
  auto base = [&](const std::string& cause) {
    Verdict v;
    v.kind = "hang";
    v.cause = cause;
    v.detected_at_ns = detected;
    v.onset_at_ns = onset;
    return v;
  };
  auto node_of = [&](int r) {
    return ranks[r].present ? ranks[r].dump->snapshot.info.node : std::string("?");
  };
  std::map<int, std::vector<int>> waited_by;  // target -> ranks waiting on it
  for (const Wait& x : waits) waited_by[x.to].push_back(x.from);
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
    for (const Wait& x : waits) {
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
  auto link_verdict = [&](int from, int to, const FlightEntry& e, std::string_view group,
                          double confidence) {
    Verdict v = base("link_stall");
    v.root_ranks = {from, to};
    v.root_nodes = {node_of(from), node_of(to)};
    v.group = group;
    v.seq = static_cast<int64_t>(e.seq);
    v.op = tracer::IsP2P(e.op) ? "send" : std::string(tracer::Name(e.op));
    v.waiting_ranks = waiters_of({from, to});
    v.confidence = confidence;
    return v;
  };

  // 1. Different ops at the same sequence number.
  for (const Mismatch& m : mismatches) {
    Verdict v = base("op_mismatch");
    std::set<int> roots(m.ranks.begin(), m.ranks.end());
    for (int r : m.ranks) {
      v.root_ranks.push_back(r);
      v.root_nodes.push_back(node_of(r));
      explained.insert(r);
    }
    v.group = m.group;
    v.seq = m.seq;
    v.op = m.found.substr(0, m.found.find(' '));
    v.waiting_ranks = waiters_of(roots);
    v.confidence = 0.95;
    v.explanation = ranks[m.ranks[0]].Describe() + " issued " + m.found + " as #" +
                    std::to_string(m.seq) + " in " + m.group + " where its peers issued " +
                    m.expected + "; it took another code path.";
    v.evidence.push_back("group " + m.group + " seq " + std::to_string(m.seq) + ": expected " +
                         m.expected + ", found " + m.found);
    out.push_back(std::move(v));
  }
  // 2. Stalled links: both sides posted, the data stopped.
  for (const Link& l : links) {
    const FlightEntry* e = l.recv ? l.recv : l.send;
    const bool p2p = tracer::IsP2P(e->op);
    Verdict v = link_verdict(l.sender, l.receiver, *e, l.group, 0.85);
    auto bytes = [](int64_t b) { return b < 0 ? std::string("unknown") : std::to_string(b); };
    const std::string sent = l.send ? bytes(l.send->bytes_sent) : "unknown";
    const std::string got = l.recv ? bytes(l.recv->bytes_received) : "unknown";
    const std::string suspect =
        " Suspect the link between " + node_of(l.sender) + " and " + node_of(l.receiver) + ".";
    v.explanation =
        p2p ? "the transfer #" + std::to_string(e->seq) + " in " + l.group + " from " +
                  ranks[l.sender].Describe() + " to " + ranks[l.receiver].Describe() +
                  " stalled: both sides joined, " + sent + " of " + std::to_string(e->bytes) +
                  " bytes sent and " + got + " received." + suspect
            : ranks[l.sender].Describe() + " completed " + v.op + " #" + std::to_string(e->seq) +
                  " in " + l.group + " but " + ranks[l.receiver].Describe() +
                  " still waits in it: its data stopped on the way." + suspect;
    v.evidence.push_back("bytes_sent=" + sent + " bytes_received=" + got + " of " +
                         std::to_string(e->bytes));
    if (!v.waiting_ranks.empty())
      v.evidence.push_back(std::to_string(v.waiting_ranks.size()) + " ranks wait behind it");
    explained.insert(l.sender);
    explained.insert(l.receiver);
    out.push_back(std::move(v));
  }
  // 3. The ranks at the end of the wait-for edges.
  int64_t freshest = 0;
  for (const Rank& R : ranks) {
    if (R.present)
      freshest = std::max(freshest, R.dump->snapshot.heartbeat.updated_at_ns - R.offset);
  }
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
  std::map<std::string, std::vector<int>> by_cause;
  std::vector<std::pair<int, int>> crawling;  // (rank, peer): a transfer moving too slowly
  std::map<int, std::string> why;
  for (int r : sinks) {
    // Explained already, or itself stuck in an op every peer joined (a link or an unknown case).
    if (explained.count(r) || waiting.count(r)) continue;
    const Rank& R = ranks[r];
    std::string cause = "rank_not_joined";
    if (!R.present) {
      cause = "rank_dead";
      why[r] = "left no flight recorder";
    } else if (!R.alive) {
      cause = "rank_dead";
      why[r] = "its process is gone";
    } else if (freshest - (R.dump->snapshot.heartbeat.updated_at_ns - R.offset) >
               static_cast<int64_t>(opt.stale_heartbeat_s * 1e9)) {
      cause = "rank_dead";
      why[r] = "its heartbeat is " +
               Fmt("%.0f", static_cast<double>(
                               freshest - (R.dump->snapshot.heartbeat.updated_at_ns - R.offset)) /
                               1e9) +
               " s older than its peers'";
    }
    // Alive, and not stuck in compute: moving a transfer whose other side is posted, on another
    // host, just not for long enough to count as a wait. Its data crawls over the link (a lossy
    // link retransmitting, a link far below its rate): the link is the root, not the rank.
    if (cause == "rank_not_joined" && R.blocking != nullptr) {
      const FlightEntry& b = *R.blocking;
      int peer = -1;  // the other side, on another host, that has posted its part
      if (tracer::IsP2P(b.op)) {
        const int p = b.peer;
        if (p >= 0 && p < n && ranks[p].present && node_of(p) != node_of(r)) {
          const bool recv = b.op == OpType::kRecv;
          const int64_t counterpart = recv ? issued(ranks[p].sends_issued, R.blocking_group, r)
                                           : issued(ranks[p].recvs_issued, R.blocking_group, r);
          if (counterpart >= static_cast<int64_t>(b.seq) + 1) peer = p;
        }
      } else if (auto git = R.groups.find(R.blocking_group); git != R.groups.end()) {
        // A collective every member has issued, with a member on another host.
        bool all = true;
        for (int m : git->second->ranks) {
          if (m < 0 || m >= n || !ranks[m].present ||
              last_coll(ranks[m], R.blocking_group) < static_cast<int64_t>(b.seq)) {
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
    Verdict v = recv || !p2p ? link_verdict(p, r, b, R.blocking_group, 0.7)
                             : link_verdict(r, p, b, R.blocking_group, 0.7);
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
  if (auto nj = by_cause.find("rank_not_joined"); nj != by_cause.end()) {
    std::vector<int> kept;
    for (int r : nj->second) {
      Verdict* link = nullptr;
      for (Verdict& v : out) {
        if (v.cause == "link_stall" &&
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
      for (const Wait& x : waits) {
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
        for (const Wait& x : waits) {
          if (x.to != r) continue;
          const Rank& W = ranks[x.from];
          v.group = W.blocking_group;
          v.seq = static_cast<int64_t>(W.blocking->seq);
          v.op = std::string(tracer::Name(W.blocking->op));
          break;
        }
      }
      if (!text.empty()) text += " ";
      if (cause == "rank_dead") {
        text += R.Describe() + " is dead: " + why[r] + (R.present ? "; " + R.Doing(now) : "") + ".";
      } else {
        text += R.Describe() + " is alive but never issued " + awaited + "; " + R.Doing(now) + ".";
      }
      text += " Waiting on it: " + wait_lines(r) + ".";
      v.evidence.push_back(R.Describe() + (R.present ? " from " + R.source : ""));
    }
    v.waiting_ranks = waiters_of(root_set);
    v.confidence = cause == "rank_dead" ? 0.95 : 0.9;
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
      } else if (auto git = R.groups.find(R.blocking_group); git != R.groups.end()) {
        for (int m : git->second->ranks) {
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
      Verdict v = base("link_stall");
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
      std::vector<std::string> h(R.history.begin(),
                                 R.history.begin() + static_cast<std::ptrdiff_t>(std::min(
                                                         R.history_at_blocking, R.history.size())));
      if (!h.empty() && h.back() == R.blocking_group) h.pop_back();
      const size_t len = h.size();
      // The period: the smallest P for which the whole recorded history repeats itself.
      for (size_t p = 1; p <= std::min<size_t>(256, len / 2); ++p) {
        bool periodic = true;
        for (size_t i = p; i < len && periodic; ++i) periodic = h[i] == h[i - p];
        if (!periodic) continue;
        const std::string& expected = h[len - p];
        if (expected != R.blocking_group) {
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
      Verdict v = base("order_mismatch");
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
    Verdict v = base("unknown");
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
    v.kind = "healthy";
    v.detected_at_ns = detected;
    v.confidence = 0.9;
    v.explanation = "no rank has waited longer than " + Fmt("%.0f", opt.min_wait_s) +
                    " s in an operation; nothing is hung.";
    out.push_back(std::move(v));
  }
  // What the ranks' stacks say, beside the wait-for graph: the rank doing what no other does.
  if (const std::string odd = OddStackEvidence(in, GroupByStack(in)); !odd.empty()) {
    for (Verdict& v : out) {
      if (v.kind == "hang") v.evidence.push_back(odd);
    }
  }
  return out;
}

std::string FormatHangReport(const std::vector<Verdict>& verdicts) {
  std::string out;
  for (const Verdict& v : verdicts) {
    if (v.kind == "healthy") {
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
    for (const std::string& e : v.evidence) {
      if (e.rfind("stacks: ", 0) == 0) out += "  " + e + "\n";
    }
  }
  return out;
}

}  // namespace megascope::analyzer
