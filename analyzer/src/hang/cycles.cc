// Phases 4 and 5, and the conclusion: a dead link seen from the ops, ranks waiting on each other
// in a cycle, and when nothing is named, an unknown hang or a healthy job.
#include <algorithm>
#include <cstdint>
#include <iterator>
#include <optional>

#include "../format.h"
#include "analysis.h"
#include "megascope/analyzer/stacks.h"
#include "megascope/tracer/enum_names.h"

namespace megascope::analyzer::hang {
namespace {

// The hosts rank R's blocking op crosses: its own, and its peer's or its members'.
std::set<std::string> HostsOf(const HangAnalysis& a, const Rank& R) {
  std::set<std::string> hosts = {a.NodeOf(R.id)};
  if (tracer::IsP2P(R.blocking->op)) {
    if (R.blocking->peer >= 0 && R.blocking->peer < a.n) hosts.insert(a.NodeOf(R.blocking->peer));
  } else {
    for (int m : R.BlockingMembers()) {
      if (m >= 0 && m < a.n) hosts.insert(a.NodeOf(m));
    }
  }
  return hosts;
}

// 4. Nothing moves, every rank waits where its own period says it should, and every stuck op that
// crosses hosts crosses the link of one host (or of one pair): that link carries nothing -- a
// dead link seen from the ops (no transfer recorded partial progress to show it). Ranks behind it
// wait in different groups, which would otherwise read as a cycle of mismatched order.
// `at_sinks`: only the ranks whose wait leads nowhere -- in a collective every member joined,
// that still does not finish. Everyone else waits on them (transitively), so only their ops say
// where the stall is; a joined collective that stops across hosts is the link's doing, whatever
// order the ranks behind it wait in. Returns whether any verdict is out.
bool NameDeadLink(HangAnalysis& a, bool at_sinks) {
  std::optional<std::set<std::string>> common;
  std::vector<int> stuck;
  for (int r : a.waiting) {
    if (at_sinks && (!a.sinks.count(r) || a.explained.count(r))) continue;
    const Rank& R = a.ranks[r];
    if (R.blocking == nullptr) continue;
    const std::set<std::string> hosts = HostsOf(a, R);
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
  if (!common || common->empty() || common->size() > 2 || stuck.size() < 2) return !a.out.empty();
  Verdict v = a.Base(Cause::kLinkStall);
  std::string where;
  for (const std::string& h : *common) {
    for (int r : stuck) {
      if (a.NodeOf(r) == h) {
        v.root_ranks.push_back(r);
        v.root_nodes.push_back(h);
        break;
      }
    }
    where += (where.empty() ? "" : " and ") + h;
  }
  if (v.root_ranks.empty()) return !a.out.empty();
  for (int r : a.waiting) {
    if (std::find(v.root_ranks.begin(), v.root_ranks.end(), r) == v.root_ranks.end())
      v.waiting_ranks.push_back(r);
  }
  const Rank& first = a.ranks[stuck[0]];
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
  v.evidence.push_back(std::to_string(stuck.size()) + " stuck cross-host ops, all via " + where);
  a.out.push_back(std::move(v));
  return true;
}

// Training is periodic: the waiting ranks whose blocking collective is not what their own
// recorded history says comes next. `text` gets why, rank by rank.
std::vector<int> PeriodDeviators(const HangAnalysis& a, std::string& text) {
  std::vector<int> deviators;
  for (int r : a.waiting) {
    const Rank& R = a.ranks[r];
    if (R.blocking == nullptr || tracer::IsP2P(R.blocking->op)) continue;
    // What it issued before its blocking op (behind a device queue, later ops follow it).
    const RankOps::Array<int32_t>& all = R.ops->history;
    std::vector<int32_t> h(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(std::min(
                                                          R.ops->history_at_blocking, all.size())));
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
  for (int r : a.waiting) {
    considered += a.ranks[r].blocking != nullptr && !tracer::IsP2P(a.ranks[r].blocking->op);
  }
  if (!deviators.empty() && deviators.size() == considered) {
    deviators.clear();
    text.clear();
  }
  return deviators;
}

// No periodic history (a deadlock in the first iterations): the ranks stuck in the group fewer of
// the cycle's ranks are stuck in took the other order. With no smaller side (one rank against
// one), nobody is named: the cycle is reported as unknown with its ranks.
std::vector<int> MinorityDeviators(const HangAnalysis& a, std::string& text) {
  std::vector<int> deviators;
  std::map<std::string, std::vector<int>> stuck_in;
  for (int r : a.waiting) {
    const Rank& R = a.ranks[r];
    if (R.blocking != nullptr && !tracer::IsP2P(R.blocking->op))
      stuck_in[std::string(R.blocking_group)].push_back(r);
  }
  if (stuck_in.size() <= 1) return deviators;
  size_t fewest = SIZE_MAX;
  for (const auto& [g, who] : stuck_in) fewest = std::min(fewest, who.size());
  for (const auto& [g, who] : stuck_in) {
    if (who.size() != fewest) continue;
    for (int r : who) {
      deviators.push_back(r);
      text += a.ranks[r].Describe() + " waits in " +
              OpName(*a.ranks[r].blocking, a.ranks[r].blocking_group) + ", while " +
              std::to_string(a.waiting.size() - who.size()) +
              " of the ranks it waits with wait in another group first. ";
    }
  }
  if (deviators.size() == a.waiting.size()) deviators.clear();  // no side is smaller
  return deviators;
}

// Ranks each blocked in a send or receive whose peer has not posted its side of it, the peer
// itself blocked in a send or receive of its own, round to the first: each waits for a transfer
// the next cannot reach (a pipeline schedule in which both stages send first, or both receive
// first). None of them skipped anything; their order is wrong together, so all are named. The
// first such cycle, its ranks in order; `text` says how each waits.
std::vector<int> TransferCycle(const HangAnalysis& a, std::string& text) {
  for (int start : a.waiting) {
    std::vector<int> path = {start};
    for (int cur = start;;) {
      const Rank& R = a.ranks[cur];
      if (R.blocking == nullptr || !tracer::IsP2P(R.blocking->op)) break;
      const int peer = R.blocking->peer;
      auto e = a.edges.find(cur);
      if (peer < 0 || peer >= a.n || e == a.edges.end() || !e->second.count(peer) ||
          !a.ranks[peer].present)
        break;  // the peer posted its side (a link's matter) or is gone
      const auto at = std::find(path.begin(), path.end(), peer);
      if (at != path.end()) {
        std::vector<int> cycle(at, path.end());
        if (cycle.size() < 2) break;
        for (size_t i = 0; i < cycle.size(); ++i) {
          const Rank& X = a.ranks[cycle[i]];
          const Rank& Y = a.ranks[cycle[(i + 1) % cycle.size()]];
          text += X.Describe() + " waits in " + OpName(*X.blocking, X.blocking_group) +
                  ", which rank " + std::to_string(Y.id) + " cannot match: it waits in " +
                  OpName(*Y.blocking, Y.blocking_group) + " itself. ";
        }
        text +=
            "Each issued its transfers in an order its peer's cannot meet (both sending, or "
            "both receiving, first). ";
        return cycle;
      }
      path.push_back(peer);
      cur = peer;
    }
  }
  return {};
}

Verdict OrderVerdict(const HangAnalysis& a, const std::vector<int>& deviators,
                     const std::string& text) {
  Verdict v = a.Base(Cause::kOrderMismatch);
  std::set<int> roots(deviators.begin(), deviators.end());
  for (int r : deviators) {
    v.root_ranks.push_back(r);
    v.root_nodes.push_back(a.NodeOf(r));
  }
  v.waiting_ranks = a.WaitersOf(roots);
  for (int r : a.waiting) {
    if (!roots.count(r) &&
        std::find(v.waiting_ranks.begin(), v.waiting_ranks.end(), r) == v.waiting_ranks.end()) {
      v.waiting_ranks.push_back(r);
    }
  }
  std::sort(v.waiting_ranks.begin(), v.waiting_ranks.end());
  const Rank& first = a.ranks[deviators[0]];
  v.group = first.blocking_group;
  v.seq = static_cast<int64_t>(first.blocking->seq);
  v.op = std::string(tracer::Name(first.blocking->op));
  v.confidence = 0.8;
  v.explanation = text + "Ranks wait on each other in a cycle.";
  return v;
}

// Where the blocked ops' data waits, when the writer could tell (NCCL's proxy steps): on the
// rank's own GPU, or on its peer and the network.
void AddWaitSides(const HangAnalysis& a, Verdict& v) {
  std::vector<int> who(v.root_ranks.begin(), v.root_ranks.end());
  who.insert(who.end(), v.waiting_ranks.begin(), v.waiting_ranks.end());
  int said = 0;
  for (int r : who) {
    if (r < 0 || r >= a.n || a.ranks[r].blocking == nullptr || said >= 4) continue;
    const tracer::WaitSide w = a.ranks[r].blocking->waiting_on;
    if (w != tracer::WaitSide::kGpu && w != tracer::WaitSide::kNetwork) continue;
    ++said;
    v.evidence.push_back(
        a.ranks[r].Describe() + " in " + OpName(*a.ranks[r].blocking, a.ranks[r].blocking_group) +
        (w == tracer::WaitSide::kGpu ? ": its data waits on its own GPU (NCCL proxy step)"
                                     : ": its data waits on the network side, for its peer or the "
                                       "link (NCCL proxy step)"));
  }
}

}  // namespace

// 5. Ranks waiting on each other in a cycle: transfers posted in orders that cannot meet, or
// someone issued collectives in another order --
// unless the waits end in joined collectives that stopped across one link (a lossy link makes
// every rank wait somewhere, in an order a short history can take for a deviation).
void NameCycle(HangAnalysis& a) {
  // Waits that end at ranks whose dumps were not collected cannot be placed on a link or an order:
  // nothing here says where those ranks are.
  if (!a.out.empty() || !a.uncollected.empty()) return;
  if (a.waits.empty()) {  // everyone joined everything
    NameDeadLink(a, /*at_sinks=*/false);
    return;
  }
  if (NameDeadLink(a, /*at_sinks=*/true)) return;
  std::string text;
  if (std::vector<int> cycle = TransferCycle(a, text); !cycle.empty()) {
    std::sort(cycle.begin(), cycle.end());
    a.out.push_back(OrderVerdict(a, cycle, text));
    return;
  }
  std::vector<int> deviators = PeriodDeviators(a, text);
  if (deviators.empty() && !NameDeadLink(a, /*at_sinks=*/false))
    deviators = MinorityDeviators(a, text);
  if (!deviators.empty()) a.out.push_back(OrderVerdict(a, deviators, text));
}

void Conclude(HangAnalysis& a) {
  if (a.out.empty() && (!a.waits.empty() || !a.waiting.empty() || a.failed_seen)) {
    Verdict v = a.Base(Cause::kUnknown);
    for (int r : a.waiting) v.waiting_ranks.push_back(r);
    v.confidence = 0.3;
    v.explanation = std::to_string(a.waiting.size()) + " ranks have waited longer than " +
                    Fmt("%.0f", a.opt.min_wait_s) +
                    " s, but every member joined their ops and no transfer shows partial progress.";
    if (!a.uncollected.empty()) {
      std::string who;
      for (int r : a.uncollected) who += (who.empty() ? "" : ", ") + std::to_string(r);
      v.explanation = std::to_string(a.waiting.size()) + " ranks wait on rank(s) " + who +
                      ", whose dumps are not here; taken as not collected (not as gone), nothing "
                      "decides whether they are stuck, dead or slow: collect their dumps.";
      for (int r : a.uncollected) v.evidence.push_back("rank " + std::to_string(r) + ": no dump");
    }
    for (int r : a.waiting) {
      v.evidence.push_back(a.ranks[r].Describe() + " in " +
                           OpName(*a.ranks[r].blocking, a.ranks[r].blocking_group));
      if (v.evidence.size() >= 8) break;
    }
    a.out.push_back(std::move(v));
  }
  if (a.out.empty()) {
    Verdict v;
    v.kind = VerdictKind::kHealthy;
    v.detected_at_ns = a.now;
    v.confidence = 0.9;
    v.explanation = "no rank has waited longer than " + Fmt("%.0f", a.opt.min_wait_s) +
                    " s in an operation; nothing is hung.";
    a.out.push_back(std::move(v));
  }
  for (Verdict& v : a.out) {
    if (v.kind == VerdictKind::kHang) AddWaitSides(a, v);
  }
  // What the ranks' stacks say, beside the wait-for graph: the rank doing what no other does.
  if (const std::string odd = OddStackEvidence(a.in, GroupByStack(a.in)); !odd.empty()) {
    for (Verdict& v : a.out) {
      if (v.kind == VerdictKind::kHang) v.evidence.push_back(odd);
    }
  }
}

}  // namespace megascope::analyzer::hang
