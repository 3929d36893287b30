// The CPU backend: host memory, the reference functions of cpu.h, synchronous.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "megascope/kernels/kernels.h"

namespace megascope::kernels {

namespace {

float* F(Act a) { return static_cast<float*>(a.p); }
const float* F(CAct a) { return static_cast<const float*>(a.p); }

class CpuKernels final : public Kernels {
 public:
  Backend backend() const override { return Backend::kCpu; }
  std::string device_name() const override { return "cpu (OpenBLAS, one thread per rank)"; }

  void* Allocate(size_t bytes) override {
    void* p = std::calloc(1, bytes);
    if (p == nullptr && error_.empty())
      error_ = "calloc(" + std::to_string(bytes) + "): out of memory";
    return p;
  }
  void Free(void* p) override { std::free(p); }
  void* AllocateHost(size_t bytes) override { return Allocate(bytes); }
  void FreeHost(void* p) override { std::free(p); }
  bool IsDevicePointer(const void*) const override { return false; }
  void Upload(void* dst, const void* host_src, size_t bytes) override {
    std::memcpy(dst, host_src, bytes);
  }
  void Download(void* host_dst, const void* src, size_t bytes) override {
    std::memcpy(host_dst, src, bytes);
  }
  void Copy(void* dst, const void* src, size_t bytes) override { std::memmove(dst, src, bytes); }
  void Fill(float* x, size_t n, float value) override {
    for (size_t i = 0; i < n; ++i) x[i] = value;
  }
  std::string Synchronize() override { return error_; }
  std::string error() const override { return error_; }

  Storage storage() const override { return Storage::kF32; }
  void ToAct(Act dst, const float* src, size_t n) override {
    std::memmove(dst.p, src, n * sizeof(float));
  }
  void FromAct(float* dst, CAct src, size_t n) override {
    std::memmove(dst, src.p, n * sizeof(float));
  }

  void Scale(float* x, size_t n, float s) override {
    for (size_t i = 0; i < n; ++i) x[i] *= s;
  }
  float SumSquares(const float* x, const std::vector<std::pair<size_t, size_t>>& ranges) override {
    float sum = 0;
    for (const auto& r : ranges) {
      for (size_t i = r.first; i < r.first + r.second; ++i) sum += x[i] * x[i];
    }
    return sum;
  }

  void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, CAct a, CAct b,
            float beta, Act c) override {
    kernels::Gemm(trans_a, trans_b, m, n, k, alpha, F(a), F(b), beta, F(c));
  }
  void GemmToFloat(bool trans_a, bool trans_b, int m, int n, int k, float alpha, CAct a, CAct b,
                   float beta, float* c) override {
    kernels::Gemm(trans_a, trans_b, m, n, k, alpha, F(a), F(b), beta, c);
  }
  // The unfused sequence, in the order the model ran it before the epilogues existed.
  void Linear(int m, int n, int k, CAct a, CAct w, CAct bias, Act out, Act pre_gelu) override {
    float* y = pre_gelu.p != nullptr ? F(pre_gelu) : F(out);
    kernels::Gemm(false, false, m, n, k, 1, F(a), F(w), 0, y);
    AddBias({y}, bias, m, n);
    if (pre_gelu.p != nullptr) kernels::GeluForward(y, static_cast<size_t>(m) * n, F(out));
  }
  void LinearGeluBackward(int m, int n, int k, CAct dy, CAct w, CAct pre_gelu, Act dpre,
                          float* dbias) override {
    const size_t total = static_cast<size_t>(m) * n;
    std::vector<float> dg(total, 0.0f);
    kernels::Gemm(false, true, m, n, k, 1, F(dy), F(w), 0, dg.data());
    std::fill(F(dpre), F(dpre) + total, 0.0f);
    kernels::GeluBackward(dg.data(), F(pre_gelu), total, F(dpre));
    ColumnSum(dpre, m, n, dbias);
  }

  void AddBias(Act x, CAct bias, int n, int c) override {
    float* xp = F(x);
    const float* bp = F(bias);
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < c; ++j) xp[static_cast<size_t>(i) * c + j] += bp[j];
    }
  }
  void ColumnSum(CAct x, int n, int c, float* out) override {
    const float* xp = F(x);
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < c; ++j) out[j] += xp[static_cast<size_t>(i) * c + j];
    }
  }
  void Add(Act y, CAct x, size_t n) override {
    float* yp = F(y);
    const float* xp = F(x);
    for (size_t i = 0; i < n; ++i) yp[i] += xp[i];
  }
  void EmbeddingForward(const int32_t* tokens, int n, int t, CAct wte, int vocab_start, int rows,
                        CAct wpe, int c, Act out) override {
    kernels::EmbeddingForward(tokens, n, t, F(wte), vocab_start, rows, F(wpe), c, F(out));
  }
  void EmbeddingBackward(const int32_t* tokens, int n, int t, CAct dout, int vocab_start, int rows,
                         int c, float* dwte, float* dwpe) override {
    kernels::EmbeddingBackward(tokens, n, t, F(dout), vocab_start, rows, c, dwte, dwpe);
  }
  void AddPositions(Act x, CAct wpe, int n, int t, int c) override {
    float* xp = F(x);
    const float* w = F(wpe);
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < c; ++j) xp[static_cast<size_t>(i) * c + j] += w[(i % t) * c + j];
    }
  }
  void LayerNormForward(CAct x, CAct gamma, CAct beta, int n, int c, Act out, float* mean,
                        float* rstd) override {
    kernels::LayerNormForward(F(x), F(gamma), F(beta), n, c, F(out), mean, rstd);
  }
  void ResidualLayerNormForward(Act x, CAct delta, CAct bias, CAct gamma, CAct beta, int n, int c,
                                Act out, float* mean, float* rstd) override {
    Add(x, delta, static_cast<size_t>(n) * c);
    if (bias.p != nullptr) AddBias(x, bias, n, c);
    LayerNormForward(x, gamma, beta, n, c, out, mean, rstd);
  }
  void LayerNormBackward(CAct dout, CAct x, CAct gamma, const float* mean, const float* rstd, int n,
                         int c, Act dx, float* dgamma, float* dbeta) override {
    kernels::LayerNormBackward(F(dout), F(x), F(gamma), mean, rstd, n, c, F(dx), dgamma, dbeta);
  }
  void AttentionForward(CAct qkv, int b, int t, int h, int d, Act out, Act att) override {
    kernels::AttentionForward(F(qkv), b, t, h, d, F(out), F(att));
  }
  void AttentionBackward(CAct dout, CAct qkv, CAct att, int b, int t, int h, int d,
                         Act dqkv) override {
    kernels::AttentionBackward(F(dout), F(qkv), F(att), b, t, h, d, F(dqkv));
  }

  // The reference's two passes (RowMaxSumExp, then the target's logit): the CPU path stays the
  // reference bit for bit; the fusion is the CUDA backend's.
  void CrossEntropyForward(CAct logits, const int32_t* targets, int rows, int cols, int vocab_start,
                           float* max, float* sumexp, float* target_logit) override {
    const float* l = F(logits);
    kernels::RowMaxSumExp(l, rows, cols, max, sumexp);
    for (int i = 0; i < rows; ++i) {
      const int col = targets[i] - vocab_start;
      target_logit[i] = col >= 0 && col < cols ? l[static_cast<size_t>(i) * cols + col] : 0.0f;
    }
  }
  void RescaleSumExp(float* sumexp, float* max, const float* gmax, int rows) override {
    for (int i = 0; i < rows; ++i) {
      sumexp[i] *= std::exp(max[i] - gmax[i]);
      max[i] = gmax[i];
    }
  }
  void AddLoss(const float* sumexp, const float* max, const float* target_logit, int rows,
               double* host_sum) override {
    for (int i = 0; i < rows; ++i) *host_sum += std::log(sumexp[i]) + max[i] - target_logit[i];
  }
  // cpu.h's CrossEntropyBackward adds into a zeroed gradient; `0.0f +` keeps its rounding exactly.
  void CrossEntropyBackward(Act logits, const int32_t* targets, const float* max,
                            const float* sumexp, int rows, int cols, int vocab_start,
                            float scale) override {
    float* l = F(logits);
    for (int r = 0; r < rows; ++r) {
      float* row = l + static_cast<size_t>(r) * cols;
      for (int j = 0; j < cols; ++j) {
        const float p = std::exp(row[j] - max[r]) / sumexp[r];
        row[j] = 0.0f + scale * (p - (targets[r] == vocab_start + j ? 1.0f : 0.0f));
      }
    }
  }
  void AdamWUpdate(float* param, const float* grad, float* m, float* v, size_t n, const AdamW& opt,
                   int64_t t, bool decay) override {
    kernels::AdamWUpdate(param, grad, m, v, n, opt, t, decay);
  }

 private:
  std::string error_;
};

}  // namespace

std::unique_ptr<Kernels> CreateCpuKernels() { return std::make_unique<CpuKernels>(); }

}  // namespace megascope::kernels
