// Hang root cause on live runs: real (2,2,2) training jobs with faults injected into real worker
// processes, analysed from the agents while the job hangs and from the dumps after it failed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "megascope/launch/process.h"
#include "megascope/runtime/data.h"
#include "test_util.h"

namespace megascope::analyzer {
namespace {

using megascope::testing::RunCommand;
using megascope::testing::TempDir;

// Live: real (2,2,2) runs with faults injected into real worker processes.
class HangLiveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    data_ = dir_.path() + "/notes.bin";
    ASSERT_TRUE(
        runtime::PrepareByteTokens(MEGASCOPE_TEST_DATA "/text/notes_on_training.txt", data_).ok());
  }
  std::string Train(const std::string& run, const std::string& extra) {
    return std::string(MEGASCOPE_BIN) + " train --dp 2 --tp 2 --pp 2 --nodes 2 --data " + data_ +
           " --run-dir " + dir_.path() + "/" + run + " --job h" + std::to_string(::getpid()) + run +
           " --steps 8 --layers 2 --width 32 --heads 2 --seq 16 --batch 4 " + extra;
  }
  nlohmann::json Verdict1(const std::string& args) {
    auto r =
        RunCommand(std::string(MEGASCOPE_BIN) + " analyze hang " + args + " --json --min-wait 1");
    EXPECT_EQ(r.code, 0) << r.out;
    return nlohmann::json::parse(r.out.substr(0, r.out.find('\n')));
  }
  // Polls `analyze hang --agents` (the agents listed in run.json) until it says hang (<= 60 s).
  nlohmann::json WaitForHang(const std::string& run, std::string* agents) {
    nlohmann::json v;
    for (int i = 0; i < 120; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      if (agents->empty()) {
        std::ifstream in(dir_.path() + "/" + run + "/run.json");
        if (!in) continue;
        try {
          auto j = nlohmann::json::parse(in);
          for (const auto& a : j["agents"])
            *agents += (agents->empty() ? "" : ",") + a["url"].get<std::string>();
        } catch (...) {
          continue;
        }
      }
      auto r = RunCommand(std::string(MEGASCOPE_BIN) + " analyze hang --agents " + *agents +
                          " --json --min-wait 2");
      if (r.code != 0) continue;
      v = nlohmann::json::parse(r.out.substr(0, r.out.find('\n')));
      if (v["kind"] == "hang") break;
    }
    return v;
  }
  TempDir dir_;
  std::string data_;
};

TEST_F(HangLiveTest, AHungRankIsNamedFromTheAgentsWhileTheJobHangs) {
  auto train = megascope::launch::Process::Spawn(
      {{"/bin/sh", "-c", "exec " + Train("live", "--timeout 120000 --fault hang:rank=5,step=3")},
       "/dev/null"});
  ASSERT_TRUE(train.ok()) << train.status().ToString();
  std::string agents;
  const nlohmann::json v = WaitForHang("live", &agents);
  // While it hangs, the trace databases hold the ops the waiting ranks have open (the agents
  // write them about every second): `query waits` lists the hung collectives as still open.
  nlohmann::json waits;
  bool open_seen = false;
  for (int i = 0; i < 40 && !open_seen; ++i) {
    auto q = RunCommand(std::string(MEGASCOPE_BIN) + " query " + dir_.path() +
                        "/live waits --json 2>/dev/null");
    waits = nlohmann::json::parse(q.out, nullptr, false);
    for (const auto& w : waits.is_array() ? waits : nlohmann::json::array())
      open_seen = open_seen || w.value("still_open", 0) > 0;
    if (!open_seen) std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  (*train)->Stop(std::chrono::seconds(20));
  EXPECT_TRUE(open_seen) << waits.dump();
  EXPECT_EQ(v["cause"], "rank_not_joined") << v.dump();
  EXPECT_EQ(v["root_ranks"], nlohmann::json::array({5}));
  EXPECT_EQ(v["root_nodes"], nlohmann::json::array({"node1"}));
}

// Asked through their agents (SIGUSR1), the 8 real workers each dump every thread's stack; grouped,
// the hung rank's main thread stands apart from the 7 waiting in collectives, in the worker's hang.
// The dumps they wrote say the same read from the directory.
TEST_F(HangLiveTest, TheHungRanksStackStandsApartFromItsPeers) {
  auto train = megascope::launch::Process::Spawn(
      {{"/bin/sh", "-c", "exec " + Train("stk", "--timeout 120000 --fault hang:rank=5,step=3")},
       "/dev/null"});
  ASSERT_TRUE(train.ok()) << train.status().ToString();
  std::string agents;
  ASSERT_EQ(WaitForHang("stk", &agents)["kind"], "hang");
  const std::string dumps = dir_.path() + "/stk/dumps/attempt_0";
  // Read while the job still hangs (stopped, its ranks rewrite their dumps as they fail).
  auto live = RunCommand(std::string(MEGASCOPE_BIN) + " analyze hang --agents " + agents +
                         " --stacks --min-wait 1");
  auto files = RunCommand(std::string(MEGASCOPE_BIN) + " analyze hang " + dumps + " --min-wait 1");
  auto v = Verdict1(dumps);
  (*train)->Stop(std::chrono::seconds(20));
  for (const auto* report : {&live, &files}) {
    EXPECT_EQ(report->code, 0) << report->out;
    EXPECT_NE(report->out.find("stacks: rank 5 stands apart, in megascope::"), std::string::npos)
        << report->out;
    EXPECT_NE(report->out.find("Worker::Hang(long), while 7 ranks wait in collectives"),
              std::string::npos)
        << report->out;
    // The distinct stacks, each with its ranks; rank 5's shows the worker's hang.
    EXPECT_NE(report->out.find("stacks (main thread; "), std::string::npos) << report->out;
    const size_t at = report->out.find("1 rank [5]:");
    ASSERT_NE(at, std::string::npos) << report->out;
    const std::string five = report->out.substr(at, report->out.find(" rank", at + 12) - at);
    EXPECT_NE(five.find("Worker::Hang("), std::string::npos) << five;
  }
  bool named = false;
  for (const auto& e : v["evidence"])
    named |= e.get<std::string>().rfind("stacks: rank 5 ", 0) == 0;
  EXPECT_TRUE(named) << v.dump();
}

TEST_F(HangLiveTest, ACrashedRankIsDead) {
  EXPECT_EQ(RunCommand(Train("crash", "--fault crash:rank=5,step=3")).code, 1);
  auto v = Verdict1(dir_.path() + "/crash");
  EXPECT_EQ(v["cause"], "rank_dead") << v.dump();
  EXPECT_EQ(v["root_ranks"], nlohmann::json::array({5}));
}

TEST_F(HangLiveTest, AStalledSendNamesThePair) {
  EXPECT_EQ(RunCommand(Train("stall", "--timeout 3000 --fault stall-send:rank=2,step=2")).code, 1);
  auto v = Verdict1(dir_.path() + "/stall");
  EXPECT_EQ(v["cause"], "link_stall") << v.dump();
  EXPECT_EQ(v["root_ranks"], nlohmann::json::array({2, 6}));
}

}  // namespace
}  // namespace megascope::analyzer
