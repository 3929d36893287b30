// The CUDA backend against the CPU one, op by op and for a whole GPT stage (label gpu: these run on
// a GPU machine only, through scripts/gpu-check.sh). The same random inputs go to both backends;
// every output is compared as max |cuda - cpu| <= tol * max(1, max |cpu|). Tolerances: 2e-2 for
// what goes through a GEMM (bf16 tensor-core products, fp32 sums: 8 bits of mantissa), 1e-4 for
// fp32 elementwise and row-wise kernels (fast-math exp/tanh, sums in another order), 5e-2 for a
// whole stage's gradients.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "megascope/kernels/kernels.h"
#include "megascope/runtime/model.h"

namespace megascope::kernels {
namespace {

constexpr double kGemmTol = 2e-2, kExactTol = 1e-4;

std::vector<float> Random(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// One host array on both backends.
template <typename T>
struct Pair {
  Buffer<T> cpu, gpu;
};

class CudaKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    gpu_ = CreateKernels(Backend::kCuda, 0, &why);
    ASSERT_NE(gpu_, nullptr) << "the gpu tests need a CUDA device: " << why;
    cpu_ = CreateCpuKernels();
  }
  void TearDown() override {
    if (gpu_ != nullptr) {
      EXPECT_EQ(gpu_->Synchronize(), "");
    }
  }

  template <typename T>
  Pair<T> Make(const std::vector<T>& host) {
    Pair<T> p{Buffer<T>(cpu_.get(), host.size()), Buffer<T>(gpu_.get(), host.size())};
    cpu_->Upload(p.cpu.data(), host.data(), host.size() * sizeof(T));
    gpu_->Upload(p.gpu.data(), host.data(), host.size() * sizeof(T));
    return p;
  }
  Pair<float> Zeros(size_t n) { return Make(std::vector<float>(n, 0.0f)); }
  Pair<float> Rand(size_t n, uint32_t seed, float scale = 1.0f) {
    return Make(Random(n, seed, scale));
  }

  void ExpectClose(const Pair<float>& p, double tol, const std::string& what) {
    std::vector<float> c(p.cpu.size()), g(p.gpu.size());
    cpu_->Download(c.data(), p.cpu.data(), p.cpu.bytes());
    gpu_->Download(g.data(), p.gpu.data(), p.gpu.bytes());
    ASSERT_EQ(gpu_->error(), "") << what;
    double max_ref = 0, max_err = 0;
    size_t worst = 0;
    for (size_t i = 0; i < c.size(); ++i) {
      max_ref = std::max(max_ref, std::fabs(static_cast<double>(c[i])));
      const double err = std::fabs(static_cast<double>(c[i]) - g[i]);
      if (std::isnan(err) || err > max_err) {  // NaN counts as the worst
        max_err = std::isnan(err) ? INFINITY : err;
        worst = i;
      }
    }
    EXPECT_LE(max_err, tol * std::max(1.0, max_ref))
        << what << ": worst at " << worst << ": cpu " << c[worst] << ", cuda " << g[worst];
  }

  std::unique_ptr<Kernels> cpu_, gpu_;
};

TEST_F(CudaKernelsTest, GemmMatchesInEveryTransposeAndAlignment) {
  const int m = 37, n = 53, k = 29;
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      for (int shift = 0; shift < 2; ++shift) {  // 4-byte aligned operands as well as 256-byte
        auto a = Rand(m * k + shift, 1), b = Rand(k * n + shift, 2), c = Rand(m * n + shift, 3);
        for (Kernels* kk : {cpu_.get(), gpu_.get()}) {
          const bool gpu = kk == gpu_.get();
          Pair<float>* ps[] = {&a, &b, &c};
          float* x[3];
          for (int i = 0; i < 3; ++i) x[i] = (gpu ? ps[i]->gpu.data() : ps[i]->cpu.data()) + shift;
          kk->Gemm(ta, tb, m, n, k, 0.7f, x[0], x[1], 0.5f, x[2]);
        }
        ExpectClose(c, kGemmTol,
                    "gemm ta=" + std::to_string(ta) + " tb=" + std::to_string(tb) +
                        " shift=" + std::to_string(shift));
      }
    }
  }
}

TEST_F(CudaKernelsTest, ElementwiseOpsMatch) {
  const int n = 33, c = 70;
  auto x = Rand(n * c, 4), bias = Rand(c, 5), y = Rand(n * c, 6), sums = Rand(c, 7);
  auto wpe = Rand(8 * c, 8);
  for (Kernels* k : {cpu_.get(), gpu_.get()}) {
    const bool g = k == gpu_.get();
    auto P = [g](Pair<float>& p) { return g ? p.gpu.data() : p.cpu.data(); };
    k->AddBias(P(x), P(bias), n, c);
    k->Add(P(y), P(x), n * c);
    k->ColumnSum(P(y), n, c, P(sums));
    k->Scale(P(x), n * c, -1.5f);
    k->AddPositions(P(x), P(wpe), n, 8, c);
  }
  ExpectClose(x, kExactTol, "add bias, scale, add positions");
  ExpectClose(y, kExactTol, "add");
  ExpectClose(sums, kExactTol, "column sum");
  const std::vector<std::pair<size_t, size_t>> ranges = {{0, 100}, {500, 1000}, {2000, 310}};
  const float ss_cpu = cpu_->SumSquares(y.cpu.data(), ranges);
  const float ss_gpu = gpu_->SumSquares(y.gpu.data(), ranges);
  EXPECT_NEAR(ss_gpu, ss_cpu, kExactTol * ss_cpu);
  auto f = Zeros(1000);
  cpu_->Fill(f.cpu.data(), 1000, 2.5f);
  gpu_->Fill(f.gpu.data(), 1000, 2.5f);
  ExpectClose(f, 0, "fill");
}

TEST_F(CudaKernelsTest, EmbeddingMatchesOnAVocabShard) {
  const int n = 40, t = 8, c = 24, vocab_start = 16, rows = 16;
  std::vector<int32_t> tok(n);
  std::mt19937 rng(9);
  for (int32_t& v : tok) v = static_cast<int32_t>(rng() % 48);  // a third in this shard
  auto ids = Make(tok);
  auto wte = Rand(rows * c, 10), wpe = Rand(t * c, 11), out = Zeros(n * c);
  auto dout = Rand(n * c, 12), dwte = Zeros(rows * c), dwpe = Zeros(t * c);
  for (Kernels* k : {cpu_.get(), gpu_.get()}) {
    const bool g = k == gpu_.get();
    auto P = [g](Pair<float>& p) { return g ? p.gpu.data() : p.cpu.data(); };
    const int32_t* id = g ? ids.gpu.data() : ids.cpu.data();
    k->EmbeddingForward(id, n, t, P(wte), vocab_start, rows, P(wpe), c, P(out));
    k->EmbeddingBackward(id, n, t, P(dout), vocab_start, rows, c, P(dwte), P(dwpe));
  }
  ExpectClose(out, kExactTol, "embedding forward");
  ExpectClose(dwte, kExactTol, "embedding backward (wte)");
  ExpectClose(dwpe, kExactTol, "embedding backward (wpe)");
}

TEST_F(CudaKernelsTest, LayerNormAndGeluMatch) {
  const int n = 19, c = 300;  // c above the block size: the strided loops
  auto x = Rand(n * c, 13, 3.0f), gamma = Rand(c, 14), beta = Rand(c, 15), out = Zeros(n * c);
  auto mean = Zeros(n), rstd = Zeros(n), dout = Rand(n * c, 16), dx = Rand(n * c, 17);
  auto dgamma = Rand(c, 18), dbeta = Rand(c, 19), gelu = Zeros(n * c), dgelu = Rand(n * c, 20);
  for (Kernels* k : {cpu_.get(), gpu_.get()}) {
    const bool g = k == gpu_.get();
    auto P = [g](Pair<float>& p) { return g ? p.gpu.data() : p.cpu.data(); };
    k->LayerNormForward(P(x), P(gamma), P(beta), n, c, P(out), P(mean), P(rstd));
    k->LayerNormBackward(P(dout), P(x), P(gamma), P(mean), P(rstd), n, c, P(dx), P(dgamma),
                         P(dbeta));
    k->GeluForward(P(x), n * c, P(gelu));
    k->GeluBackward(P(dout), P(x), n * c, P(dgelu));
  }
  ExpectClose(out, kExactTol, "layer norm");
  ExpectClose(mean, kExactTol, "layer norm mean");
  ExpectClose(rstd, kExactTol, "layer norm rstd");
  ExpectClose(dx, kExactTol, "layer norm dx");
  ExpectClose(dgamma, kExactTol, "layer norm dgamma");
  ExpectClose(dbeta, kExactTol, "layer norm dbeta");
  ExpectClose(gelu, kExactTol, "gelu");
  ExpectClose(dgelu, kExactTol, "gelu backward");
}

TEST_F(CudaKernelsTest, CausalAttentionMatches) {
  const int b = 2, t = 37, h = 3, d = 16;  // t above a warp: the strided softmax
  auto qkv = Rand(static_cast<size_t>(b) * t * 3 * h * d, 21), out = Zeros(b * t * h * d);
  auto att = Zeros(static_cast<size_t>(b) * h * t * t), dout = Rand(b * t * h * d, 22);
  auto dqkv = Rand(static_cast<size_t>(b) * t * 3 * h * d, 23);
  for (Kernels* k : {cpu_.get(), gpu_.get()}) {
    const bool g = k == gpu_.get();
    auto P = [g](Pair<float>& p) { return g ? p.gpu.data() : p.cpu.data(); };
    k->AttentionForward(P(qkv), b, t, h, d, P(out), P(att));
    k->AttentionBackward(P(dout), P(qkv), P(att), b, t, h, d, P(dqkv));
  }
  ExpectClose(att, kGemmTol, "attention probabilities");
  ExpectClose(out, kGemmTol, "attention output");
  ExpectClose(dqkv, kGemmTol, "attention backward");
}

TEST_F(CudaKernelsTest, ShardedCrossEntropyMatches) {
  const int rows = 21, cols = 1000, vocab_start = 1000;
  std::vector<int32_t> tgt(rows);
  std::mt19937 rng(24);
  for (int32_t& v : tgt) v = static_cast<int32_t>(rng() % 3000);
  auto targets = Make(tgt);
  auto logits = Rand(static_cast<size_t>(rows) * cols, 25, 4.0f), max = Zeros(rows);
  auto sumexp = Zeros(rows), target = Zeros(rows), gmax = Rand(rows, 26);
  auto dlogits = Rand(static_cast<size_t>(rows) * cols, 27);
  double loss[2] = {0.5, 0.5};
  for (Kernels* k : {cpu_.get(), gpu_.get()}) {
    const bool g = k == gpu_.get();
    auto P = [g](Pair<float>& p) { return g ? p.gpu.data() : p.cpu.data(); };
    const int32_t* tg = g ? targets.gpu.data() : targets.cpu.data();
    k->RowMaxSumExp(P(logits), rows, cols, P(max), P(sumexp));
    k->TargetLogits(P(logits), tg, rows, cols, vocab_start, P(target));
    k->CrossEntropyBackward(P(logits), tg, P(max), P(sumexp), rows, cols, vocab_start, 0.25f,
                            P(dlogits));
    k->AddLoss(P(sumexp), P(max), P(target), rows, &loss[g]);
  }
  ExpectClose(max, kExactTol, "row max");
  ExpectClose(sumexp, kExactTol, "row sum of exponentials");
  ExpectClose(target, 0, "target logits");
  ExpectClose(dlogits, kExactTol, "cross-entropy backward");
  EXPECT_NEAR(loss[1], loss[0], kExactTol * std::fabs(loss[0]));
  for (Kernels* k : {cpu_.get(), gpu_.get()}) {
    const bool g = k == gpu_.get();
    auto P = [g](Pair<float>& p) { return g ? p.gpu.data() : p.cpu.data(); };
    k->RescaleSumExp(P(sumexp), P(max), P(gmax), rows);
  }
  ExpectClose(sumexp, kExactTol, "rescaled sum of exponentials");
  ExpectClose(max, 0, "global max");
}

TEST_F(CudaKernelsTest, AdamWMatchesOverSteps) {
  const size_t n = 5000;
  auto p = Rand(n, 28), m = Zeros(n), v = Zeros(n), grad = Rand(n, 29);
  AdamW opt;
  for (int64_t t = 1; t <= 3; ++t) {
    cpu_->AdamWUpdate(p.cpu.data(), grad.cpu.data(), m.cpu.data(), v.cpu.data(), n, opt, t, t != 2);
    gpu_->AdamWUpdate(p.gpu.data(), grad.gpu.data(), m.gpu.data(), v.gpu.data(), n, opt, t, t != 2);
  }
  ExpectClose(p, kExactTol, "adamw params");
  ExpectClose(m, kExactTol, "adamw m");
  ExpectClose(v, kExactTol, "adamw v");
}

TEST_F(CudaKernelsTest, AFailedCallIsKeptWithItsCallAndPlace) {
  float host[4];
  gpu_->Download(host, reinterpret_cast<const float*>(uintptr_t{0x10}), sizeof(host));
  const std::string e = gpu_->Synchronize();
  EXPECT_NE(e.find("cudaMemcpyAsync"), std::string::npos) << e;
  EXPECT_NE(e.find("cuda_kernels.cc:"), std::string::npos) << e;
  EXPECT_EQ(gpu_->error(), e);  // sticky
  gpu_.reset();                 // no Synchronize check in TearDown: the error is the point
}

// A whole stage (embedding, two blocks, head) on both backends: the loss and every gradient.
TEST_F(CudaKernelsTest, AGptStageTrainsAlikeOnBothBackends) {
  for (bool parallel : {false, true}) {
    runtime::ModelConfig cfg;
    cfg.layers = 2;
    cfg.heads = 4;
    cfg.width = 64;
    cfg.seq = 32;
    cfg.vocab = 512;
    cfg.parallel_block = parallel;
    const int batch = 3, n = batch * cfg.seq;
    std::vector<int32_t> tokens(n), targets(n);
    std::mt19937 rng(30);
    for (int i = 0; i < n; ++i) {
      tokens[i] = static_cast<int32_t>(rng() % cfg.vocab);
      targets[i] = static_cast<int32_t>(rng() % cfg.vocab);
    }
    runtime::GptStage c(cfg, runtime::Layout{}, 0, nullptr, cpu_.get());
    runtime::GptStage g(cfg, runtime::Layout{}, 0, nullptr, gpu_.get());
    double loss_c = 0, loss_g = 0;
    const float scale = 1.0f / static_cast<float>(n);
    ASSERT_TRUE(c.Forward(0, batch, tokens.data(), nullptr, targets.data(), nullptr, &loss_c).ok());
    ASSERT_TRUE(c.Backward(0, nullptr, nullptr, scale).ok());
    const Status fg = g.Forward(0, batch, tokens.data(), nullptr, targets.data(), nullptr, &loss_g);
    ASSERT_TRUE(fg.ok()) << fg.ToString();
    const Status bg = g.Backward(0, nullptr, nullptr, scale);
    ASSERT_TRUE(bg.ok()) << bg.ToString();
    EXPECT_NEAR(loss_g, loss_c, 1e-2 * loss_c) << (parallel ? "parallel" : "sequential");
    const std::vector<float> gc = c.HostGrads(), gg = g.HostGrads();
    for (const runtime::ParamTensor& t : c.tensors()) {
      double max_ref = 0, max_err = 0;
      for (size_t i = t.offset; i < t.offset + t.size; ++i) {
        max_ref = std::max(max_ref, std::fabs(static_cast<double>(gc[i])));
        max_err = std::max(max_err, std::fabs(static_cast<double>(gc[i]) - gg[i]));
      }
      EXPECT_LE(max_err, 5e-2 * max_ref + 1e-6) << t.name << (parallel ? " (parallel)" : "");
    }
  }
}

}  // namespace
}  // namespace megascope::kernels
