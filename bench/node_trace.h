// One node's last 10 minutes as its agent writes them into trace.db, through the real store: the
// node's ranks' 200-ms steps, each a forward span of 100 ms, 4 tensor-parallel all-reduces with the
// node and one data-parallel all-reduce across nodes (and, when asked, a heartbeat). What
// fleet_scale's SRE query and store_scale's ingest read.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "megascope/tracer/trace_store.h"

namespace megascope::bench {

inline constexpr int kNodeTpOps = 4;
inline constexpr int64_t kNodeStepNs = 200'000'000, kNodeSteps = 600 * 1000 / 200;

// Returns the records written.
inline Result<size_t> WriteTenMinutes(tracer::TraceStore& store, const std::string& job, int ranks,
                                      int world, int64_t now_ns, bool heartbeats) {
  constexpr int64_t kMs = 1000000;
  const std::vector<std::string> names = {"forward"};
  size_t rows = 0;
  for (int l = 0; l < ranks; ++l) {
    tracer::RankInfo info;
    info.job = job;
    info.node = "node0";
    info.rank = l;
    info.world_size = world;
    info.local_rank = l;
    info.coords = {0, 0, l};
    RETURN_IF_ERROR(store.UpsertRank(info));
    const std::vector<tracer::GroupInfo> groups = {{"tp.0", "tp", {}},
                                                   {"dp." + std::to_string(l), "dp", {}}};
    std::vector<tracer::Record> recs;
    for (int64_t step = 0; step < kNodeSteps; ++step) {
      const int64_t t0 = now_ns - kNodeSteps * kNodeStepNs + step * kNodeStepNs;
      const int64_t compute = 100 * kMs;
      tracer::Record span{};
      span.span = {tracer::RecordType::kSpan,
                   tracer::SpanKind::kForward,
                   0,
                   -1,
                   step,
                   t0,
                   t0 + compute,
                   0,
                   0,
                   0,
                   0,
                   0,
                   {}};
      recs.push_back(span);
      if (heartbeats) {
        tracer::Record hb{};
        hb.heartbeat.type = tracer::RecordType::kHeartbeat;
        hb.heartbeat.phase = tracer::Phase::kForward;
        hb.heartbeat.step = step;
        hb.heartbeat.ticks = t0;
        recs.push_back(hb);
      }
      for (int k = 0; k <= kNodeTpOps; ++k) {
        tracer::Record op{};
        auto& c = op.collective;
        c.type = tracer::RecordType::kCollective;
        c.op = tracer::OpType::kAllreduce;
        c.state = tracer::OpState::kCompleted;
        c.group = k < kNodeTpOps ? 0 : 1;
        c.peer = -1;
        c.seq =
            static_cast<uint64_t>(step * (k < kNodeTpOps ? kNodeTpOps : 1) + (k % kNodeTpOps) + 1);
        c.bytes = 8 << 20;
        c.enqueued_ticks = t0 + compute + k * kMs;
        c.started_ticks = c.enqueued_ticks;
        c.completed_ticks = c.enqueued_ticks + kMs;
        c.entry_id = recs.size() + 1;
        c.step = static_cast<int32_t>(step);
        recs.push_back(op);
      }
    }
    tracer::RingRows batch;
    batch.info = &info;
    batch.names = &names;
    batch.groups = &groups;
    batch.records = recs;
    batch.ring = "rank" + std::to_string(l);
    batch.lane_tails = {recs.size()};
    RETURN_IF_ERROR(store.Write({&batch, 1}, {}, {}));
    rows += recs.size();
  }
  return rows;
}

}  // namespace megascope::bench
