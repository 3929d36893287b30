// The SRE views answered from a real ClickHouse store give what the same views give over the run's
// trace databases, row for row: a real (2,2,2) training run on two nodes, each node's trace.db
// shipped by the agent's sink. And the fleet views over controllers' verdicts across jobs.
#include "megascope/analyzer/store_views.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

#include "clickhouse_server.h"
#include "megascope/runtime/data.h"
#include "megascope/tracer/agent/store_sink.h"
#include "megascope/tracer/run_layout.h"
#include "test_util.h"

namespace megascope::analyzer {
namespace {

using megascope::testing::ClickHouseServer;
using megascope::testing::RunCommand;
using megascope::testing::TempDir;

// Rows as sorted lists of cells (the views' order among equal keys is the engine's).
std::vector<std::vector<std::string>> Sorted(const Table& t) {
  std::vector<std::vector<std::string>> rows = t.rows;
  for (size_t r = 0; r < rows.size(); ++r)
    for (size_t c = 0; c < rows[r].size(); ++c)
      if (t.is_null[r][c]) rows[r][c] = "NULL";
  std::sort(rows.begin(), rows.end());
  return rows;
}

// Equal cell for cell; numbers rounded to 3 decimals may differ in their last place where the
// engines round a tie differently (SQLite away from zero, ClickHouse to even).
void ExpectSameTable(const Table& here, const Table& store, const std::string& view) {
  EXPECT_EQ(here.columns, store.columns) << view;
  const auto a = Sorted(here), b = Sorted(store);
  ASSERT_EQ(a.size(), b.size()) << view;
  for (size_t r = 0; r < a.size(); ++r) {
    ASSERT_EQ(a[r].size(), b[r].size()) << view;
    for (size_t c = 0; c < a[r].size(); ++c) {
      if (a[r][c] == b[r][c]) continue;
      char* end_a = nullptr;
      char* end_b = nullptr;
      const double x = std::strtod(a[r][c].c_str(), &end_a);
      const double y = std::strtod(b[r][c].c_str(), &end_b);
      EXPECT_TRUE(*end_a == '\0' && *end_b == '\0' && std::fabs(x - y) <= 0.0011)
          << view << " row " << r << " column " << here.columns[c] << ": " << a[r][c] << " here, "
          << b[r][c] << " in the store";
    }
  }
}

class StoreViewsTest : public megascope::testing::ClickHouseTest {
 protected:
  void SetUp() override {
    ClickHouseTest::SetUp();
    if (server_) url_ = *tracer::StoreUrl::Parse(server_->Url("fleet"));
  }
  // Ships a database through the agent's sink, as an agent (or a launch) does.
  void Ship(const std::string& db, const std::string& job, const std::string& node,
            tracer::StoreSource source) {
    tracer::agent::StoreSinkOptions o;
    o.url = url_;
    o.job = job;
    o.node = node;
    o.db_path = db;
    o.source = source;
    auto sink = tracer::agent::StoreSink::Open(o);
    ASSERT_TRUE(sink.ok()) << sink.status().ToString();
    auto shipped = (*sink)->Pass(/*last=*/true);  // the run is over
    ASSERT_TRUE(shipped.ok()) << shipped.status().ToString();
    EXPECT_EQ((*sink)->lag_rows(), 0);
  }
  tracer::StoreUrl url_;
};

TEST_F(StoreViewsTest, TheRunViewsFromTheStoreAreThoseOfTheRunsTraceDatabases) {
  const std::string data = dir_.path() + "/notes.bin";
  ASSERT_TRUE(
      runtime::PrepareByteTokens(MEGASCOPE_TEST_DATA "/text/notes_on_training.txt", data).ok());
  const std::string run = dir_.path() + "/run";
  const std::string job = "sv" + std::to_string(::getpid());
  auto r = RunCommand(std::string(MEGASCOPE_BIN) + " train --dp 2 --tp 2 --pp 2 --nodes 2 --data " +
                      data + " --run-dir " + run + " --job " + job +
                      " --steps 4 --layers 2 --width 32 --heads 2 --seq 16 --batch 4");
  ASSERT_EQ(r.code, 0) << r.out;
  for (const std::string node : {"node0", "node1"})
    Ship(RunLayout(run).trace_db(node), job, node, tracer::StoreSource::kTrace);
  // Another job in the same store: the views of one job never see it.
  Ship(RunLayout(run).trace_db("node0"), job + "-other", "node0", tracer::StoreSource::kTrace);

  auto here = RunDatabase::Open(run);
  ASSERT_TRUE(here.ok()) << here.status().ToString();
  tracer::ClickHouse ch(url_);
  StoreScope scope;
  scope.job = job;
  scope.limit = 1000;
  const std::vector<std::pair<StoreView, std::string>> views = {
      {StoreView::kSteps, StepsSql()},
      {StoreView::kStragglers, StragglersSql()},
      {StoreView::kWaits, WaitsSql(scope.limit)},
      {StoreView::kOpen,
       "SELECT attempt, rank, grp, seq, op, peer, bytes, dtype, state, enqueued_ns, started_ns, "
       "seen_ns FROM open_collectives"}};
  for (const auto& [view, sql] : views) {
    auto a = (*here)->Query(sql);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    auto b = QueryStore(ch, view, scope);
    ASSERT_TRUE(b.ok()) << Name(view) << ": " << b.status().ToString();
    if (view != StoreView::kOpen) {
      EXPECT_FALSE(a->rows.empty()) << Name(view);
    }
    ExpectSameTable(*a, *b, std::string(Name(view)));
  }
  // What every rank was doing at three moments of the run.
  auto span = (*here)->Query("SELECT MIN(start_ns), MAX(end_ns) FROM spans");
  ASSERT_TRUE(span.ok());
  const int64_t lo = std::stoll(span->rows[0][0]), hi = std::stoll(span->rows[0][1]);
  for (const int64_t t : {lo + (hi - lo) / 3, lo + (hi - lo) / 2, hi - 1}) {
    auto a = (*here)->Query(AtSql(t));
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    StoreScope at = scope;
    at.at_ns = t;
    auto b = QueryStore(ch, StoreView::kAt, at);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    EXPECT_EQ(a->rows.size(), 8u);
    ExpectSameTable(*a, *b, "at " + std::to_string(t));
  }

  // The controller's straggler window from the store: what the run's databases give.
  SlowOptions window;
  window.attempt = 0;
  window.first_step = 1;
  window.last_step = 3;
  auto want = LoadSlowInput(**here, window);
  ASSERT_TRUE(want.ok()) << want.status().ToString();
  auto got = LoadSlowInputFromStore(ch, job, window, 8, false);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_TRUE(got->has_value()) << "all 8 ranks are through step 3 in the store";
  const SlowInput& in = **got;
  ASSERT_EQ(in.ranks.size(), want->ranks.size());
  for (const auto& [rank, r] : want->ranks) {
    const auto& g = in.ranks.at(rank);
    EXPECT_EQ(std::tie(g.node, g.dp, g.pp, g.tp, g.clock_offset_ns),
              std::tie(r.node, r.dp, r.pp, r.tp, r.clock_offset_ns))
        << "rank " << rank;
  }
  auto step_key = [](const SlowInput::Step& x) {
    return std::tie(x.attempt, x.rank, x.step, x.wall, x.compute, x.comm, x.data);
  };
  auto op_key = [](const SlowInput::Op& x) {
    return std::tie(x.grp, x.seq, x.rank, x.enqueued, x.completed, x.bytes, x.p2p);
  };
  auto steps_a = want->steps, steps_b = in.steps;
  auto ops_a = want->ops, ops_b = in.ops;
  std::sort(steps_a.begin(), steps_a.end(),
            [&](const auto& x, const auto& y) { return step_key(x) < step_key(y); });
  std::sort(steps_b.begin(), steps_b.end(),
            [&](const auto& x, const auto& y) { return step_key(x) < step_key(y); });
  std::sort(ops_a.begin(), ops_a.end(),
            [&](const auto& x, const auto& y) { return op_key(x) < op_key(y); });
  std::sort(ops_b.begin(), ops_b.end(),
            [&](const auto& x, const auto& y) { return op_key(x) < op_key(y); });
  ASSERT_EQ(steps_a.size(), steps_b.size());
  EXPECT_EQ(steps_a.size(), 8u * 3);
  for (size_t i = 0; i < steps_a.size(); ++i)
    EXPECT_TRUE(step_key(steps_a[i]) == step_key(steps_b[i])) << "step row " << i;
  ASSERT_EQ(ops_a.size(), ops_b.size());
  EXPECT_FALSE(ops_a.empty());
  for (size_t i = 0; i < ops_a.size(); ++i)
    EXPECT_TRUE(op_key(ops_a[i]) == op_key(ops_b[i])) << "op " << i;
  // A window past what is stored waits.
  window.first_step = 3;
  window.last_step = 99;
  auto later = LoadSlowInputFromStore(ch, job, window, 8, false);
  ASSERT_TRUE(later.ok()) << later.status().ToString();
  EXPECT_FALSE(later->has_value());

  // The same from the command line, and the store's status and retention.
  const std::string url = server_->Url("fleet");
  auto cli = RunCommand(std::string(MEGASCOPE_BIN) + " query --store " + url + " steps --job " +
                        job + " --csv");
  ASSERT_EQ(cli.code, 0) << cli.out;
  EXPECT_EQ(cli.out, FormatCsv(*QueryStore(ch, StoreView::kSteps, scope)));
  auto status = RunCommand(std::string(MEGASCOPE_BIN) + " store status --store " + url);
  ASSERT_EQ(status.code, 0) << status.out;
  EXPECT_NE(status.out.find("schema version " + std::to_string(tracer::kStoreSchemaVersion)),
            std::string::npos)
      << status.out;
  EXPECT_NE(status.out.find("rank_steps"), std::string::npos) << status.out;
  auto prune = RunCommand(std::string(MEGASCOPE_BIN) + " store prune --store " + url);
  ASSERT_EQ(prune.code, 0) << prune.out;
  EXPECT_NE(prune.out.find("0 day partitions dropped"), std::string::npos) << prune.out;
  auto bad = RunCommand(std::string(MEGASCOPE_BIN) + " store status --store http://x");
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("expected clickhouse://"), std::string::npos) << bad.out;

  // A run view without a job is refused, saying so.
  auto no_job = QueryStore(ch, StoreView::kSteps, StoreScope{});
  ASSERT_FALSE(no_job.ok());
  EXPECT_NE(no_job.status().message().find("--job"), std::string::npos);
}

// Verdicts of three jobs' controllers: the fleet views count each machine's namings across jobs.
TEST_F(StoreViewsTest, TheFleetViewsCountEachMachinesNamingsAcrossJobs) {
  const int64_t t0 = 1796600000000000000;
  for (int j = 0; j < 3; ++j) {
    const std::string path = dir_.path() + "/control" + std::to_string(j) + ".db";
    auto db = tracer::sql::Database::Open(path, tracer::sql::Database::Mode::kReadWrite);
    ASSERT_TRUE(db.ok());
    ASSERT_TRUE(db->Exec("CREATE TABLE events(ts_ns INTEGER, attempt INTEGER, kind TEXT, node "
                         "TEXT, rank INTEGER, detail_json TEXT)")
                    .ok());
    // Every job: node7 faulty; job 1 also a hang rooted at node3 (rank 5); a restart event.
    const std::string ts = std::to_string(t0 + j * 3'600'000'000'000LL);
    ASSERT_TRUE(
        db->Exec("INSERT INTO events VALUES (" + ts +
                 ", 0, 'verdict', 'node7', NULL, '{\"kind\":\"faulty_machine\",\"cause\":\"xid\","
                 "\"level\":\"faulty\",\"root_nodes\":[\"node7\"]}'), (" +
                 ts + ", 0, 'restart', NULL, NULL, '{\"cause\":\"detector\"}')")
            .ok());
    if (j == 1) {
      ASSERT_TRUE(db->Exec("INSERT INTO events VALUES (" + ts +
                           ", 1, 'verdict', 'node3', 5, '{\"kind\":\"hang\",\"cause\":"
                           "\"rank_not_joined\",\"root_nodes\":[\"node3\"],\"root_ranks\":[5]}')")
                      .ok());
    }
    Ship(path, "job" + std::to_string(j), "controller", tracer::StoreSource::kControl);
  }
  tracer::ClickHouse ch(url_);
  auto machines = QueryStore(ch, StoreView::kMachines, {});
  ASSERT_TRUE(machines.ok()) << machines.status().ToString();
  ASSERT_EQ(machines->rows.size(), 2u);
  const std::vector<std::string> want_cols = {
      "node", "named_times", "faulty",           "suspect",  "straggler",
      "hang", "jobs",        "named_over_hours", "first_ns", "last_ns"};
  EXPECT_EQ(machines->columns, want_cols);
  EXPECT_EQ(machines->rows[0][0], "node7");
  EXPECT_EQ(machines->rows[0][1], "3");
  EXPECT_EQ(machines->rows[0][2], "3");
  EXPECT_EQ(machines->rows[0][6], "3");
  EXPECT_EQ(machines->rows[0][7], "2.0") << "named over two hours";
  EXPECT_EQ(machines->rows[1][0], "node3");
  EXPECT_EQ(machines->rows[1][5], "1");

  auto incidents = QueryStore(ch, StoreView::kIncidents, {});
  ASSERT_TRUE(incidents.ok()) << incidents.status().ToString();
  ASSERT_EQ(incidents->rows.size(), 2u);
  EXPECT_EQ(incidents->rows[0][0] + " " + incidents->rows[0][1] + " " + incidents->rows[0][2],
            "faulty_machine xid node7");
  EXPECT_EQ(incidents->rows[1][0] + " " + incidents->rows[1][1] + " " + incidents->rows[1][3],
            "hang rank_not_joined 5");

  // --since: only what is newer (the last job's verdict).
  StoreScope recent;
  recent.since_ns = t0 + 2 * 3'600'000'000'000LL;
  auto last = QueryStore(ch, StoreView::kVerdicts, recent);

  ASSERT_TRUE(last.ok()) << last.status().ToString();
  ASSERT_EQ(last->rows.size(), 1u);
  EXPECT_EQ(last->rows[0][1], "job2");
  EXPECT_EQ(last->rows[0][3], "faulty_machine");
}

}  // namespace
}  // namespace megascope::analyzer
