// Private: the state AnalyzeHang's phases share, and the phases themselves. AnalyzeHang
// (analyzer/src/hang.cc) is their driver:
//   LoadRanks          the ranks' dumps, where each waits, and the analysis' "now";
//   BuildWaitGraph     (wait_graph.cc) who waits on whom, the stalled links and the mismatched
//                      collectives met on the way;
//   NameOpMismatches   1. different ops at one sequence number (links.cc);
//   NameStalledLinks   2. both sides posted, the data stopped (links.cc);
//   NameRoots          3. the ranks the waits end at: dead, never joined, or a crawling link
//                      (roots.cc);
//   NameCycle          4-5. a dead link seen from the ops, or ranks waiting in a cycle (cycles.cc);
//   Conclude           nothing named: unknown or healthy; then the evidence every hang verdict
//                      carries (cycles.cc).
// Each phase reads what the ones before it left in HangAnalysis and adds its own; none reads a
// clock, a file or a global.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "megascope/analyzer/hang.h"

namespace megascope::analyzer::hang {

using tracer::FlightEntry;
using tracer::OpState;
using tracer::OpType;
using Collective = RankOps::Collective;
using Transfer = RankOps::Transfer;

// a - b, saturated: the times of a dump are whatever its writer put there (a fuzzer found an
// overflow in the time an op had waited).
inline int64_t Minus(int64_t a, int64_t b) {
  int64_t r = 0;
  if (!__builtin_sub_overflow(a, b, &r)) return r;
  return b < 0 ? std::numeric_limits<int64_t>::max() : std::numeric_limits<int64_t>::min();
}

template <typename Op>  // a FlightEntry or a Collective
bool IsOpen(const Op& e) {
  return e.state != OpState::kCompleted;
}

// "allreduce #24 in dp.0.0", "send #3 in pp.0 to rank 5".
std::string OpName(const FlightEntry& e, std::string_view group);

// The rank's index of its group `name` (of two of one name, the later), -1 if it has none.
int32_t GroupOf(const RankOps& ops, const std::vector<tracer::GroupInfo>& groups,
                std::string_view name);

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
    return hang::GroupOf(*ops, dump->snapshot.groups, name);
  }
  // Ranks that never issued anything in a group still count as having issued nothing (-1).
  int64_t LastColl(std::string_view group) const {
    const int32_t g = GroupOf(group);
    return g < 0 ? -1 : ops->last_coll[g];
  }
  // The rank's collective `seq` in `group`, and the one it issued before it in that group.
  std::pair<const Collective*, const Collective*> CollAt(std::string_view group, int64_t seq) const;
  // Its transfer `seq` with `peer` in `group`, of `in` (its sends or its recvs).
  const Transfer* Find(const RankOps::Array<Transfer>& in, std::string_view group, int peer,
                       int64_t seq) const;
  // How many transfers of `in` (sends or recvs) it issued with `peer` in `group`: one past the
  // newest seq.
  int64_t Issued(const RankOps::Array<Transfer>& in, std::string_view group, int peer) const;
  const std::string& GroupName(const FlightEntry& e) const {
    return dump->snapshot.groups[e.group].name;
  }
  // "rank 5 (node1, dp=1 pp=0 tp=1)".
  std::string Describe() const;
  // What its recorder says it was doing at `now`.
  std::string Doing(int64_t now) const;
  // The members of the group it waits in.
  const tracer::RankList& BlockingMembers() const {
    return dump->snapshot.groups[blocking_index].ranks;
  }
};

// megascope's rule for the members of a collective (HangOptions::matcher unset).
MemberComparison CompareSignatures(const std::vector<Rank>& ranks, std::string_view group,
                                   int64_t seq, const std::vector<int>& members);

// A collective whose members issued different ops.
struct Mismatch {
  std::string group;
  int64_t seq;
  MemberComparison how;
};
// A stalled link: its ends, the transfer or collective it stalled in, and what moved.
struct Link {
  int sender, receiver;
  std::string group;
  int64_t seq;
  OpType op;
  uint64_t bytes;
  int64_t sent, received;  // -1: unknown
};
// Who has and has not issued one collective someone waits in, and how those that did compare.
struct CollectiveState {
  std::vector<int> missing;      // members that have not issued it
  std::vector<int> behind;       // members that issued it behind an older open op of their own
  std::vector<int> completed;    // members for whom it completed
  std::vector<int> not_started;  // members whose device never started it while others' did
  MemberComparison comparison;   // how the members that issued it compare
  bool reported = false;         // its mismatch is in `mismatches`
};
using CollectiveKey = std::pair<std::string_view, int64_t>;  // (group, seq)

struct HangAnalysis {
  HangAnalysis(const HangInput& input, const HangOptions& options)
      : in(input), opt(options), n(input.world_size) {}

  const HangInput& in;
  const HangOptions& opt;
  const int n;
  // LoadRanks
  std::vector<Rank> ranks;
  int64_t now = 0;  // the newest dump's time, on rank 0's clock
  // BuildWaitGraph
  std::vector<WaitEdge> waits;
  std::map<int, std::set<int>> edges;
  std::vector<Mismatch> mismatches;
  std::vector<Link> links;
  std::set<int> waiting;
  // Members that issued an op their peers' devices started, while theirs never did: a device
  // stuck in something else (with timing on, PyTorch's `started` of a kernel that began).
  std::set<int> not_started;
  std::map<CollectiveKey, CollectiveState> collectives;
  int64_t onset = 0;
  bool failed_seen = false;
  std::map<int, std::vector<int>> waited_by;  // target -> ranks waiting on it
  // The verdicts, and the ranks they explain
  std::vector<Verdict> out;
  std::set<int> explained;
  // NameStalledLinks
  int64_t freshest = 0;  // the freshest heartbeat, on rank 0's clock
  std::set<int> frozen;
  // NameRoots
  std::set<int> sinks;        // where the wait-for edges end, and the frozen ranks
  std::set<int> uncollected;  // sinks without a dump, taken as not collected (absent_not_collected)

  // Who has and has not issued `key`'s collective of `members`, worked out once per key.
  const CollectiveState& StateOf(const CollectiveKey& key, const tracer::RankList& members);
  // A hang verdict of `cause` with the times every one carries.
  Verdict Base(Cause cause) const;
  std::string NodeOf(int r) const;
  // Everyone who waits on `roots`, directly or through others, sorted.
  std::vector<int> WaitersOf(const std::set<int>& roots) const;
  // The first four waits on `root`, readable.
  std::string WaitLines(int root) const;
  // A stalled link between the ends `from` -> `to`, at `seq` (a transfer's `op`, or a
  // collective's) in `group`: the fields every link_stall verdict shares.
  Verdict LinkVerdict(int from, int to, int64_t seq, OpType op, std::string_view group,
                      double confidence) const;
  // How much older rank `r`'s heartbeat is than the freshest.
  int64_t HeartbeatLag(int r) const;
};

void LoadRanks(HangAnalysis& a);
void BuildWaitGraph(HangAnalysis& a);
void NameOpMismatches(HangAnalysis& a);
void NameStalledLinks(HangAnalysis& a);
void NameRoots(HangAnalysis& a);
void NameCycle(HangAnalysis& a);
void Conclude(HangAnalysis& a);

}  // namespace megascope::analyzer::hang
