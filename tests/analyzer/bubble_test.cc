// The pipeline bubble of real runs against 1F1B's theory. Labelled slow: how much of a step is
// idle on a loaded 2-core machine depends on the load (the exact accounting is checked on
// synthetic traces in slow_blame_test.cc).
#include <gtest/gtest.h>

#include "megascope/analyzer/slow.h"
#include "small_run.h"

namespace megascope::analyzer {
namespace {

class SlowTest : public SmallRunTest {};

// The pipeline bubble measured from the spans: 1F1B with p stages and m microbatches idles each
// stage (p - 1) / (m + p - 1) of a step (1/5 for p = 2, m = 4); one stage idles almost never.
TEST_F(SlowTest, ThePipelineBubbleIsMeasuredNearItsOneFOneBShare) {
  auto one = RunDatabase::Open(Run("one_stage", "--microbatches 4", "--dp 1 --tp 1 --pp 1"));
  auto two = RunDatabase::Open(Run("two_stages", "--microbatches 4", "--dp 1 --tp 1 --pp 2"));
  ASSERT_TRUE(one.ok() && two.ok());
  auto a = AnalyzeSlow(**one), b = AnalyzeSlow(**two);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_LT(a->bubble_share, 0.05);
  EXPECT_GT(b->bubble_share, 0.1) << "theory: 0.2";
  EXPECT_LT(b->bubble_share, 0.35) << "theory: 0.2";
}

}  // namespace
}  // namespace megascope::analyzer
