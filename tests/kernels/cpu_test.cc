// Every backward pass against central finite differences of a random projection of its output.
#include "megascope/kernels/cpu.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "megascope/kernels/kernels.h"

namespace megascope::kernels {
namespace {

// Test sizes are small ints; their products index vectors.
// NOLINTBEGIN(bugprone-implicit-widening-of-multiplication-result)

std::vector<float> Random(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Checks d(sum(out * proj))/d(input) from `analytic` against finite differences of `forward`.
void ExpectGradientsMatch(std::vector<float>& input,
                          const std::function<std::vector<float>()>& forward,
                          const std::vector<float>& analytic, const std::vector<float>& proj,
                          float tol = 2e-2f) {
  auto loss = [&] {
    std::vector<float> out = forward();
    double s = 0;
    for (size_t i = 0; i < out.size(); ++i) s += static_cast<double>(out[i]) * proj[i];
    return s;
  };
  const float eps = 1e-2f;
  double max_err = 0, max_ref = 0;
  for (size_t i = 0; i < input.size(); i += std::max<size_t>(1, input.size() / 64)) {
    const float saved = input[i];
    input[i] = saved + eps;
    const double up = loss();
    input[i] = saved - eps;
    const double down = loss();
    input[i] = saved;
    const double numeric = (up - down) / (2 * eps);
    max_err = std::max(max_err, std::fabs(numeric - analytic[i]));
    max_ref = std::max(max_ref, std::fabs(numeric));
  }
  EXPECT_LE(max_err, tol * std::max(1.0, max_ref)) << "max |numeric - analytic| = " << max_err;
}

TEST(KernelsTest, GemmMatchesNaive) {
  const int m = 5, n = 7, k = 3;
  auto a = Random(m * k, 1), b = Random(n * k, 2);
  std::vector<float> c(m * n, 1.0f);
  Gemm(false, true, m, n, k, 2.0f, a.data(), b.data(), 0.5f, c.data());
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      float s = 0;
      for (int e = 0; e < k; ++e) s += a[i * k + e] * b[j * k + e];
      EXPECT_NEAR(c[i * n + j], 2 * s + 0.5f, 1e-4);
    }
  }
}

TEST(KernelsTest, LayerNormGradients) {
  const int n = 4, c = 16;
  auto x = Random(n * c, 3), g = Random(c, 4), b = Random(c, 5), proj = Random(n * c, 6);
  std::vector<float> mean(n), rstd(n), out(n * c);
  auto fwd = [&] {
    LayerNormForward(x.data(), g.data(), b.data(), n, c, out.data(), mean.data(), rstd.data());
    return out;
  };
  fwd();
  std::vector<float> dx(n * c, 0), dg(c, 0), db(c, 0);
  LayerNormBackward(proj.data(), x.data(), g.data(), mean.data(), rstd.data(), n, c, dx.data(),
                    dg.data(), db.data());
  ExpectGradientsMatch(x, fwd, dx, proj);
  ExpectGradientsMatch(g, fwd, dg, proj);
  ExpectGradientsMatch(b, fwd, db, proj);
}

TEST(KernelsTest, GeluGradients) {
  auto x = Random(64, 7, 2.0f), proj = Random(64, 8);
  std::vector<float> out(64), dx(64, 0);
  auto fwd = [&] {
    GeluForward(x.data(), x.size(), out.data());
    return out;
  };
  fwd();
  EXPECT_NEAR(out[0], 0.5f * x[0] * (1 + std::erf(x[0] / std::sqrt(2.0f))),
              2e-3);  // close to exact GELU
  GeluBackward(proj.data(), x.data(), x.size(), dx.data());
  ExpectGradientsMatch(x, fwd, dx, proj);
}

TEST(KernelsTest, AttentionGradientsAndCausality) {
  const int b = 2, t = 5, h = 2, d = 4;
  auto qkv = Random(b * t * 3 * h * d, 9), proj = Random(b * t * h * d, 10);
  std::vector<float> out(b * t * h * d), att(b * h * t * t);
  auto fwd = [&] {
    AttentionForward(qkv.data(), b, t, h, d, out.data(), att.data());
    return out;
  };
  fwd();
  for (int i = 0; i < t; ++i) {
    float sum = 0;
    for (int j = 0; j < t; ++j) {
      if (j > i) {
        EXPECT_EQ(att[i * t + j], 0.0f);  // no peeking at the future
      }
      sum += att[i * t + j];
    }
    EXPECT_NEAR(sum, 1.0f, 1e-5);
  }
  std::vector<float> dqkv(qkv.size(), 0);
  AttentionBackward(proj.data(), qkv.data(), att.data(), b, t, h, d, dqkv.data());
  ExpectGradientsMatch(qkv, fwd, dqkv, proj);
}

TEST(KernelsTest, EmbeddingGradientsWithVocabShard) {
  const int n = 6, t = 3, c = 4, start = 10, rows = 5;
  std::vector<int32_t> tokens = {10, 12, 3, 14, 12, 20};  // 3 and 20 belong to other shards
  auto wte = Random(rows * c, 11), wpe = Random(t * c, 12), proj = Random(n * c, 13);
  std::vector<float> out(n * c);
  auto fwd = [&] {
    EmbeddingForward(tokens.data(), n, t, wte.data(), start, rows, wpe.data(), c, out.data());
    return out;
  };
  fwd();
  EXPECT_FLOAT_EQ(out[2 * c], wpe[2 * c]);  // foreign token: position only
  std::vector<float> dwte(rows * c, 0), dwpe(t * c, 0);
  EmbeddingBackward(tokens.data(), n, t, proj.data(), start, rows, c, dwte.data(), dwpe.data());
  ExpectGradientsMatch(wte, fwd, dwte, proj);
  ExpectGradientsMatch(wpe, fwd, dwpe, proj);
}

TEST(KernelsTest, ShardedCrossEntropyEqualsWholeAndItsGradient) {
  const int rows = 3, v = 8;
  auto logits = Random(rows * v, 14);
  std::vector<int32_t> targets = {1, 6, 3};
  auto ce = [&](const std::vector<float>& l) {
    std::vector<float> mx(rows), se(rows);
    RowMaxSumExp(l.data(), rows, v, mx.data(), se.data());
    double loss = 0;
    for (int r = 0; r < rows; ++r) loss += std::log(se[r]) + mx[r] - l[r * v + targets[r]];
    return loss / rows;
  };
  // Two shards of 4 columns combine to the whole: global max, sum of rescaled sums.
  std::vector<float> mx(rows), se(rows);
  RowMaxSumExp(logits.data(), rows, v, mx.data(), se.data());
  std::vector<float> shard(rows * 4), m0(rows), s0(rows), m1(rows), s1(rows);
  for (int half = 0; half < 2; ++half) {
    for (int r = 0; r < rows; ++r) {
      for (int j = 0; j < 4; ++j) shard[r * 4 + j] = logits[r * v + half * 4 + j];
    }
    RowMaxSumExp(shard.data(), rows, 4, half ? m1.data() : m0.data(), half ? s1.data() : s0.data());
  }
  for (int r = 0; r < rows; ++r) {
    const float g = std::max(m0[r], m1[r]);
    EXPECT_NEAR(s0[r] * std::exp(m0[r] - g) + s1[r] * std::exp(m1[r] - g),
                se[r] * std::exp(mx[r] - g), 1e-4);
  }
  std::vector<float> dl(rows * v, 0);
  CrossEntropyBackward(logits.data(), targets.data(), mx.data(), se.data(), rows, v, 0, 1.0f / rows,
                       dl.data());
  const float eps = 1e-2f;
  for (int i = 0; i < rows * v; ++i) {
    auto up = logits, down = logits;
    up[i] += eps;
    down[i] -= eps;
    EXPECT_NEAR((ce(up) - ce(down)) / (2 * eps), dl[i], 2e-3);
  }
}

TEST(KernelsTest, AdamWMovesAgainstTheGradientAndDecays) {
  std::vector<float> p = {1.0f, -1.0f}, g = {0.5f, -0.5f}, m(2, 0), v(2, 0);
  AdamW opt;
  opt.lr = 0.1f;
  opt.weight_decay = 0.0f;
  AdamWUpdate(p.data(), g.data(), m.data(), v.data(), 2, opt, 1, false);
  EXPECT_NEAR(p[0], 0.9f, 1e-5);  // first step moves by lr against the sign of the gradient
  EXPECT_NEAR(p[1], -0.9f, 1e-5);
  std::vector<float> q = {2.0f}, zero = {0.0f}, m2 = {0}, v2 = {0};
  opt.weight_decay = 0.5f;
  AdamWUpdate(q.data(), zero.data(), m2.data(), v2.data(), 1, opt, 1, true);
  EXPECT_NEAR(q[0], 2.0f - 0.1f * 0.5f * 2.0f, 1e-5);
}

// The CPU backend's fused ops (the CUDA backend's epilogues and fused kernels) are the reference
// ops in the order the model ran them before the fusion, bit for bit: the CPU path's losses do not
// move when the GPU path fuses.
TEST(KernelsTest, TheCpuBackendsFusedOpsAreTheReferenceOpsInOrder) {
  auto k = CreateCpuKernels();
  ASSERT_EQ(k->storage(), Storage::kF32);
  auto act = [](std::vector<float>& v) { return Act{v.data()}; };
  const int m = 7, n = 12, kk = 5;
  auto a = Random(m * kk, 1), w = Random(kk * n, 2), bias = Random(n, 3);
  std::vector<float> out(m * n), pre(m * n), gelu(m * n);
  k->Linear(m, n, kk, act(a), act(w), act(bias), act(out), Act{});
  k->Linear(m, n, kk, act(a), act(w), act(bias), act(gelu), act(pre));
  std::vector<float> want(m * n), want_gelu(m * n);
  Gemm(false, false, m, n, kk, 1, a.data(), w.data(), 0, want.data());
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) want[i * n + j] += bias[j];
  }
  GeluForward(want.data(), want.size(), want_gelu.data());
  EXPECT_EQ(out, want);
  EXPECT_EQ(pre, want);
  EXPECT_EQ(gelu, want_gelu);

  auto dy = Random(m * kk, 4), w2 = Random(n * kk, 5);
  std::vector<float> dpre(m * n, 9.0f), dbias = Random(n, 6), want_dbias = dbias;
  k->LinearGeluBackward(m, n, kk, act(dy), act(w2), act(pre), act(dpre), dbias.data());
  std::vector<float> dg(m * n), want_dpre(m * n, 0.0f);
  Gemm(false, true, m, n, kk, 1, dy.data(), w2.data(), 0, dg.data());
  GeluBackward(dg.data(), pre.data(), dg.size(), want_dpre.data());
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) want_dbias[j] += want_dpre[i * n + j];
  }
  EXPECT_EQ(dpre, want_dpre);  // written, not added to
  EXPECT_EQ(dbias, want_dbias);

  const int c = n;
  auto x = Random(m * c, 7), delta = Random(m * c, 8), gamma = Random(c, 9), beta = Random(c, 10);
  std::vector<float> want_x = x, ln(m * c), mean(m), rstd(m), want_ln(m * c), want_mean(m),
                     want_rstd(m);
  k->ResidualLayerNormForward(act(x), act(delta), act(bias), act(gamma), act(beta), m, c, act(ln),
                              mean.data(), rstd.data());
  for (size_t i = 0; i < want_x.size(); ++i) want_x[i] += delta[i];
  for (size_t i = 0; i < want_x.size(); ++i) want_x[i] += bias[i % c];
  LayerNormForward(want_x.data(), gamma.data(), beta.data(), m, c, want_ln.data(), want_mean.data(),
                   want_rstd.data());
  EXPECT_EQ(x, want_x);
  EXPECT_EQ(ln, want_ln);
  EXPECT_EQ(mean, want_mean);
  EXPECT_EQ(rstd, want_rstd);

  const int rows = 6, cols = 20, vocab_start = 20;
  auto logits = Random(rows * cols, 11, 3.0f);
  const std::vector<int32_t> targets = {20, 39, 5, 25, 60, 21};  // two outside this shard
  std::vector<float> mx(rows), se(rows), tl(rows), want_mx(rows), want_se(rows);
  k->CrossEntropyForward(act(logits), targets.data(), rows, cols, vocab_start, mx.data(), se.data(),
                         tl.data());
  RowMaxSumExp(logits.data(), rows, cols, want_mx.data(), want_se.data());
  EXPECT_EQ(mx, want_mx);
  EXPECT_EQ(se, want_se);
  for (int r = 0; r < rows; ++r) {
    const int col = targets[r] - vocab_start;
    EXPECT_EQ(tl[r], col >= 0 && col < cols ? logits[r * cols + col] : 0.0f) << r;
  }
  std::vector<float> want_d(rows * cols, 0.0f);
  CrossEntropyBackward(logits.data(), targets.data(), mx.data(), se.data(), rows, cols, vocab_start,
                       0.3f, want_d.data());
  k->CrossEntropyBackward(act(logits), targets.data(), mx.data(), se.data(), rows, cols,
                          vocab_start, 0.3f);
  EXPECT_EQ(logits, want_d);  // in place
}

// NOLINTEND(bugprone-implicit-widening-of-multiplication-result)

}  // namespace
}  // namespace megascope::kernels
