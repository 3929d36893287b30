// The compute backend of the training runtime, one interface for CPU and CUDA (docs/architecture.md
// section 3: the backend is chosen in one place, `CreateKernels`, and the model never asks which it
// has).
//
// Every pointer a method takes lives in the backend's memory (`Allocate`d here: host memory on CPU,
// device memory on CUDA) unless its name says `host`. Shapes and semantics are those of the CPU
// reference functions in cpu.h; backward passes accumulate (+=) into gradients. Work may run
// asynchronously (CUDA: in stream order on the backend's stream); `Download` and `Synchronize` wait
// for it. Errors are sticky, as CUDA's are: the first failed call is kept, later calls do nothing,
// and `Synchronize` (or `error`) reports it with the call, the backend's message and file:line.
//
// Two kinds of numbers, two pointer types. fp32 (`float*`): master parameters, gradients, optimizer
// moments, per-row statistics (layer norm's mean and rstd, the loss's max and sum of exponentials).
// Activations (`Act` / `CAct`): what flows between the ops, the compute copy of the parameters the
// forward and backward passes read, and the gradients of activations, stored in the backend's
// `storage()` type: fp32 on CPU (so the CPU path is the reference, bit for bit), bf16 on CUDA
// (mixed precision as Megatron trains: bf16 in memory and into the tensor cores, fp32 arithmetic
// inside every kernel, fp32 accumulation of the weight gradients and fp32 master weights). The two
// are distinct types so that one cannot be passed for the other.
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
// The storage type of activations.
enum class Storage { kF32, kBF16 };
inline size_t StorageBytes(Storage s) { return s == Storage::kBF16 ? 2 : 4; }

// Activations in the backend's storage type (see above). An Act converts to a CAct.
struct CAct {
  const void* p = nullptr;
};
struct Act {
  void* p = nullptr;
  operator CAct() const { return {p}; }  // NOLINT(google-explicit-constructor): as T* -> const T*
};
// The element `i` places after `a` (in the backend's storage type `s`).
inline Act Offset(Act a, size_t i, Storage s) {
  return {static_cast<char*>(a.p) + i * StorageBytes(s)};
}
inline CAct Offset(CAct a, size_t i, Storage s) {
  return {static_cast<const char*>(a.p) + i * StorageBytes(s)};
}
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

  // ---- storage
  virtual Storage storage() const = 0;
  // dst = src in the storage type (CPU: a copy; CUDA: rounded to bf16), and back to fp32.
  virtual void ToAct(Act dst, const float* src, size_t n) = 0;
  virtual void FromAct(float* dst, CAct src, size_t n) = 0;

  // ---- dense algebra (fp32)
  virtual void Scale(float* x, size_t n, float s) = 0;  // x *= s
  // The sum of x[i]^2 over the ranges [offset, offset + size) of x (the runtime's gradient norm
  // over the tensors this rank counts); on CPU accumulated in float, in order.
  virtual float SumSquares(const float* x,
                           const std::vector<std::pair<size_t, size_t>>& ranges) = 0;

  // ---- GEMMs over activations: C[M,N] = alpha * op(A) op(B) + beta * C, row-major, op(X) = X or
  // X^T; products of the storage type accumulated in fp32.
  virtual void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, CAct a, CAct b,
                    float beta, Act c) = 0;
  // The same with an fp32 C (weight gradients accumulate here with beta = 1).
  virtual void GemmToFloat(bool trans_a, bool trans_b, int m, int n, int k, float alpha, CAct a,
                           CAct b, float beta, float* c) = 0;
  // A linear layer's forward, the bias (and GELU) fused into the GEMM's epilogue where the backend
  // can (cuBLASLt's BIAS and GELU_AUX_BIAS): out[M,N] = a[M,K] w[K,N] + bias[N]; with `pre_gelu`
  // (not null), pre_gelu = that sum and out = GELU(pre_gelu) (the tanh approximation of cpu.h).
  virtual void Linear(int m, int n, int k, CAct a, CAct w, CAct bias, Act out, Act pre_gelu) = 0;
  // The backward of out = GELU(pre_gelu) after `Linear` fed by a GEMM: dpre[M,N] = (dy[M,K]
  // w[N,K]^T) * GELU'(pre_gelu), and dbias[N] += sum over rows of dpre (cuBLASLt's DGELU_BGRAD).
  virtual void LinearGeluBackward(int m, int n, int k, CAct dy, CAct w, CAct pre_gelu, Act dpre,
                                  float* dbias) = 0;

  // ---- elementwise and row-wise ops over activations
  virtual void AddBias(Act x, CAct bias, int n, int c) = 0;      // x[i,:] += bias
  virtual void ColumnSum(CAct x, int n, int c, float* out) = 0;  // out += sum_i x[i,:]
  virtual void Add(Act y, CAct x, size_t n) = 0;                 // y += x
  virtual void EmbeddingForward(const int32_t* tokens, int n, int t, CAct wte, int vocab_start,
                                int rows, CAct wpe, int c, Act out) = 0;
  virtual void EmbeddingBackward(const int32_t* tokens, int n, int t, CAct dout, int vocab_start,
                                 int rows, int c, float* dwte, float* dwpe) = 0;
  // x[i,:] += wpe[i % t, :]
  virtual void AddPositions(Act x, CAct wpe, int n, int t, int c) = 0;
  virtual void LayerNormForward(CAct x, CAct gamma, CAct beta, int n, int c, Act out, float* mean,
                                float* rstd) = 0;
  // Layer norm fused with the residual add before it: x[i,:] += delta[i,:] + bias (bias may be
  // null), then out = LayerNorm(x), in one pass over x (CPU: Add, AddBias, LayerNormForward).
  virtual void ResidualLayerNormForward(Act x, CAct delta, CAct bias, CAct gamma, CAct beta, int n,
                                        int c, Act out, float* mean, float* rstd) = 0;
  virtual void LayerNormBackward(CAct dout, CAct x, CAct gamma, const float* mean,
                                 const float* rstd, int n, int c, Act dx, float* dgamma,
                                 float* dbeta) = 0;
  virtual void AttentionForward(CAct qkv, int b, int t, int h, int d, Act out, Act att) = 0;
  virtual void AttentionBackward(CAct dout, CAct qkv, CAct att, int b, int t, int h, int d,
                                 Act dqkv) = 0;

  // ---- vocab-parallel cross-entropy, fused with the classifier's softmax: one pass over a row of
  // logits gives its max, its sum of exponentials (online, as flash attention does) and the
  // target's logit (logits[i, targets[i] - vocab_start] when this shard owns it, else 0).
  virtual void CrossEntropyForward(CAct logits, const int32_t* targets, int rows, int cols,
                                   int vocab_start, float* max, float* sumexp,
                                   float* target_logit) = 0;
  // Moves a shard's sum of exponentials onto the global max: sumexp[i] *= exp(max[i] - gmax[i]),
  // then max = gmax.
  virtual void RescaleSumExp(float* sumexp, float* max, const float* gmax, int rows) = 0;
  // Adds log(sumexp) + max - target_logit of every row to *host_sum (the loss summed over a
  // step's microbatches; on CPU row by row in double, as the reference does).
  virtual void AddLoss(const float* sumexp, const float* max, const float* target_logit, int rows,
                       double* host_sum) = 0;
  // In place: logits becomes d(loss)/d(logits) * scale (softmax minus the target's one-hot).
  virtual void CrossEntropyBackward(Act logits, const int32_t* targets, const float* max,
                                    const float* sumexp, int rows, int cols, int vocab_start,
                                    float scale) = 0;

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

// The backend's memory for `n` activations in its storage type, freed with it. Move-only.
class ActBuffer {
 public:
  ActBuffer() = default;
  ActBuffer(Kernels* k, size_t n) : n_(n), mem_(k, n * StorageBytes(k->storage())) {}
  Act act() { return {mem_.data()}; }
  CAct cact() const { return {mem_.data()}; }
  size_t size() const { return n_; }
  size_t bytes() const { return mem_.size(); }

 private:
  size_t n_ = 0;
  Buffer<unsigned char> mem_;
};

std::unique_ptr<Kernels> CreateCpuKernels();
// The CPU backend with activations stored in `storage`: kF32 is CreateCpuKernels(); kBF16 rounds
// every activation it stores to bf16 as the CUDA backend does (src/bf16_storage.cc: for testing
// the mixed-precision path without a GPU, not for training).
std::unique_ptr<Kernels> CreateCpuKernels(Storage storage);
// The one place a backend is chosen. CUDA: `device` is the CUDA device ordinal; a build without
// CUDA, or a machine without a usable GPU, gives nullptr and says why in *error.
std::unique_ptr<Kernels> CreateKernels(Backend backend, int device, std::string* error);
// Whether this build has the CUDA backend compiled in.
bool CudaCompiledIn();

}  // namespace megascope::kernels
