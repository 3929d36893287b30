// Phases 1 and 2: collectives whose members issued different ops, and links whose both sides
// posted while the data stopped.
#include "analysis.h"
#include "megascope/tracer/enum_names.h"

namespace megascope::analyzer::hang {
namespace {

// Rank 4 (node1), rank 5 and 2 more.
std::string Who(const HangAnalysis& a, const std::vector<int>& ranks) {
  std::string who;
  for (size_t i = 0; i < ranks.size() && i < 4; ++i)
    who += (i ? (i + 1 == ranks.size() ? " and " : ", ") : "") + a.ranks[ranks[i]].Describe();
  if (ranks.size() > 4) who += " and " + std::to_string(ranks.size() - 4) + " more";
  return who;
}

// A rank whose process exists but whose heartbeat stopped while its peers' beat on is frozen
// (SIGSTOP, uninterruptible sleep, a stuck driver call): its transfers stop because it does, so
// it is a root itself (NameRoots), never one end of a stalled link.
void FindFrozen(HangAnalysis& a) {
  for (const Rank& R : a.ranks) {
    if (R.present)
      a.freshest = std::max(a.freshest, Minus(R.dump->snapshot.heartbeat.updated_at_ns, R.offset));
  }
  for (int r = 0; r < a.n; ++r) {
    if (a.ranks[r].present && a.ranks[r].alive &&
        a.HeartbeatLag(r) > static_cast<int64_t>(a.opt.stale_heartbeat_s * 1e9))
      a.frozen.insert(r);
  }
}

}  // namespace

// 1. Different ops at the same sequence number: the odd ones out, and everyone stuck in it.
void NameOpMismatches(HangAnalysis& a) {
  for (const Mismatch& m : a.mismatches) {
    Verdict v = a.Base(Cause::kOpMismatch);
    const std::vector<int>& odd = m.how.odd;
    std::set<int> roots(odd.begin(), odd.end());
    for (int r : odd) {
      v.root_ranks.push_back(r);
      v.root_nodes.push_back(a.NodeOf(r));
      a.explained.insert(r);
    }
    v.group = m.group;
    v.seq = m.seq;
    const Collective* found = a.ranks[odd[0]].CollAt(m.group, m.seq).first;
    v.op = found != nullptr ? std::string(tracer::Name(found->op)) : "";
    std::set<int> behind;
    for (int w : a.WaitersOf(roots)) behind.insert(w);
    for (int r : a.waiting) {
      if (!roots.count(r) && a.ranks[r].blocking_group == m.group &&
          static_cast<int64_t>(a.ranks[r].blocking->seq) == m.seq)
        behind.insert(r);
    }
    v.waiting_ranks.assign(behind.begin(), behind.end());
    v.mismatch = std::string(Name(m.how.kind));
    v.confidence = 0.95;
    v.explanation = Who(a, odd) + " issued " + m.how.found + " as #" + std::to_string(m.seq) +
                    " in " + m.group + " where " + (odd.size() == 1 ? "its" : "their") +
                    " peers issued " + m.how.expected + " (" + std::string(Name(m.how.kind)) +
                    "): a different code path.";
    v.evidence.push_back("group " + m.group + " seq " + std::to_string(m.seq) + ": expected " +
                         m.how.expected + ", found " + m.how.found);
    a.out.push_back(std::move(v));
  }
}

// 2. Stalled links: both sides posted, the data stopped.
void NameStalledLinks(HangAnalysis& a) {
  FindFrozen(a);
  for (const Link& l : a.links) {
    if (a.frozen.count(l.sender) || a.frozen.count(l.receiver)) continue;
    const bool p2p = tracer::IsP2P(l.op);
    Verdict v = a.LinkVerdict(l.sender, l.receiver, l.seq, l.op, l.group, 0.85);
    if (!p2p) v.mismatch = std::string(Name(MismatchKind::kState));  // completed on one, not both
    auto bytes = [](int64_t b) { return b < 0 ? std::string("unknown") : std::to_string(b); };
    const std::string sent = bytes(l.sent), got = bytes(l.received);
    const std::string suspect =
        " Suspect the link between " + a.NodeOf(l.sender) + " and " + a.NodeOf(l.receiver) + ".";
    const Rank &S = a.ranks[l.sender], &D = a.ranks[l.receiver];
    v.explanation = p2p ? "the transfer #" + std::to_string(l.seq) + " in " + l.group + " from " +
                              S.Describe() + " to " + D.Describe() +
                              " stalled: both sides joined, " + sent + " of " +
                              std::to_string(l.bytes) + " bytes sent and " + got + " received." +
                              suspect
                        : S.Describe() + " completed " + v.op + " #" + std::to_string(l.seq) +
                              " in " + l.group + " but " + D.Describe() +
                              " still waits in it: its data stopped on the way." + suspect;
    v.evidence.push_back("bytes_sent=" + sent + " bytes_received=" + got + " of " +
                         std::to_string(l.bytes));
    if (!v.waiting_ranks.empty())
      v.evidence.push_back(std::to_string(v.waiting_ranks.size()) + " ranks wait behind it");
    a.explained.insert(l.sender);
    a.explained.insert(l.receiver);
    a.out.push_back(std::move(v));
  }
}

}  // namespace megascope::analyzer::hang
