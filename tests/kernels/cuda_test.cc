// The CUDA backend against the CPU one, op by op and for a whole GPT stage (label gpu: these run on
// a GPU machine only, through scripts/gpu-check.sh). The same random inputs go to both backends
// (activations rounded to bf16 first, so both start from the same numbers); every output is
// compared as max |cuda - cpu| <= tol * max(1, max |cpu|). Tolerances: 1e-4 for fp32 outputs of
// fp32 arithmetic (fast-math exp/tanh, sums in another order); 1e-2 for bf16 outputs of
// elementwise and row-wise kernels (bf16 keeps 8 bits of mantissa: a rounding is <= 2^-9
// relative, a residual rounded before its norm a little more); 2e-2 for what goes through a GEMM
// (bf16 products, fp32 sums, a bf16 result); 1e-1 of a tensor's largest gradient for a whole
// stage (two layers of bf16 activations: the CPU backend storing bf16 lands at about 5e-2).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "megascope/kernels/kernels.h"
#include "megascope/runtime/model.h"

namespace megascope::kernels {
namespace {

constexpr double kGemmTol = 2e-2, kBf16Tol = 1e-2, kExactTol = 1e-4;

// x rounded to the nearest bf16 (ties to even), as the device rounds.
float RoundBf16(float x) {
  uint32_t u = 0;
  std::memcpy(&u, &x, sizeof(u));
  if ((u & 0x7f800000u) == 0x7f800000u) return x;
  u += 0x7fffu + ((u >> 16) & 1u);
  u &= 0xffff0000u;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}

std::vector<float> Random(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0, scale);
  std::vector<float> v(n);
  for (float& x : v) x = RoundBf16(dist(rng));  // exact in both storage types
  return v;
}

// One host array on both backends: fp32 buffers, or activations in each backend's storage type.
template <typename T>
struct Pair {
  Buffer<T> cpu, gpu;
};
struct ActPair {
  ActBuffer cpu, gpu;
  Act at(bool gpu_side) { return gpu_side ? gpu.act() : cpu.act(); }
};

// max |got - want| <= tol * max(1, max |want|), NaN counting as the worst.
void ExpectAllClose(const std::vector<float>& want, const std::vector<float>& got, double tol,
                    const std::string& what) {
  double max_ref = 0, max_err = 0;
  size_t worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(want[i])));
    const double err = std::fabs(static_cast<double>(want[i]) - got[i]);
    if (std::isnan(err) || err > max_err) {
      max_err = std::isnan(err) ? INFINITY : err;
      worst = i;
    }
  }
  EXPECT_LE(max_err, tol * std::max(1.0, max_ref))
      << what << ": worst at " << worst << ": cpu " << want[worst] << ", cuda " << got[worst];
}

class CudaKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    gpu_ = CreateKernels(Backend::kCuda, 0, &why);
    ASSERT_NE(gpu_, nullptr) << "the gpu tests need a CUDA device: " << why;
    ASSERT_EQ(gpu_->storage(), Storage::kBF16);
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
  ActPair MakeActs(const std::vector<float>& host) {
    ActPair p{ActBuffer(cpu_.get(), host.size()), ActBuffer(gpu_.get(), host.size())};
    Buffer<float> staged(gpu_.get(), host.size());
    cpu_->Upload(p.cpu.act().p, host.data(), host.size() * sizeof(float));
    gpu_->Upload(staged.data(), host.data(), staged.bytes());
    gpu_->ToAct(p.gpu.act(), staged.data(), host.size());
    return p;
  }
  ActPair RandActs(size_t n, uint32_t seed, float scale = 1.0f) {
    return MakeActs(Random(n, seed, scale));
  }
  ActPair ZeroActs(size_t n) { return MakeActs(std::vector<float>(n, 0.0f)); }

  std::vector<float> Host(Kernels* k, const Buffer<float>& b) {
    std::vector<float> h(b.size());
    k->Download(h.data(), b.data(), b.bytes());
    return h;
  }
  std::vector<float> Host(Kernels* k, const ActBuffer& b) {
    Buffer<float> f(k, b.size());
    k->FromAct(f.data(), b.cact(), b.size());
    return Host(k, f);
  }
  template <typename P>
  void ExpectClose(const P& p, double tol, const std::string& what) {
    const std::vector<float> c = Host(cpu_.get(), p.cpu), g = Host(gpu_.get(), p.gpu);
    ASSERT_EQ(gpu_->error(), "") << what;
    ExpectAllClose(c, g, tol, what);
  }

  std::unique_ptr<Kernels> cpu_, gpu_;
};

TEST_F(CudaKernelsTest, GemmMatchesInEveryTransposeAndAlignment) {
  const int m = 37, n = 53, k = 29;
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      for (int shift = 0; shift < 2; ++shift) {  // element-aligned operands as well as 256-byte
        auto a = RandActs(m * k + shift, 1), b = RandActs(k * n + shift, 2);
        auto c = RandActs(m * n + shift, 3);
        auto cf = Rand(m * n + shift, 3);
        for (Kernels* kk : {cpu_.get(), gpu_.get()}) {
          const bool g = kk == gpu_.get();
          const Storage st = kk->storage();
          kk->Gemm(ta, tb, m, n, k, 0.7f, Offset(a.at(g), shift, st), Offset(b.at(g), shift, st),
                   0.5f, Offset(c.at(g), shift, st));
          kk->GemmToFloat(ta, tb, m, n, k, 0.7f, Offset(a.at(g), shift, st),
                          Offset(b.at(g), shift, st), 0.5f,
                          (g ? cf.gpu.data() : cf.cpu.data()) + shift);
        }
        const std::string what = "ta=" + std::to_string(ta) + " tb=" + std::to_string(tb) +
                                 " shift=" + std::to_string(shift);
        ExpectClose(c, kGemmTol, "gemm (bf16 out) " + what);
        ExpectClose(cf, kGemmTol, "gemm (fp32 out) " + what);
      }
    }
  }
}

// The bias and GELU epilogues (n = 64: fused in cuBLASLt) and the unfused path they fall back to
// (n = 60: GELU's aux needs a leading dimension divisible by 8).
TEST_F(CudaKernelsTest, LinearLayersMatchFusedAndUnfused) {
  const int m = 45, k = 32;
  for (int n : {64, 60}) {
    auto a = RandActs(m * k, 31), w = RandActs(k * n, 32), bias = RandActs(n, 33);
    auto out = ZeroActs(m * n), gelu = ZeroActs(m * n), pre = ZeroActs(m * n);
    auto dy = RandActs(m * k, 34), w2 = RandActs(n * k, 35), dpre = ZeroActs(m * n);
    auto dbias = Rand(n, 36);
    for (Kernels* kk : {cpu_.get(), gpu_.get()}) {
      const bool g = kk == gpu_.get();
      kk->Linear(m, n, k, a.at(g), w.at(g), bias.at(g), out.at(g), Act{});
      kk->Linear(m, n, k, a.at(g), w.at(g), bias.at(g), gelu.at(g), pre.at(g));
      kk->LinearGeluBackward(m, n, k, dy.at(g), w2.at(g), pre.at(g), dpre.at(g),
                             g ? dbias.gpu.data() : dbias.cpu.data());
    }
    const std::string what = " (n=" + std::to_string(n) + ")";
    ExpectClose(out, kGemmTol, "linear + bias" + what);
    ExpectClose(pre, kGemmTol, "linear + bias: GELU's input" + what);
    ExpectClose(gelu, kGemmTol, "linear + bias + GELU" + what);
    ExpectClose(dpre, kGemmTol, "GELU backward through the GEMM" + what);
    ExpectClose(dbias, kGemmTol, "bias gradient" + what);
  }
}

TEST_F(CudaKernelsTest, ElementwiseOpsMatch) {
  const int n = 33, c = 70;
  auto x = RandActs(n * c, 4);
  auto bias = RandActs(c, 5);
  auto y = RandActs(n * c, 6);
  auto sums = Rand(c, 7);
  auto wpe = RandActs(8 * c, 8);
  auto f32 = Rand(n * c, 9);
  for (Kernels* k : {cpu_.get(), gpu_.get()}) {
    const bool g = k == gpu_.get();
    k->AddBias(x.at(g), bias.at(g), n, c);
    k->Add(y.at(g), x.at(g), n * c);
    k->ColumnSum(y.at(g), n, c, g ? sums.gpu.data() : sums.cpu.data());
    k->AddPositions(x.at(g), wpe.at(g), n, 8, c);
    k->Scale(g ? f32.gpu.data() : f32.cpu.data(), n * c, -1.5f);
  }
  ExpectClose(x, kBf16Tol, "add bias, add positions");
  ExpectClose(y, kBf16Tol, "add");
  ExpectClose(sums, kBf16Tol, "column sum");
  ExpectClose(f32, kExactTol, "scale");
  const std::vector<std::pair<size_t, size_t>> ranges = {{0, 100}, {500, 1000}, {2000, 310}};
  const float ss_cpu = cpu_->SumSquares(f32.cpu.data(), ranges);
  const float ss_gpu = gpu_->SumSquares(f32.gpu.data(), ranges);
  EXPECT_NEAR(ss_gpu, ss_cpu, kExactTol * ss_cpu);
  auto f = Zeros(1000);
  cpu_->Fill(f.cpu.data(), 1000, 2.5f);
  gpu_->Fill(f.gpu.data(), 1000, 2.5f);
  ExpectClose(f, 0, "fill");
  // Through the storage type and back: bf16-exact values come back exactly.
  auto round = MakeActs(Random(1000, 10));
  ExpectClose(round, 0, "to bf16 and back");
}

TEST_F(CudaKernelsTest, EmbeddingMatchesOnAVocabShard) {
  const int n = 40, t = 8, c = 24, vocab_start = 16, rows = 16;
  std::vector<int32_t> tok(n);
  std::mt19937 rng(9);
  for (int32_t& v : tok) v = static_cast<int32_t>(rng() % 48);  // a third in this shard
  auto ids = Make(tok);
  auto wte = RandActs(rows * c, 10), wpe = RandActs(t * c, 11), out = ZeroActs(n * c);
  auto dout = RandActs(n * c, 12);
  auto dwte = Zeros(rows * c);
  auto dwpe = Zeros(t * c);
  for (Kernels* k : {cpu_.get(), gpu_.get()}) {
    const bool g = k == gpu_.get();
    auto P = [g](Pair<float>& p) { return g ? p.gpu.data() : p.cpu.data(); };
    const int32_t* id = g ? ids.gpu.data() : ids.cpu.data();
    k->EmbeddingForward(id, n, t, wte.at(g), vocab_start, rows, wpe.at(g), c, out.at(g));
    k->EmbeddingBackward(id, n, t, dout.at(g), vocab_start, rows, c, P(dwte), P(dwpe));
  }
  ExpectClose(out, kBf16Tol, "embedding forward");
  ExpectClose(dwte, kExactTol, "embedding backward (wte)");
  ExpectClose(dwpe, kExactTol, "embedding backward (wpe)");
}

TEST_F(CudaKernelsTest, LayerNormAndItsResidualFusionMatch) {
  const int n = 19, c = 300;  // c above the block size: the strided loops
  auto x = RandActs(n * c, 13, 3.0f), gamma = RandActs(c, 14), beta = RandActs(c, 15);
  auto out = ZeroActs(n * c);
  auto mean = Zeros(n);
  auto rstd = Zeros(n);
  auto dout = RandActs(n * c, 16);
  auto dx = RandActs(n * c, 17);
  auto dgamma = Rand(c, 18);
  auto dbeta = Rand(c, 19);
  auto res = RandActs(n * c, 20), delta = RandActs(n * c, 21), bias = RandActs(c, 22);
  auto res_out = ZeroActs(n * c);
  auto res_mean = Zeros(n);
  auto res_rstd = Zeros(n);
  for (Kernels* k : {cpu_.get(), gpu_.get()}) {
    const bool g = k == gpu_.get();
    auto P = [g](Pair<float>& p) { return g ? p.gpu.data() : p.cpu.data(); };
    k->LayerNormForward(x.at(g), gamma.at(g), beta.at(g), n, c, out.at(g), P(mean), P(rstd));
    k->LayerNormBackward(dout.at(g), x.at(g), gamma.at(g), P(mean), P(rstd), n, c, dx.at(g),
                         P(dgamma), P(dbeta));
    k->ResidualLayerNormForward(res.at(g), delta.at(g), bias.at(g), gamma.at(g), beta.at(g), n, c,
                                res_out.at(g), P(res_mean), P(res_rstd));
  }
  ExpectClose(out, kBf16Tol, "layer norm");
  ExpectClose(mean, kExactTol, "layer norm mean");
  ExpectClose(rstd, kExactTol, "layer norm rstd");
  ExpectClose(dx, kBf16Tol, "layer norm dx");
  ExpectClose(dgamma, kExactTol, "layer norm dgamma");
  ExpectClose(dbeta, kExactTol, "layer norm dbeta");
  ExpectClose(res, kBf16Tol, "residual stream after the fused add");
  ExpectClose(res_out, kBf16Tol, "layer norm of the residual");
  ExpectClose(res_mean, kBf16Tol, "its mean");
  ExpectClose(res_rstd, kBf16Tol, "its rstd");
}

TEST_F(CudaKernelsTest, CausalAttentionMatches) {
  const int b = 2, t = 37, h = 3, d = 16;  // t above a warp: the strided softmax
  auto qkv = RandActs(static_cast<size_t>(b) * t * 3 * h * d, 21), out = ZeroActs(b * t * h * d);
  auto att = ZeroActs(static_cast<size_t>(b) * h * t * t), dout = RandActs(b * t * h * d, 22);
  auto dqkv = RandActs(static_cast<size_t>(b) * t * 3 * h * d, 23);
  for (Kernels* k : {cpu_.get(), gpu_.get()}) {
    const bool g = k == gpu_.get();
    k->AttentionForward(qkv.at(g), b, t, h, d, out.at(g), att.at(g));
    k->AttentionBackward(dout.at(g), qkv.at(g), att.at(g), b, t, h, d, dqkv.at(g));
  }
  ExpectClose(att, kGemmTol, "attention probabilities");
  ExpectClose(out, kGemmTol, "attention output");
  ExpectClose(dqkv, kGemmTol, "attention backward");
}

TEST_F(CudaKernelsTest, FusedShardedCrossEntropyMatches) {
  const int rows = 21, cols = 1000, vocab_start = 1000;
  std::vector<int32_t> tgt(rows);
  std::mt19937 rng(24);
  for (int32_t& v : tgt) v = static_cast<int32_t>(rng() % 3000);
  auto targets = Make(tgt);
  auto logits = RandActs(static_cast<size_t>(rows) * cols, 25, 4.0f);
  auto max = Zeros(rows);
  auto sumexp = Zeros(rows), target = Zeros(rows), gmax = Rand(rows, 26);
  double loss[2] = {0.5, 0.5};
  for (Kernels* k : {cpu_.get(), gpu_.get()}) {
    const bool g = k == gpu_.get();
    auto P = [g](Pair<float>& p) { return g ? p.gpu.data() : p.cpu.data(); };
    const int32_t* tg = g ? targets.gpu.data() : targets.cpu.data();
    k->CrossEntropyForward(logits.at(g), tg, rows, cols, vocab_start, P(max), P(sumexp), P(target));
    k->AddLoss(P(sumexp), P(max), P(target), rows, &loss[g]);
    k->CrossEntropyBackward(logits.at(g), tg, P(max), P(sumexp), rows, cols, vocab_start, 0.25f);
  }
  ExpectClose(max, 0, "row max");
  ExpectClose(sumexp, kExactTol, "row sum of exponentials (online)");
  ExpectClose(target, 0, "target logits");
  ExpectClose(logits, kBf16Tol, "cross-entropy backward, in place");
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
  // ...and it stays this backend's: the next one's launches are not blamed for it (CUDA keeps a
  // failed call's error as the thread's last error, which a launch check reads).
  std::string why;
  auto next = CreateKernels(Backend::kCuda, 0, &why);
  ASSERT_NE(next, nullptr) << why;
  Buffer<float> x(next.get(), 256);
  next->Fill(x.data(), x.size(), 1.0f);
  EXPECT_EQ(next->Synchronize(), "");
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
      EXPECT_LE(max_err, 1e-1 * max_ref + 1e-6) << t.name << (parallel ? " (parallel)" : "");
    }
  }
}

}  // namespace
}  // namespace megascope::kernels
