// Launchers of the CUDA backend's hand-written kernels, all in stream order on `s`. Shapes and
// semantics follow the CPU references in kernels/include/megascope/kernels/cpu.h. Activations are
// bf16 in memory (`bf16`); every kernel computes in fp32 and rounds once when it stores.
// Parameters' master copies, gradients, moments and per-row statistics are fp32 (`float`).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace megascope::kernels::cuda {

using bf16 = __nv_bfloat16;

// ---- fp32
void Fill(cudaStream_t s, float* x, size_t n, float value);
void Scale(cudaStream_t s, float* x, size_t n, float f);
// *acc (device, double) += sum of x[i]^2 over [0, n)
void SumSquares(cudaStream_t s, const float* x, size_t n, double* acc);
// bc1, bc2: the bias corrections 1 - beta^t.
void AdamW(cudaStream_t s, float* param, const float* grad, float* m, float* v, size_t n, float lr,
           float beta1, float beta2, float eps, float weight_decay, float bc1, float bc2);
void RescaleSumExp(cudaStream_t s, float* sumexp, float* max, const float* gmax, int rows);
// *acc (device, double) += sum over rows of log(sumexp) + max - target_logit
void LossSum(cudaStream_t s, const float* sumexp, const float* max, const float* target_logit,
             int rows, double* acc);

// ---- conversions
void ToBf16(cudaStream_t s, const float* x, size_t n, bf16* out);
void ToFloat(cudaStream_t s, const bf16* x, size_t n, float* out);
void AddToFloat(cudaStream_t s, float* y, const bf16* x, size_t n);  // y += x

// ---- activations (bf16)
void Add(cudaStream_t s, bf16* y, const bf16* x, size_t n);
void AddBias(cudaStream_t s, bf16* x, const bf16* bias, int n, int c);
// out[j] += sum_i x[i, j]
void ColumnSum(cudaStream_t s, const bf16* x, int n, int c, float* out);
void EmbeddingForward(cudaStream_t s, const int32_t* tokens, int n, int t, const bf16* wte,
                      int vocab_start, int rows, const bf16* wpe, int c, bf16* out);
void EmbeddingBackward(cudaStream_t s, const int32_t* tokens, int n, int t, const bf16* dout,
                       int vocab_start, int rows, int c, float* dwte, float* dwpe);
void AddPositions(cudaStream_t s, bf16* x, const bf16* wpe, int n, int t, int c);
void LayerNormForward(cudaStream_t s, const bf16* x, const bf16* gamma, const bf16* beta, int n,
                      int c, bf16* out, float* mean, float* rstd);
// x += delta (+ bias when not null), then out = LayerNorm(x), in one pass over each row (the
// residual add fused with the norm).
void ResidualLayerNormForward(cudaStream_t s, bf16* x, const bf16* delta, const bf16* bias,
                              const bf16* gamma, const bf16* beta, int n, int c, bf16* out,
                              float* mean, float* rstd);
void LayerNormBackward(cudaStream_t s, const bf16* dout, const bf16* x, const bf16* gamma,
                       const float* mean, const float* rstd, int n, int c, bf16* dx, float* dgamma,
                       float* dbeta);
// The unfused forms of the GEMM epilogues: out = GELU(x); dx = dout * GELU'(x) (written).
void GeluForward(cudaStream_t s, const bf16* x, size_t n, bf16* out);
void GeluBackward(cudaStream_t s, const bf16* dout, const bf16* x, size_t n, bf16* dx);

// Attention pieces (the GEMMs between them run through cuBLASLt):
// qkv [B*T, 3*H*D] -> q, k, v [B, H, T, D]
void SplitHeads(cudaStream_t s, const bf16* qkv, int b, int t, int h, int d, bf16* q, bf16* k,
                bf16* v);
// dq, dk, dv [B, H, T, D] added into dqkv [B*T, 3*H*D]
void AddMergedHeadGrads(cudaStream_t s, const bf16* dq, const bf16* dk, const bf16* dv, int b,
                        int t, int h, int d, bf16* dqkv);
// y [B, H, T, D] -> out [B*T, H*D] (copy) and the reverse (dout -> dy)
void MergeHeads(cudaStream_t s, const bf16* y, int b, int t, int h, int d, bf16* out);
void SplitHeadGrad(cudaStream_t s, const bf16* dout, int b, int t, int h, int d, bf16* dy);
// In place over rows of T scores (B*H*T rows): causal softmax (columns past the row's position 0).
void CausalSoftmax(cudaStream_t s, bf16* att, int rows, int t);
// In place: datt -> d(pre-softmax scores) * scale, causal.
void CausalSoftmaxBackward(cudaStream_t s, const bf16* att, bf16* datt, int rows, int t,
                           float scale);

// Cross-entropy fused with the classifier's softmax: one pass over each row of logits gives its
// max and sum of exponentials (online) and the target's logit (0 when another shard owns it).
void CrossEntropyForward(cudaStream_t s, const bf16* logits, const int32_t* targets, int rows,
                         int cols, int vocab_start, float* max, float* sumexp, float* target_logit);
// In place: logits -> scale * (softmax - one-hot of the target).
void CrossEntropyBackward(cudaStream_t s, bf16* logits, const int32_t* targets, const float* max,
                          const float* sumexp, int rows, int cols, int vocab_start, float scale);

}  // namespace megascope::kernels::cuda
