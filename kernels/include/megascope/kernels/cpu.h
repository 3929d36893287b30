// CPU compute kernels for the GPT runtime: GEMM through CBLAS (OpenBLAS) and hand-written
// forward/backward passes for embedding, layer norm, causal self-attention, GELU, cross-entropy
// and the AdamW update. All row-major fp32; backward passes accumulate (+=) into gradients.
// Shapes: N rows of C channels; attention over B sequences of T tokens with H heads of size D.
#pragma once

#include <cstddef>
#include <cstdint>

namespace megascope::kernels {

// C[M,N] = alpha * op(A) op(B) + beta * C, op(X) = X or X^T (row-major).
void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
          const float* b, float beta, float* c);
// Pins BLAS to one thread (one rank per core).
void SetBlasThreads(int n);

// out[n, :] = wte[tokens[n] - vocab_start, :] if the token lies in [vocab_start, vocab_start +
// rows), else 0; plus wpe[n % T, :] when wpe is given.
void EmbeddingForward(const int32_t* tokens, int n, int t, const float* wte, int vocab_start,
                      int rows, const float* wpe, int c, float* out);
void EmbeddingBackward(const int32_t* tokens, int n, int t, const float* dout, int vocab_start,
                       int rows, int c, float* dwte, float* dwpe);

void LayerNormForward(const float* x, const float* gamma, const float* beta, int n, int c,
                      float* out, float* mean, float* rstd);
void LayerNormBackward(const float* dout, const float* x, const float* gamma, const float* mean,
                       const float* rstd, int n, int c, float* dx, float* dgamma, float* dbeta);

// GELU, tanh approximation.
void GeluForward(const float* x, size_t n, float* out);
void GeluBackward(const float* dout, const float* x, size_t n, float* dx);

// qkv: [B*T, 3*H*D] laid out [q heads | k heads | v heads]; out: [B*T, H*D];
// att: [B, H, T, T] softmax probabilities (saved for backward).
void AttentionForward(const float* qkv, int b, int t, int h, int d, float* out, float* att);
void AttentionBackward(const float* dout, const float* qkv, const float* att, int b, int t, int h,
                       int d, float* dqkv);

// Row-wise: max and sum of exp(x - max) over `cols` columns of a [rows, cols] matrix.
void RowMaxSumExp(const float* x, int rows, int cols, float* max, float* sumexp);
// Softmax cross-entropy over (possibly vocab-sharded) logits whose global row max and sum of
// exponentials are given. dlogits = scale * (softmax - onehot) for columns this shard owns.
void CrossEntropyBackward(const float* logits, const int32_t* targets, const float* max,
                          const float* sumexp, int rows, int cols, int vocab_start, float scale,
                          float* dlogits);

struct AdamW {
  float lr = 3e-4f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
};
// One AdamW step at (1-based) step `t`; decay applies when `decay` is set.
void AdamWUpdate(float* param, const float* grad, float* m, float* v, size_t n, const AdamW& opt,
                 int64_t t, bool decay);

}  // namespace megascope::kernels
