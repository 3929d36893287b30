// Phase 3: the ranks at the end of the wait-for edges, and the frozen ones wherever they wait --
// each dead, never joined, or one end of a link its data crawls over.
#include <algorithm>

#include "../format.h"
#include "analysis.h"
#include "megascope/tracer/enum_names.h"

namespace megascope::analyzer::hang {
namespace {

// Follows the edges from every waiting rank to the ranks that wait on nobody.
void FindSinks(HangAnalysis& a) {
  std::vector<char> seen(a.n, 0);
  std::vector<int> todo(a.waiting.begin(), a.waiting.end());
  while (!todo.empty()) {
    const int r = todo.back();
    todo.pop_back();
    if (seen[r]) continue;
    seen[r] = 1;
    auto it = a.edges.find(r);
    if (it == a.edges.end() || it->second.empty()) {
      a.sinks.insert(r);
      continue;
    }
    for (int m : it->second) todo.push_back(m);
  }
  a.sinks.insert(a.frozen.begin(), a.frozen.end());
}

// Rank r, alive and not stuck in compute, moving a transfer whose other side is posted, on
// another host, just not for long enough to count as a wait: that other side (-1: none). Its data
// crawls over the link (a lossy link retransmitting, a link far below its rate): the link is the
// root, not the rank.
int CrawlPeer(const HangAnalysis& a, int r) {
  const Rank& R = a.ranks[r];
  const FlightEntry& b = *R.blocking;
  int peer = -1;  // the other side, on another host, that has posted its part
  if (tracer::IsP2P(b.op)) {
    const int p = b.peer;
    if (p >= 0 && p < a.n && a.ranks[p].present && a.NodeOf(p) != a.NodeOf(r)) {
      const bool recv = b.op == OpType::kRecv;
      const Rank& P = a.ranks[p];
      const int64_t counterpart = recv ? P.Issued(P.ops->sends, R.blocking_group, r)
                                       : P.Issued(P.ops->recvs, R.blocking_group, r);
      if (counterpart >= static_cast<int64_t>(b.seq) + 1) peer = p;
    }
    return peer;
  }
  // A collective every member has issued, with a member on another host.
  for (int m : R.BlockingMembers()) {
    if (m < 0 || m >= a.n || !a.ranks[m].present ||
        a.ranks[m].LastColl(R.blocking_group) < static_cast<int64_t>(b.seq))
      return -1;
    if (peer < 0 && a.NodeOf(m) != a.NodeOf(r)) peer = m;
  }
  return peer;
}

// One link_stall verdict per transfer whose data crawls (of its two sides, once).
void NameCrawlingLinks(HangAnalysis& a, const std::vector<std::pair<int, int>>& crawling) {
  for (const auto& [r, p] : crawling) {
    bool known = false;  // the other side of the same crawling transfer
    for (const auto& [r2, p2] : crawling) known |= r2 == p && p2 == r && r2 < r;
    if (known) continue;
    const Rank& R = a.ranks[r];
    const FlightEntry& b = *R.blocking;
    const bool p2p = tracer::IsP2P(b.op);
    const bool recv = b.op == OpType::kRecv;
    const auto seq = static_cast<int64_t>(b.seq);
    Verdict v = recv || !p2p ? a.LinkVerdict(p, r, seq, b.op, R.blocking_group, 0.7)
                             : a.LinkVerdict(r, p, seq, b.op, R.blocking_group, 0.7);
    const std::string doing =
        p2p ? std::string(recv ? "receiving #" : "sending #") + std::to_string(b.seq) + " in " +
                  std::string(R.blocking_group) + (recv ? " from " : " to ") +
                  a.ranks[p].Describe() + ", both sides posted"
            : "in " + OpName(b, R.blocking_group) + ", which every member has joined, with " +
                  a.ranks[p].Describe();
    v.explanation = R.Describe() + " is not stuck in compute: it is " + doing +
                    ", while the job stopped advancing: the data crawls. " +
                    "Suspect the link between " + v.root_nodes[0] + " and " + v.root_nodes[1] +
                    ". Waiting on it: " + a.WaitLines(r) + ".";
    v.evidence.push_back("open " + OpName(b, R.blocking_group) + ", " + R.Doing(a.now));
    a.out.push_back(std::move(v));
  }
}

// A rank that has not joined, alive, on a host at one end of a stalled link is behind because of
// that link (its last transfer over it crawled): it is evidence of the link, not a root. Returns
// the ranks that stay roots.
std::vector<int> FoldIntoLinks(HangAnalysis& a, const std::vector<int>& not_joined) {
  std::vector<int> kept;
  for (int r : not_joined) {
    Verdict* link = nullptr;
    for (Verdict& v : a.out) {
      if (ParseCause(v.cause) == Cause::kLinkStall &&
          std::find(v.root_nodes.begin(), v.root_nodes.end(), a.NodeOf(r)) != v.root_nodes.end())
        link = &v;
    }
    if (link == nullptr) {
      kept.push_back(r);
      continue;
    }
    link->evidence.push_back(a.ranks[r].Describe() + " has not joined what its peers wait in (" +
                             a.WaitLines(r) + "): it is behind the same link");
    for (int w : a.WaitersOf({r})) {
      if (std::find(link->waiting_ranks.begin(), link->waiting_ranks.end(), w) ==
          link->waiting_ranks.end())
        link->waiting_ranks.push_back(w);
    }
    std::sort(link->waiting_ranks.begin(), link->waiting_ranks.end());
  }
  return kept;
}

// What the others wait for from rank r: the same collective, or its side of a transfer.
std::string Awaited(const HangAnalysis& a, int r) {
  for (const WaitEdge& x : a.waits) {
    if (x.to != r) continue;
    const FlightEntry& w = *a.ranks[x.from].blocking;
    const std::string g(a.ranks[x.from].blocking_group);
    if (w.op == OpType::kRecv)
      return "send #" + std::to_string(w.seq) + " in " + g + " to rank " + std::to_string(x.from);
    if (w.op == OpType::kSend)
      return "recv #" + std::to_string(w.seq) + " in " + g + " from rank " + std::to_string(x.from);
    return OpName(w, g);
  }
  return "";
}

// One verdict of `cause` naming `roots`; `why` says why a dead one is dead.
Verdict RootVerdict(const HangAnalysis& a, Cause cause, const std::vector<int>& roots,
                    const std::map<int, std::string>& why) {
  Verdict v = a.Base(cause);
  std::string text;
  for (int r : roots) {
    v.root_ranks.push_back(r);
    v.root_nodes.push_back(a.NodeOf(r));
    const Rank& R = a.ranks[r];
    if (v.group.empty()) {  // where the first waiter on it waits
      for (const WaitEdge& x : a.waits) {
        if (x.to != r) continue;
        const Rank& W = a.ranks[x.from];
        v.group = W.blocking_group;
        v.seq = static_cast<int64_t>(W.blocking->seq);
        v.op = std::string(tracer::Name(W.blocking->op));
        break;
      }
    }
    if (!text.empty()) text += " ";
    if (cause == Cause::kRankDead) {
      text +=
          R.Describe() + " is dead: " + why.at(r) + (R.present ? "; " + R.Doing(a.now) : "") + ".";
    } else if (a.not_started.count(r)) {
      text += R.Describe() + " issued " + OpName(*R.blocking, R.blocking_group) +
              " but its device never started it, while its peers' devices did: the device is "
              "stuck in work of its own before it; " +
              R.Doing(a.now) + ".";
      v.mismatch = std::string(Name(MismatchKind::kState));
    } else {
      text += R.Describe() + " is alive but never issued " + Awaited(a, r) + "; " + R.Doing(a.now) +
              ".";
    }
    text += " Waiting on it: " + a.WaitLines(r) + ".";
    v.evidence.push_back(R.Describe() + (R.present ? " from " + R.source : ""));
  }
  v.waiting_ranks = a.WaitersOf(std::set<int>(roots.begin(), roots.end()));
  v.confidence = cause == Cause::kRankDead ? 0.95 : 0.9;
  v.explanation = text;
  return v;
}

}  // namespace

void NameRoots(HangAnalysis& a) {
  FindSinks(a);
  std::map<Cause, std::vector<int>> by_cause;
  std::vector<std::pair<int, int>> crawling;  // (rank, peer): a transfer moving too slowly
  std::map<int, std::string> why;
  for (int r : a.sinks) {
    // Explained already, or itself stuck in an op every peer joined (a link or an unknown case)
    // -- unless its device never started what its peers' devices did.
    if (a.explained.count(r) ||
        (a.waiting.count(r) && !a.not_started.count(r) && !a.frozen.count(r)))
      continue;
    const Rank& R = a.ranks[r];
    Cause cause = Cause::kRankNotJoined;
    if (!R.present && a.opt.absent_not_collected) {
      a.uncollected.insert(r);  // nothing says whether it lives: Conclude says so
      continue;
    }
    if (!R.present) {
      cause = Cause::kRankDead;
      why[r] = "left no flight recorder";
    } else if (!R.alive) {
      cause = Cause::kRankDead;
      why[r] = "its process is gone";
    } else if (a.frozen.count(r)) {
      cause = Cause::kRankDead;
      why[r] = "its process exists but is frozen: its heartbeat is " +
               Fmt("%.0f", static_cast<double>(a.HeartbeatLag(r)) / 1e9) +
               " s older than its peers'";
    }
    if (cause == Cause::kRankNotJoined && R.blocking != nullptr && !a.not_started.count(r)) {
      if (const int peer = CrawlPeer(a, r); peer >= 0) {
        crawling.push_back({r, peer});
        continue;
      }
    }
    by_cause[cause].push_back(r);
  }
  NameCrawlingLinks(a, crawling);
  if (auto nj = by_cause.find(Cause::kRankNotJoined); nj != by_cause.end()) {
    nj->second = FoldIntoLinks(a, nj->second);
    if (nj->second.empty()) by_cause.erase(nj);
  }
  for (const auto& [cause, roots] : by_cause) a.out.push_back(RootVerdict(a, cause, roots, why));
}

}  // namespace megascope::analyzer::hang
