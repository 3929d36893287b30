// `megascope query` and `megascope metrics export` on a real run directory made by a real
// (2,2,2) training run with its two agents.
#include "megascope/analyzer/query.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "megascope/analyzer/node_query.h"
#include "megascope/launch/process.h"
#include "megascope/launch/scrape_targets.h"
#include "megascope/runtime/data.h"
#include "megascope/tracer/file_util.h"
#include "megascope/tracer/trace_schema.h"
#include "megascope/tracer/trace_store.h"
#include "store_run.h"
#include "test_util.h"

namespace megascope::analyzer {
namespace {

using megascope::testing::RunCommand;
using megascope::testing::TempDir;

class QueryTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    const std::string data = dir_->path() + "/notes.bin";
    ASSERT_TRUE(
        runtime::PrepareByteTokens(MEGASCOPE_TEST_DATA "/text/notes_on_training.txt", data).ok());
    run_ = dir_->path() + "/run";
    auto r = RunCommand(Bin() + " train --dp 2 --tp 2 --pp 2 --nodes 2 --data " + data +
                        " --run-dir " + run_ + " --job q" + std::to_string(::getpid()) +
                        " --steps 4 --layers 2 --width 32 --heads 2 --seq 16 --batch 4");
    ASSERT_EQ(r.code, 0) << r.out;
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::string Bin() { return MEGASCOPE_BIN; }
  static nlohmann::json Json(const std::string& args) {
    auto r = RunCommand(Bin() + " query " + run_ + " " + args + " --json");
    EXPECT_EQ(r.code, 0) << r.out;
    return nlohmann::json::parse(r.out);
  }

  static TempDir* dir_;
  static std::string run_;
};
TempDir* QueryTest::dir_ = nullptr;
std::string QueryTest::run_;

TEST_F(QueryTest, StepsBreakDownEveryStepOverAllRanks) {
  auto steps = Json("steps");
  ASSERT_EQ(steps.size(), 4u);
  for (const auto& s : steps) {
    EXPECT_EQ(s["ranks"], 8);
    EXPECT_GT(s["step_ms"].get<double>(), 0);
    EXPECT_GE(s["compute_ms"].get<double>(), 0);
    EXPECT_GT(s["comm_wait_ms"].get<double>(), 0);
  }
}

TEST_F(QueryTest, StragglersRankEveryRankAgainstItsPeers) {
  auto rows = Json("stragglers");
  ASSERT_EQ(rows.size(), 8u);
  for (const auto& r : rows) {
    EXPECT_EQ(r["peers"], 2);  // dp=2 ranks share each (pp, tp)
    EXPECT_GT(r["ratio"].get<double>(), 0);
  }
  EXPECT_GE(rows.front()["ratio"].get<double>(), rows.back()["ratio"].get<double>());
}

TEST_F(QueryTest, WaitsNameWhoArrivedLast) {
  auto rows = Json("waits --limit 5");
  ASSERT_EQ(rows.size(), 5u);
  for (const auto& r : rows) {
    EXPECT_GE(r["members"].get<int>(), 2);
    EXPECT_TRUE(r["last_rank"].is_number_integer());
  }
}

TEST_F(QueryTest, AtShowsWhatEveryRankWasDoing) {
  auto rows = Json("at +0.01");
  ASSERT_EQ(rows.size(), 8u);
  int known = 0;
  for (const auto& r : rows) known += r["last_heartbeat"].is_string() ? 1 : 0;
  EXPECT_EQ(known, 8);
}

TEST_F(QueryTest, SqlOverUnifiedViewsAndOutputFormats) {
  auto r = RunCommand(Bin() + " query " + run_ +
                      " --sql \"SELECT COUNT(DISTINCT rank) AS ranks, COUNT(DISTINCT node) AS "
                      "nodes FROM ranks\" --csv");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out, "ranks,nodes\n8,2\n");
  auto table = RunCommand(Bin() + " query " + run_ +
                          " --sql \"SELECT rank FROM ranks ORDER BY rank LIMIT 2\"");
  EXPECT_EQ(table.out, "rank\n----\n0\n1\n(2 rows)\n");
}

TEST_F(QueryTest, BadSqlWritesAndMissingRunsAreRefusedClearly) {
  auto bad = RunCommand(Bin() + " query " + run_ + " --sql \"SELEC 1\"");
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.out.find("bad SQL"), std::string::npos);
  for (const char* write : {"DELETE FROM spans", "DROP TABLE spans", "CREATE TABLE x(a)",
                            "INSERT INTO metrics VALUES('a',1,'b',2)"}) {
    auto w = RunCommand(Bin() + " query " + run_ + " --sql \"" + write + "\"");
    EXPECT_EQ(w.code, 1) << write;
    EXPECT_NE(w.out.find("writes are refused"), std::string::npos) << write << ": " << w.out;
  }
  auto count = RunCommand(Bin() + " query " + run_ +
                          " --sql \"SELECT COUNT(*) > 0 AS kept FROM spans\" --csv");
  EXPECT_EQ(count.out, "kept\n1\n");  // the refused writes changed nothing
  auto missing = RunCommand(Bin() + " query " + dir_->path() + "/nope steps");
  EXPECT_EQ(missing.code, 1);
  EXPECT_NE(missing.out.find("does not exist"), std::string::npos);
  auto unknown = RunCommand(Bin() + " query " + run_ + " slowest");
  EXPECT_EQ(unknown.code, 2);
}

// Each node's part (as its agent sends it) merged over every node gives the answer the whole
// run's databases give, for every canned question: the merges add, combine and pick across nodes
// what the run-wide SQL computes (a dp group's members, a pp stage's peers, an all-reduce's waiters
// are on different nodes here).
TEST_F(QueryTest, EachNodesPartMergedGivesTheAnswerOfTheWholeRun) {
  auto db = RunDatabase::Open(run_);
  ASSERT_TRUE(db.ok()) << db.status().ToString();
  auto first = (*db)->Query("SELECT MIN(start_ns) FROM spans");
  ASSERT_TRUE(first.ok());
  const int64_t mid = std::stoll(first->rows[0][0]) + 30000000;  // 30 ms in: ranks are busy
  struct Case {
    Question question;
    std::string local_sql;
  };
  const std::vector<Case> cases = {{Question::kSteps, StepsSql()},
                                   {Question::kStragglers, StragglersSql()},
                                   {Question::kWaits, WaitsSql(1000)},
                                   {Question::kAt, AtSql(mid)}};
  for (const Case& c : cases) {
    NodeQuery q;
    q.question = c.question;
    q.limit = 1000;
    q.at_ns = mid;
    std::vector<QueryPart> parts;
    for (const char* node : {"node1", "node0"}) {
      auto part = QueryServer(run_, node).Part(q);
      ASSERT_TRUE(part.ok()) << part.status().ToString();
      auto sent = ParseQueryPart(QueryPartJson(*part));
      ASSERT_TRUE(sent.ok()) << sent.status().ToString();
      parts.push_back(std::move(*sent));
    }
    auto merged = MergeParts(q, parts);
    ASSERT_TRUE(merged.ok()) << merged.status().ToString();
    auto whole = (*db)->Query(c.local_sql);
    ASSERT_TRUE(whole.ok()) << whole.status().ToString();
    SCOPED_TRACE(std::string(QuestionName(c.question)));
    EXPECT_GT(whole->rows.size(), 2u);
    EXPECT_EQ(merged->columns, whole->columns);
    EXPECT_EQ(FormatCsv(*merged), FormatCsv(*whole));
  }
}

// A time window is what is read: the parts hold the window's rows only, and merged they give what
// the run's databases opened over that window give.
TEST_F(QueryTest, ATimeWindowReadsOnlyItsRows) {
  auto all = RunDatabase::Open(run_);
  ASSERT_TRUE(all.ok());
  // From the first span of the last step on: every rank's first step is over by then (each step
  // ends in collectives of every rank), however the steps' lengths fell. The middle of the run's
  // time failed on a loaded CI machine, whose first step took most of it.
  auto span =
      (*all)->Query("SELECT MIN(start_ns) FROM spans WHERE step = (SELECT MAX(step) FROM spans)");
  ASSERT_TRUE(span.ok());
  NodeQuery q;
  q.question = Question::kSteps;
  q.from_ns = std::stoll(span->rows[0][0]);
  auto parse = ParseNodeQuery(NodeQueryPath(q).substr(std::string("/query?").size()));
  ASSERT_TRUE(parse.ok()) << parse.status().ToString();
  EXPECT_EQ(parse->from_ns, q.from_ns);
  std::vector<QueryPart> parts;
  for (const char* node : {"node0", "node1"}) {
    auto part = QueryServer(run_, node).Part(*parse);
    ASSERT_TRUE(part.ok()) << part.status().ToString();
    parts.push_back(std::move(*part));
  }
  auto merged = MergeParts(q, parts);
  ASSERT_TRUE(merged.ok()) << merged.status().ToString();
  auto windowed = RunDatabase::Open(run_, QueryScope(q));
  ASSERT_TRUE(windowed.ok());
  auto expected = (*windowed)->Query(StepsSql());
  ASSERT_TRUE(expected.ok());
  EXPECT_EQ(FormatCsv(*merged), FormatCsv(*expected));
  auto every = (*all)->Query(StepsSql());
  ASSERT_TRUE(every.ok());
  EXPECT_LT(merged->rows.size(), every->rows.size());  // the first steps are outside the window
  auto outside = (*windowed)->Query("SELECT COUNT(*) FROM spans WHERE start_ns < " +
                                    std::to_string(q.from_ns));
  ASSERT_TRUE(outside.ok());
  EXPECT_EQ(outside->rows[0][0], "0");
}

// Quantiles merge by sketch: each node's buckets, added, give p50/p90/p99 within 1 % of the exact
// quantiles over every rank of the run (the least duration with at least q of them at or below
// it), the exact count and maximum; the question travels in the URL; asked of the run directory,
// the answer is the same.
TEST_F(QueryTest, QuantilesMergedFromEachNodesSketchAreWithinOnePercentOfTheExactOnes) {
  auto db = RunDatabase::Open(run_);
  ASSERT_TRUE(db.ok());
  for (const std::string of : {"step", "compute", "comm_wait"}) {
    SCOPED_TRACE(of);
    NodeQuery asked;
    asked.question = Question::kQuantiles;
    asked.of = of;
    auto q = ParseNodeQuery(NodeQueryPath(asked).substr(std::string("/query?").size()));
    ASSERT_TRUE(q.ok()) << q.status().ToString();
    EXPECT_EQ(q->of, of);
    std::vector<QueryPart> parts;
    for (const char* node : {"node1", "node0"}) {
      auto part = QueryServer(run_, node).Part(*q);
      ASSERT_TRUE(part.ok()) << part.status().ToString();
      auto sent = ParseQueryPart(QueryPartJson(*part));
      ASSERT_TRUE(sent.ok());
      parts.push_back(std::move(*sent));
    }
    auto merged = MergeParts(*q, parts);
    ASSERT_TRUE(merged.ok()) << merged.status().ToString();
    ASSERT_EQ(merged->rows.size(), 1u) << FormatCsv(*merged);  // one attempt
    const std::string column = of == "step" ? "wall" : of == "compute" ? "compute" : "comm";
    auto exact = (*db)->Query(PerRankStepCte() + " SELECT " + column + " FROM per_rank ORDER BY 1");
    ASSERT_TRUE(exact.ok()) << exact.status().ToString();
    std::vector<double> xs;
    for (const auto& row : exact->rows) xs.push_back(std::stod(row[0]) / 1e6);
    ASSERT_EQ(xs.size(), 32u);  // 4 steps x 8 ranks
    auto cell = [&](const std::string& name) {
      const auto it = std::find(merged->columns.begin(), merged->columns.end(), name);
      EXPECT_NE(it, merged->columns.end()) << name;
      return merged->rows[0][static_cast<size_t>(it - merged->columns.begin())];
    };
    EXPECT_EQ(cell("of"), of);
    EXPECT_EQ(cell("samples"), "32");
    for (const auto& [name, p] : std::vector<std::pair<std::string, double>>{
             {"p50_ms", 0.5}, {"p90_ms", 0.9}, {"p99_ms", 0.99}}) {
      const double want = xs[static_cast<size_t>(std::ceil(p * 32)) - 1];
      EXPECT_NEAR(std::stod(cell(name)), want, 0.01 * want + 0.0005) << name;
    }
    EXPECT_NEAR(std::stod(cell("max_ms")), xs.back(), 0.0005);
    auto here = RunCommand(Bin() + " query " + run_ + " quantiles " + of + " --csv");
    ASSERT_EQ(here.code, 0) << here.out;
    EXPECT_EQ(here.out, FormatCsv(*merged));
  }
  EXPECT_FALSE(ParseNodeQuery("q=quantiles&of=loss").ok());
  auto bad = RunCommand(Bin() + " query " + run_ + " quantiles loss");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.out.find("expected step, compute, comm_wait or data"), std::string::npos)
      << bad.out;
}

// What an agent answers others is bounded: rows (the part says it was cut), time (an error that
// says so), writes refused, a bad query named.
TEST_F(QueryTest, AnAgentsAnswerIsBoundedInRowsAndTimeAndRefusesWrites) {
  QueryServer few(run_, "node0", /*max_rows=*/3);
  auto [code, body] = few.Serve("q=sql&sql=SELECT%20rank%20FROM%20spans");
  ASSERT_EQ(code, 200) << body;
  auto part = ParseQueryPart(body);
  ASSERT_TRUE(part.ok());
  EXPECT_EQ(part->table.rows.size(), 3u);
  EXPECT_TRUE(part->truncated);
  QueryServer quick(run_, "node0", 100, /*max_seconds=*/0.05);
  std::tie(code, body) = quick.Serve(
      "q=sql&sql=" +
      std::string("WITH%20RECURSIVE%20c(x)%20AS%20(SELECT%201%20UNION%20ALL%20SELECT%20x%2B1%20"
                  "FROM%20c)%20SELECT%20MAX(x)%20FROM%20c"));  // counts for ever
  EXPECT_EQ(code, 503);
  EXPECT_NE(body.find("ran past this agent's limit"), std::string::npos) << body;
  std::tie(code, body) = few.Serve("q=sql&sql=DELETE%20FROM%20spans");
  EXPECT_EQ(code, 400);
  EXPECT_NE(body.find("writes are refused"), std::string::npos) << body;
  for (const char* bad : {"q=slowest", "sql=SELECT%201", "q=steps&sql=SELECT%201",
                          "q=steps&from_ns=x", "q=steps&colour=red", "q=steps&from_ns=5&to_ns=5"}) {
    std::tie(code, body) = few.Serve(bad);
    EXPECT_EQ(code, 400) << bad << ": " << body;
    EXPECT_NE(body.find("query: "), std::string::npos) << bad << ": " << body;
  }
  EXPECT_FALSE(ParseQueryPart(R"({"version": 2, "node": "n"})").ok());
  EXPECT_FALSE(ParseQueryPart(R"({"version": 1, "node": "n", "truncated": false,
                                  "columns": ["a"], "rows": [["1", "2"]]})")
                   .ok());
}

// `megascope query --from-agents`: the run's real agents (with the run's token) each answer over
// their own trace.db, the answers merged equal the local answer; an agent that does not answer is
// named and the rest still answered.
TEST_F(QueryTest, FromAgentsMergesTheirAnswersAndNamesThoseThatDoNotAnswer) {
  TempDir shm;
  const std::string token = run_ + "/control.token";
  std::ofstream(token) << "s3cret\n";
  std::vector<std::unique_ptr<launch::Process>> agents;
  std::vector<launch::ScrapeTarget> targets;
  for (const char* node : {"node0", "node1"}) {
    std::filesystem::remove(RunLayout(run_).agent_port(node));
    auto agent = launch::Process::Spawn(
        launch::ProcessSpec({MEGASCOPE_BIN, "agent", "--node", node, "--job", "querytest",
                             "--run-dir", run_, "--shm-dir", shm.path(), "--token-file", token},
                            shm.path() + "/" + node + ".log"));
    ASSERT_TRUE(agent.ok()) << agent.status().ToString();
    agents.push_back(std::move(*agent));
    const std::string port_file = RunLayout(run_).agent_port(node);
    for (int i = 0; i < 600 && !std::filesystem::exists(port_file); ++i)  // its start, up to 30 s
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    int port = 0;
    std::ifstream(port_file) >> port;
    ASSERT_GT(port, 0) << agents.back()->LogTail(20);
    targets.push_back({node, "127.0.0.1", port});
  }
  targets.push_back({"node7", "127.0.0.1", 1});  // nobody listens there
  ASSERT_TRUE(launch::WriteScrapeTargets(RunLayout(run_), targets).ok());
  auto remote = RunCommand("(" + Bin() + " query " + run_ + " stragglers --from-agents --json 2>" +
                           shm.path() + "/err)");
  auto local = RunCommand(Bin() + " query " + run_ + " stragglers --json");
  std::ifstream err_in(shm.path() + "/err");
  const std::string err((std::istreambuf_iterator<char>(err_in)), {});
  EXPECT_EQ(remote.code, 0) << remote.out << err;
  EXPECT_EQ(remote.out, local.out);
  EXPECT_NE(err.find("2 of 3 agents answered"), std::string::npos) << err;
  EXPECT_NE(err.find("node7 (http://127.0.0.1:1)"), std::string::npos) << err;
  std::filesystem::remove(token);  // the agents now refuse the query
  auto refused = RunCommand(Bin() + " query " + run_ + " steps --from-agents");
  EXPECT_EQ(refused.code, 1) << refused.out;
  EXPECT_NE(refused.out.find("no agent answered"), std::string::npos) << refused.out;
  for (auto& a : agents) EXPECT_TRUE(a->Stop(std::chrono::seconds(10)).success());
  std::filesystem::remove(RunLayout(run_).prometheus_targets());
}

TEST_F(QueryTest, MetricsExportWritesTheDetectorCsv) {
  const std::string csv = dir_->path() + "/m.csv";
  auto r = RunCommand(Bin() + " metrics export " + run_ + " -o " + csv);
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream in(csv);
  std::string header, line;
  std::getline(in, header);
  EXPECT_EQ(header, "timestamp_s,machine,metric,value");
  bool node_metric = false, training_metric = false;
  while (std::getline(in, line)) {
    node_metric |= line.find(",node_cpu_utilization_ratio,") != std::string::npos;
    training_metric |= line.find(",step_seconds,") != std::string::npos;
  }
  EXPECT_TRUE(node_metric);
  EXPECT_TRUE(training_metric);
  // and the detector reads it
  auto d = RunCommand(Bin() + " detect --metrics " + csv);
  EXPECT_EQ(d.code, 0) << d.out;
}

}  // namespace
}  // namespace megascope::analyzer

namespace megascope::analyzer {
namespace {

TEST(RunDatabaseTest, MoreNodesThanSqliteAttachesAtOnce) {
  megascope::testing::TempDir dir;
  constexpr int kNodes = 14;  // SQLite attaches 10 by default
  for (int n = 0; n < kNodes; ++n) {
    auto store =
        tracer::TraceStore::Open(dir.path() + "/nodes/node" + std::to_string(n) + "/trace.db");
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    tracer::RankInfo info;
    info.rank = n;
    info.node = "node" + std::to_string(n);
    ASSERT_TRUE((*store)->UpsertRank(info).ok());
    std::vector<tracer::MetricRow> m = {{info.node, 1, "node_cpu_utilization_ratio", 0.5}};
    // One kernel each: device_spans, a table older files lack, is copied too.
    tracer::Record kernel{};
    kernel.span.type = tracer::RecordType::kSpan;
    kernel.span.kind = tracer::SpanKind::kKernel;
    kernel.span.end_ticks = 10;
    kernel.span.correlation = static_cast<uint32_t>(n + 1);
    const std::vector<std::string> names = {"gemm"};
    const std::vector<tracer::GroupInfo> groups;
    tracer::RingRows rows;
    rows.info = &info;
    rows.names = &names;
    rows.groups = &groups;
    rows.records = {&kernel, 1};
    rows.ring = "r" + std::to_string(n);
    rows.lane_tails = {1};
    ASSERT_TRUE((*store)->Write({&rows, 1}, m, {}).ok());
  }
  auto db = RunDatabase::Open(dir.path());
  ASSERT_TRUE(db.ok()) << db.status().ToString();
  EXPECT_EQ((*db)->nodes(), kNodes);
  auto t = (*db)->Query("SELECT COUNT(*), COUNT(DISTINCT node) FROM metrics");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->rows[0][0], std::to_string(kNodes));
  EXPECT_EQ(t->rows[0][1], std::to_string(kNodes));
  EXPECT_EQ((*db)->Query("SELECT COUNT(*) FROM ranks")->rows[0][0], std::to_string(kNodes));
  EXPECT_EQ((*db)->Query("SELECT COUNT(DISTINCT correlation) FROM device_spans")->rows[0][0],
            std::to_string(kNodes));
  EXPECT_FALSE((*db)->Query("DELETE FROM ranks").ok());
}

// A run of `nodes` nodes, one rank each (rank n on node n), each recording a forward span of
// `steps` steps; rank n's span of step s lasts `duration(n)` ticks.
void WriteOneRankANode(const std::string& dir, int nodes, int steps,
                       const std::function<int64_t(int)>& duration) {
  for (int n = 0; n < nodes; ++n) {
    tracer::RankInfo info;
    info.rank = n;
    info.world_size = nodes;
    info.node = "node" + std::to_string(n);
    std::vector<tracer::Record> spans;
    for (int step = 0; step < steps; ++step) {
      tracer::Record r{};
      r.span.type = tracer::RecordType::kSpan;
      r.span.kind = tracer::SpanKind::kForward;
      r.span.microbatch = -1;
      r.span.step = step;
      r.span.start_ticks = int64_t{1000} * step;
      r.span.end_ticks = int64_t{1000} * step + duration(n);
      spans.push_back(r);
    }
    WriteRankRecords(dir, info, {"forward"}, {}, spans);
  }
}

// Each node's trace.db gains 100 device spans, one every 100 ns from 0, and an op still open,
// issued at 9,000 ns.
void AddDeviceSpansAndAnOpenOp(const std::string& dir, int nodes) {
  for (int n = 0; n < nodes; ++n) {
    auto db = tracer::sql::Database::Open(dir + "/nodes/node" + std::to_string(n) + "/trace.db",
                                          tracer::sql::Database::Mode::kReadWrite);
    ASSERT_TRUE(db.ok()) << db.status().ToString();
    for (const auto& table : tracer::kOptionalTraceTables)
      ASSERT_TRUE(db->Exec(tracer::OptionalTableSql(table)).ok());
    for (int k = 0; k < 100; ++k) {
      ASSERT_TRUE(db->Exec("INSERT INTO device_spans VALUES(" + std::to_string(n) +
                           ", 0, 'kernel', " + std::to_string(100 * k) + ", 0, 0, 0, 0)")
                      .ok());
    }
    ASSERT_TRUE(
        db->Exec("INSERT INTO open_ops VALUES(" + std::to_string(n) +
                 ", 0, 'world', 11, 'allreduce', -1, 4, 'f32', 'started', 9000, 9000, 9500)")
            .ok());
  }
}

// A window of a run: its steps' spans (of its attempt), every rank, the ops still open and the
// device spans within its spans' time, nothing else -- attached (3 nodes) or copied (14 nodes,
// past SQLite's attach limit) alike; a time window reads each table by its time.
TEST(RunDatabaseTest, AScopedOpenReadsOnlyItsWindow) {
  for (int nodes : {3, 14}) {
    megascope::testing::TempDir dir;
    WriteOneRankANode(dir.path(), nodes, 10, [](int) { return 500; });
    AddDeviceSpansAndAnOpenOp(dir.path(), nodes);
    auto count = [](RunDatabase& db, const std::string& table) {
      auto t = db.Query("SELECT COUNT(*) FROM " + table);
      EXPECT_TRUE(t.ok()) << t.status().ToString();
      return t.ok() ? std::stoi(t->rows[0][0]) : -1;
    };
    auto whole = RunDatabase::Open(dir.path());
    ASSERT_TRUE(whole.ok()) << whole.status().ToString();
    EXPECT_EQ(count(**whole, "spans"), nodes * 10);
    auto window = RunDatabase::Open(dir.path(), {0, 3, 5, ""});
    ASSERT_TRUE(window.ok()) << window.status().ToString();
    EXPECT_EQ(count(**window, "spans"), nodes * 3) << nodes << " nodes";
    EXPECT_EQ((*window)->Query("SELECT MIN(step), MAX(step) FROM spans")->rows[0],
              (std::vector<std::string>{"3", "5"}));
    EXPECT_EQ(count(**window, "ranks"), nodes);
    EXPECT_EQ(count(**whole, "device_spans"), nodes * 100);
    // Steps 3-5 run from 3,000 to 5,500 ns: device spans starting at 3,000, 3,100 ... 5,500.
    EXPECT_EQ(count(**window, "device_spans"), nodes * 26) << nodes << " nodes";
    EXPECT_EQ(count(**window, "open_ops"), nodes);
    auto other_attempt = RunDatabase::Open(dir.path(), {1, 0, 9, ""});
    ASSERT_TRUE(other_attempt.ok()) << other_attempt.status().ToString();
    EXPECT_EQ(count(**other_attempt, "spans"), 0);
    RunScope time;
    time.from_ns = 3000;
    time.to_ns = 5000;
    auto timed = RunDatabase::Open(dir.path(), time);
    ASSERT_TRUE(timed.ok()) << timed.status().ToString();
    EXPECT_EQ(count(**timed, "spans"), nodes * 2);  // steps 3 and 4 start in it
    EXPECT_EQ(count(**timed, "device_spans"), nodes * 20);
    EXPECT_EQ(count(**timed, "open_ops"), 0);  // issued at 9,000 ns
  }
}

// Node by node: the same per-rank rows the unified database gives, one node's database attached at
// a time (14 nodes: past the attach limit, where an open copies); an unreadable node is named and
// skipped, a statement no node can answer is an error.
TEST(NodeScanTest, ReadsEachNodeInTurnTheRowsTheUnifiedDatabaseHas) {
  megascope::testing::TempDir dir;
  constexpr int kNodes = 14;
  WriteOneRankANode(dir.path(), kNodes, 4, [](int n) { return int64_t{100} * (n + 1); });
  const std::string sql = PerRankStepCte() + "\nSELECT rank, step, compute FROM per_rank";
  std::set<std::vector<int64_t>> unified, by_node;
  auto db = RunDatabase::Open(dir.path());
  ASSERT_TRUE(db.ok()) << db.status().ToString();
  ASSERT_TRUE((*db)
                  ->Scan(sql,
                         [&](const RunDatabase::Row& r) {
                           unified.insert({r.Int(0), r.Int(1), r.Int(2)});
                         })
                  .ok());
  NodeScan scan(dir.path());
  ASSERT_TRUE(scan.Scan(sql,
                        [&](const RunDatabase::Row& r) {
                          by_node.insert({r.Int(0), r.Int(1), r.Int(2)});
                        })
                  .ok());
  EXPECT_EQ(unified.size(), size_t{kNodes} * 4);
  EXPECT_EQ(by_node, unified);

  const std::string bad = dir.path() + "/nodes/node3/trace.db";
  std::ofstream(bad, std::ios::trunc | std::ios::binary) << "not a database";
  by_node.clear();
  ASSERT_TRUE(scan.Scan(sql,
                        [&](const RunDatabase::Row& r) {
                          by_node.insert({r.Int(0), r.Int(1), r.Int(2)});
                        })
                  .ok());
  EXPECT_EQ(by_node.size(), size_t{kNodes - 1} * 4);
  ASSERT_EQ(scan.warnings().size(), 1u);
  EXPECT_EQ(scan.warnings()[0].rfind("node3: ", 0), 0u) << scan.warnings()[0];
  const Status wrong = scan.Scan("SELECT no_such_column FROM spans", [](auto&) {});
  EXPECT_FALSE(wrong.ok());
  EXPECT_NE(wrong.message().find("no_such_column"), std::string::npos) << wrong.message();
}

// One node's trace.db that cannot be read (here cut short) is named and skipped: every other
// node is still answered for, attached (3 nodes) or copied in batches (14 nodes). Only when no
// node can be read is it an error.
TEST(RunDatabaseTest, AnUnreadableNodeDatabaseIsSkippedWithAWarning) {
  for (int nodes : {3, 14}) {
    megascope::testing::TempDir dir;
    for (int n = 0; n < nodes; ++n) {
      auto store =
          tracer::TraceStore::Open(dir.path() + "/nodes/node" + std::to_string(n) + "/trace.db");
      ASSERT_TRUE(store.ok()) << store.status().ToString();
      std::vector<tracer::MetricRow> m = {
          {"node" + std::to_string(n), 1, "node_cpu_utilization_ratio", 0.5}};
      ASSERT_TRUE((*store)->Write({}, m, {}).ok());
    }
    const std::string bad = dir.path() + "/nodes/node1/trace.db";
    const std::string bytes = tracer::ReadFile(bad).value();
    std::ofstream(bad, std::ios::trunc | std::ios::binary) << bytes.substr(0, 2000);
    auto db = RunDatabase::Open(dir.path());
    ASSERT_TRUE(db.ok()) << db.status().ToString();
    EXPECT_EQ((*db)->nodes(), nodes - 1);
    ASSERT_EQ((*db)->warnings().size(), 1u);
    EXPECT_NE((*db)->warnings()[0].find(bad + ": "), std::string::npos) << (*db)->warnings()[0];
    EXPECT_NE((*db)->warnings()[0].find("skipped"), std::string::npos);
    EXPECT_EQ((*db)->warnings()[0].find(":memory:"), std::string::npos) << (*db)->warnings()[0];
    auto t = (*db)->Query("SELECT COUNT(DISTINCT node) FROM metrics WHERE node != 'node1'");
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    EXPECT_EQ(t->rows[0][0], std::to_string(nodes - 1)) << nodes << " nodes";
  }
  megascope::testing::TempDir dir;
  std::filesystem::create_directories(dir.path() + "/nodes/node0");
  std::ofstream(dir.path() + "/nodes/node0/trace.db") << "not a database";
  auto none = RunDatabase::Open(dir.path());
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("no trace database under"), std::string::npos)
      << none.status().message();
}

// A trace.db of schema version 1 (the FORMATS tables stored as such, before the compact rows)
// is still read; one from a newer megascope is refused with a clear error, not misread.
TEST(RunDatabaseTest, ReadsVersionOneFilesAndRefusesNewerVersions) {
  megascope::testing::TempDir dir;
  std::filesystem::create_directories(dir.path() + "/nodes/node0");
  const std::string path = dir.path() + "/nodes/node0/trace.db";
  {
    auto v1 = tracer::sql::Database::Open(path, tracer::sql::Database::Mode::kReadWrite);
    ASSERT_TRUE(v1.ok());
    ASSERT_TRUE(v1->Exec(R"sql(
      CREATE TABLE ranks(rank, node, local_rank, dp, pp, tp, pid, attempt, clock_offset_ns);
      CREATE TABLE spans(rank, attempt, step, microbatch, kind, name, start_ns, end_ns);
      CREATE TABLE collectives(rank, attempt, grp, seq, op, peer, bytes, dtype, state, enqueued_ns,
                               started_ns, completed_ns);
      CREATE TABLE heartbeats(rank, attempt, ts_ns, step, phase);
      CREATE TABLE metrics(node, ts_ns, name, value);
      CREATE TABLE drops(rank, ts_ns, dropped_records);
      INSERT INTO spans VALUES(0, 0, 3, NULL, 'forward', 'forward', 100, 250);
      PRAGMA user_version = 1;)sql")
                    .ok());
  }
  {
    auto db = RunDatabase::Open(dir.path());
    ASSERT_TRUE(db.ok()) << db.status().ToString();
    auto t = (*db)->Query("SELECT step, end_ns - start_ns FROM spans WHERE kind = 'forward'");
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    ASSERT_EQ(t->rows.size(), 1u);
    EXPECT_EQ(t->rows[0][0], "3");
    EXPECT_EQ(t->rows[0][1], "150");
  }
  {
    auto db = tracer::sql::Database::Open(path, tracer::sql::Database::Mode::kReadWrite);
    ASSERT_TRUE(db.ok());
    ASSERT_TRUE(
        db->Exec("PRAGMA user_version = " + std::to_string(tracer::kTraceSchemaVersion + 1)).ok());
  }
  auto db = RunDatabase::Open(dir.path());
  ASSERT_FALSE(db.ok());
  EXPECT_NE(db.status().message().find("newer megascope"), std::string::npos)
      << db.status().message();
  EXPECT_NE(db.status().message().find(path), std::string::npos) << db.status().message();
}

}  // namespace
}  // namespace megascope::analyzer
