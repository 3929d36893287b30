// A straggler window computed where its data is: each node's part (what its agent answers on
// /window, over its own trace.db) merged gives the analysis the whole run's databases give; a
// window not yet stored is answered with how far each rank is, without its rows.
#include "megascope/analyzer/window.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "megascope/launch/process.h"
#include "megascope/tracer/http_client.h"
#include "megascope/tracer/run_layout.h"
#include "store_run.h"
#include "test_util.h"

namespace megascope::analyzer {
namespace {

constexpr int kNodes = 3, kRanksPerNode = 2, kSteps = 10;
constexpr int64_t kMs = 1000000;

// kNodes x kRanksPerNode ranks of a (dp=3, tp=2) job; each step every rank computes 10 ms (rank 4:
// 16 ms, a compute straggler) then joins its tp pair's all-reduce (on its node) and its dp group's
// (across nodes), each completing 1 ms after its last member arrives. Node n's clock runs n ms
// ahead (clock offsets).
void WriteRun(const std::string& dir) {
  const std::vector<std::string> names = {"forward"};
  constexpr int kWorld = kNodes * kRanksPerNode;
  std::vector<std::vector<tracer::Record>> recs(kWorld);
  std::vector<int64_t> free_at(kWorld, 1000 * kMs);
  std::vector<uint64_t> entry(kWorld, 0);
  for (int s = 0; s < kSteps; ++s) {
    std::vector<int64_t> enq(kWorld);
    for (int r = 0; r < kWorld; ++r) {
      tracer::Record rec{};
      enq[r] = free_at[r] + (r == 4 ? 16 : 10) * kMs;
      rec.span = {tracer::RecordType::kSpan,
                  tracer::SpanKind::kForward,
                  0,
                  -1,
                  s,
                  free_at[r],
                  enq[r],
                  0,
                  0,
                  0,
                  0,
                  0,
                  {}};
      recs[r].push_back(rec);
    }
    // Group 0: the rank's tp pair (its node); group 1: its dp group (tp rank r % 2, every node).
    for (uint16_t g = 0; g < 2; ++g) {
      for (int r = 0; r < kWorld; ++r) {
        int64_t last = 0;
        for (int q = 0; q < kWorld; ++q) {
          if (g == 0 ? q / 2 == r / 2 : q % 2 == r % 2) last = std::max(last, enq[q]);
        }
        recs[r].push_back(CompletedAllreduce(g, static_cast<uint64_t>(s) + 1, ++entry[r], s, enq[r],
                                             last + kMs, 1 << 20));
        free_at[r] = last + kMs;
      }
      enq = free_at;
    }
  }
  for (int r = 0; r < kWorld; ++r) {
    tracer::RankInfo info;
    info.job = "window";
    info.node = "node" + std::to_string(r / kRanksPerNode);
    info.rank = r;
    info.local_rank = r % kRanksPerNode;
    info.world_size = kWorld;
    info.coords = {r / 2, 0, r % 2};
    info.clock_offset_ns = (r / kRanksPerNode) * kMs;
    const std::vector<tracer::GroupInfo> groups = {
        {"tp." + std::to_string(r / 2), "tp", {r / 2 * 2, r / 2 * 2 + 1}},
        {"dp." + std::to_string(r % 2), "dp", {r % 2, r % 2 + 2, r % 2 + 4}}};
    WriteRankRecords(dir, info, names, groups, recs[r]);
  }
}

class WindowTest : public ::testing::Test {
 protected:
  void SetUp() override { WriteRun(dir_.path()); }
  // Every node's part of the window, as its agent would answer it (JSON and back).
  std::map<std::string, WindowPart> Parts(const std::string& query) {
    std::map<std::string, WindowPart> parts;
    for (int n = 0; n < kNodes; ++n) {
      const std::string node = "node" + std::to_string(n);
      WindowServer server(dir_.path(), node);
      auto [code, body] = server.Serve(query);
      EXPECT_EQ(code, 200) << body;
      auto part = ParseWindowPart(body);
      EXPECT_TRUE(part.ok()) << part.status().ToString();
      if (part.ok()) parts[node] = std::move(*part);
    }
    return parts;
  }
  megascope::testing::TempDir dir_;
};

#ifndef MEGASCOPE_BIN  // analyzer_window_test: in-process; analyzer_window_agent_test: the process
// A verdict as JSON without the time it was made at.
std::string Stable(Verdict v) {
  v.detected_at_ns = 0;
  return VerdictToJson(v);
}

TEST_F(WindowTest, TheNodesPartsMergeIntoTheAnalysisOfTheWholeRunsDatabases) {
  SlowOptions o;
  o.attempt = 0;
  o.first_step = 2;
  o.last_step = 7;
  auto db = RunDatabase::Open(dir_.path());
  ASSERT_TRUE(db.ok()) << db.status().ToString();
  auto whole = AnalyzeSlow(**db, o);
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();

  std::map<std::string, WindowPart> parts = Parts("attempt=0&from=2&to=7");
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(RanksThrough(parts, 7), 6);
  SlowInput merged;
  for (auto& [node, part] : parts) {
    ASSERT_TRUE(part.has_rows) << node;
    EXPECT_EQ(part.input.ranks.size(), 2u) << node << " holds its own ranks";
    merged.Merge(std::move(part.input));
  }
  EXPECT_EQ(merged.steps.size(), 6u * 6);
  auto from_parts = AnalyzeSlow(merged, o);
  ASSERT_TRUE(from_parts.ok()) << from_parts.status().ToString();

  ASSERT_EQ(from_parts->verdicts.size(), whole->verdicts.size());
  for (size_t i = 0; i < whole->verdicts.size(); ++i)
    EXPECT_EQ(Stable(from_parts->verdicts[i]), Stable(whole->verdicts[i]));
  EXPECT_EQ(from_parts->mean_step_s, whole->mean_step_s);
  EXPECT_EQ(from_parts->bubble_share, whole->bubble_share);
  // ... and it is the analysis that finds the straggler, not two empty ones.
  const Verdict& first = from_parts->verdicts.front();
  EXPECT_EQ(first.cause, "compute_straggler");
  EXPECT_EQ(first.root_ranks, std::vector<int32_t>{4});
  EXPECT_EQ(first.root_nodes, std::vector<std::string>{"node2"});
}

TEST_F(WindowTest, AWindowNotYetStoredIsAnsweredWithHowFarEachRankIs) {
  std::map<std::string, WindowPart> parts = Parts("attempt=0&from=8&to=15");
  for (const auto& [node, part] : parts) {
    EXPECT_FALSE(part.has_rows) << node;
    EXPECT_TRUE(part.input.steps.empty()) << node;
    ASSERT_EQ(part.through.size(), 2u) << node;
    EXPECT_EQ(part.through.begin()->second, kSteps - 1);
  }
  EXPECT_EQ(RanksThrough(parts, 15), 0);
  // Asked anyway (a rank stays behind), what is stored comes: steps 8 and 9 of every rank.
  parts = Parts("attempt=0&from=8&to=15&anyway=1");
  for (const auto& [node, part] : parts) {
    EXPECT_TRUE(part.has_rows) << node;
    EXPECT_EQ(part.input.steps.size(), 4u) << node;
  }
  // Another attempt has stored nothing.
  parts = Parts("attempt=1&from=0&to=5");
  for (const auto& [node, part] : parts) EXPECT_TRUE(part.through.empty()) << node;
}

TEST_F(WindowTest, BadQueriesAndUnknownVersionsAreClearErrors) {
  WindowServer server(dir_.path(), "node0");
  auto [code, body] = server.Serve("attempt=0&from=x&to=3");
  EXPECT_EQ(code, 400);
  EXPECT_NE(body.find("from is not an integer: 'x'"), std::string::npos) << body;
  std::tie(code, body) = server.Serve("from=1&to=3");
  EXPECT_EQ(code, 400);
  EXPECT_NE(body.find("attempt, from and to are all needed"), std::string::npos) << body;
  std::tie(code, body) = server.Serve("attempt=0&from=1&to=3&steps=9");
  EXPECT_EQ(code, 400);
  EXPECT_NE(body.find("unknown field 'steps'"), std::string::npos) << body;
  std::tie(code, body) = server.Serve("attempt=0&from=5&to=3");
  EXPECT_EQ(code, 400);

  auto later = ParseWindowPart(R"({"version": 2, "node": "node0"})");
  ASSERT_FALSE(later.ok());
  EXPECT_NE(later.status().message().find("format version 2"), std::string::npos);
  auto torn = ParseWindowPart(R"({"version": 1, "node": "node0", "through": [[0, 5]]})");
  ASSERT_FALSE(torn.ok());
  EXPECT_NE(torn.status().message().find("malformed /window answer from node0"), std::string::npos)
      << torn.status().message();
  EXPECT_FALSE(ParseWindowPart("not json").ok());

  // A node whose database does not exist yet has stored nothing; anyway, it has nothing to send.
  WindowServer fresh(dir_.path(), "node9");
  std::tie(code, body) = fresh.Serve("attempt=0&from=0&to=3&anyway=1");
  EXPECT_EQ(code, 200) << body;
  auto part = ParseWindowPart(body);
  ASSERT_TRUE(part.ok()) << part.status().ToString();
  EXPECT_TRUE(part->through.empty());
  EXPECT_TRUE(part->input.steps.empty());
}

#else
// The real `megascope agent` answers /window over its node's trace.db (with the run's token), the
// same part the analyzer computes in-process.
TEST_F(WindowTest, TheAgentProcessServesItsNodesPartWithTheRunsToken) {
  megascope::testing::TempDir shm;
  const std::string token_file = dir_.path() + "/control.token";
  std::ofstream(token_file) << "s3cret\n";
  auto agent = launch::Process::Spawn(launch::ProcessSpec(
      {MEGASCOPE_BIN, "agent", "--node", "node2", "--job", "windowtest", "--run-dir", dir_.path(),
       "--shm-dir", shm.path(), "--token-file", token_file, "--retain-hours",
       "0"},  // (the records are timed in 1970: past any retention window)
      dir_.path() + "/agent.log"));
  ASSERT_TRUE(agent.ok()) << agent.status().ToString();
  const std::string port_file = RunLayout(dir_.path()).agent_port("node2");
  for (int i = 0; i < 600 && !std::filesystem::exists(port_file); ++i)  // its start, up to 30 s
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  int port = 0;
  std::ifstream(port_file) >> port;
  ASSERT_GT(port, 0) << (*agent)->LogTail(20);
  const std::string url =
      "http://127.0.0.1:" + std::to_string(port) + "/window?attempt=0&from=2&to=7";
  EXPECT_FALSE(tracer::HttpGet(url, 10000).ok()) << "answered without the token";
  auto body = tracer::HttpGet(url, 10000, "s3cret");
  ASSERT_TRUE(body.ok()) << body.status().ToString() << (*agent)->LogTail(20);
  auto part = ParseWindowPart(*body);
  ASSERT_TRUE(part.ok()) << part.status().ToString();
  EXPECT_EQ(part->node, "node2");
  EXPECT_TRUE(part->has_rows);
  WindowServer here(dir_.path(), "node2");
  auto expected = here.Part({0, 2, 7, false});
  ASSERT_TRUE(expected.ok());
  EXPECT_EQ(*body, WindowPartJson(*expected));
  auto bad = tracer::HttpGet("http://127.0.0.1:" + std::to_string(port) + "/window?from=2", 10000,
                             "s3cret");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("attempt, from and to are all needed"), std::string::npos)
      << bad.status().message();
  EXPECT_TRUE((*agent)->Stop(std::chrono::seconds(10)).success());
}
#endif

}  // namespace
}  // namespace megascope::analyzer
