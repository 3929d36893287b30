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

// One microbatch's forward and backward (d(sum of token losses)) on each of two tensor-parallel
// ranks over real Gloo, in threads; `storage`: the activations' type of each rank's CPU backend.
struct TpRun {
  std::vector<double> losses = std::vector<double>(2, 0);
  std::vector<std::vector<float>> grads = std::vector<std::vector<float>>(2);
  std::vector<std::vector<ParamTensor>> tensors = std::vector<std::vector<ParamTensor>>(2);
};
TpRun RunTwoTpRanks(const ModelConfig& cfg, const Batch& b, int batch, kernels::Storage storage) {
  megascope::testing::TempDir dir;
  const Layout layout{1, 2, 1};
  TpRun run;
  std::vector<std::thread> threads;
  threads.reserve(2);
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      GlooOptions go;
      go.rendezvous_dir = dir.path() + "/rdzv";
      auto comm = CreateGlooCommunicator(r, layout, go);
      ASSERT_TRUE(comm.ok()) << comm.status().ToString();
      auto k = kernels::CreateCpuKernels(storage);
      GptStage s(cfg, layout, r, comm->get(), k.get());
      const Status fw =
          s.Forward(0, batch, b.tokens.data(), nullptr, b.targets.data(), nullptr, &run.losses[r]);
      ASSERT_TRUE(fw.ok()) << fw.ToString();
      ASSERT_TRUE(s.Backward(0, nullptr, nullptr, 1.0f).ok());
      run.grads[r] = s.HostGrads();
      run.tensors[r] = s.tensors();
    });
  }
  for (auto& t : threads) t.join();
  return run;
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

  const TpRun run = RunTwoTpRanks(cfg, b, batch, kernels::Storage::kF32);
  const auto& losses = run.losses;
  const auto& grads = run.grads;
  const auto& tensors = run.tensors;
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

// The mixed-precision path (the CUDA backend's: activations and the compute copy of the parameters
// in bf16) on the CPU backend that stores activations in bf16, against fp32. Tolerances as in
// tests/kernels/cuda_test.cc: 2e-2 for the loss, 5e-2 of a tensor's largest gradient.
ModelConfig Medium(bool parallel) {
  ModelConfig c;
  c.layers = 2;
  c.heads = 4;
  c.width = 32;
  c.seq = 16;
  c.vocab = 64;
  c.parallel_block = parallel;
  return c;
}

double MaxRelativeError(const std::vector<float>& want, const std::vector<float>& got,
                        const ParamTensor& t) {
  double max_ref = 0, max_err = 0;
  for (size_t i = t.offset; i < t.offset + t.size; ++i) {
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(want[i])));
    max_err = std::max(max_err, std::fabs(static_cast<double>(want[i]) - got[i]));
  }
  return max_err / std::max(max_ref, 1e-6);
}

TEST(ModelBf16Test, ABf16StageTrainsLikeTheFp32OneAndReadsItsUpdatedWeights) {
  for (bool parallel : {false, true}) {
    const ModelConfig cfg = Medium(parallel);
    const int batch = 3, n = batch * cfg.seq;
    const Batch b = MakeBatch(n, cfg.vocab);
    auto bf16 = kernels::CreateCpuKernels(kernels::Storage::kBF16);
    ASSERT_EQ(bf16->storage(), kernels::Storage::kBF16);
    GptStage f(cfg, Layout{}, 0, nullptr);
    GptStage h(cfg, Layout{}, 0, nullptr, bf16.get());
    const float scale = 1.0f / static_cast<float>(n);
    double loss_f = 0, loss_h = 0;
    for (int step = 0; step < 2; ++step) {
      loss_f = loss_h = 0;
      ASSERT_TRUE(
          f.Forward(0, batch, b.tokens.data(), nullptr, b.targets.data(), nullptr, &loss_f).ok());
      ASSERT_TRUE(f.Backward(0, nullptr, nullptr, scale).ok());
      ASSERT_TRUE(
          h.Forward(0, batch, b.tokens.data(), nullptr, b.targets.data(), nullptr, &loss_h).ok());
      ASSERT_TRUE(h.Backward(0, nullptr, nullptr, scale).ok());
      const std::string what =
          (parallel ? "parallel, step " : "sequential, step ") + std::to_string(step);
      EXPECT_NEAR(loss_h, loss_f, 2e-2 * loss_f) << what;
      EXPECT_NE(loss_h, loss_f) << what << ": nothing was rounded to bf16";
      const std::vector<float> gf = f.HostGrads(), gh = h.HostGrads();
      for (const ParamTensor& t : f.tensors())
        EXPECT_LE(MaxRelativeError(gf, gh, t), 1e-1) << t.name << ", " << what;
      // A large step on the master weights, through params(): the next forward must read it.
      for (GptStage* s : {&f, &h}) {
        const std::vector<float> g = s->HostGrads();
        float* p = s->params();
        for (size_t i = 0; i < s->count(); ++i) p[i] -= 20.0f * g[i];
        s->ZeroGrads();
      }
    }
  }
}

TEST(ModelBf16Test, TensorParallelRanksSumBf16ActivationsOverGloo) {
  const ModelConfig cfg = Medium(false);
  const int batch = 2, n = batch * cfg.seq;
  const Batch b = MakeBatch(n, cfg.vocab);
  auto whole_k = kernels::CreateCpuKernels(kernels::Storage::kBF16);
  GptStage whole(cfg, Layout{}, 0, nullptr, whole_k.get());
  double whole_loss = 0;
  ASSERT_TRUE(
      whole.Forward(0, batch, b.tokens.data(), nullptr, b.targets.data(), nullptr, &whole_loss)
          .ok());
  ASSERT_TRUE(whole.Backward(0, nullptr, nullptr, 1.0f).ok());
  const std::vector<float> gw = whole.HostGrads();

  const TpRun run = RunTwoTpRanks(cfg, b, batch, kernels::Storage::kBF16);
  const auto& losses = run.losses;
  const auto& grads = run.grads;
  const auto& tensors = run.tensors;
  ASSERT_FALSE(grads[0].empty() || grads[1].empty());
  EXPECT_NEAR(losses[0], whole_loss, 2e-2 * whole_loss);
  EXPECT_EQ(losses[0], losses[1]);  // the loss is summed over the tp group: one value
  for (const ParamTensor& w : whole.tensors()) {
    const ParamTensor& a = tensors[0][&w - whole.tensors().data()];
    const ParamTensor& c = tensors[1][&w - whole.tensors().data()];
    double ss_whole = 0, ss_shards = 0;
    for (size_t i = 0; i < w.size; ++i) ss_whole += gw[w.offset + i] * gw[w.offset + i];
    for (size_t i = 0; i < a.size; ++i)
      ss_shards += grads[0][a.offset + i] * grads[0][a.offset + i];
    for (size_t i = 0; i < c.size; ++i)
      ss_shards += grads[1][c.offset + i] * grads[1][c.offset + i];
    if (a.size == w.size) ss_shards /= 2;  // replicated over tp: both ranks hold the whole
    EXPECT_NEAR(ss_shards, ss_whole, 1e-1 * ss_whole + 1e-9) << w.name;
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
