// The compute backend of the training runtime, one interface for CPU and CUDA (DESIGN.md section 3:
// the backend is chosen in one place, `CreateKernels`, and the model never asks which it has).
//
// Every pointer a method takes lives in the backend's memory (`Allocate`d here: host memory on CPU,
// device memory on CUDA) unless its name says `host`. Shapes and semantics are those of the CPU
// reference functions in cpu.h; backward passes accumulate (+=) into gradients. Work may run
// asynchronously (CUDA: in stream order on the backend's stream); `Download` and `Synchronize` wait
// for it. Errors are sticky, as CUDA's are: the first failed call is kept, later calls do nothing,
// and `Synchronize` (or `error`) reports it with the call, the backend's message and file:line.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "megascope/kernels/cpu.h"

namespace megascope::kernels {

enum class Backend { kCpu, kCuda };
// "cpu" or "cuda" (the spelling of --device).
const char* BackendName(Backend b);
// Parses --device; false when `name` is neither.
bool ParseBackend(const std::string& name, Backend* out);

class Kernels {
 public:
  virtual ~Kernels() = default;
  virtual Backend backend() const = 0;
  // What runs the work, for logs and reports: "cpu (OpenBLAS, 1 thread)", "NVIDIA H100 ... sm_90".
  virtual std::string device_name() const = 0;
  // The stream the work runs on in order (a cudaStream_t), for timing it; nullptr on CPU.
  virtual void* stream() const { return nullptr; }

  // ---- memory
  virtual void* Allocate(size_t bytes) = 0;  // zero-filled; nullptr (and the error set) on failure
  virtual void Free(void* p) = 0;
  // Host memory the backend copies fastest (CUDA: pinned), for staging; zero-filled.
  virtual void* AllocateHost(size_t bytes) = 0;
  virtual void FreeHost(void* p) = 0;
  // Whether p is the backend's memory rather than the host's (CPU: never).
  virtual bool IsDevicePointer(const void* p) const = 0;
  virtual void Upload(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void Download(void* host_dst, const void* src, size_t bytes) = 0;  // waits for the data
  virtual void Copy(void* dst, const void* src, size_t bytes) = 0;
  virtual void Fill(float* x, size_t n, float value) = 0;
  // Waits for the work issued so far; returns the first error ("" when none).
  virtual std::string Synchronize() = 0;
  virtual std::string error() const = 0;

  // ---- dense algebra
  // C[M,N] = alpha * op(A) op(B) + beta * C, row-major, op(X) = X or X^T.
  virtual void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                    const float* b, float beta, float* c) = 0;
  virtual void AddBias(float* x, const float* bias, int n, int c) = 0;   // x[i,:] += bias
  virtual void ColumnSum(const float* x, int n, int c, float* out) = 0;  // out += sum_i x[i,:]
  virtual void Add(float* y, const float* x, size_t n) = 0;              // y += x
  virtual void Scale(float* x, size_t n, float s) = 0;                   // x *= s
  // The sum of x[i]^2 over the ranges [offset, offset + size) of x (the runtime's gradient norm
  // over the tensors this rank counts); on CPU accumulated in float, in order.
  virtual float SumSquares(const float* x,
                           const std::vector<std::pair<size_t, size_t>>& ranges) = 0;

  // ---- the transformer's ops (cpu.h gives each one's reference semantics)
  virtual void EmbeddingForward(const int32_t* tokens, int n, int t, const float* wte,
                                int vocab_start, int rows, const float* wpe, int c, float* out) = 0;
  virtual void EmbeddingBackward(const int32_t* tokens, int n, int t, const float* dout,
                                 int vocab_start, int rows, int c, float* dwte, float* dwpe) = 0;
  // x[i,:] += wpe[i % t, :]
  virtual void AddPositions(float* x, const float* wpe, int n, int t, int c) = 0;
  virtual void LayerNormForward(const float* x, const float* gamma, const float* beta, int n, int c,
                                float* out, float* mean, float* rstd) = 0;
  virtual void LayerNormBackward(const float* dout, const float* x, const float* gamma,
                                 const float* mean, const float* rstd, int n, int c, float* dx,
                                 float* dgamma, float* dbeta) = 0;
  virtual void GeluForward(const float* x, size_t n, float* out) = 0;
  virtual void GeluBackward(const float* dout, const float* x, size_t n, float* dx) = 0;
  virtual void AttentionForward(const float* qkv, int b, int t, int h, int d, float* out,
                                float* att) = 0;
  virtual void AttentionBackward(const float* dout, const float* qkv, const float* att, int b,
                                 int t, int h, int d, float* dqkv) = 0;

  // ---- vocab-parallel cross-entropy
  virtual void RowMaxSumExp(const float* x, int rows, int cols, float* max, float* sumexp) = 0;
  // target_logit[i] = logits[i, targets[i] - vocab_start] when this shard owns it, else 0.
  virtual void TargetLogits(const float* logits, const int32_t* targets, int rows, int cols,
                            int vocab_start, float* target_logit) = 0;
  // Moves a shard's sum of exponentials onto the global max: sumexp[i] *= exp(max[i] - gmax[i]),
  // then max = gmax.
  virtual void RescaleSumExp(float* sumexp, float* max, const float* gmax, int rows) = 0;
  // Adds log(sumexp) + max - target_logit of every row to *host_sum (the loss summed over a
  // step's microbatches; on CPU row by row in double, as the reference does).
  virtual void AddLoss(const float* sumexp, const float* max, const float* target_logit, int rows,
                       double* host_sum) = 0;
  virtual void CrossEntropyBackward(const float* logits, const int32_t* targets, const float* max,
                                    const float* sumexp, int rows, int cols, int vocab_start,
                                    float scale, float* dlogits) = 0;

  // ---- optimizer (fp32 master weights and moments)
  virtual void AdamWUpdate(float* param, const float* grad, float* m, float* v, size_t n,
                           const AdamW& opt, int64_t t, bool decay) = 0;
};

// The backend's memory for `n` values of T, freed with it. Move-only.
template <typename T>
class Buffer {
 public:
  Buffer() = default;
  Buffer(Kernels* k, size_t n)
      : k_(k), n_(n), p_(n ? static_cast<T*>(k->Allocate(n * sizeof(T))) : nullptr) {}
  Buffer(Buffer&& o) noexcept : k_(o.k_), n_(o.n_), p_(o.p_) { o.p_ = nullptr, o.n_ = 0; }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      Release();
      k_ = o.k_, n_ = o.n_, p_ = o.p_;
      o.p_ = nullptr, o.n_ = 0;
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { Release(); }

  T* data() { return p_; }
  const T* data() const { return p_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }

 private:
  void Release() {
    if (p_ != nullptr) k_->Free(p_);
    p_ = nullptr;
  }
  Kernels* k_ = nullptr;
  size_t n_ = 0;
  T* p_ = nullptr;
};

std::unique_ptr<Kernels> CreateCpuKernels();
// The one place a backend is chosen. CUDA: `device` is the CUDA device ordinal; a build without
// CUDA, or a machine without a usable GPU, gives nullptr and says why in *error.
std::unique_ptr<Kernels> CreateKernels(Backend backend, int device, std::string* error);
// Whether this build has the CUDA backend compiled in.
bool CudaCompiledIn();

}  // namespace megascope::kernels
