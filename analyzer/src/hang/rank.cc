// The ranks as the analysis sees them, and the helpers every phase shares.
#include <algorithm>
#include <iterator>
#include <tuple>

#include "../format.h"
#include "analysis.h"
#include "megascope/tracer/enum_names.h"

namespace megascope::analyzer::hang {
namespace {

// What every member of a collective must agree on: op, size and dtype -- but not the size of an
// all-to-all, whose per-rank splits may legally differ.
std::tuple<int, uint64_t, int> Signature(const Collective& e) {
  return {static_cast<int>(e.op), e.op == OpType::kAlltoall ? 0 : e.bytes,
          static_cast<int>(e.dtype)};
}

}  // namespace

std::string OpName(const FlightEntry& e, std::string_view group) {
  std::string s =
      std::string(tracer::Name(e.op)) + " #" + std::to_string(e.seq) + " in " + std::string(group);
  if (e.peer >= 0)
    s += (e.op == OpType::kSend ? " to rank " : " from rank ") + std::to_string(e.peer);
  return s;
}

int32_t GroupOf(const RankOps& ops, const std::vector<tracer::GroupInfo>& groups,
                std::string_view name) {
  auto it = std::lower_bound(ops.by_name.begin(), ops.by_name.end(), name,
                             [&](int32_t g, std::string_view n) { return groups[g].name < n; });
  return it != ops.by_name.end() && groups[*it].name == name ? *it : -1;
}

std::pair<const Collective*, const Collective*> Rank::CollAt(std::string_view group,
                                                             int64_t seq) const {
  const int32_t g = GroupOf(group);
  if (g < 0) return {nullptr, nullptr};
  const auto first = ops->colls.begin() + ops->coll_start[g],
             last = ops->colls.begin() + ops->coll_start[g + 1];
  auto it =
      std::lower_bound(first, last, seq, [](const Collective& c, int64_t s) { return c.seq < s; });
  if (it == last || it->seq != seq) return {nullptr, nullptr};
  return {&*it, it != first ? &*std::prev(it) : nullptr};
}

const Transfer* Rank::Find(const RankOps::Array<Transfer>& in, std::string_view group, int peer,
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

int64_t Rank::Issued(const RankOps::Array<Transfer>& in, std::string_view group, int peer) const {
  const int32_t g = GroupOf(group);
  if (g < 0) return 0;
  auto it = std::upper_bound(
      in.begin(), in.end(), std::make_pair(g, peer),
      [](const auto& k, const Transfer& a) { return k < std::make_pair(a.group, a.peer); });
  if (it == in.begin() || std::prev(it)->group != g || std::prev(it)->peer != peer) return 0;
  const int64_t newest = std::prev(it)->seq;
  return newest < 0 ? 0 : (newest == INT64_MAX ? newest : newest + 1);
}

std::string Rank::Describe() const {
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

std::string Rank::Doing(int64_t now) const {
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

// Op, size and dtype must agree (an op or dtype this build does not know, from a newer writer, is
// no evidence). The largest agreeing set is the norm and everyone outside it departs; of two sets
// as large, the one whose members took another path than their own previous op in the group
// departs (one rank against one).
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

void LoadRanks(HangAnalysis& a) {
  a.ranks.resize(a.n);
  for (int r = 0; r < a.n; ++r) {
    Rank& R = a.ranks[r];
    R.id = r;
    const RankView& v = a.in.ranks[r];
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
  for (const Rank& R : a.ranks) {
    if (R.present) a.now = std::max(a.now, Minus(R.dump->dumped_at_ns, R.offset));
  }
}

Verdict HangAnalysis::Base(Cause cause) const {
  Verdict v;
  v.kind = VerdictKind::kHang;
  v.cause = Name(cause);
  v.detected_at_ns = now;
  v.onset_at_ns = onset;
  return v;
}

std::string HangAnalysis::NodeOf(int r) const {
  return ranks[r].present ? ranks[r].dump->snapshot.info.node : std::string("?");
}

std::vector<int> HangAnalysis::WaitersOf(const std::set<int>& roots) const {
  std::set<int> w;
  std::vector<int> todo(roots.begin(), roots.end());
  while (!todo.empty()) {  // iterative: chains can be long
    const int t = todo.back();
    todo.pop_back();
    auto it = waited_by.find(t);
    if (it == waited_by.end()) continue;
    for (int from : it->second) {
      if (!roots.count(from) && w.insert(from).second) todo.push_back(from);
    }
  }
  return std::vector<int>(w.begin(), w.end());
}

std::string HangAnalysis::WaitLines(int root) const {
  std::string s;
  int shown = 0, total = 0;
  for (const WaitEdge& x : waits) {
    if (x.to != root) continue;
    if (++total > 4) continue;
    ++shown;
    s += (s.empty() ? "" : "; ") + ranks[x.from].Describe() + " waits in " + x.what + " for " +
         Fmt("%.1f s", x.seconds);
  }
  if (total > shown) s += "; and " + std::to_string(total - shown) + " more";
  return s;
}

Verdict HangAnalysis::LinkVerdict(int from, int to, int64_t seq, OpType op, std::string_view group,
                                  double confidence) const {
  Verdict v = Base(Cause::kLinkStall);
  v.root_ranks = {from, to};
  v.root_nodes = {NodeOf(from), NodeOf(to)};
  v.group = group;
  v.seq = seq;
  v.op = tracer::IsP2P(op) ? "send" : std::string(tracer::Name(op));
  v.waiting_ranks = WaitersOf({from, to});
  v.confidence = confidence;
  return v;
}

int64_t HangAnalysis::HeartbeatLag(int r) const {
  return Minus(freshest, Minus(ranks[r].dump->snapshot.heartbeat.updated_at_ns, ranks[r].offset));
}

}  // namespace megascope::analyzer::hang
