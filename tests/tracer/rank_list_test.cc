// Group membership as runs: reads like the vector it was built from, whatever the order.
#include "megascope/tracer/rank_list.h"

#include <gtest/gtest.h>

#include <random>

namespace megascope::tracer {
namespace {

TEST(RankListTest, ALayoutsGroupsAreOneRunEach) {
  RankList world, dp, mp;
  for (int r = 0; r < 12288; ++r) world.push_back(r);
  for (int d = 0; d < 96; ++d) dp.push_back(3 + 8 * d);  // tp = 8
  for (int p = 0; p < 16; ++p) {
    for (int t = 0; t < 8; ++t) mp.push_back(t + 8 * 96 * p);
  }
  EXPECT_EQ(world.runs().size(), 1u);
  EXPECT_EQ(dp.runs().size(), 1u);
  EXPECT_EQ(mp.runs().size(), 16u);  // one per stage
  EXPECT_EQ(world.size(), 12288u);
  EXPECT_EQ(dp[95], 3 + 8 * 95);
  EXPECT_EQ(mp[8], 8 * 96);
  EXPECT_EQ(dp.IndexOf(3 + 8 * 40), 40);
  EXPECT_EQ(dp.IndexOf(4), -1);
  EXPECT_EQ(mp.IndexOf(8), -1);
  EXPECT_EQ(mp.back(), 7 + 8 * 96 * 15);
}

TEST(RankListTest, AnyListReadsBackAsItWasBuilt) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<int32_t> v;
    const int n = static_cast<int>(rng() % 40);
    int32_t at = static_cast<int32_t>(rng() % 100);
    for (int i = 0; i < n; ++i) {
      // Mostly arithmetic stretches, with jumps and repeats between them.
      at += rng() % 4 == 0 ? static_cast<int32_t>(rng() % 50) - 25 : 3;
      v.push_back(std::max(at, 0));
    }
    RankList l(v);
    ASSERT_EQ(l.size(), v.size());
    EXPECT_EQ(l.ToVector(), v);
    for (size_t i = 0; i < v.size(); ++i) {
      ASSERT_EQ(l[i], v[i]) << "trial " << trial << " index " << i;
      EXPECT_EQ(v[l.IndexOf(v[i])], v[i]);
    }
    EXPECT_EQ(RankList(v), l);
    if (!v.empty()) {
      std::vector<int32_t> w = v;
      w.back() += 1;
      EXPECT_FALSE(RankList(w) == l) << "trial " << trial;
    }
  }
}

TEST(RankListTest, AppendingARunEqualsPushingItsRanks) {
  for (int32_t lead : {-1, 0, 5, 6}) {
    for (int32_t stride : {1, 2, 3, -1}) {
      RankList bulk, one;
      if (lead >= 0) {
        bulk.push_back(lead);
        one.push_back(lead);
      }
      bulk.AppendRun(10, 7, stride);
      for (int k = 0; k < 7; ++k) one.push_back(10 + k * stride);
      EXPECT_EQ(bulk, one) << "lead " << lead << " stride " << stride;
      EXPECT_EQ(bulk.ToVector(), one.ToVector());
    }
  }
}

}  // namespace
}  // namespace megascope::tracer
