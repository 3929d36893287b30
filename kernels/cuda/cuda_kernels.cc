// The CUDA backend: device memory from the stream-ordered pool (cudaMallocAsync, kept cached so a
// step's activations cost no driver call after the first step), every kernel and copy on one
// non-blocking stream, GEMMs through cuBLASLt (gemm.h), attention as two batched GEMMs around a
// fused causal softmax.
#include "cuda_kernels.h"

#include <cmath>
#include <cstdint>
#include <cstring>

#include "gemm.h"
#include "ops.h"

namespace megascope::kernels {
namespace {

using cuda::StickyError;

class CudaKernels final : public Kernels {
 public:
  ~CudaKernels() override {
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    if (scratch_ != nullptr) cudaFree(scratch_);
    if (acc_ != nullptr) cudaFree(acc_);
    gemm_.reset();
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  bool Init(int device, std::string* error) {
    int count = 0;
    if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess || count == 0) {
      *error = e != cudaSuccess ? std::string("no usable CUDA device: cudaGetDeviceCount: ") +
                                      cudaGetErrorString(e)
                                : "no CUDA device on this machine";
      return false;
    }
    if (device < 0 || device >= count) {
      *error = "CUDA device " + std::to_string(device) + " does not exist (" +
               std::to_string(count) + " device(s))";
      return false;
    }
    cudaDeviceProp prop{};
    cudaMemPool_t pool = nullptr;
    const uint64_t keep_all = UINT64_MAX;  // the pool keeps freed memory for the next step
    const bool ok =
        MEGASCOPE_CUDA_TRY(err_, cudaSetDevice(device)) &&
        MEGASCOPE_CUDA_TRY(err_, cudaGetDeviceProperties(&prop, device)) &&
        MEGASCOPE_CUDA_TRY(err_, cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)) &&
        MEGASCOPE_CUDA_TRY(err_, cudaDeviceGetDefaultMemPool(&pool, device)) &&
        MEGASCOPE_CUDA_TRY(err_, cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold,
                                                         const_cast<uint64_t*>(&keep_all))) &&
        MEGASCOPE_CUDA_TRY(err_, cudaMalloc(&acc_, sizeof(double)));
    gemm_ = std::make_unique<cuda::LtGemm>();
    if (!ok || !gemm_->Init(&err_, stream_)) {
      *error = err_.message();
      return false;
    }
    name_ = std::string(prop.name) + " (sm_" + std::to_string(prop.major) +
            std::to_string(prop.minor) + ", " + std::to_string(prop.totalGlobalMem >> 30) +
            " GiB, device " + std::to_string(device) + ")";
    return true;
  }

  Backend backend() const override { return Backend::kCuda; }
  std::string device_name() const override { return name_; }
  void* stream() const override { return stream_; }

  void* Allocate(size_t bytes) override {
    void* p = nullptr;
    if (bytes == 0 || !err_.ok()) return nullptr;
    if (!MEGASCOPE_CUDA_TRY(err_, cudaMallocAsync(&p, bytes, stream_))) return nullptr;
    MEGASCOPE_CUDA_TRY(err_, cudaMemsetAsync(p, 0, bytes, stream_));
    return p;
  }
  void Free(void* p) override {
    if (p != nullptr) MEGASCOPE_CUDA_TRY(err_, cudaFreeAsync(p, stream_));
  }
  void* AllocateHost(size_t bytes) override {
    void* p = nullptr;
    if (bytes == 0 || !MEGASCOPE_CUDA_TRY(err_, cudaMallocHost(&p, bytes))) return nullptr;
    std::memset(p, 0, bytes);
    return p;
  }
  void FreeHost(void* p) override {
    if (p != nullptr) MEGASCOPE_CUDA_TRY(err_, cudaFreeHost(p));
  }
  bool IsDevicePointer(const void* p) const override {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      (void)cudaGetLastError();  // not sticky: an unknown pointer is the host's
      return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
  }
  void Upload(void* dst, const void* host_src, size_t bytes) override {
    if (bytes && err_.ok())
      MEGASCOPE_CUDA_TRY(err_,
                         cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_));
  }
  void Download(void* host_dst, const void* src, size_t bytes) override {
    if (bytes == 0 || !err_.ok()) return;
    MEGASCOPE_CUDA_TRY(err_,
                       cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream_)) &&
        MEGASCOPE_CUDA_TRY(err_, cudaStreamSynchronize(stream_));
  }
  void Copy(void* dst, const void* src, size_t bytes) override {
    if (bytes && err_.ok())
      MEGASCOPE_CUDA_TRY(err_, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  }
  void Fill(float* x, size_t n, float value) override {
    Launch([&] { cuda::Fill(stream_, x, n, value); });
  }
  std::string Synchronize() override {
    if (err_.ok()) MEGASCOPE_CUDA_TRY(err_, cudaStreamSynchronize(stream_));
    return err_.message();
  }
  std::string error() const override { return err_.message(); }

  void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
            const float* b, float beta, float* c) override {
    gemm_->Run(trans_a, trans_b, m, n, k, alpha, a, 0, b, 0, beta, c, 0, 1);
  }
  void AddBias(float* x, const float* bias, int n, int c) override {
    Launch([&] { cuda::AddBias(stream_, x, bias, n, c); });
  }
  void ColumnSum(const float* x, int n, int c, float* out) override {
    Launch([&] { cuda::ColumnSum(stream_, x, n, c, out); });
  }
  void Add(float* y, const float* x, size_t n) override {
    Launch([&] { cuda::Add(stream_, y, x, n); });
  }
  void Scale(float* x, size_t n, float s) override {
    Launch([&] { cuda::Scale(stream_, x, n, s); });
  }
  float SumSquares(const float* x, const std::vector<std::pair<size_t, size_t>>& ranges) override {
    if (!MEGASCOPE_CUDA_TRY(err_, cudaMemsetAsync(acc_, 0, sizeof(double), stream_))) return NAN;
    for (const auto& r : ranges)
      Launch([&] { cuda::SumSquares(stream_, x + r.first, r.second, acc_); });
    double sum = NAN;
    Download(&sum, acc_, sizeof(sum));
    return static_cast<float>(sum);
  }

  void EmbeddingForward(const int32_t* tokens, int n, int t, const float* wte, int vocab_start,
                        int rows, const float* wpe, int c, float* out) override {
    Launch([&] {
      cuda::EmbeddingForward(stream_, tokens, n, t, wte, vocab_start, rows, wpe, c, out);
    });
  }
  void EmbeddingBackward(const int32_t* tokens, int n, int t, const float* dout, int vocab_start,
                         int rows, int c, float* dwte, float* dwpe) override {
    Launch([&] {
      cuda::EmbeddingBackward(stream_, tokens, n, t, dout, vocab_start, rows, c, dwte, dwpe);
    });
  }
  void AddPositions(float* x, const float* wpe, int n, int t, int c) override {
    Launch([&] { cuda::AddPositions(stream_, x, wpe, n, t, c); });
  }
  void LayerNormForward(const float* x, const float* gamma, const float* beta, int n, int c,
                        float* out, float* mean, float* rstd) override {
    Launch([&] { cuda::LayerNormForward(stream_, x, gamma, beta, n, c, out, mean, rstd); });
  }
  void LayerNormBackward(const float* dout, const float* x, const float* gamma, const float* mean,
                         const float* rstd, int n, int c, float* dx, float* dgamma,
                         float* dbeta) override {
    Launch([&] {
      cuda::LayerNormBackward(stream_, dout, x, gamma, mean, rstd, n, c, dx, dgamma, dbeta);
    });
  }
  void GeluForward(const float* x, size_t n, float* out) override {
    Launch([&] { cuda::GeluForward(stream_, x, n, out); });
  }
  void GeluBackward(const float* dout, const float* x, size_t n, float* dx) override {
    Launch([&] { cuda::GeluBackward(stream_, dout, x, n, dx); });
  }

  // S = scale * Q K^T per (sequence, head), causal softmax in place into att, Y = att V.
  void AttentionForward(const float* qkv, int b, int t, int h, int d, float* out,
                        float* att) override {
    const size_t hs = static_cast<size_t>(b) * h * t * d;
    float* q = Scratch(4 * hs);
    if (q == nullptr) return;
    float *k = q + hs, *v = k + hs, *y = v + hs;
    const int64_t td = int64_t{t} * d, tt = int64_t{t} * t;
    const int batch = b * h;
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    Launch([&] { cuda::SplitHeads(stream_, qkv, b, t, h, d, q, k, v); });
    gemm_->Run(false, true, t, t, d, scale, q, td, k, td, 0, att, tt, batch);
    Launch([&] { cuda::CausalSoftmax(stream_, att, batch * t, t); });
    gemm_->Run(false, false, t, d, t, 1, att, tt, v, td, 0, y, td, batch);
    Launch([&] { cuda::MergeHeads(stream_, y, b, t, h, d, out); });
  }
  void AttentionBackward(const float* dout, const float* qkv, const float* att, int b, int t, int h,
                         int d, float* dqkv) override {
    const size_t hs = static_cast<size_t>(b) * h * t * d;
    const int64_t td = int64_t{t} * d, tt = int64_t{t} * t;
    const int batch = b * h;
    float* q = Scratch(7 * hs + static_cast<size_t>(batch) * tt);
    if (q == nullptr) return;
    float *k = q + hs, *v = k + hs, *dy = v + hs, *dq = dy + hs, *dk = dq + hs, *dv = dk + hs;
    float* datt = dv + hs;
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    Launch([&] { cuda::SplitHeads(stream_, qkv, b, t, h, d, q, k, v); });
    Launch([&] { cuda::SplitHeadGrad(stream_, dout, b, t, h, d, dy); });
    gemm_->Run(false, true, t, t, d, 1, dy, td, v, td, 0, datt, tt, batch);  // dY V^T
    gemm_->Run(true, false, t, d, t, 1, att, tt, dy, td, 0, dv, td, batch);  // att^T dY
    Launch([&] { cuda::CausalSoftmaxBackward(stream_, att, datt, batch * t, t, scale); });
    gemm_->Run(false, false, t, d, t, 1, datt, tt, k, td, 0, dq, td, batch);  // dS K
    gemm_->Run(true, false, t, d, t, 1, datt, tt, q, td, 0, dk, td, batch);   // dS^T Q
    Launch([&] { cuda::AddMergedHeadGrads(stream_, dq, dk, dv, b, t, h, d, dqkv); });
  }

  void RowMaxSumExp(const float* x, int rows, int cols, float* max, float* sumexp) override {
    Launch([&] { cuda::RowMaxSumExp(stream_, x, rows, cols, max, sumexp); });
  }
  void TargetLogits(const float* logits, const int32_t* targets, int rows, int cols,
                    int vocab_start, float* target_logit) override {
    Launch([&] {
      cuda::TargetLogits(stream_, logits, targets, rows, cols, vocab_start, target_logit);
    });
  }
  void RescaleSumExp(float* sumexp, float* max, const float* gmax, int rows) override {
    Launch([&] { cuda::RescaleSumExp(stream_, sumexp, max, gmax, rows); });
  }
  void AddLoss(const float* sumexp, const float* max, const float* target_logit, int rows,
               double* host_sum) override {
    if (!MEGASCOPE_CUDA_TRY(err_, cudaMemsetAsync(acc_, 0, sizeof(double), stream_))) return;
    Launch([&] { cuda::LossSum(stream_, sumexp, max, target_logit, rows, acc_); });
    double sum = 0;
    Download(&sum, acc_, sizeof(sum));
    if (err_.ok()) *host_sum += sum;
  }
  void CrossEntropyBackward(const float* logits, const int32_t* targets, const float* max,
                            const float* sumexp, int rows, int cols, int vocab_start, float scale,
                            float* dlogits) override {
    Launch([&] {
      cuda::CrossEntropyBackward(stream_, logits, targets, max, sumexp, rows, cols, vocab_start,
                                 scale, dlogits);
    });
  }
  void AdamWUpdate(float* param, const float* grad, float* m, float* v, size_t n, const AdamW& opt,
                   int64_t t, bool decay) override {
    const float bc1 = 1.0f - std::pow(opt.beta1, static_cast<float>(t));
    const float bc2 = 1.0f - std::pow(opt.beta2, static_cast<float>(t));
    Launch([&] {
      cuda::AdamW(stream_, param, grad, m, v, n, opt.lr, opt.beta1, opt.beta2, opt.eps,
                  decay ? opt.weight_decay : 0.0f, bc1, bc2);
    });
  }

 private:
  // Runs a launcher unless an error is kept, and keeps its launch error.
  template <typename F>
  void Launch(F&& launch) {
    if (!err_.ok()) return;
    launch();
    MEGASCOPE_CUDA_LAUNCHED(err_);
  }
  // Scratch space for one op at a time (stream order makes reuse safe), grown on demand.
  float* Scratch(size_t floats) {
    if (!err_.ok()) return nullptr;
    if (floats > scratch_floats_) {
      if (scratch_ != nullptr) MEGASCOPE_CUDA_TRY(err_, cudaFreeAsync(scratch_, stream_));
      scratch_ = nullptr;
      scratch_floats_ = 0;
      if (!MEGASCOPE_CUDA_TRY(err_, cudaMallocAsync(reinterpret_cast<void**>(&scratch_),
                                                    floats * sizeof(float), stream_)))
        return nullptr;
      scratch_floats_ = floats;
    }
    return scratch_;
  }

  StickyError err_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<cuda::LtGemm> gemm_;
  double* acc_ = nullptr;  // device accumulator of reductions read back by the host
  float* scratch_ = nullptr;
  size_t scratch_floats_ = 0;
  std::string name_;
};

}  // namespace

std::unique_ptr<Kernels> CreateCudaKernels(int device, std::string* error) {
  auto k = std::make_unique<CudaKernels>();
  if (!k->Init(device, error)) return nullptr;
  return k;
}

}  // namespace megascope::kernels
