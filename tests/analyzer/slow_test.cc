// Slowdown analysis on real runs: a rank made slow by a real fault is named with its cost.
#include "megascope/analyzer/slow.h"

#include <gtest/gtest.h>

#include "small_run.h"

namespace megascope::analyzer {
namespace {

class SlowTest : public SmallRunTest {};

TEST_F(SlowTest, ASlowRankIsAComputeStragglerWithItsCost) {
  auto db = RunDatabase::Open(Run("slow", "--fault slow:rank=3,step=0,seconds=0.15"));
  ASSERT_TRUE(db.ok());
  auto rep = AnalyzeSlow(**db);
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  ASSERT_FALSE(rep->verdicts.empty());
  const Verdict& v = rep->verdicts.front();
  EXPECT_EQ(Name(v.kind), "slow");
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
  EXPECT_EQ(Name(rep->verdicts[0].kind), "healthy") << rep->verdicts[0].explanation;
  auto steps = AnalyzeSlow(**db, SlowOptions{100, 200});
  EXPECT_FALSE(steps.ok());  // no such steps
}

}  // namespace
}  // namespace megascope::analyzer
