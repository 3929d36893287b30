// The CUDA backend's hand-written kernels (launchers declared in ops.h). Elementwise kernels use
// grid-stride loops; row-wise ones a block (or a warp) per row with shuffle reductions; column
// sums split the rows into chunks whose partial sums meet in atomicAdd.
#include <algorithm>
#include <cmath>

#include "ops.h"

namespace megascope::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarp = 32;
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)

unsigned Blocks(size_t n) {
  return static_cast<unsigned>(std::min<size_t>((n + kThreads - 1) / kThreads, size_t{1} << 16));
}

__device__ float WarpSum(float v) {
  for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ double WarpSumD(double v) {
  for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ float WarpMax(float v) {
  for (int o = kWarp / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum (or max) over the block; every thread gets the result. blockDim.x: a multiple of 32.
template <bool kMax>
__device__ float BlockReduce(float v) {
  __shared__ float partial[kWarp];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  v = kMax ? WarpMax(v) : WarpSum(v);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const float init = kMax ? -INFINITY : 0.0f;
  v = lane < static_cast<int>(blockDim.x / kWarp) ? partial[lane] : init;
  v = kMax ? WarpMax(v) : WarpSum(v);
  __syncthreads();  // partial is reused by the next call
  return v;
}

// Adds the block's sum of `v` to *acc.
__device__ void BlockAtomicAddD(double v, double* acc) {
  __shared__ double partial[kWarp];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  v = WarpSumD(v);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < static_cast<int>(blockDim.x / kWarp) ? partial[lane] : 0.0;
    v = WarpSumD(v);
    if (lane == 0) atomicAdd(acc, v);
  }
}

#define GRID_STRIDE(i, n)                                                 \
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < (n); \
       i += size_t{blockDim.x} * gridDim.x)

__global__ void FillKernel(float* x, size_t n, float value) { GRID_STRIDE(i, n) x[i] = value; }
__global__ void AddKernel(float* y, const float* x, size_t n) { GRID_STRIDE(i, n) y[i] += x[i]; }
__global__ void ScaleKernel(float* x, size_t n, float f) { GRID_STRIDE(i, n) x[i] *= f; }
__global__ void AddBiasKernel(float* x, const float* bias, size_t n, int c) {
  GRID_STRIDE(i, n) x[i] += bias[i % c];
}
__global__ void SumSquaresKernel(const float* x, size_t n, double* acc) {
  double s = 0;
  GRID_STRIDE(i, n) s += static_cast<double>(x[i]) * x[i];
  BlockAtomicAddD(s, acc);
}

// out[j] += sum of rows [r0, r0 + chunk) of column j (of x, or of x's normalisation when mean is
// given: dgamma's sum of dout * (x - mean) * rstd).
constexpr int kRowChunk = 64;
__global__ void ColumnSumKernel(const float* d, const float* x, const float* mean,
                                const float* rstd, int n, int c, float* out_d, float* out_dn) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= c) return;
  const int r0 = blockIdx.y * kRowChunk, r1 = min(n, r0 + kRowChunk);
  float s = 0, sn = 0;
  for (int i = r0; i < r1; ++i) {
    const size_t at = static_cast<size_t>(i) * c + j;
    s += d[at];
    if (x != nullptr) sn += d[at] * (x[at] - mean[i]) * rstd[i];
  }
  atomicAdd(out_d + j, s);
  if (x != nullptr) atomicAdd(out_dn + j, sn);
}
void LaunchColumnSums(cudaStream_t s, const float* d, const float* x, const float* mean,
                      const float* rstd, int n, int c, float* out_d, float* out_dn) {
  if (n <= 0 || c <= 0) return;
  const dim3 grid((c + kThreads - 1) / kThreads, (n + kRowChunk - 1) / kRowChunk);
  ColumnSumKernel<<<grid, kThreads, 0, s>>>(d, x, mean, rstd, n, c, out_d, out_dn);
}

__global__ void EmbeddingForwardKernel(const int32_t* tokens, size_t total, int t, const float* wte,
                                       int vocab_start, int rows, const float* wpe, int c,
                                       float* out) {
  GRID_STRIDE(idx, total) {
    const size_t i = idx / c;
    const int j = static_cast<int>(idx % c);
    const int row = tokens[i] - vocab_start;
    float v = row >= 0 && row < rows ? wte[static_cast<size_t>(row) * c + j] : 0.0f;
    if (wpe != nullptr) v += wpe[static_cast<size_t>(i % t) * c + j];
    out[idx] = v;
  }
}
__global__ void EmbeddingBackwardKernel(const int32_t* tokens, size_t total, int t,
                                        const float* dout, int vocab_start, int rows, int c,
                                        float* dwte, float* dwpe) {
  GRID_STRIDE(idx, total) {
    const size_t i = idx / c;
    const int j = static_cast<int>(idx % c);
    const int row = tokens[i] - vocab_start;
    if (row >= 0 && row < rows) atomicAdd(dwte + static_cast<size_t>(row) * c + j, dout[idx]);
    if (dwpe != nullptr) atomicAdd(dwpe + static_cast<size_t>(i % t) * c + j, dout[idx]);
  }
}
__global__ void AddPositionsKernel(float* x, const float* wpe, size_t total, int t, int c) {
  GRID_STRIDE(idx, total) {
    const size_t i = idx / c;
    x[idx] += wpe[static_cast<size_t>(i % t) * c + idx % c];
  }
}

__global__ void LayerNormForwardKernel(const float* x, const float* gamma, const float* beta, int c,
                                       float* out, float* mean, float* rstd) {
  const size_t row = blockIdx.x;
  const float* xi = x + row * c;
  float s = 0;
  for (int j = threadIdx.x; j < c; j += blockDim.x) s += xi[j];
  const float mu = BlockReduce<false>(s) / static_cast<float>(c);
  float v = 0;
  for (int j = threadIdx.x; j < c; j += blockDim.x) v += (xi[j] - mu) * (xi[j] - mu);
  const float rs = rsqrtf(BlockReduce<false>(v) / static_cast<float>(c) + 1e-5f);
  float* oi = out + row * c;
  for (int j = threadIdx.x; j < c; j += blockDim.x) oi[j] = (xi[j] - mu) * rs * gamma[j] + beta[j];
  if (threadIdx.x == 0) {
    mean[row] = mu;
    rstd[row] = rs;
  }
}
__global__ void LayerNormBackwardKernel(const float* dout, const float* x, const float* gamma,
                                        const float* mean, const float* rstd, int c, float* dx) {
  const size_t row = blockIdx.x;
  const float* d = dout + row * c;
  const float* xi = x + row * c;
  const float mu = mean[row], rs = rstd[row];
  float a = 0, b = 0;
  for (int j = threadIdx.x; j < c; j += blockDim.x) {
    const float dn = d[j] * gamma[j];
    a += dn;
    b += dn * (xi[j] - mu) * rs;
  }
  const float dnorm_mean = BlockReduce<false>(a) / static_cast<float>(c);
  const float dnorm_norm_mean = BlockReduce<false>(b) / static_cast<float>(c);
  float* o = dx + row * c;
  for (int j = threadIdx.x; j < c; j += blockDim.x) {
    const float norm = (xi[j] - mu) * rs;
    o[j] += (d[j] * gamma[j] - dnorm_mean - norm * dnorm_norm_mean) * rs;
  }
}

__global__ void GeluForwardKernel(const float* x, size_t n, float* out) {
  GRID_STRIDE(i, n) {
    const float xi = x[i];
    const float u = kGeluScale * (xi + 0.044715f * xi * xi * xi);
    out[i] = 0.5f * xi * (1.0f + tanhf(u));
  }
}
__global__ void GeluBackwardKernel(const float* dout, const float* x, size_t n, float* dx) {
  GRID_STRIDE(i, n) {
    const float xi = x[i];
    const float th = tanhf(kGeluScale * (xi + 0.044715f * xi * xi * xi));
    const float grad = 0.5f * (1.0f + th) + 0.5f * xi * (1.0f - th * th) * kGeluScale *
                                                (1.0f + 3.0f * 0.044715f * xi * xi);
    dx[i] += grad * dout[i];
  }
}

// Element idx of a [B, H, T, D] tensor and its place in a [B*T, width] row-major matrix whose
// head hi starts at column `base + hi*D`.
struct HeadIndex {
  size_t row_major;
  __device__ HeadIndex(size_t idx, int t, int h, int d, int width, int base) {
    const int e = static_cast<int>(idx % d);
    const size_t r = idx / d;
    const int ti = static_cast<int>(r % t);
    const size_t bh = r / t;
    const int hi = static_cast<int>(bh % h);
    const size_t bi = bh / h;
    row_major = (bi * t + ti) * width + base + static_cast<size_t>(hi) * d + e;
  }
};

__global__ void SplitHeadsKernel(const float* qkv, size_t total, int t, int h, int d, float* q,
                                 float* k, float* v) {
  const int width = 3 * h * d;
  GRID_STRIDE(idx, total) {
    q[idx] = qkv[HeadIndex(idx, t, h, d, width, 0).row_major];
    k[idx] = qkv[HeadIndex(idx, t, h, d, width, h * d).row_major];
    v[idx] = qkv[HeadIndex(idx, t, h, d, width, 2 * h * d).row_major];
  }
}
__global__ void AddMergedHeadGradsKernel(const float* dq, const float* dk, const float* dv,
                                         size_t total, int t, int h, int d, float* dqkv) {
  const int width = 3 * h * d;
  GRID_STRIDE(idx, total) {
    dqkv[HeadIndex(idx, t, h, d, width, 0).row_major] += dq[idx];
    dqkv[HeadIndex(idx, t, h, d, width, h * d).row_major] += dk[idx];
    dqkv[HeadIndex(idx, t, h, d, width, 2 * h * d).row_major] += dv[idx];
  }
}
__global__ void MergeHeadsKernel(const float* y, size_t total, int t, int h, int d, float* out) {
  GRID_STRIDE(idx, total) out[HeadIndex(idx, t, h, d, h * d, 0).row_major] = y[idx];
}
__global__ void SplitHeadGradKernel(const float* dout, size_t total, int t, int h, int d,
                                    float* dy) {
  GRID_STRIDE(idx, total) dy[idx] = dout[HeadIndex(idx, t, h, d, h * d, 0).row_major];
}

// A warp per row of T scores; the row's query position is row % T.
__global__ void CausalSoftmaxKernel(float* att, int rows, int t) {
  const int row = blockIdx.x * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= rows) return;
  float* a = att + static_cast<size_t>(row) * t;
  const int last = row % t;
  float mx = -INFINITY;
  for (int j = lane; j <= last; j += kWarp) mx = fmaxf(mx, a[j]);
  mx = WarpMax(mx);
  float sum = 0;
  for (int j = lane; j <= last; j += kWarp) sum += expf(a[j] - mx);
  sum = WarpSum(sum);
  for (int j = lane; j < t; j += kWarp) a[j] = j <= last ? expf(a[j] - mx) / sum : 0.0f;
}
__global__ void CausalSoftmaxBackwardKernel(const float* att, float* datt, int rows, int t,
                                            float scale) {
  const int row = blockIdx.x * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= rows) return;
  const float* a = att + static_cast<size_t>(row) * t;
  float* g = datt + static_cast<size_t>(row) * t;
  const int last = row % t;
  float dot = 0;
  for (int j = lane; j <= last; j += kWarp) dot += a[j] * g[j];
  dot = WarpSum(dot);
  for (int j = lane; j < t; j += kWarp) g[j] = j <= last ? a[j] * (g[j] - dot) * scale : 0.0f;
}

__global__ void RowMaxSumExpKernel(const float* x, int cols, float* max, float* sumexp) {
  const size_t row = blockIdx.x;
  const float* xr = x + row * cols;
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) mx = fmaxf(mx, xr[j]);
  mx = BlockReduce<true>(mx);
  float s = 0;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) s += expf(xr[j] - mx);
  s = BlockReduce<false>(s);
  if (threadIdx.x == 0) {
    max[row] = mx;
    sumexp[row] = s;
  }
}
__global__ void TargetLogitsKernel(const float* logits, const int32_t* targets, int rows, int cols,
                                   int vocab_start, float* target_logit) {
  GRID_STRIDE(i, static_cast<size_t>(rows)) {
    const int col = targets[i] - vocab_start;
    target_logit[i] = col >= 0 && col < cols ? logits[i * cols + col] : 0.0f;
  }
}
__global__ void RescaleSumExpKernel(float* sumexp, float* max, const float* gmax, int rows) {
  GRID_STRIDE(i, static_cast<size_t>(rows)) {
    sumexp[i] *= expf(max[i] - gmax[i]);
    max[i] = gmax[i];
  }
}
__global__ void LossSumKernel(const float* sumexp, const float* max, const float* target_logit,
                              int rows, double* acc) {
  double s = 0;
  GRID_STRIDE(i, static_cast<size_t>(rows)) s += logf(sumexp[i]) + max[i] - target_logit[i];
  BlockAtomicAddD(s, acc);
}
__global__ void CrossEntropyBackwardKernel(const float* logits, const int32_t* targets,
                                           const float* max, const float* sumexp, size_t total,
                                           int cols, int vocab_start, float scale, float* dlogits) {
  GRID_STRIDE(idx, total) {
    const size_t r = idx / cols;
    const int j = static_cast<int>(idx % cols);
    const float p = expf(logits[idx] - max[r]) / sumexp[r];
    dlogits[idx] += scale * (p - (targets[r] == vocab_start + j ? 1.0f : 0.0f));
  }
}

__global__ void AdamWKernel(float* param, const float* grad, float* m, float* v, size_t n, float lr,
                            float beta1, float beta2, float eps, float weight_decay, float bc1,
                            float bc2) {
  GRID_STRIDE(i, n) {
    const float g = grad[i];
    const float mi = beta1 * m[i] + (1 - beta1) * g;
    const float vi = beta2 * v[i] + (1 - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float update = (mi / bc1) / (sqrtf(vi / bc2) + eps);
    param[i] -= lr * (update + weight_decay * param[i]);
  }
}

}  // namespace

void Fill(cudaStream_t s, float* x, size_t n, float value) {
  if (n) FillKernel<<<Blocks(n), kThreads, 0, s>>>(x, n, value);
}
void Add(cudaStream_t s, float* y, const float* x, size_t n) {
  if (n) AddKernel<<<Blocks(n), kThreads, 0, s>>>(y, x, n);
}
void Scale(cudaStream_t s, float* x, size_t n, float f) {
  if (n) ScaleKernel<<<Blocks(n), kThreads, 0, s>>>(x, n, f);
}
void AddBias(cudaStream_t s, float* x, const float* bias, int n, int c) {
  const size_t total = static_cast<size_t>(n) * c;
  if (total) AddBiasKernel<<<Blocks(total), kThreads, 0, s>>>(x, bias, total, c);
}
void ColumnSum(cudaStream_t s, const float* x, int n, int c, float* out) {
  LaunchColumnSums(s, x, nullptr, nullptr, nullptr, n, c, out, nullptr);
}
void SumSquares(cudaStream_t s, const float* x, size_t n, double* acc) {
  if (n) SumSquaresKernel<<<Blocks(n), kThreads, 0, s>>>(x, n, acc);
}

void EmbeddingForward(cudaStream_t s, const int32_t* tokens, int n, int t, const float* wte,
                      int vocab_start, int rows, const float* wpe, int c, float* out) {
  const size_t total = static_cast<size_t>(n) * c;
  if (total)
    EmbeddingForwardKernel<<<Blocks(total), kThreads, 0, s>>>(tokens, total, t, wte, vocab_start,
                                                              rows, wpe, c, out);
}
void EmbeddingBackward(cudaStream_t s, const int32_t* tokens, int n, int t, const float* dout,
                       int vocab_start, int rows, int c, float* dwte, float* dwpe) {
  const size_t total = static_cast<size_t>(n) * c;
  if (total)
    EmbeddingBackwardKernel<<<Blocks(total), kThreads, 0, s>>>(tokens, total, t, dout, vocab_start,
                                                               rows, c, dwte, dwpe);
}
void AddPositions(cudaStream_t s, float* x, const float* wpe, int n, int t, int c) {
  const size_t total = static_cast<size_t>(n) * c;
  if (total) AddPositionsKernel<<<Blocks(total), kThreads, 0, s>>>(x, wpe, total, t, c);
}
void LayerNormForward(cudaStream_t s, const float* x, const float* gamma, const float* beta, int n,
                      int c, float* out, float* mean, float* rstd) {
  if (n > 0) LayerNormForwardKernel<<<n, kThreads, 0, s>>>(x, gamma, beta, c, out, mean, rstd);
}
void LayerNormBackward(cudaStream_t s, const float* dout, const float* x, const float* gamma,
                       const float* mean, const float* rstd, int n, int c, float* dx, float* dgamma,
                       float* dbeta) {
  if (n <= 0) return;
  LayerNormBackwardKernel<<<n, kThreads, 0, s>>>(dout, x, gamma, mean, rstd, c, dx);
  LaunchColumnSums(s, dout, x, mean, rstd, n, c, dbeta, dgamma);
}
void GeluForward(cudaStream_t s, const float* x, size_t n, float* out) {
  if (n) GeluForwardKernel<<<Blocks(n), kThreads, 0, s>>>(x, n, out);
}
void GeluBackward(cudaStream_t s, const float* dout, const float* x, size_t n, float* dx) {
  if (n) GeluBackwardKernel<<<Blocks(n), kThreads, 0, s>>>(dout, x, n, dx);
}

void SplitHeads(cudaStream_t s, const float* qkv, int b, int t, int h, int d, float* q, float* k,
                float* v) {
  const size_t total = static_cast<size_t>(b) * h * t * d;
  if (total) SplitHeadsKernel<<<Blocks(total), kThreads, 0, s>>>(qkv, total, t, h, d, q, k, v);
}
void AddMergedHeadGrads(cudaStream_t s, const float* dq, const float* dk, const float* dv, int b,
                        int t, int h, int d, float* dqkv) {
  const size_t total = static_cast<size_t>(b) * h * t * d;
  if (total)
    AddMergedHeadGradsKernel<<<Blocks(total), kThreads, 0, s>>>(dq, dk, dv, total, t, h, d, dqkv);
}
void MergeHeads(cudaStream_t s, const float* y, int b, int t, int h, int d, float* out) {
  const size_t total = static_cast<size_t>(b) * h * t * d;
  if (total) MergeHeadsKernel<<<Blocks(total), kThreads, 0, s>>>(y, total, t, h, d, out);
}
void SplitHeadGrad(cudaStream_t s, const float* dout, int b, int t, int h, int d, float* dy) {
  const size_t total = static_cast<size_t>(b) * h * t * d;
  if (total) SplitHeadGradKernel<<<Blocks(total), kThreads, 0, s>>>(dout, total, t, h, d, dy);
}
void CausalSoftmax(cudaStream_t s, float* att, int rows, int t) {
  constexpr int kRowsPerBlock = kThreads / kWarp;
  if (rows > 0)
    CausalSoftmaxKernel<<<(rows + kRowsPerBlock - 1) / kRowsPerBlock, kThreads, 0, s>>>(att, rows,
                                                                                        t);
}
void CausalSoftmaxBackward(cudaStream_t s, const float* att, float* datt, int rows, int t,
                           float scale) {
  constexpr int kRowsPerBlock = kThreads / kWarp;
  if (rows > 0)
    CausalSoftmaxBackwardKernel<<<(rows + kRowsPerBlock - 1) / kRowsPerBlock, kThreads, 0, s>>>(
        att, datt, rows, t, scale);
}

void RowMaxSumExp(cudaStream_t s, const float* x, int rows, int cols, float* max, float* sumexp) {
  if (rows > 0) RowMaxSumExpKernel<<<rows, kThreads, 0, s>>>(x, cols, max, sumexp);
}
void TargetLogits(cudaStream_t s, const float* logits, const int32_t* targets, int rows, int cols,
                  int vocab_start, float* target_logit) {
  if (rows > 0)
    TargetLogitsKernel<<<Blocks(rows), kThreads, 0, s>>>(logits, targets, rows, cols, vocab_start,
                                                         target_logit);
}
void RescaleSumExp(cudaStream_t s, float* sumexp, float* max, const float* gmax, int rows) {
  if (rows > 0) RescaleSumExpKernel<<<Blocks(rows), kThreads, 0, s>>>(sumexp, max, gmax, rows);
}
void LossSum(cudaStream_t s, const float* sumexp, const float* max, const float* target_logit,
             int rows, double* acc) {
  if (rows > 0)
    LossSumKernel<<<Blocks(rows), kThreads, 0, s>>>(sumexp, max, target_logit, rows, acc);
}
void CrossEntropyBackward(cudaStream_t s, const float* logits, const int32_t* targets,
                          const float* max, const float* sumexp, int rows, int cols,
                          int vocab_start, float scale, float* dlogits) {
  const size_t total = static_cast<size_t>(rows) * cols;
  if (total)
    CrossEntropyBackwardKernel<<<Blocks(total), kThreads, 0, s>>>(
        logits, targets, max, sumexp, total, cols, vocab_start, scale, dlogits);
}
void AdamW(cudaStream_t s, float* param, const float* grad, float* m, float* v, size_t n, float lr,
           float beta1, float beta2, float eps, float weight_decay, float bc1, float bc2) {
  if (n)
    AdamWKernel<<<Blocks(n), kThreads, 0, s>>>(param, grad, m, v, n, lr, beta1, beta2, eps,
                                               weight_decay, bc1, bc2);
}

}  // namespace megascope::kernels::cuda
