// The CUDA backend: device memory from the stream-ordered pool (cudaMallocAsync, kept cached so a
// step's activations cost no driver call after the first step), every kernel and copy on one
// non-blocking stream, activations in bf16, GEMMs through cuBLASLt (gemm.h) with the linear
// layers' bias and GELU in their epilogues, attention as two batched GEMMs around a fused causal
// softmax.
#include "cuda_kernels.h"

#include <cmath>
#include <cstdint>
#include <cstring>

#include "gemm.h"
#include "ops.h"

namespace megascope::kernels {
namespace {

using cuda::StickyError;

cuda::bf16* B(Act a) { return static_cast<cuda::bf16*>(a.p); }
const cuda::bf16* B(CAct a) { return static_cast<const cuda::bf16*>(a.p); }
constexpr cuda::LtGemm::Types kBf16{CUDA_R_16BF, CUDA_R_16BF};

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
    (void)cudaGetLastError();  // an error left by code before this backend is not its own
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

  Storage storage() const override { return Storage::kBF16; }
  void ToAct(Act dst, const float* src, size_t n) override {
    Launch([&] { cuda::ToBf16(stream_, src, n, B(dst)); });
  }
  void FromAct(float* dst, CAct src, size_t n) override {
    Launch([&] { cuda::ToFloat(stream_, B(src), n, dst); });
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

  void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, CAct a, CAct b,
            float beta, Act c) override {
    gemm_->Run(trans_a, trans_b, m, n, k, alpha, a.p, 0, b.p, 0, beta, c.p, 0, 1, kBf16);
  }
  void GemmToFloat(bool trans_a, bool trans_b, int m, int n, int k, float alpha, CAct a, CAct b,
                   float beta, float* c) override {
    gemm_->Run(trans_a, trans_b, m, n, k, alpha, a.p, 0, b.p, 0, beta, c, 0, 1,
               {CUDA_R_16BF, CUDA_R_32F});
  }
  // cuBLASLt's BIAS / GELU_AUX_BIAS epilogue; the unfused ops where it has none (GELU's aux needs
  // a leading dimension divisible by 8).
  void Linear(int m, int n, int k, CAct a, CAct w, CAct bias, Act out, Act pre_gelu) override {
    void* b = const_cast<void*>(bias.p);
    if (pre_gelu.p == nullptr) {
      if (gemm_->Run(false, false, m, n, k, 1, a.p, 0, w.p, 0, 0, out.p, 0, 1, kBf16,
                     cuda::Epilogue::kBias, b))
        return;
      gemm_->Run(false, false, m, n, k, 1, a.p, 0, w.p, 0, 0, out.p, 0, 1, kBf16);
      AddBias(out, bias, m, n);
      return;
    }
    if (n % 8 == 0 && gemm_->Run(false, false, m, n, k, 1, a.p, 0, w.p, 0, 0, out.p, 0, 1, kBf16,
                                 cuda::Epilogue::kGeluAuxBias, b, pre_gelu.p))
      return;
    gemm_->Run(false, false, m, n, k, 1, a.p, 0, w.p, 0, 0, pre_gelu.p, 0, 1, kBf16);
    AddBias(pre_gelu, bias, m, n);
    Launch(
        [&] { cuda::GeluForward(stream_, B(CAct(pre_gelu)), static_cast<size_t>(m) * n, B(out)); });
  }
  // cuBLASLt's DGELU_BGRAD writes the bias gradient (in bf16) into scratch; it is added to the
  // fp32 gradient, which accumulates over microbatches.
  void LinearGeluBackward(int m, int n, int k, CAct dy, CAct w, CAct pre_gelu, Act dpre,
                          float* dbias) override {
    auto* db = static_cast<cuda::bf16*>(Scratch(static_cast<size_t>(n) * sizeof(cuda::bf16)));
    if (db == nullptr) return;
    if (n % 8 == 0 && gemm_->Run(false, true, m, n, k, 1, dy.p, 0, w.p, 0, 0, dpre.p, 0, 1, kBf16,
                                 cuda::Epilogue::kDGeluBGrad, db, const_cast<void*>(pre_gelu.p))) {
      Launch([&] { cuda::AddToFloat(stream_, dbias, db, n); });
      return;
    }
    gemm_->Run(false, true, m, n, k, 1, dy.p, 0, w.p, 0, 0, dpre.p, 0, 1, kBf16);
    const size_t total = static_cast<size_t>(m) * n;
    Launch([&] { cuda::GeluBackward(stream_, B(CAct(dpre)), B(pre_gelu), total, B(dpre)); });
    ColumnSum(dpre, m, n, dbias);
  }

  void AddBias(Act x, CAct bias, int n, int c) override {
    Launch([&] { cuda::AddBias(stream_, B(x), B(bias), n, c); });
  }
  void ColumnSum(CAct x, int n, int c, float* out) override {
    Launch([&] { cuda::ColumnSum(stream_, B(x), n, c, out); });
  }
  void Add(Act y, CAct x, size_t n) override {
    Launch([&] { cuda::Add(stream_, B(y), B(x), n); });
  }
  void EmbeddingForward(const int32_t* tokens, int n, int t, CAct wte, int vocab_start, int rows,
                        CAct wpe, int c, Act out) override {
    Launch([&] {
      cuda::EmbeddingForward(stream_, tokens, n, t, B(wte), vocab_start, rows, B(wpe), c, B(out));
    });
  }
  void EmbeddingBackward(const int32_t* tokens, int n, int t, CAct dout, int vocab_start, int rows,
                         int c, float* dwte, float* dwpe) override {
    Launch([&] {
      cuda::EmbeddingBackward(stream_, tokens, n, t, B(dout), vocab_start, rows, c, dwte, dwpe);
    });
  }
  void AddPositions(Act x, CAct wpe, int n, int t, int c) override {
    Launch([&] { cuda::AddPositions(stream_, B(x), B(wpe), n, t, c); });
  }
  void LayerNormForward(CAct x, CAct gamma, CAct beta, int n, int c, Act out, float* mean,
                        float* rstd) override {
    Launch([&] {
      cuda::LayerNormForward(stream_, B(x), B(gamma), B(beta), n, c, B(out), mean, rstd);
    });
  }
  void ResidualLayerNormForward(Act x, CAct delta, CAct bias, CAct gamma, CAct beta, int n, int c,
                                Act out, float* mean, float* rstd) override {
    Launch([&] {
      cuda::ResidualLayerNormForward(stream_, B(x), B(delta), B(bias), B(gamma), B(beta), n, c,
                                     B(out), mean, rstd);
    });
  }
  void LayerNormBackward(CAct dout, CAct x, CAct gamma, const float* mean, const float* rstd, int n,
                         int c, Act dx, float* dgamma, float* dbeta) override {
    Launch([&] {
      cuda::LayerNormBackward(stream_, B(dout), B(x), B(gamma), mean, rstd, n, c, B(dx), dgamma,
                              dbeta);
    });
  }

  // S = scale * Q K^T per (sequence, head), causal softmax in place into att, Y = att V.
  void AttentionForward(CAct qkv, int b, int t, int h, int d, Act out, Act att) override {
    const size_t hs = static_cast<size_t>(b) * h * t * d;
    auto* q = static_cast<cuda::bf16*>(Scratch(4 * hs * sizeof(cuda::bf16)));
    if (q == nullptr) return;
    cuda::bf16 *k = q + hs, *v = k + hs, *y = v + hs;
    const int64_t td = int64_t{t} * d, tt = int64_t{t} * t;
    const int batch = b * h;
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    Launch([&] { cuda::SplitHeads(stream_, B(qkv), b, t, h, d, q, k, v); });
    gemm_->Run(false, true, t, t, d, scale, q, td, k, td, 0, att.p, tt, batch, kBf16);
    Launch([&] { cuda::CausalSoftmax(stream_, B(att), batch * t, t); });
    gemm_->Run(false, false, t, d, t, 1, att.p, tt, v, td, 0, y, td, batch, kBf16);
    Launch([&] { cuda::MergeHeads(stream_, y, b, t, h, d, B(out)); });
  }
  void AttentionBackward(CAct dout, CAct qkv, CAct att, int b, int t, int h, int d,
                         Act dqkv) override {
    const size_t hs = static_cast<size_t>(b) * h * t * d;
    const int64_t td = int64_t{t} * d, tt = int64_t{t} * t;
    const int batch = b * h;
    auto* q = static_cast<cuda::bf16*>(
        Scratch((7 * hs + static_cast<size_t>(batch) * tt) * sizeof(cuda::bf16)));
    if (q == nullptr) return;
    cuda::bf16 *k = q + hs, *v = k + hs, *dy = v + hs, *dq = dy + hs, *dk = dq + hs, *dv = dk + hs;
    cuda::bf16* datt = dv + hs;
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    Launch([&] { cuda::SplitHeads(stream_, B(qkv), b, t, h, d, q, k, v); });
    Launch([&] { cuda::SplitHeadGrad(stream_, B(dout), b, t, h, d, dy); });
    gemm_->Run(false, true, t, t, d, 1, dy, td, v, td, 0, datt, tt, batch, kBf16);    // dY V^T
    gemm_->Run(true, false, t, d, t, 1, att.p, tt, dy, td, 0, dv, td, batch, kBf16);  // att^T dY
    Launch([&] { cuda::CausalSoftmaxBackward(stream_, B(att), datt, batch * t, t, scale); });
    gemm_->Run(false, false, t, d, t, 1, datt, tt, k, td, 0, dq, td, batch, kBf16);  // dS K
    gemm_->Run(true, false, t, d, t, 1, datt, tt, q, td, 0, dk, td, batch, kBf16);   // dS^T Q
    Launch([&] { cuda::AddMergedHeadGrads(stream_, dq, dk, dv, b, t, h, d, B(dqkv)); });
  }

  void CrossEntropyForward(CAct logits, const int32_t* targets, int rows, int cols, int vocab_start,
                           float* max, float* sumexp, float* target_logit) override {
    Launch([&] {
      cuda::CrossEntropyForward(stream_, B(logits), targets, rows, cols, vocab_start, max, sumexp,
                                target_logit);
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
  void CrossEntropyBackward(Act logits, const int32_t* targets, const float* max,
                            const float* sumexp, int rows, int cols, int vocab_start,
                            float scale) override {
    Launch([&] {
      cuda::CrossEntropyBackward(stream_, B(logits), targets, max, sumexp, rows, cols, vocab_start,
                                 scale);
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
  void* Scratch(size_t bytes) {
    if (!err_.ok()) return nullptr;
    if (bytes > scratch_bytes_) {
      if (scratch_ != nullptr) MEGASCOPE_CUDA_TRY(err_, cudaFreeAsync(scratch_, stream_));
      scratch_ = nullptr;
      scratch_bytes_ = 0;
      if (!MEGASCOPE_CUDA_TRY(err_, cudaMallocAsync(&scratch_, bytes, stream_))) return nullptr;
      scratch_bytes_ = bytes;
    }
    return scratch_;
  }

  StickyError err_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<cuda::LtGemm> gemm_;
  double* acc_ = nullptr;  // device accumulator of reductions read back by the host
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  std::string name_;
};

}  // namespace

std::unique_ptr<Kernels> CreateCudaKernels(int device, std::string* error) {
  auto k = std::make_unique<CudaKernels>();
  if (!k->Init(device, error)) return nullptr;
  return k;
}

}  // namespace megascope::kernels
