// `megascope wrap -- CMD`: a program megascope did not start, which loads NCCL's profiler plugin
// the way NCCL does (nccl_plugin_driver, given "-": the plugin NCCL_PROFILER_PLUGIN names), is
// traced into a run directory that query, report and analyze hang read -- and an interrupted
// hang keeps every rank's flight recorder, taken while the ranks were still there.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "test_util.h"
#include "tracer/nccl_drivers.h"

namespace megascope {
namespace {

using megascope::testing::RunCommand;

class WrapTest : public ::testing::Test {
 protected:
  std::string Wrap(const std::string& cmd) const {
    return std::string(MEGASCOPE_BIN) + " wrap --run-dir " + run_ + " --node n0 --job wrap" +
           std::to_string(::getpid()) + " --shm-dir " + shm_.path() + " -- " + cmd;
  }
  megascope::testing::TempDir dir_, shm_;
  std::string run_ = dir_.path() + "/run";
};

TEST_F(WrapTest, AWrappedJobsCollectivesReachTheTraceDatabaseAndTheRunAnswersQueriesAndReport) {
  auto r = RunCommand(Wrap(std::string(MEGASCOPE_NCCL_DRIVER) + " - 6 0 1 4 -1 < /dev/null 2>&1"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("ready"), std::string::npos) << "the plugin loaded from the environment";
  // The CUDA injection library wrap names is the plugin's own file (one object, one ring).
  if (std::filesystem::exists(std::filesystem::path(MEGASCOPE_NCCL_PLUGIN).parent_path() /
                              "libmegascope-cupti.so")) {
    EXPECT_NE(r.out.find("cuda injection: the profiler plugin's own object"), std::string::npos)
        << r.out;
  }
  auto q = RunCommand(std::string(MEGASCOPE_BIN) + " query " + run_ +
                      " --sql \"SELECT op || ':' || state || ':' || COUNT(*) FROM collectives "
                      "GROUP BY op, state\"");
  ASSERT_EQ(q.code, 0) << q.out;
  EXPECT_NE(q.out.find("allreduce:completed:4"), std::string::npos) << q.out;
  auto rep = RunCommand(std::string(MEGASCOPE_BIN) + " report " + run_);
  ASSERT_EQ(rep.code, 0) << rep.out;
  EXPECT_NE(rep.out.find("Status: **finished**"), std::string::npos) << rep.out;
}

TEST_F(WrapTest, AnInterruptedHangKeepsEveryRanksFlightRecorderAndAnalyzeNamesTheRank) {
  // Two ranks under one wrap (as torchrun starts its workers); rank 1 never issues the fourth
  // all-reduce rank 0 waits in.
  const std::string driver = std::string(MEGASCOPE_NCCL_DRIVER) + " - 6 ";
  nccl_test::Driver wrap = nccl_test::Spawn(
      {"/bin/sh", "-c",
       "exec " + Wrap("/bin/sh -c 'RANK=0 WORLD_SIZE=2 " + driver +
                      "0 2 3 1 hold & RANK=1 WORLD_SIZE=2 " + driver + "1 2 3 1 hold & wait'")},
      {});
  EXPECT_EQ(nccl_test::FirstLine(wrap), "ready\n");
  EXPECT_EQ(nccl_test::FirstLine(wrap), "ready\n");
  ASSERT_EQ(::kill(wrap.pid, SIGINT), 0);  // an operator gives up on the hung job
  EXPECT_EQ(nccl_test::Finish(wrap), 128 + SIGINT);
  auto a = RunCommand(std::string(MEGASCOPE_BIN) + " analyze hang " + run_ +
                      " --min-wait 0 --json 2>&1");
  bool named = false;
  std::istringstream lines(a.out);
  for (std::string line; std::getline(lines, line);) {
    const auto v = nlohmann::json::parse(line, nullptr, false);
    if (v.is_object() && v.value("kind", "") == "hang")
      named = v["root_ranks"] == nlohmann::json::array({1}) && v["cause"] == "rank_not_joined";
  }
  EXPECT_TRUE(named) << a.out;
}

}  // namespace
}  // namespace megascope
