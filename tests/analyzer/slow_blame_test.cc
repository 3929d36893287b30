// Communication-straggler blame on traces written through the real store, with timings chosen
// exactly: a rank that arrives late only because it left the previous op late (a ring's last
// receiver does, every step) is not a straggler; a rank whose own work between ops takes longer
// (its link holds its data back) is, with the seconds its peers waited for it.
#include <gtest/gtest.h>

#include "store_run.h"
#include "test_util.h"

namespace megascope::analyzer {
namespace {

constexpr int kRanks = 4, kSteps = 20;
constexpr int64_t kMs = 1000000;

// Each rank computes 10 ms per step, then (`hold` ms for rank 3) waits on its link, then joins the
// step's all-reduce; the all-reduce completes 1 ms after the last arrival, `tail` ms later still
// on rank 3. Rank 3's compute is never longer than its peers'.
// With `gap_us`, each rank idles that long in the middle of its compute (no span covers it).
std::string WriteRun(const std::string& dir, int64_t tail_ms, int64_t hold_ms, int64_t gap_us = 0) {
  const std::vector<std::string> names = {"forward", "allreduce", "link"};
  const std::vector<tracer::GroupInfo> groups = {{"dp.0", "dp", {0, 1, 2, 3}}};
  std::vector<tracer::RankInfo> infos(kRanks);
  std::vector<std::vector<tracer::Record>> recs(kRanks);
  std::vector<int64_t> free_at(kRanks, 1000 * kMs);  // when each rank's previous op completed
  for (int s = 0; s < kSteps; ++s) {
    std::vector<int64_t> enq(kRanks);
    for (int r = 0; r < kRanks; ++r) {
      auto span = [&](tracer::SpanKind kind, uint16_t name, int64_t a, int64_t b) {
        tracer::Record rec{};
        rec.span = {tracer::RecordType::kSpan, kind, name, -1, s, a, b, 0, 0, 0, 0, 0, {}};
        recs[r].push_back(rec);
      };
      const int64_t gap = gap_us * 1000;
      const int64_t fwd_end = free_at[r] + 10 * kMs + gap;
      span(tracer::SpanKind::kForward, 0, free_at[r], free_at[r] + 5 * kMs);
      span(tracer::SpanKind::kBackward, 0, free_at[r] + 5 * kMs + gap, fwd_end);
      enq[r] = fwd_end + (r == 3 ? hold_ms * kMs : 0);
      if (enq[r] > fwd_end) span(tracer::SpanKind::kComm, 2, fwd_end, enq[r]);
    }
    const int64_t last = *std::max_element(enq.begin(), enq.end());
    for (int r = 0; r < kRanks; ++r) {
      const int64_t done = last + kMs + (r == 3 ? tail_ms * kMs : 0);
      const tracer::Record rec = CompletedAllreduce(
          0, static_cast<uint64_t>(s) + 1, static_cast<uint64_t>(s) + 1, s, enq[r], done, 4096);
      recs[r].push_back(rec);  // also its comm span (trace_schema.h)
      free_at[r] = done;
    }
  }
  for (int r = 0; r < kRanks; ++r) {
    tracer::RankInfo& info = infos[r];
    info.job = "blame";
    info.node = "node" + std::to_string(r);
    info.rank = r;
    info.world_size = kRanks;
    info.coords.dp = r;
    WriteRankRecords(dir, info, names, groups, recs[r]);
  }
  return dir;
}

std::vector<Verdict> CommStragglers(const std::string& run) {
  return SlowVerdicts(run, "comm_straggler");
}

TEST(SlowBlameTest, ARankThatLeavesEveryOpLastIsNotACommStraggler) {
  megascope::testing::TempDir dir;
  // Rank 3 arrives 5 ms after its peers at every all-reduce -- 15 ms of waiting per step if
  // lateness were blamed on arrival alone -- only because the previous one released it last.
  const auto verdicts = CommStragglers(WriteRun(dir.path(), /*tail_ms=*/5, /*hold_ms=*/0));
  EXPECT_TRUE(verdicts.empty()) << verdicts.front().explanation;
}

TEST(SlowBlameTest, ARankWhoseLinkHoldsItsDataIsACommStragglerWithItsCost) {
  megascope::testing::TempDir dir;
  const auto verdicts = CommStragglers(WriteRun(dir.path(), /*tail_ms=*/0, /*hold_ms=*/8));
  ASSERT_EQ(verdicts.size(), 1u);
  EXPECT_EQ(verdicts[0].root_ranks, std::vector<int32_t>{3});
  EXPECT_EQ(verdicts[0].root_nodes, std::vector<std::string>{"node3"});
  // Three peers waited 8 ms each at every all-reduce but the first (which has no previous op).
  const std::string& cost = verdicts[0].evidence[0];
  const double per_step = std::stod(cost.substr(cost.find('=') + 1));
  EXPECT_NEAR(per_step, 0.024 * (kSteps - 1) / kSteps, 0.001) << cost;
  // What decided comes with the verdict: the steps read and the thresholds.
  const std::string& why = verdicts[0].evidence.back();
  EXPECT_EQ(why.rfind("thresholds: steps 0..the last of every attempt; ", 0), 0u) << why;
  EXPECT_NE(why.find("over 1.20x the median of its peers"), std::string::npos) << why;
}

TEST(SlowBlameTest, AHealthyVerdictSaysWhichStepsAndThresholdsItHeldTo) {
  megascope::testing::TempDir dir;
  auto db = RunDatabase::Open(WriteRun(dir.path(), /*tail_ms=*/0, /*hold_ms=*/0));
  ASSERT_TRUE(db.ok()) << db.status().ToString();
  SlowOptions o;
  o.first_step = 1;
  o.last_step = 3;
  o.compute_ratio = 1.5;
  auto rep = AnalyzeSlow(**db, o);
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  ASSERT_EQ(rep->verdicts.size(), 1u);
  EXPECT_EQ(Name(rep->verdicts[0].kind), "healthy");
  EXPECT_EQ(rep->verdicts[0].evidence.back(), rep->thresholds);
  EXPECT_NE(rep->thresholds.find("steps 1..3 of every attempt"), std::string::npos)
      << rep->thresholds;
  EXPECT_NE(rep->thresholds.find("over 1.50x"), std::string::npos) << rep->thresholds;
  EXPECT_NE(FormatSlowReport(*rep).find(rep->thresholds), std::string::npos);
}

TEST(SlowBlameTest, ALateLeaverThatAlsoHoldsItsDataIsBlamedOnlyForTheHold) {
  megascope::testing::TempDir dir;
  const auto verdicts = CommStragglers(WriteRun(dir.path(), /*tail_ms=*/5, /*hold_ms=*/8));
  ASSERT_EQ(verdicts.size(), 1u);
  EXPECT_EQ(verdicts[0].root_ranks, std::vector<int32_t>{3});
  const std::string& cost = verdicts[0].evidence[0];
  EXPECT_NEAR(std::stod(cost.substr(cost.find('=') + 1)), 0.024 * (kSteps - 1) / kSteps, 0.001)
      << cost;
}

// The bubble is the share of a step no span of a rank accounts for: 2.75 ms idle in an 11-ms step
// of compute and all-reduce is 20 %, none is 0 (and a compute span split in two is no bubble).
TEST(SlowBlameTest, TheBubbleIsTheUnaccountedShareOfEachStep) {
  megascope::testing::TempDir a, b;
  auto idle = RunDatabase::Open(WriteRun(a.path(), 0, 0, /*gap_us=*/2750));
  auto busy = RunDatabase::Open(WriteRun(b.path(), 0, 0));
  ASSERT_TRUE(idle.ok() && busy.ok());
  auto with_gap = AnalyzeSlow(**idle), without = AnalyzeSlow(**busy);
  ASSERT_TRUE(with_gap.ok() && without.ok());
  EXPECT_NEAR(with_gap->bubble_share, 2.75 / 13.75, 1e-6);
  EXPECT_NEAR(without->bubble_share, 0.0, 1e-6);
  EXPECT_NEAR(with_gap->mean_step_s, 0.01375, 1e-6);
}

}  // namespace
}  // namespace megascope::analyzer
