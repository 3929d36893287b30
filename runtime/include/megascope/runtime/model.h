// One pipeline stage of a GPT-2-style decoder (token + position embeddings, pre-LN blocks, tied LM
// head; optionally MegaScale's parallel block) with Megatron tensor parallelism: column-parallel
// QKV and first MLP GEMM, row-parallel output projections, heads split across tp ranks,
// vocab-parallel embedding and cross-entropy. Parameters are initialised from global tensors seeded
// by name, so every layout starts from the same model. Forward/Backward handle one microbatch each
// and keep its activations until its backward. Compute goes through a kernels::Kernels backend
// (CPU or CUDA); parameters, gradients, activations and the stage's inputs and outputs live in the
// backend's memory, tokens and targets on the host. Activations are kept in the backend's storage
// type (bf16 on CUDA) and the stage's inputs and outputs in fp32, converted at its edges.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "megascope/kernels/kernels.h"
#include "megascope/runtime/comm.h"
#include "megascope/runtime/layout.h"

namespace megascope::runtime {

struct ModelConfig {
  int layers = 4;
  int heads = 4;
  int width = 128;
  int seq = 64;
  int vocab = 256;
  bool parallel_block = false;
  uint64_t seed = 1234;
  // Empty when valid; otherwise what is wrong with this model on this layout.
  std::string Validate(const Layout& layout) const;
  // The whole model's parameters (the embedding tied with the classifier counted once).
  int64_t ParameterCount() const;
};

struct ParamTensor {
  std::string name;
  size_t offset = 0, size = 0;
  bool decay = false;  // weight decay (matrices)
  bool unique = true;  // counted in the global gradient norm on this rank
};

class GptStage {
 public:
  // `kernels`: the backend, which must outlive the stage; nullptr: a CPU backend of its own.
  GptStage(const ModelConfig& cfg, const Layout& layout, int rank, Communicator* comm,
           kernels::Kernels* kernels = nullptr);
  ~GptStage();

  // First stage: tokens [B*T]; other stages: `in` [B*T, C] from the previous stage. Last stage:
  // adds the sum of token losses to *loss_sum; other stages fill `out` [B*T, C].
  Status Forward(int mb, int batch, const int32_t* tokens, const float* in, const int32_t* targets,
                 float* out, double* loss_sum);
  // Last stage: `dout` unused (the loss is the start; `loss_scale` = 1/(global tokens)); other
  // stages: dout [B*T, C]. Non-first stages fill `din` [B*T, C]. Gradients accumulate.
  Status Backward(int mb, const float* dout, float* din, float loss_scale);

  // Flat fp32 parameters (the master weights) and gradients in the backend's memory (`count()`
  // floats each). Whoever takes the parameters to write them (the optimizer, a restore) makes the
  // compute copy stale; the next Forward refreshes it.
  float* params() {
    compute_params_stale_ = true;
    return params_.data();
  }
  float* grads() { return grads_.data(); }
  size_t count() const { return count_; }
  std::vector<float> HostParams() const;
  std::vector<float> HostGrads() const;
  void ZeroGrads();
  kernels::Kernels* kernels() { return k_; }
  const std::vector<ParamTensor>& tensors() const { return tensors_; }
  const ParamTensor* Find(const std::string& name) const;
  bool first() const { return stage_ == 0; }
  bool last() const { return stage_ == layout_.pp - 1; }
  int width() const { return cfg_.width; }

 private:
  struct Saved;
  size_t Add(const std::string& name, size_t size, bool decay, bool replicated_over_tp);
  float* P(size_t off) { return params_.data() + off; }
  float* G(size_t off) { return grads_.data() + off; }
  kernels::Buffer<float> New(size_t n) { return kernels::Buffer<float>(k_, n); }
  kernels::ActBuffer NewActs(size_t n) { return kernels::ActBuffer(k_, n); }
  kernels::ActBuffer Clone(const kernels::ActBuffer& b);
  // The compute copy of the parameters at `off`, in the backend's storage type: what the forward
  // and backward passes read (on an fp32 backend, the master weights themselves).
  kernels::CAct W(size_t off) const;
  void RefreshComputeParams();
  // An in-place sum of activations over the tp group, in their storage type.
  Status AllReduceActs(kernels::Act x, size_t n);
  // The backend's first error as a Status (after the phase's work is issued).
  Status Check() const;
  std::vector<float> InitParams() const;

  ModelConfig cfg_;
  Layout layout_;
  int stage_, tp_rank_;
  int layer_begin_, layer_end_;
  int hl_, d_, vl_;  // local heads, head size, local vocab rows
  Communicator* comm_;
  int tp_group_;
  std::unique_ptr<kernels::Kernels> own_kernels_;
  kernels::Kernels* k_;
  size_t count_ = 0;
  kernels::Buffer<float> params_, grads_;
  kernels::ActBuffer compute_params_;  // empty on an fp32 backend
  bool compute_params_stale_ = true;
  std::vector<ParamTensor> tensors_;
  struct LayerOffsets {
    size_t ln1g, ln1b, wqkv, bqkv, wo, bo, ln2g, ln2b, w1, b1, w2, b2;
  };
  std::vector<LayerOffsets> layer_;
  // The forward pass' parts. Residual: what the residual stream still owes before the next layer
  // norm (added by the norm itself: the residual add fused with the layer norm).
  struct Residual;
  void NormForward(Residual& r, kernels::ActBuffer& x, size_t g, size_t b,
                   kernels::ActBuffer* saved_in, kernels::ActBuffer* out,
                   kernels::Buffer<float>* mean, kernels::Buffer<float>* rstd, int n);
  Status LayerForward(const LayerOffsets& o, Saved& sv, Residual& r, kernels::ActBuffer& x,
                      int batch);
  Status HeadForward(Saved& sv, Residual& r, kernels::ActBuffer& x, const int32_t* targets,
                     double* loss_sum);
  size_t wte_ = 0, wpe_ = 0, lnfg_ = 0, lnfb_ = 0;
  std::map<int, std::unique_ptr<Saved>> saved_;
};

}  // namespace megascope::runtime
