// Slowdown analysis on real runs: a rank made slow by a real fault is named with its cost.
#include "megascope/analyzer/slow.h"

#include <gtest/gtest.h>

#include "megascope/runtime/data.h"
#include "test_util.h"

namespace megascope::analyzer {
namespace {

using megascope::testing::RunCommand;
using megascope::testing::TempDir;

class SlowTest : public ::testing::Test {
 protected:
  void SetUp() override {
    data_ = dir_.path() + "/notes.bin";
    ASSERT_TRUE(
        runtime::PrepareByteTokens(MEGASCOPE_TEST_DATA "/text/notes_on_training.txt", data_).ok());
  }
  std::string Run(const std::string& name, const std::string& extra,
                  const std::string& layout = "--dp 2 --tp 2 --pp 1") {
    std::string run = dir_.path() + "/" + name;
    auto r = RunCommand(std::string(MEGASCOPE_BIN) + " train " + layout + " --data " + data_ +
                        " --run-dir " + run + " --job s" + std::to_string(::getpid()) + name +
                        " --steps 8 --layers 2 --width 32 --heads 2 --seq 16 --batch 4 " + extra);
    EXPECT_EQ(r.code, 0) << r.out;
    return run;
  }
  TempDir dir_;
  std::string data_;
};

TEST_F(SlowTest, ASlowRankIsAComputeStragglerWithItsCost) {
  auto db = RunDatabase::Open(Run("slow", "--fault slow:rank=3,step=0,seconds=0.15"));
  ASSERT_TRUE(db.ok());
  auto rep = AnalyzeSlow(**db);
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  ASSERT_FALSE(rep->verdicts.empty());
  const Verdict& v = rep->verdicts.front();
  EXPECT_EQ(v.kind, "slow");
  EXPECT_EQ(v.cause, "compute_straggler");
  EXPECT_EQ(v.root_ranks, std::vector<int32_t>{3});
  const double cost = std::stod(v.evidence[0].substr(v.evidence[0].find('=') + 1));
  EXPECT_NEAR(cost, 0.15, 0.05);
  EXPECT_EQ(rep->steps, 8);
  for (const Verdict& other : rep->verdicts) EXPECT_EQ(other.root_ranks, std::vector<int32_t>{3});
}

TEST_F(SlowTest, AnEvenRunHasNoStraggler) {
  auto db = RunDatabase::Open(Run("even", ""));
  ASSERT_TRUE(db.ok());
  auto rep = AnalyzeSlow(**db);
  ASSERT_TRUE(rep.ok());
  ASSERT_EQ(rep->verdicts.size(), 1u);
  EXPECT_EQ(rep->verdicts[0].kind, "healthy") << rep->verdicts[0].explanation;
  auto steps = AnalyzeSlow(**db, SlowOptions{100, 200});
  EXPECT_FALSE(steps.ok());  // no such steps
}

}  // namespace
}  // namespace megascope::analyzer
