// End to end: `megascope launch` over real processes (agents, ranks, Gloo over TCP), each fault
// injected into the real processes. After every recovery the losses continue those of an
// uninterrupted run and no trace row is written twice.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "megascope/controller/control_db.h"
#include "megascope/launch/process.h"
#include "megascope/launch/run_layout.h"
#include "megascope/runtime/data.h"
#include "sqlite_util.h"
#include "test_util.h"

namespace megascope::controller {
namespace {

namespace fs = std::filesystem;
using megascope::testing::CommandResult;
using megascope::testing::RunCommand;
using megascope::testing::TempDir;

constexpr int kSteps = 12;
const char* kModel =
    " --layers 2 --width 64 --heads 4 --seq 32 --batch 4 --microbatches 2 --hang-after 2 --tick "
    "0.1";

class LaunchTest : public ::testing::Test {
 public:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    data_ = dir_->path() + "/notes.bin";
    ASSERT_TRUE(
        runtime::PrepareByteTokens(MEGASCOPE_TEST_DATA "/text/notes_on_training.txt", data_).ok());
  }
  static void TearDownTestSuite() { delete dir_; }
  // A launch that was stopped keeps its in-memory snapshots (tmpfs) for a resume: not the tests'.
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(launch::MemoryRoot("/dev/shm", Job()), ec);
  }

  // Short: job names are stored in fixed-size ring headers.
  std::string Job() const {
    return "l" + std::to_string(::getpid()) + "_" +
           std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
           std::to_string(std::hash<std::string>()(
                              ::testing::UnitTest::GetInstance()->current_test_info()->name()) %
                          100000);
  }
  std::string Run() const {
    return dir_->path() + "/" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }

  std::string LaunchCmd(const std::string& layout, const std::string& extra,
                        int steps = kSteps) const {
    // Self-checks measure real throughput; with other tests sharing the two cores a healthy node
    // can measure at a third of its launch figure, so the tests pass nodes at a fifth unless they
    // set the ratio themselves (a degraded node is injected 16x slower).
    const std::string ratios = extra.find("--min-gemm-ratio") == std::string::npos
                                   ? " --min-gemm-ratio 0.2 --min-bandwidth-ratio 0.1"
                                   : "";
    return std::string(MEGASCOPE_BIN) + " launch " + layout + " --data " + data_ + " --run-dir " +
           Run() + " --job " + Job() + " --steps " + std::to_string(steps) + kModel + ratios + " " +
           extra;
  }
  CommandResult Launch(const std::string& layout, const std::string& extra,
                       int steps = kSteps) const {
    CommandResult r = RunCommand(LaunchCmd(layout, extra, steps));
    std::ifstream report(Run() + "/report.md");
    std::cout << report.rdbuf() << "\n";  // the stage times of every incident, in the test log
    return r;
  }

  // Losses of an uninterrupted run of the same job (per layout, computed once).
  static const std::map<int64_t, double>& Reference(const std::string& layout) {
    static std::map<std::string, std::map<int64_t, double>> cache;
    auto it = cache.find(layout);
    if (it != cache.end()) return it->second;
    const std::string run = dir_->path() + "/reference" + std::to_string(cache.size());
    CommandResult r =
        RunCommand(std::string(MEGASCOPE_BIN) + " train " + layout + " --data " + data_ +
                   " --run-dir " + run + " --job ref" + std::to_string(::getpid()) +
                   std::to_string(cache.size()) + " --steps " + std::to_string(kSteps) +
                   " --layers 2 --width 64 --heads 4 --seq 32 --batch 4 --microbatches 2");
    EXPECT_EQ(r.code, 0) << r.out;
    return cache[layout] = Losses(run);
  }
  // step -> loss of the step's last (kept) run.
  static std::map<int64_t, double> Losses(const std::string& run) {
    std::map<int64_t, double> out;
    std::ifstream in(run + "/progress.jsonl");
    for (std::string line; std::getline(in, line);) {
      auto j = nlohmann::json::parse(line);
      if (!j.contains("event")) out[j["step"].get<int64_t>()] = j["loss"].get<double>();
    }
    return out;
  }
  void ExpectLossesContinue(const std::string& layout) const {
    const auto& want = Reference(layout);
    const auto got = Losses(Run());
    ASSERT_EQ(got.size(), want.size());
    for (const auto& [step, loss] : want)
      EXPECT_NEAR(got.at(step), loss, 1e-5 * std::fabs(loss)) << "step " << step;
  }
  std::string RunDir() const { return Run(); }
  std::vector<Event> AllEvents() const { return Events(); }
  static std::string ReadLog(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string s = ss.str();
    return s.size() > 6000 ? s.substr(s.size() - 6000) : s;
  }
  std::vector<Event> Events() const {
    auto db = ControlDb::Open(Run() + "/control.db", true);
    EXPECT_TRUE(db.ok()) << db.status().ToString();
    auto ev = (*db)->Events();
    return ev.ok() ? *ev : std::vector<Event>{};
  }
  static std::vector<Event> Of(const std::vector<Event>& all, const std::string& kind) {
    std::vector<Event> out;
    for (const Event& e : all) {
      if (e.kind_name == kind) out.push_back(e);
    }
    return out;
  }
  // Every span row is in a trace.db once: no (rank, attempt, step, microbatch, kind, name) twice.
  void ExpectNoDuplicateRows() const {
    for (const auto& node : fs::directory_iterator(Run() + "/nodes")) {
      EXPECT_EQ(fs::status(node.path() / "trace.db").permissions() & fs::perms::all,
                fs::perms::owner_read | fs::perms::owner_write)
          << "trace databases are private to the run's owner";
      const std::vector<int64_t> n = megascope::testing::FirstRow(
          (node.path() / "trace.db").string(),
          "SELECT COUNT(*), (SELECT COUNT(*) FROM (SELECT DISTINCT rank, attempt, step, "
          "microbatch, kind, name, start_ns FROM spans)) FROM spans");
      ASSERT_EQ(n.size(), 2u) << node.path();
      EXPECT_GT(n[0], 0) << node.path();
      EXPECT_EQ(n[0], n[1]) << node.path() << ": duplicated span rows";
    }
  }

  static TempDir* dir_;
  static std::string data_;
};
TempDir* LaunchTest::dir_ = nullptr;
std::string LaunchTest::data_;

const char* kDp2 = "--dp 2 --nodes 2";

TEST_F(LaunchTest, ACrashedRanksNodeIsEvictedAndASpareResumesTheLossCurve) {
  CommandResult r = Launch(std::string(kDp2) + " --spares 1", "--inject crash:node=node1,at=5");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto ev = Events();
  ASSERT_EQ(Of(ev, "verdict").size(), 1u);
  EXPECT_EQ(Of(ev, "verdict")[0].detail["cause"], "rank_dead");
  EXPECT_EQ(Of(ev, "verdict")[0].detail["root_ranks"], nlohmann::json::array({1}));
  ASSERT_EQ(Of(ev, "eviction").size(), 1u);
  EXPECT_EQ(Of(ev, "eviction")[0].node, "node1");
  const auto restarts = Of(ev, "restart");
  ASSERT_EQ(restarts.size(), 2u);  // the start, then the recovery
  EXPECT_EQ(restarts[1].detail["nodes"], nlohmann::json::array({"node0", "node2"}));
  EXPECT_EQ(restarts[1].detail["source"], "memory");
  EXPECT_LE(restarts[1].detail["steps_lost"].get<int>(), 1);
  EXPECT_EQ(Of(ev, "resumed").size(), 1u);
  EXPECT_EQ(Of(ev, "job_finished").at(0).detail["status"], "finished");
  ExpectLossesContinue(kDp2);
  ExpectNoDuplicateRows();
}

TEST_F(LaunchTest, AHangInComputeIsNamedFromTheLiveAgentsAndItsNodeEvicted) {
  CommandResult r = Launch(std::string(kDp2) + " --spares 1", "--inject hang:node=node1,at=5");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto ev = Events();
  ASSERT_EQ(Of(ev, "trigger").size(), 1u);
  EXPECT_EQ(Of(ev, "trigger")[0].detail["cause"], "hang");
  ASSERT_GE(Of(ev, "verdict").size(), 1u);
  EXPECT_EQ(Of(ev, "verdict")[0].detail["cause"], "rank_not_joined");
  EXPECT_EQ(Of(ev, "verdict")[0].detail["root_nodes"], nlohmann::json::array({"node1"}));
  ASSERT_EQ(Of(ev, "eviction").size(), 1u);
  EXPECT_EQ(Of(ev, "eviction")[0].node, "node1");
  ExpectLossesContinue(kDp2);
  ExpectNoDuplicateRows();
}

TEST_F(LaunchTest, AStalledSendSelfChecksBothEndsAndRestartsInPlaceWhenBothPass) {
  const std::string pp2 = "--pp 2 --nodes 2";
  CommandResult r = Launch(pp2, "--inject stall-send:rank=0,at=5");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto ev = Events();
  ASSERT_GE(Of(ev, "verdict").size(), 1u);
  EXPECT_EQ(Of(ev, "verdict")[0].detail["cause"], "link_stall");
  EXPECT_EQ(Of(ev, "verdict")[0].detail["root_ranks"], nlohmann::json::array({0, 1}));
  int checked_ends = 0;
  for (const Event& e : Of(ev, "self_check"))
    checked_ends += e.detail["why"] == "end of a stalled link" ? 1 : 0;
  EXPECT_EQ(checked_ends, 2);
  EXPECT_TRUE(Of(ev, "eviction").empty());
  EXPECT_EQ(Of(ev, "restart").back().detail["nodes"], nlohmann::json::array({"node0", "node1"}));
  ExpectLossesContinue(pp2);
  ExpectNoDuplicateRows();
}

TEST_F(LaunchTest, ADeadAgentIsRestartedWithoutEvictionAndNoRowIsLostOrDuplicated) {
  CommandResult r = Launch(kDp2, "--inject kill-agent:node=node0,at=4");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto ev = Events();
  ASSERT_EQ(Of(ev, "agent_restarted").size(), 1u);
  EXPECT_EQ(Of(ev, "agent_restarted")[0].node, "node0");
  EXPECT_TRUE(Of(ev, "eviction").empty());
  EXPECT_TRUE(Of(ev, "trigger").empty());
  ExpectNoDuplicateRows();
  // Nothing lost: every step of rank 0 has its forward spans in node0's trace.db.
  const std::vector<int64_t> n = megascope::testing::FirstRow(
      Run() + "/nodes/node0/trace.db",
      "SELECT COUNT(DISTINCT step), (SELECT COALESCE(SUM(dropped_records), 0) FROM drops) FROM "
      "spans WHERE rank = 0 AND kind = 'forward'");
  ASSERT_EQ(n.size(), 2u);
  if (n[1] == 0) {
    EXPECT_EQ(n[0], kSteps);
  }
  ExpectLossesContinue(kDp2);
}

TEST_F(LaunchTest, ACorruptNewestStateIsSkippedForThePreviousOne) {
  CommandResult r = Launch(std::string(kDp2) + " --spares 1",
                           "--inject crash:node=node1,at=6 --inject corrupt-checkpoint");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("corrupt (checksum mismatch)"), std::string::npos) << r.out;
  const auto ev = Events();
  const auto restarts = Of(ev, "restart");
  ASSERT_EQ(restarts.size(), 2u);
  int64_t corrupted = -1;
  for (const Event& e : Of(ev, "fault_injected")) {
    if (e.detail["kind"] == "corrupt-checkpoint") corrupted = e.detail["memory_step"];
  }
  ASSERT_GT(corrupted, 1);
  EXPECT_EQ(restarts[1].detail["resume_step"].get<int64_t>(), corrupted - 1)
      << "the newest complete state (step " << corrupted
      << ") was corrupted: the one before it is used";
  ExpectLossesContinue(kDp2);
  ExpectNoDuplicateRows();
}

TEST_F(LaunchTest, ASpareThatFailsItsSelfCheckIsSkippedForTheNextOne) {
  // node2 runs its self-check 16x slower; a healthy node passes at 0.3 of its launch figure even
  // when other tests share the cores.
  CommandResult r = Launch(std::string(kDp2) + " --spares 2",
                           "--min-gemm-ratio 0.3 --min-bandwidth-ratio 0.1 "
                           "--inject degrade:node=node2,factor=16 "
                           "--inject crash:node=node1,at=5");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto ev = Events();
  std::map<std::string, bool> passed;
  for (const Event& e : Of(ev, "self_check")) {
    if (e.detail["why"] != "baseline") passed[e.node] = e.detail["passed"];
  }
  EXPECT_EQ(passed["node2"], false);
  EXPECT_EQ(passed["node3"], true);
  EXPECT_EQ(Of(ev, "restart").back().detail["nodes"], nlohmann::json::array({"node0", "node3"}));
  ExpectLossesContinue(kDp2);
  ExpectNoDuplicateRows();
}

TEST_F(LaunchTest, NoSpareLeftPausesWithAClearMessageInsteadOfLooping) {
  CommandResult r = Launch(kDp2, "--inject crash:node=node1,at=4");
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("no spare node left to replace node1"), std::string::npos) << r.out;
  const auto ev = Events();
  EXPECT_EQ(Of(ev, "trigger").size(), 1u);
  EXPECT_EQ(Of(ev, "paused").size(), 1u);
  EXPECT_EQ(Of(ev, "restart").size(), 1u);  // the start only
}

TEST_F(LaunchTest, TwoFaultsInARowEvictTwiceThenTheSafetyValvePauses) {
  CommandResult r = Launch(std::string(kDp2) + " --spares 3 --max-evictions 2",
                           "--inject crash:node=node1,at=3 --inject crash:node=node0,at=6 --inject "
                           "crash:node=node2,at=9");
  EXPECT_EQ(r.code, 3) << r.out;
  const auto ev = Events();
  EXPECT_EQ(Of(ev, "eviction").size(), 2u);
  ASSERT_EQ(Of(ev, "paused").size(), 1u);
  EXPECT_NE(Of(ev, "paused")[0].detail["reason"].get<std::string>().find("--max-evictions 2"),
            std::string::npos);
  EXPECT_EQ(Of(ev, "trigger").size(), 3u);
}

TEST_F(LaunchTest, ManualEvictAndStopNeedTheRunsToken) {
  auto launch = launch::Process::Spawn(
      {{"/bin/sh", "-c", "exec " + LaunchCmd(std::string(kDp2) + " --spares 1", "", 400)},
       dir_->path() + "/manual.log"});
  ASSERT_TRUE(launch.ok());
  const std::string progress = Run() + "/progress.jsonl";
  auto steps_done = [&] { return Losses(Run()).size(); };
  for (int i = 0; i < 600 && steps_done() < 3; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_GE(steps_done(), 3u);
  // Without the token (another directory holding only controller.json) nothing happens.
  const std::string other = dir_->path() + "/no-token";
  fs::create_directories(other);
  fs::copy_file(Run() + "/controller.json", other + "/controller.json",
                fs::copy_options::overwrite_existing);
  CommandResult denied = RunCommand(std::string(MEGASCOPE_BIN) + " evict node1 --run-dir " + other);
  EXPECT_EQ(denied.code, 1);
  EXPECT_NE(denied.out.find("token"), std::string::npos) << denied.out;
  std::ofstream(other + "/control.token") << "0123456789abcdef\n";
  CommandResult wrong = RunCommand(std::string(MEGASCOPE_BIN) + " evict node1 --run-dir " + other);
  EXPECT_EQ(wrong.code, 1);
  EXPECT_NE(wrong.out.find("403"), std::string::npos) << wrong.out;
  EXPECT_EQ(fs::status(Run() + "/control.token").permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write);
  // With it: evict, then stop.
  CommandResult evict = RunCommand(std::string(MEGASCOPE_BIN) + " evict node1 --run-dir " + Run());
  ASSERT_EQ(evict.code, 0) << evict.out;
  bool resumed = false;
  for (int i = 0; i < 600 && !resumed; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    resumed = !Of(Events(), "resumed").empty();
  }
  EXPECT_TRUE(resumed);
  CommandResult stop = RunCommand(std::string(MEGASCOPE_BIN) + " stop --run-dir " + Run());
  EXPECT_EQ(stop.code, 0) << stop.out;
  auto end = (*launch)->WaitFor(std::chrono::seconds(60));
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->code(), 130);
  const auto ev = Events();
  ASSERT_EQ(Of(ev, "eviction").size(), 1u);
  EXPECT_EQ(Of(ev, "eviction")[0].node, "node1");
  EXPECT_EQ(Of(ev, "eviction")[0].detail["reason"], "manual");
  EXPECT_EQ(Of(ev, "job_finished").at(0).detail["status"], "stopped");
}

// --- Faults that do not stop the job: the detector and the straggler analysis online ---------

// Four nodes doing the same work (the detector needs four peers) and a spare.
std::string EvidenceCmd(const std::string& run, const std::string& job, const std::string& data,
                        const std::string& layout, int steps, const std::string& extra) {
  return std::string(MEGASCOPE_BIN) + " launch " + layout + " --spares 1 --data " + data +
         " --run-dir " + run + " --job " + job + " --steps " + std::to_string(steps) +
         " --layers 2 --width 64 --heads 4 --seq 32 --batch 8 --microbatches 2 --hang-after 2"
         " --tick 0.1 --min-gemm-ratio 0.2 --min-bandwidth-ratio 0.1 --detector-warmup 20 " +
         extra;
}
const char* kDp4 = "--dp 4 --nodes 4";

TEST_F(LaunchTest, ASlowedNodeIsNamedByTheStragglerPathEvictedAndTheJobResumes) {
  CommandResult r =
      RunCommand(EvidenceCmd(Run(), Job(), data_, kDp4, 60,
                             "--straggler-every 8 --inject slow:node=node2,at=10,factor=1.5"));
  ASSERT_EQ(r.code, 0) << r.out;
  const auto ev = Events();
  bool named = false;
  for (const Event& e : Of(ev, "verdict"))
    named |= e.detail["cause"] == "compute_straggler" && e.node == "node2";
  EXPECT_TRUE(named) << r.out;
  ASSERT_EQ(Of(ev, "eviction").size(), 1u) << r.out;  // the machine, not its group, nor a peer
  EXPECT_EQ(Of(ev, "eviction")[0].node, "node2");
  EXPECT_EQ(Of(ev, "eviction")[0].detail["reason"], "compute_straggler");
  bool decided = false;
  for (const Event& e : Of(ev, "decision"))
    decided |= e.detail["action"] == "evict" && e.node == "node2";
  EXPECT_TRUE(decided);
  EXPECT_FALSE(Of(ev, "resumed").empty());
  EXPECT_EQ(Of(ev, "job_finished").at(0).detail["steps"], 60);

  // The incident report renders in a browser, the straggler's cells outlined in the heat map.
  const std::string html = Run() + "/incident.html";
  CommandResult rep =
      RunCommand(std::string(MEGASCOPE_BIN) + " report " + Run() + " --html " + html);
  ASSERT_EQ(rep.code, 0) << rep.out;
  const std::string page = ReadLog(html);
  EXPECT_EQ(page.find("<script"), std::string::npos);  // static: nothing to fail, nothing fetched
  EXPECT_EQ(page.find("src=\"http"), std::string::npos);
  if (RunCommand("command -v chromium").code != 0)
    GTEST_SKIP() << "chromium is not installed (scripts/setup.sh installs it)";
  const std::string chromium =
      "timeout 60 chromium --headless --no-sandbox --disable-gpu --disable-background-networking "
      "--disable-component-update --no-first-run --disable-sync --user-data-dir=" +
      dir_->path() + "/chrome ";
  CommandResult dom = RunCommand(chromium + "--dump-dom file://" + html + " 2>/dev/null");
  ASSERT_EQ(dom.code, 0) << dom.out.substr(0, 500);
  auto count = [&](const std::string& needle) {
    size_t n = 0;
    for (size_t at = dom.out.find(needle); at != std::string::npos;
         at = dom.out.find(needle, at + 1))
      ++n;
    return n;
  };
  const size_t straggler_cells = count("class=\"cell slow\" data-rank=\"2\"");
  EXPECT_GE(straggler_cells, 5u) << "the slowed rank's steps are outlined";
  for (int r : {0, 1, 3}) {
    EXPECT_LT(count("class=\"cell slow\" data-rank=\"" + std::to_string(r) + "\""), straggler_cells)
        << "rank " << r;
  }
  EXPECT_NE(dom.out.find("row-suspect\">rank 2 "), std::string::npos)
      << "the named rank's row is marked";
  EXPECT_NE(dom.out.find("id=\"events\""), std::string::npos);
  EXPECT_NE(dom.out.find("Loss across restarts"), std::string::npos);
  CommandResult shot = RunCommand(chromium + "--window-size=1300,1400 --screenshot=" + Run() +
                                  "/report.png file://" + html);
  EXPECT_EQ(shot.code, 0) << shot.out;
  EXPECT_GT(fs::file_size(Run() + "/report.png"), 20000u);  // a picture, not a blank page
}

TEST_F(LaunchTest, ANodeWithASlowNetworkIsACommStragglerFailsItsBandwidthCheckAndIsEvicted) {
  // node2's data leaves at 10 MB/s (the link seam): it computes as fast as its peers but reaches
  // every collective late (about 0.2 s a step; stragglers costing under 20 ms a step, the noise of
  // a loaded two-core machine, are left out).
  CommandResult r = RunCommand(EvidenceCmd(Run(), Job(), data_, kDp4, 60,
                                           "--straggler-every 8 --straggler-min-cost 0.02 "
                                           "--inject link:node=node2,kind=slow,rate=10,at=10"));
  ASSERT_EQ(r.code, 0) << r.out;
  const auto ev = Events();
  bool named = false;
  for (const Event& e : Of(ev, "verdict")) {
    named |= e.detail["cause"] == "comm_straggler" && e.node == "node2";
    if (e.node == "node2") {
      EXPECT_NE(e.detail["cause"], "compute_straggler")
          << "its compute is not slower: " << e.detail.dump();
    }
  }
  EXPECT_TRUE(named) << r.out;
  bool failed_bandwidth = false;
  for (const Event& e : Of(ev, "self_check")) {
    if (e.node == "node2") {
      failed_bandwidth =
          e.detail["passed"] == false && e.detail["allreduce_gbps"].get<double>() <
                                             0.1 * e.detail["healthy_allreduce_gbps"].get<double>();
    }
  }
  EXPECT_TRUE(failed_bandwidth) << r.out;
  ASSERT_EQ(Of(ev, "eviction").size(), 1u) << r.out;
  EXPECT_EQ(Of(ev, "eviction")[0].node, "node2");
  EXPECT_EQ(Of(ev, "eviction")[0].detail["reason"], "comm_straggler");
  EXPECT_FALSE(Of(ev, "resumed").empty());
  EXPECT_EQ(Of(ev, "job_finished").at(0).detail["steps"], 60);
}

TEST_F(LaunchTest, AStageSlowOnEveryReplicaIsReportedAsImbalanceAndNothingIsEvicted) {
  CommandResult r = RunCommand(EvidenceCmd(Run(), Job(), data_, "--dp 2 --pp 2 --nodes 4", 50,
                                           "--straggler-every 8 --inject slow:pp=1,at=4,factor=2"));
  ASSERT_EQ(r.code, 0) << r.out;
  const auto ev = Events();
  bool imbalance = false;
  for (const Event& e : Of(ev, "decision")) {
    if (e.detail["verdict"]["cause"] == "stage_imbalance") {
      imbalance = true;
      EXPECT_EQ(e.detail["action"], "alert");
    }
  }
  EXPECT_TRUE(imbalance) << r.out;
  EXPECT_TRUE(Of(ev, "eviction").empty()) << r.out;
}

// Runs the launch in the background until `done` holds on control.db's events (or `seconds`
// pass), then stops it.
std::vector<Event> RunUntil(LaunchTest* t, const std::string& cmd, const std::string& log,
                            const std::function<bool(const std::vector<Event>&)>& done,
                            int seconds) {
  auto launch = launch::Process::Spawn({{"/bin/sh", "-c", "exec " + cmd}, log});
  EXPECT_TRUE(launch.ok());
  if (!launch.ok()) return {};
  for (int i = 0; i < seconds * 10; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (fs::exists(t->RunDir() + "/control.db") && done(t->AllEvents())) break;
    if ((*launch)->Poll()) break;
  }
  RunCommand(std::string(MEGASCOPE_BIN) + " stop --run-dir " + t->RunDir());
  (*launch)->WaitFor(std::chrono::seconds(60));
  return t->AllEvents();
}

TEST_F(LaunchTest, AFailingMetricIsNamedByTheDetectorSelfCheckedAndEvicted) {
  const auto ev = RunUntil(
      this,
      EvidenceCmd(Run(), Job(), data_, kDp4, 100000,
                  "--straggler-every 0 --inject metric:node=node1,what=nic-errors,at=25s"),
      dir_->path() + "/metric.log",
      [](const std::vector<Event>& ev) {
        return !Of(ev, "resumed").empty() && !Of(ev, "eviction").empty();
      },
      150);
  bool named = false;
  for (const Event& e : Of(ev, "verdict"))
    named |= e.detail["kind"] == "faulty_machine" && e.node == "node1";
  EXPECT_TRUE(named) << ReadLog(dir_->path() + "/metric.log");
  bool failed_check = false;
  for (const Event& e : Of(ev, "self_check")) {
    if (e.node == "node1") {
      failed_check = e.detail["passed"] == false;
      EXPECT_NE(e.detail["errors_rose"].get<std::string>().find("node_network_receive_errors"),
                std::string::npos);
    }
  }
  EXPECT_TRUE(failed_check);
  ASSERT_EQ(Of(ev, "eviction").size(), 1u) << ReadLog(dir_->path() + "/metric.log");
  EXPECT_EQ(Of(ev, "eviction")[0].node, "node1");
  EXPECT_FALSE(Of(ev, "resumed").empty());
}

TEST_F(LaunchTest, ATwentySecondMetricExcursionEvictsNothing) {
  // Memory 40 % up on one node for 20 s, after the detector has learned the nodes: a benign
  // excursion shorter than the weak-evidence window.
  const auto ev = RunUntil(
      this,
      EvidenceCmd(Run(), Job(), data_, kDp4, 100000,
                  "--straggler-every 0 --inject metric:node=node1,what=memory,at=25s,seconds=20"),
      dir_->path() + "/excursion.log",
      [start = std::chrono::steady_clock::now()](const std::vector<Event>& ev) {
        // Until the excursion is 40 s over (the detector's weak window and then some).
        bool fired = !Of(ev, "fault_injected").empty();
        return fired && std::chrono::steady_clock::now() - start > std::chrono::seconds(90);
      },
      150);
  EXPECT_FALSE(Of(ev, "fault_injected").empty()) << ReadLog(dir_->path() + "/excursion.log");
  EXPECT_TRUE(Of(ev, "eviction").empty()) << ReadLog(dir_->path() + "/excursion.log");
  for (const Event& e : Of(ev, "verdict"))
    EXPECT_NE(e.detail["kind"], "faulty_machine") << e.detail.dump();
}

TEST_F(LaunchTest, BadFlagsAreRefusedBeforeAnythingStarts) {
  struct Case {
    std::string extra, says;
  };
  for (const Case& c : {Case{"--inject melt:node=node0", "unknown kind 'melt'"},
                        Case{"--inject crash:node=node9,at=2", "no node node9"},
                        Case{"--inject crash:node=node0", "needs at=STEP"},
                        Case{"--inject kill-agent:at=3", "needs node=N"},
                        Case{"--spares -1", "--spares must be >= 0"}}) {
    CommandResult r = RunCommand(LaunchCmd(kDp2, c.extra));
    EXPECT_EQ(r.code, 2) << c.extra << "\n" << r.out;
    EXPECT_NE(r.out.find(c.says), std::string::npos) << c.extra << "\n" << r.out;
    EXPECT_FALSE(fs::exists(Run() + "/control.db")) << c.extra;
  }
  CommandResult r = RunCommand(std::string(MEGASCOPE_BIN) + " report " + dir_->path() + "/nowhere");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("does not exist"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace megascope::controller
