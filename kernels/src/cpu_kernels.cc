// The CPU backend: host memory, the reference functions of cpu.h, synchronous.
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "megascope/kernels/kernels.h"

namespace megascope::kernels {

namespace {

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

  void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
            const float* b, float beta, float* c) override {
    kernels::Gemm(trans_a, trans_b, m, n, k, alpha, a, b, beta, c);
  }
  void AddBias(float* x, const float* bias, int n, int c) override {
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < c; ++j) x[static_cast<size_t>(i) * c + j] += bias[j];
    }
  }
  void ColumnSum(const float* x, int n, int c, float* out) override {
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < c; ++j) out[j] += x[static_cast<size_t>(i) * c + j];
    }
  }
  void Add(float* y, const float* x, size_t n) override {
    for (size_t i = 0; i < n; ++i) y[i] += x[i];
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

  void EmbeddingForward(const int32_t* tokens, int n, int t, const float* wte, int vocab_start,
                        int rows, const float* wpe, int c, float* out) override {
    kernels::EmbeddingForward(tokens, n, t, wte, vocab_start, rows, wpe, c, out);
  }
  void EmbeddingBackward(const int32_t* tokens, int n, int t, const float* dout, int vocab_start,
                         int rows, int c, float* dwte, float* dwpe) override {
    kernels::EmbeddingBackward(tokens, n, t, dout, vocab_start, rows, c, dwte, dwpe);
  }
  void AddPositions(float* x, const float* wpe, int n, int t, int c) override {
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < c; ++j) x[static_cast<size_t>(i) * c + j] += wpe[(i % t) * c + j];
    }
  }
  void LayerNormForward(const float* x, const float* gamma, const float* beta, int n, int c,
                        float* out, float* mean, float* rstd) override {
    kernels::LayerNormForward(x, gamma, beta, n, c, out, mean, rstd);
  }
  void LayerNormBackward(const float* dout, const float* x, const float* gamma, const float* mean,
                         const float* rstd, int n, int c, float* dx, float* dgamma,
                         float* dbeta) override {
    kernels::LayerNormBackward(dout, x, gamma, mean, rstd, n, c, dx, dgamma, dbeta);
  }
  void GeluForward(const float* x, size_t n, float* out) override {
    kernels::GeluForward(x, n, out);
  }
  void GeluBackward(const float* dout, const float* x, size_t n, float* dx) override {
    kernels::GeluBackward(dout, x, n, dx);
  }
  void AttentionForward(const float* qkv, int b, int t, int h, int d, float* out,
                        float* att) override {
    kernels::AttentionForward(qkv, b, t, h, d, out, att);
  }
  void AttentionBackward(const float* dout, const float* qkv, const float* att, int b, int t, int h,
                         int d, float* dqkv) override {
    kernels::AttentionBackward(dout, qkv, att, b, t, h, d, dqkv);
  }

  void RowMaxSumExp(const float* x, int rows, int cols, float* max, float* sumexp) override {
    kernels::RowMaxSumExp(x, rows, cols, max, sumexp);
  }
  void TargetLogits(const float* logits, const int32_t* targets, int rows, int cols,
                    int vocab_start, float* target_logit) override {
    for (int i = 0; i < rows; ++i) {
      const int col = targets[i] - vocab_start;
      target_logit[i] = col >= 0 && col < cols ? logits[static_cast<size_t>(i) * cols + col] : 0.0f;
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
  void CrossEntropyBackward(const float* logits, const int32_t* targets, const float* max,
                            const float* sumexp, int rows, int cols, int vocab_start, float scale,
                            float* dlogits) override {
    kernels::CrossEntropyBackward(logits, targets, max, sumexp, rows, cols, vocab_start, scale,
                                  dlogits);
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
