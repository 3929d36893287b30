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
  TempDir dir_;
  std::string data_;
};

TEST_F(HangLiveTest, AHungRankIsNamedFromTheAgentsWhileTheJobHangs) {
  auto train = megascope::launch::Process::Spawn(
      {{"/bin/sh", "-c", "exec " + Train("live", "--timeout 120000 --fault hang:rank=5,step=3")},
       "/dev/null"});
  ASSERT_TRUE(train.ok()) << train.status().ToString();
  std::string agents;
  nlohmann::json v;
  for (int i = 0; i < 120; ++i) {  // up to 60 s
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    if (agents.empty()) {
      std::ifstream in(dir_.path() + "/live/run.json");
      if (!in) continue;
      try {
        auto j = nlohmann::json::parse(in);
        for (const auto& a : j["agents"])
          agents += (agents.empty() ? "" : ",") + a["url"].get<std::string>();
      } catch (...) {
        continue;
      }
    }
    auto r = RunCommand(std::string(MEGASCOPE_BIN) + " analyze hang --agents " + agents +
                        " --json --min-wait 2");
    if (r.code != 0) continue;
    v = nlohmann::json::parse(r.out.substr(0, r.out.find('\n')));
    if (v["kind"] == "hang") break;
  }
  (*train)->Stop(std::chrono::seconds(20));
  EXPECT_EQ(v["cause"], "rank_not_joined") << v.dump();
  EXPECT_EQ(v["root_ranks"], nlohmann::json::array({5}));
  EXPECT_EQ(v["root_nodes"], nlohmann::json::array({"node1"}));
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
