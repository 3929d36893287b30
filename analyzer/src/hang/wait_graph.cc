// BuildWaitGraph: from where every rank waits, who it waits on (the wait-for edges), the links
// whose both sides posted while the data stopped, and the collectives whose members issued
// different ops.
#include <algorithm>

#include "analysis.h"

namespace megascope::analyzer::hang {

const CollectiveState& HangAnalysis::StateOf(const CollectiveKey& key,
                                             const tracer::RankList& members) {
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
  cs.comparison = opt.matcher ? opt.matcher(key.first, key.second, issued)
                              : CompareSignatures(ranks, key.first, key.second, issued);
  if (cs.missing.empty() && cs.completed.empty() && started > 0 && cs.comparison.states_compared &&
      cs.comparison.odd.empty()) {
    for (int m : enqueued) {  // not behind an older op of its own: its device is elsewhere
      if (std::find(cs.behind.begin(), cs.behind.end(), m) == cs.behind.end())
        cs.not_started.push_back(m);
    }
  }
  return collectives.emplace(key, std::move(cs)).first->second;
}

namespace {

// How long rank R has waited in its blocking op, in seconds; negative when it is still working:
// open for less than the wait that makes a hang, or less than the op's own timeout when that is
// shorter (a job with a 1-s collective timeout hangs after 1 s) -- unless it waits on a rank that
// is gone without a dump. `start`: when the wait began, on rank 0's clock.
double Waited(const HangAnalysis& a, const Rank& R, int64_t& start) {
  const FlightEntry& b = *R.blocking;
  start = Minus(b.started_at_ns ? b.started_at_ns : b.enqueued_at_ns, R.offset);
  const int64_t end = b.state == OpState::kFailed && b.completed_at_ns
                          ? Minus(b.completed_at_ns, R.offset)
                          : Minus(R.dump->dumped_at_ns, R.offset);
  // An op without times (rebuilt from a PyTorch dump's pg_status counters) has waited at least
  // as long as the dump says it hung; it sets no onset.
  const bool timed = b.started_at_ns != 0 || b.enqueued_at_ns != 0;
  const double waited = timed ? static_cast<double>(Minus(end, start)) / 1e9 : a.opt.min_wait_s;
  const double min_wait = b.timeout_ms > 0
                              ? std::min(a.opt.min_wait_s, static_cast<double>(b.timeout_ms) / 1e3)
                              : a.opt.min_wait_s;
  if (b.state == OpState::kFailed || waited >= min_wait) return waited;
  bool on_absent = false;
  if (a.opt.absent_is_gone && tracer::IsP2P(b.op)) {
    on_absent = b.peer >= 0 && b.peer < a.n && !a.ranks[b.peer].present;
  } else if (a.opt.absent_is_gone) {
    for (int m : R.BlockingMembers()) on_absent |= m >= 0 && m < a.n && !a.ranks[m].present;
  }
  return on_absent ? waited : -1;
}

void WaitOn(HangAnalysis& a, const Rank& R, int m, const std::string& what, double waited) {
  a.edges[R.id].insert(m);
  a.waits.push_back({R.id, m, what, waited});
}

// R waits in a transfer: on its peer until the peer posted its side, else on the link.
void WaitInTransfer(HangAnalysis& a, const Rank& R, const std::string& what, double waited) {
  const FlightEntry& b = *R.blocking;
  const int p = b.peer;
  if (p < 0 || p >= a.n) return;
  const Rank& P = a.ranks[p];
  const bool recv = b.op == OpType::kRecv;
  if (!P.present) return WaitOn(a, R, p, what, waited);
  const int64_t counterpart = recv ? P.Issued(P.ops->sends, R.blocking_group, R.id)
                                   : P.Issued(P.ops->recvs, R.blocking_group, R.id);
  if (counterpart < static_cast<int64_t>(b.seq) + 1)
    return WaitOn(a, R, p, what, waited);  // the peer has not reached its side of this transfer
  const Transfer* other = P.Find(recv ? P.ops->sends : P.ops->recvs, R.blocking_group, R.id,
                                 static_cast<int64_t>(b.seq));
  // Posted but open, queued on the peer's device behind an older op of its own that has not
  // finished: the peer cannot reach it before that one.
  const bool peer_at_it = P.blocking != nullptr && tracer::IsP2P(P.blocking->op) &&
                          P.blocking->peer == R.id && P.blocking_group == R.blocking_group &&
                          P.blocking->seq == b.seq;
  if (P.dump->oldest_open_blocks && other != nullptr && other->open && !peer_at_it)
    return WaitOn(a, R, p, what, waited);
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
  for (const Link& x : a.links) known |= x.sender == l.sender && x.receiver == l.receiver;
  if (!known) a.links.push_back(l);
}

// R waits in a collective: on who has not issued this sequence number, who issued it behind an
// older op of its own or whose device never started it; a member that completed it beside R is
// a stalled link; members that issued something else are a mismatch.
void WaitInCollective(HangAnalysis& a, const Rank& R, const CollectiveKey& key,
                      const CollectiveState& cs, const std::string& what, double waited) {
  const FlightEntry& b = *R.blocking;
  for (int m : cs.missing) {
    if (m != R.id) WaitOn(a, R, m, what, waited);
  }
  // Members that issued something else explain the wait; a completed member beside them is no
  // stalled link, nor is one whose writer does not compare states.
  const bool matched = cs.comparison.odd.empty();
  if (cs.missing.empty() && matched && cs.comparison.states_compared) {
    for (int m : cs.completed) {
      if (m == R.id) continue;
      const Collective* sent = a.ranks[m].CollAt(key.first, key.second).first;
      Link l{m,    R.id,    std::string(R.blocking_group),    key.second,
             b.op, b.bytes, a.ranks[m].ops->BytesSent(*sent), b.bytes_received};
      bool known = false;
      for (const Link& x : a.links)
        known |= (x.sender == m && x.receiver == R.id) || (x.sender == R.id && x.receiver == m);
      if (!known) a.links.push_back(l);
    }
  }
  for (int m : cs.behind) {
    if (m != R.id) WaitOn(a, R, m, what, waited);
  }
  for (int m : cs.not_started) {
    a.not_started.insert(m);
    if (m != R.id) WaitOn(a, R, m, what, waited);
  }
  if (matched || cs.reported) return;
  a.collectives[key].reported = true;
  a.mismatches.push_back({std::string(R.blocking_group), key.second, cs.comparison});
}

}  // namespace

void BuildWaitGraph(HangAnalysis& a) {
  for (const Rank& R : a.ranks) {
    if (!R.present || R.blocking == nullptr) continue;
    const FlightEntry& b = *R.blocking;
    a.failed_seen |= b.state == OpState::kFailed;
    int64_t start = 0;
    const double waited = Waited(a, R, start);
    if (waited < 0) continue;
    const bool p2p = tracer::IsP2P(b.op);
    const CollectiveKey key(R.blocking_group, static_cast<int64_t>(b.seq));
    const CollectiveState* cs = p2p ? nullptr : &a.StateOf(key, R.BlockingMembers());
    // Completed by a member, in a collective whose members' states its writer does not compare:
    // the op moves.
    if (cs != nullptr && !cs->comparison.states_compared && !cs->completed.empty()) continue;
    a.waiting.insert(R.id);
    if (b.started_at_ns != 0 || b.enqueued_at_ns != 0)
      a.onset = a.onset == 0 ? start : std::min(a.onset, start);
    const std::string what = OpName(b, R.blocking_group);
    if (p2p) {
      WaitInTransfer(a, R, what, waited);
    } else {
      WaitInCollective(a, R, key, *cs, what, waited);
    }
  }
  for (const WaitEdge& x : a.waits) a.waited_by[x.to].push_back(x.from);
}

}  // namespace megascope::analyzer::hang
