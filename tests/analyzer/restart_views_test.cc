// The run's views across a restart: rank 1 ran on node1 in attempt 0 and on the spare node2 in
// attempt 1, and both attempts ran steps 1 and 2 (the second resumed from the checkpoint before
// them). Every view keys on (attempt, rank): an attempt's collectives, steps and compute are never
// merged with another's, and a rank is shown on the node it ran on then.
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "megascope/analyzer/query.h"
#include "megascope/analyzer/timeline.h"
#include "megascope/tracer/sqlite.h"
#include "store_run.h"
#include "test_util.h"

namespace megascope::analyzer {
namespace {

constexpr int64_t kMs = 1000000, kS = 1000 * kMs;
constexpr int64_t kAttemptStart[2] = {100 * kS, 200 * kS};

// Steps 1 and 2 of one rank in one attempt: a heartbeat, a forward span (rank 1 on the spare is
// slower: 80 ms against 50), then the step's all-reduce, which rank 1 joins 10 ms after rank 0.
void WriteAttempt(const std::string& run, int attempt, int rank, const std::string& node) {
  tracer::RankInfo info;
  info.job = "j";
  info.rank = rank;
  info.world_size = 2;
  info.node = node;
  info.attempt = attempt;
  info.coords.dp = rank;
  const std::vector<std::string> names = {"forward"};
  const std::vector<tracer::GroupInfo> groups = {tracer::GroupInfo{"dp.0", "dp", {0, 1}}};
  std::vector<tracer::Record> recs;
  for (int step = 1; step <= 2; ++step) {
    const int64_t t = kAttemptStart[attempt] + step * kS;
    tracer::Record hb{};
    hb.heartbeat = {tracer::RecordType::kHeartbeat, tracer::Phase::kForward, {}, step, t, {}};
    recs.push_back(hb);
    const int64_t fwd = attempt == 1 && rank == 1 ? 80 * kMs : 50 * kMs;
    tracer::Record span{};
    span.span = {tracer::RecordType::kSpan,
                 tracer::SpanKind::kForward,
                 0,
                 -1,
                 step,
                 t,
                 t + fwd,
                 0,
                 0,
                 0,
                 0,
                 0,
                 {}};
    recs.push_back(span);
    const int64_t enq = t + 100 * kMs + int64_t{rank} * 10 * kMs;
    recs.push_back(CompletedAllreduce(0, static_cast<uint64_t>(step), static_cast<uint64_t>(step),
                                      step, enq, t + 120 * kMs, 4096));
  }
  WriteRankRecords(run, info, names, groups, recs);
}

class RestartViewsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    WriteAttempt(dir_.path(), 0, 0, "node0");
    WriteAttempt(dir_.path(), 0, 1, "node1");
    WriteAttempt(dir_.path(), 1, 0, "node0");
    WriteAttempt(dir_.path(), 1, 1, "node2");
    auto db = RunDatabase::Open(dir_.path());
    ASSERT_TRUE(db.ok()) << db.status().ToString();
    db_ = std::move(*db);
  }
  // The query's rows as column -> value maps.
  std::vector<std::map<std::string, std::string>> Rows(const std::string& sql) {
    auto t = db_->Query(sql);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    std::vector<std::map<std::string, std::string>> out;
    if (!t.ok()) return out;
    for (const auto& row : t->rows) {
      std::map<std::string, std::string> m;
      for (size_t c = 0; c < t->columns.size(); ++c) m[t->columns[c]] = row[c];
      out.push_back(m);
    }
    return out;
  }

  megascope::testing::TempDir dir_;
  std::unique_ptr<RunDatabase> db_;
};

TEST_F(RestartViewsTest, WaitsAreOneCollectivePerAttempt) {
  const auto rows = Rows(WaitsSql(50));
  ASSERT_EQ(rows.size(), 4u);  // (attempt 0, 1) x (seq 1, 2)
  for (const auto& r : rows) {
    EXPECT_EQ(r.at("members"), "2") << r.at("attempt") << " " << r.at("seq");
    EXPECT_EQ(std::stod(r.at("wait_ms")), 10.0);  // not the 100 s between the attempts
    EXPECT_EQ(r.at("last_rank"), "1");
  }
}

TEST_F(RestartViewsTest, StepsAreOneRowPerAttempt) {
  const auto rows = Rows(StepsSql());
  ASSERT_EQ(rows.size(), 4u);
  for (const auto& r : rows) {
    EXPECT_EQ(r.at("ranks"), "2");
    EXPECT_LT(std::stod(r.at("step_ms")), 200.0) << "attempt " << r.at("attempt");
  }
  EXPECT_EQ(rows[0].at("attempt"), "0");
  EXPECT_EQ(rows[3].at("attempt"), "1");
}

TEST_F(RestartViewsTest, StragglersShowEachAttemptsNode) {
  std::map<std::pair<std::string, std::string>, std::map<std::string, std::string>> by;
  for (const auto& r : Rows(StragglersSql())) by[{r.at("attempt"), r.at("rank")}] = r;
  ASSERT_EQ(by.size(), 4u);
  const auto& before = by[{"0", "1"}];
  const auto& after = by[{"1", "1"}];
  EXPECT_EQ(before.at("node"), "node1");
  EXPECT_EQ(after.at("node"), "node2");
  EXPECT_EQ(before.at("compute_ms_per_step"), "50.0");
  EXPECT_EQ(after.at("compute_ms_per_step"), "80.0");
}

TEST_F(RestartViewsTest, AtShowsTheAttemptAndNodeOfThatMoment) {
  for (int attempt : {0, 1}) {
    const int64_t t = kAttemptStart[attempt] + kS + 10 * kMs;  // in step 1's forward
    const auto rows = Rows(AtSql(t));
    ASSERT_EQ(rows.size(), 2u);
    EXPECT_EQ(rows[1].at("rank"), "1");
    EXPECT_EQ(rows[1].at("attempt"), std::to_string(attempt));
    EXPECT_EQ(rows[1].at("node"), attempt == 0 ? "node1" : "node2");
    EXPECT_EQ(rows[1].at("doing"), "forward forward (step 1)");
  }
}

TEST_F(RestartViewsTest, TheTimelineDrawsARankUnderEachNodeItRanOn) {
  TimelineStats stats;
  auto json = TimelineJson(*db_, TimelineOptions{}, &stats);
  ASSERT_TRUE(json.ok()) << json.status().ToString();
  EXPECT_EQ(stats.ranks, 2);
  EXPECT_EQ(stats.spans, 16);  // a forward and the all-reduce's comm span per rank and step
  const auto doc = nlohmann::json::parse(*json);
  std::map<std::string, int> pid;
  std::map<std::pair<int, int>, int> spans;  // (pid, tid) -> spans
  std::map<std::pair<int, int>, std::set<int>> attempts;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name")
      pid[e["args"]["name"].get<std::string>()] = e["pid"].get<int>();
    if (e["ph"] == "X") {
      const std::pair<int, int> key{e["pid"].get<int>(), e["tid"].get<int>()};
      ++spans[key];
      attempts[key].insert(e["args"]["attempt"].get<int>());
    }
  }
  ASSERT_EQ(pid.size(), 3u);
  ASSERT_TRUE(pid.count("node2"));
  EXPECT_EQ((spans[{pid["node1"], 1}]), 4);
  EXPECT_EQ((spans[{pid["node2"], 1}]), 4);
  EXPECT_EQ((spans[{pid["node0"], 0}]), 8);
  EXPECT_EQ((attempts[{pid["node2"], 1}]), std::set<int>{1});
}

// A hang as the agents record it while it lasts: rank 0 issued all-reduce #3 and holds it open
// (last seen 2.9 s after), rank 1 never issued it. Rank 0's agent also still lists #2, which
// completed since its last look. The views show the open op; the completed one is not open.
class OpenOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    WriteAttempt(dir_.path(), 0, 0, "node0");
    WriteAttempt(dir_.path(), 0, 1, "node1");
    auto store = tracer::TraceStore::Open(dir_.path() + "/nodes/node0/trace.db");
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    const std::vector<tracer::GroupInfo> groups = {tracer::GroupInfo{"dp.0", "dp", {0, 1}}};
    tracer::OpenOps open{0, 0, kHung + 2900 * kMs, &groups, {}};
    for (uint64_t seq : {2, 3}) {
      tracer::FlightEntry e;
      e.id = seq;
      e.seq = seq;
      e.bytes = 4096;
      e.op = tracer::OpType::kAllreduce;
      e.state = tracer::OpState::kStarted;
      e.enqueued_at_ns = seq == 3 ? kHung : kAttemptStart[0] + 2 * kS + 100 * kMs;
      e.started_at_ns = e.enqueued_at_ns;
      open.entries.push_back(e);
    }
    ASSERT_TRUE((*store)->ReplaceOpenOps({&open, 1}).ok());
  }
  static constexpr int64_t kHung = kAttemptStart[0] + 3 * kS + 100 * kMs;
  megascope::testing::TempDir dir_;
};

TEST_F(OpenOpsTest, TheHungCollectiveIsInTheViewsWhileItLasts) {
  auto db = RunDatabase::Open(dir_.path());
  ASSERT_TRUE(db.ok()) << db.status().ToString();
  auto waits = (*db)->Query(WaitsSql(10));
  ASSERT_TRUE(waits.ok()) << waits.status().ToString();
  ASSERT_EQ(waits->rows.size(), 3u) << FormatTable(*waits);
  // Columns: attempt, grp, seq, op, members, still_open, wait_ms, last_rank; longest first.
  EXPECT_EQ(waits->rows[0][2], "3") << FormatTable(*waits);
  EXPECT_EQ(waits->rows[0][4], "1");
  EXPECT_EQ(waits->rows[0][5], "1");
  EXPECT_EQ(std::stod(waits->rows[0][6]), 2900.0);
  for (size_t r = 1; r < 3; ++r) EXPECT_EQ(waits->rows[r][5], "0") << FormatTable(*waits);

  auto at = (*db)->Query(AtSql(kHung + 2 * kS));
  ASSERT_TRUE(at.ok()) << at.status().ToString();
  ASSERT_EQ(at->rows.size(), 2u);
  EXPECT_EQ(at->rows[0][6], "in allreduce dp.0 #3 (started, open)") << FormatTable(*at);

  TimelineStats stats;
  auto json = TimelineJson(**db, TimelineOptions{}, &stats);
  ASSERT_TRUE(json.ok()) << json.status().ToString();
  EXPECT_EQ(stats.open, 1);
  int open_slices = 0;
  const auto doc = nlohmann::json::parse(*json);
  for (const auto& e : doc["traceEvents"]) {
    if (e.value("cat", "") != "open") continue;
    ++open_slices;
    EXPECT_EQ(e["tid"], 0);
    EXPECT_EQ(e["args"]["seq"], 3);
    EXPECT_EQ(e["dur"].get<double>(), 2900000.0);  // microseconds, to when it was last seen
  }
  EXPECT_EQ(open_slices, 1);
}

// The agent's next look replaces what a rank held open: the op completed, nothing is open.
TEST_F(OpenOpsTest, ARanksNextLookReplacesItsOpenOps) {
  {
    auto store = tracer::TraceStore::Open(dir_.path() + "/nodes/node0/trace.db");
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    const tracer::OpenOps none{0, 0, kHung + 3 * kS, nullptr, {}};
    ASSERT_TRUE((*store)->ReplaceOpenOps({&none, 1}).ok());
  }
  auto db = RunDatabase::Open(dir_.path());
  ASSERT_TRUE(db.ok()) << db.status().ToString();
  EXPECT_EQ((*db)->Query("SELECT COUNT(*) FROM open_ops")->rows[0][0], "0");
}

// A trace.db written before open_ops existed (same schema version) reads as having none open.
TEST_F(OpenOpsTest, AFileWithoutOpenOpsReadsAsNoneOpen) {
  for (const char* node : {"node0", "node1"}) {
    auto raw = tracer::sql::Database::Open(dir_.path() + "/nodes/" + node + "/trace.db",
                                           tracer::sql::Database::Mode::kReadWrite);
    ASSERT_TRUE(raw.ok());
    ASSERT_TRUE(raw->Exec("DROP TABLE open_ops").ok());
  }
  auto db = RunDatabase::Open(dir_.path());
  ASSERT_TRUE(db.ok()) << db.status().ToString();
  auto open = (*db)->Query("SELECT COUNT(*) FROM open_collectives");
  ASSERT_TRUE(open.ok()) << open.status().ToString();
  EXPECT_EQ(open->rows[0][0], "0");
  auto waits = (*db)->Query(WaitsSql(10));
  ASSERT_TRUE(waits.ok()) << waits.status().ToString();
  EXPECT_EQ(waits->rows.size(), 2u);
}

}  // namespace
}  // namespace megascope::analyzer
