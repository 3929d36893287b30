// Launchers of the CUDA backend's hand-written kernels, all in stream order on `s`. Shapes and
// semantics follow the CPU references in kernels/include/megascope/kernels/cpu.h; fp32 in memory
// with fp32 arithmetic (the GEMMs, in gemm.h, are where bf16 tensor cores come in).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace megascope::kernels::cuda {

void Fill(cudaStream_t s, float* x, size_t n, float value);
void Add(cudaStream_t s, float* y, const float* x, size_t n);
void Scale(cudaStream_t s, float* x, size_t n, float f);
void AddBias(cudaStream_t s, float* x, const float* bias, int n, int c);
// out[j] += sum_i x[i, j]
void ColumnSum(cudaStream_t s, const float* x, int n, int c, float* out);
// *acc (device, double) += sum of x[i]^2 over [0, n)
void SumSquares(cudaStream_t s, const float* x, size_t n, double* acc);

void EmbeddingForward(cudaStream_t s, const int32_t* tokens, int n, int t, const float* wte,
                      int vocab_start, int rows, const float* wpe, int c, float* out);
void EmbeddingBackward(cudaStream_t s, const int32_t* tokens, int n, int t, const float* dout,
                       int vocab_start, int rows, int c, float* dwte, float* dwpe);
void AddPositions(cudaStream_t s, float* x, const float* wpe, int n, int t, int c);
void LayerNormForward(cudaStream_t s, const float* x, const float* gamma, const float* beta, int n,
                      int c, float* out, float* mean, float* rstd);
void LayerNormBackward(cudaStream_t s, const float* dout, const float* x, const float* gamma,
                       const float* mean, const float* rstd, int n, int c, float* dx, float* dgamma,
                       float* dbeta);
void GeluForward(cudaStream_t s, const float* x, size_t n, float* out);
void GeluBackward(cudaStream_t s, const float* dout, const float* x, size_t n, float* dx);

// Attention pieces (the GEMMs between them run through cuBLASLt):
// qkv [B*T, 3*H*D] -> q, k, v [B, H, T, D]
void SplitHeads(cudaStream_t s, const float* qkv, int b, int t, int h, int d, float* q, float* k,
                float* v);
// dq, dk, dv [B, H, T, D] added into dqkv [B*T, 3*H*D]
void AddMergedHeadGrads(cudaStream_t s, const float* dq, const float* dk, const float* dv, int b,
                        int t, int h, int d, float* dqkv);
// y [B, H, T, D] -> out [B*T, H*D] (copy) and the reverse (dout -> dy)
void MergeHeads(cudaStream_t s, const float* y, int b, int t, int h, int d, float* out);
void SplitHeadGrad(cudaStream_t s, const float* dout, int b, int t, int h, int d, float* dy);
// In place over rows of T scores (B*H*T rows): causal softmax (columns past the row's position 0).
void CausalSoftmax(cudaStream_t s, float* att, int rows, int t);
// In place: datt -> d(pre-softmax scores) * scale, causal.
void CausalSoftmaxBackward(cudaStream_t s, const float* att, float* datt, int rows, int t,
                           float scale);

void RowMaxSumExp(cudaStream_t s, const float* x, int rows, int cols, float* max, float* sumexp);
void TargetLogits(cudaStream_t s, const float* logits, const int32_t* targets, int rows, int cols,
                  int vocab_start, float* target_logit);
void RescaleSumExp(cudaStream_t s, float* sumexp, float* max, const float* gmax, int rows);
// *acc (device, double) += sum over rows of log(sumexp) + max - target_logit
void LossSum(cudaStream_t s, const float* sumexp, const float* max, const float* target_logit,
             int rows, double* acc);
void CrossEntropyBackward(cudaStream_t s, const float* logits, const int32_t* targets,
                          const float* max, const float* sumexp, int rows, int cols,
                          int vocab_start, float scale, float* dlogits);
// bc1, bc2: the bias corrections 1 - beta^t.
void AdamW(cudaStream_t s, float* param, const float* grad, float* m, float* v, size_t n, float lr,
           float beta1, float beta2, float eps, float weight_decay, float bc1, float bc2);

}  // namespace megascope::kernels::cuda
