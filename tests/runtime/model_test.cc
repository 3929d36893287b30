// Gradient checks of a whole GPT stage: finite differences at tp=1, and tp=2 (two ranks over real
// Gloo) against tp=1 for one full block.
#include "megascope/runtime/model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <thread>

#include "test_util.h"

namespace megascope::runtime {
namespace {

struct Batch {
  std::vector<int32_t> tokens, targets;
};

Batch MakeBatch(int n, int vocab) {
  std::mt19937 rng(5);
  Batch b;
  for (int i = 0; i < n; ++i) {
    b.tokens.push_back(static_cast<int32_t>(rng() % vocab));
    b.targets.push_back(static_cast<int32_t>(rng() % vocab));
  }
  return b;
}

ModelConfig Small(bool parallel) {
  ModelConfig c;
  c.layers = 1;
  c.heads = 2;
  c.width = 8;
  c.seq = 4;
  c.vocab = 8;
  c.parallel_block = parallel;
  return c;
}

double Loss(GptStage& s, const Batch& b, int batch) {
  double loss = 0;
  EXPECT_TRUE(s.Forward(0, batch, b.tokens.data(), nullptr, b.targets.data(), nullptr, &loss).ok());
  EXPECT_TRUE(s.Backward(0, nullptr, nullptr, 0.0f).ok());  // drop the saved activations
  s.ZeroGrads();
  return loss;
}

class ModelGradientTest : public ::testing::TestWithParam<bool> {};

TEST_P(ModelGradientTest, StageGradientsMatchFiniteDifferences) {
  const ModelConfig cfg = Small(GetParam());
  const int batch = 2, n = batch * cfg.seq;
  GptStage s(cfg, Layout{}, 0, nullptr);
  Batch b = MakeBatch(n, cfg.vocab);
  double loss = 0;
  ASSERT_TRUE(s.Forward(0, batch, b.tokens.data(), nullptr, b.targets.data(), nullptr, &loss).ok());
  ASSERT_TRUE(s.Backward(0, nullptr, nullptr, 1.0f).ok());  // d(sum of token losses)
  const std::vector<float> grads = s.HostGrads();
  s.ZeroGrads();
  for (const ParamTensor& t : s.tensors()) {
    double max_err = 0, max_ref = 0;
    for (size_t i = 0; i < t.size; i += std::max<size_t>(1, t.size / 12)) {
      float& p = s.params()[t.offset + i];
      const float saved = p, eps = 1e-2f;
      p = saved + eps;
      const double up = Loss(s, b, batch);
      p = saved - eps;
      const double down = Loss(s, b, batch);
      p = saved;
      const double numeric = (up - down) / (2 * eps);
      max_err = std::max(max_err, std::fabs(numeric - grads[t.offset + i]));
      max_ref = std::max(max_ref, std::fabs(numeric));
    }
    EXPECT_LE(max_err, 3e-2 * std::max(1.0, max_ref)) << t.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Blocks, ModelGradientTest, ::testing::Values(false, true),
                         [](const auto& info) {
                           return info.param ? "parallel_block" : "sequential_block";
                         });

TEST(ModelTpTest, TensorParallelBlockGradientsEqualTheSingleRankOnes) {
  const ModelConfig cfg = Small(false);
  const int batch = 2, n = batch * cfg.seq;
  const Batch b = MakeBatch(n, cfg.vocab);
  GptStage whole(cfg, Layout{}, 0, nullptr);
  double whole_loss = 0;
  ASSERT_TRUE(
      whole.Forward(0, batch, b.tokens.data(), nullptr, b.targets.data(), nullptr, &whole_loss)
          .ok());
  ASSERT_TRUE(whole.Backward(0, nullptr, nullptr, 1.0f).ok());

  megascope::testing::TempDir dir;
  const Layout layout{1, 2, 1};
  std::vector<std::vector<float>> grads(2);
  std::vector<std::vector<ParamTensor>> tensors(2);
  std::vector<double> losses(2, 0);
  std::vector<std::thread> threads;
  threads.reserve(2);
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      GlooOptions go;
      go.rendezvous_dir = dir.path() + "/rdzv";
      auto comm = CreateGlooCommunicator(r, layout, go);
      ASSERT_TRUE(comm.ok()) << comm.status().ToString();
      GptStage s(cfg, layout, r, comm->get());
      ASSERT_TRUE(
          s.Forward(0, batch, b.tokens.data(), nullptr, b.targets.data(), nullptr, &losses[r])
              .ok());
      ASSERT_TRUE(s.Backward(0, nullptr, nullptr, 1.0f).ok());
      grads[r] = s.HostGrads();
      tensors[r] = s.tensors();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_NEAR(losses[0], whole_loss, 1e-4 * whole_loss);
  EXPECT_NEAR(losses[1], whole_loss, 1e-4 * whole_loss);
  for (const ParamTensor& w : whole.tensors()) {
    const float* gw = whole.grads() + w.offset;
    const ParamTensor& a = tensors[0][&w - whole.tensors().data()];
    const ParamTensor& c = tensors[1][&w - whole.tensors().data()];
    ASSERT_EQ(a.name, w.name);
    if (a.size == w.size) {  // replicated over tp: every rank has the whole gradient
      for (size_t i = 0; i < w.size; ++i) {
        EXPECT_NEAR(grads[0][a.offset + i], gw[i], 1e-4) << w.name;
        EXPECT_NEAR(grads[1][c.offset + i], gw[i], 1e-4) << w.name;
      }
      continue;
    }
    ASSERT_EQ(a.size + c.size, w.size) << w.name;  // sharded: the shards make up the whole
    double ss_whole = 0, ss_shards = 0;
    for (size_t i = 0; i < w.size; ++i) ss_whole += gw[i] * gw[i];
    for (size_t i = 0; i < a.size; ++i)
      ss_shards += grads[0][a.offset + i] * grads[0][a.offset + i];
    for (size_t i = 0; i < c.size; ++i)
      ss_shards += grads[1][c.offset + i] * grads[1][c.offset + i];
    EXPECT_NEAR(ss_shards, ss_whole, 1e-4 * std::max(1.0, ss_whole)) << w.name;
    if (w.name.ends_with("fc.b") ||
        w.name == "wte") {  // contiguous shards: compare element by element
      for (size_t i = 0; i < a.size; ++i)
        EXPECT_NEAR(grads[0][a.offset + i], gw[i], 1e-4) << w.name;
      for (size_t i = 0; i < c.size; ++i)
        EXPECT_NEAR(grads[1][c.offset + i], gw[a.size + i], 1e-4) << w.name;
    }
  }
}

TEST(ModelConfigTest, ParameterCountIsWhatASingleStageAllocates) {
  for (bool parallel : {false, true}) {
    ModelConfig cfg = Small(parallel);
    cfg.vocab = 300;
    cfg.layers = 3;
    GptStage s(cfg, Layout{}, 0, nullptr);
    EXPECT_EQ(cfg.ParameterCount(), static_cast<int64_t>(s.count())) << "parallel " << parallel;
  }
}

}  // namespace
}  // namespace megascope::runtime
