// Plain, process-independent views of a rank's shared state: identity, groups, heartbeat and the
// flight recorder's last entries, all times in epoch ns. Taken by a rank (Tracer::Snapshot) or by
// a reader in another process (RingReader::Snapshot); dumped and parsed by dump.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "megascope/tracer/rank_list.h"
#include "megascope/tracer/records.h"

namespace megascope::tracer {

struct RankInfo {
  std::string job;
  std::string node;
  int32_t rank = 0;
  int32_t world_size = 1;
  int32_t local_rank = 0;
  int32_t attempt = 0;
  int32_t pid = 0;
  Coords coords;
  int64_t clock_offset_ns = 0;  // this rank's clock minus rank 0's, measured at rendezvous
};

struct GroupInfo {
  std::string name;  // e.g. "tp.0.1"
  std::string kind;  // dp, tp, pp, mp, world, ...
  RankList ranks;    // global ranks, in group order
};

struct HeartbeatState {
  int64_t step = 0;
  Phase phase = Phase::kInit;
  uint64_t op_entry_id = 0;  // newest flight-recorder entry not finished, 0 when none (derived)
  int64_t updated_at_ns = 0;
};

// One collective or p2p op. Times are epoch ns, 0 when not reached; bytes_* are -1 when unknown.
// Fields ordered widest first (80 bytes, not 96): live hang analysis of 100,000 ranks holds 25
// million of them.
struct FlightEntry {
  uint64_t id = 0;  // 1-based issue index on this rank
  uint64_t seq = 0;
  uint64_t bytes = 0;
  int64_t enqueued_at_ns = 0;
  int64_t started_at_ns = 0;
  int64_t completed_at_ns = 0;
  int64_t bytes_sent = -1;
  int64_t bytes_received = -1;
  int32_t group = 0;  // index into RankSnapshot::groups
  int32_t peer = -1;  // global rank for send/recv, -1 otherwise
  // The op's own collective timeout when the writer knows it (PyTorch), else 0; readers clamp it
  // to [0, kMaxTimeoutMs].
  int32_t timeout_ms = 0;
  OpType op = OpType::kAllreduce;
  DType dtype = DType::kF32;
  OpState state = OpState::kEnqueued;
  WaitSide waiting_on = WaitSide::kNone;  // an open op's, when the writer can tell
};
static_assert(sizeof(FlightEntry) == 80);
inline constexpr int32_t kMaxTimeoutMs = INT32_MAX;  // 24.8 days

struct RankSnapshot {
  RankInfo info;
  HeartbeatState heartbeat;
  std::vector<GroupInfo> groups;
  std::vector<FlightEntry> entries;  // oldest first
  uint64_t records_total = 0;        // records offered to the ring (written + dropped)
  uint64_t dropped_total = 0;        // records dropped because the ring was full
};

}  // namespace megascope::tracer
