// Writing hand-timed records of one rank into a run's trace.db through the real store, and reading
// the slowdown analysis's verdicts of one cause back (slow_blame_test, slow_link_test).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "megascope/analyzer/slow.h"
#include "megascope/tracer/trace_store.h"

namespace megascope::analyzer {

// RUN_DIR/nodes/<info.node>/trace.db gains `info` and its `records`.
inline void WriteRankRecords(const std::string& run_dir, const tracer::RankInfo& info,
                             const std::vector<std::string>& names,
                             const std::vector<tracer::GroupInfo>& groups,
                             const std::vector<tracer::Record>& records) {
  auto store = tracer::TraceStore::Open(run_dir + "/nodes/" + info.node + "/trace.db");
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  ASSERT_TRUE((*store)->UpsertRank(info).ok());
  tracer::RingRows rows;
  rows.info = &info;
  rows.names = &names;
  rows.groups = &groups;
  rows.records = records;
  rows.ring = "rank" + std::to_string(info.rank);
  rows.lane_tails = {records.size()};
  EXPECT_TRUE((*store)->Write({&rows, 1}, {}, {}).ok());
}

// The slowdown analysis's verdicts with `cause`; no rank of these runs computes longer than its
// peers, so a compute straggler is a failure.
// A completed all-reduce of `step` as a rank records it: issued at `enqueued` (it starts at once),
// done at `completed`, in the rank's local group `group`.
inline tracer::Record CompletedAllreduce(uint16_t group, uint64_t seq, uint64_t entry, int step,
                                         int64_t enqueued, int64_t completed, uint64_t bytes) {
  tracer::Record rec{};
  rec.collective.type = tracer::RecordType::kCollective;
  rec.collective.op = tracer::OpType::kAllreduce;
  rec.collective.state = tracer::OpState::kCompleted;
  rec.collective.group = group;
  rec.collective.peer = -1;
  rec.collective.seq = seq;
  rec.collective.bytes = bytes;
  rec.collective.enqueued_ticks = enqueued;
  rec.collective.started_ticks = enqueued;
  rec.collective.completed_ticks = completed;
  rec.collective.entry_id = entry;
  rec.collective.step = step;
  return rec;
}

inline std::vector<Verdict> SlowVerdicts(const std::string& run, const std::string& cause) {
  auto db = RunDatabase::Open(run);
  EXPECT_TRUE(db.ok()) << db.status().ToString();
  if (!db.ok()) return {};
  auto rep = AnalyzeSlow(**db);
  EXPECT_TRUE(rep.ok()) << rep.status().ToString();
  if (!rep.ok()) return {};
  std::vector<Verdict> out;
  for (const Verdict& v : rep->verdicts) {
    EXPECT_NE(v.cause, "compute_straggler") << v.explanation;
    if (v.cause == cause) out.push_back(v);
  }
  return out;
}

}  // namespace megascope::analyzer
