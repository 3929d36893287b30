// The pipeline's 1F1B schedule and the learning rate's, as the worker runs them: decisions over
// explicit inputs, checked without a process or a peer.
#include "megascope/runtime/schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "megascope/runtime/optimizer.h"

namespace megascope::runtime {
namespace {

std::vector<PipelinePass> F(const std::vector<int>& ks, bool forward) {
  std::vector<PipelinePass> out(ks.size());
  for (size_t i = 0; i < ks.size(); ++i) out[i] = {forward, ks[i]};
  return out;
}

TEST(ScheduleTest, OneFOneBWarmsUpThenAlternatesThenCoolsDown) {
  // The first of two stages: one forward ahead, then one of each in turn, then the last backward.
  EXPECT_EQ(OneFOneB(4, 0, 2), (std::vector<PipelinePass>{{true, 0},
                                                          {true, 1},
                                                          {false, 0},
                                                          {true, 2},
                                                          {false, 1},
                                                          {true, 3},
                                                          {false, 2},
                                                          {false, 3}}));
  // The last stage turns each microbatch around at once.
  EXPECT_EQ(OneFOneB(3, 1, 2),
            (std::vector<PipelinePass>{
                {true, 0}, {false, 0}, {true, 1}, {false, 1}, {true, 2}, {false, 2}}));
  // Fewer microbatches than stages ahead: every forward first, then every backward.
  std::vector<PipelinePass> two = F({0, 1}, true);
  for (const PipelinePass& p : F({0, 1}, false)) two.push_back(p);
  EXPECT_EQ(OneFOneB(2, 0, 4), two);
}

// Every stage of every shape: each microbatch forward once, then backward once; activations held
// at most stages - stage at a time; and the stages together finish, each pass waiting only for
// its neighbour's (a forward for the stage before, a backward for the stage after: sends never
// block, receives do) -- the schedule cannot deadlock.
TEST(ScheduleTest, EveryStageOfEveryShapeRunsEachPassOnceWithinItsMemoryAndNeverDeadlocks) {
  for (int stages = 1; stages <= 6; ++stages) {
    for (int m = 1; m <= 9; ++m) {
      std::vector<std::vector<PipelinePass>> order(static_cast<size_t>(stages));
      for (int s = 0; s < stages; ++s) {
        order[static_cast<size_t>(s)] = OneFOneB(m, s, stages);
        std::vector<int> state(static_cast<size_t>(m), 0);  // 0 none, 1 forward, 2 backward
        int held = 0, most = 0;
        for (const PipelinePass& p : order[static_cast<size_t>(s)]) {
          int& st = state[static_cast<size_t>(p.microbatch)];
          ASSERT_EQ(st, p.forward ? 0 : 1) << "stage " << s << " of " << stages << ", m " << m;
          st = p.forward ? 1 : 2;
          held += p.forward ? 1 : -1;
          most = std::max(most, held);
        }
        EXPECT_TRUE(std::all_of(state.begin(), state.end(), [](int x) { return x == 2; }));
        EXPECT_LE(most, std::min(stages - s, m)) << "stage " << s << " of " << stages;
      }
      // Run the stages together: each takes its next pass once its input is there.
      std::vector<size_t> next(static_cast<size_t>(stages), 0);
      std::vector<std::vector<int>> done(static_cast<size_t>(stages),
                                         std::vector<int>(static_cast<size_t>(m), 0));
      const size_t last = static_cast<size_t>(stages) - 1;
      for (bool moved = true; moved;) {
        moved = false;
        for (size_t s = 0; s <= last; ++s) {
          size_t& i = next[s];
          if (i == order[s].size()) continue;
          const PipelinePass p = order[s][i];
          const auto k = static_cast<size_t>(p.microbatch);
          const bool ready =
              p.forward ? s == 0 || done[s - 1][k] >= 1 : s == last || done[s + 1][k] == 2;
          if (!ready) continue;
          done[s][k] = p.forward ? 1 : 2;
          ++i;
          moved = true;
        }
      }
      for (int s = 0; s < stages; ++s)
        EXPECT_EQ(next[static_cast<size_t>(s)], order[static_cast<size_t>(s)].size())
            << "stage " << s << " of " << stages << " with " << m << " microbatches is stuck";
    }
  }
}

TEST(ScheduleTest, TheLearningRateWarmsUpLinearlyThenDecaysToItsFloor) {
  TrainConfig cfg;
  cfg.lr = 1e-3f;
  cfg.min_lr = 1e-4f;
  cfg.warmup = 4;
  cfg.steps = 104;
  EXPECT_FLOAT_EQ(LearningRate(cfg, 0), 0.25e-3f);
  EXPECT_FLOAT_EQ(LearningRate(cfg, 3), 1e-3f);
  EXPECT_FLOAT_EQ(LearningRate(cfg, 4), 1e-3f);        // the cosine's start
  EXPECT_NEAR(LearningRate(cfg, 54), 0.55e-3f, 1e-9);  // halfway: the middle
  EXPECT_FLOAT_EQ(LearningRate(cfg, 104), 1e-4f);      // the end: the floor
  EXPECT_FLOAT_EQ(LearningRate(cfg, 500), 1e-4f);      // and after it
  for (int64_t s = 4; s < 104; ++s) EXPECT_GE(LearningRate(cfg, s), LearningRate(cfg, s + 1));
}

}  // namespace
}  // namespace megascope::runtime
