// The CUDA backend's hand-written kernels (launchers declared in ops.h). Elementwise kernels use
// grid-stride loops; row-wise ones a block (or a warp) per row with shuffle reductions; column
// sums split the rows into chunks whose partial sums meet in atomicAdd. Activations are loaded from
// bf16 into fp32 (L), computed in fp32 and rounded once when stored (S).
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

__device__ __forceinline__ float L(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ bf16 S(float x) { return __float2bfloat16(x); }

__device__ __forceinline__ float Gelu(float x) {
  return 0.5f * x * (1.0f + tanhf(kGeluScale * (x + 0.044715f * x * x * x)));
}
__device__ __forceinline__ float GeluGrad(float x) {
  const float th = tanhf(kGeluScale * (x + 0.044715f * x * x * x));
  return 0.5f * (1.0f + th) +
         0.5f * x * (1.0f - th * th) * kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
}

__global__ void FillKernel(float* x, size_t n, float value) { GRID_STRIDE(i, n) x[i] = value; }
__global__ void ScaleKernel(float* x, size_t n, float f) { GRID_STRIDE(i, n) x[i] *= f; }
__global__ void SumSquaresKernel(const float* x, size_t n, double* acc) {
  double s = 0;
  GRID_STRIDE(i, n) s += static_cast<double>(x[i]) * x[i];
  BlockAtomicAddD(s, acc);
}
__global__ void ToBf16Kernel(const float* x, size_t n, bf16* out) {
  GRID_STRIDE(i, n) out[i] = S(x[i]);
}
__global__ void ToFloatKernel(const bf16* x, size_t n, float* out) {
  GRID_STRIDE(i, n) out[i] = L(x[i]);
}
__global__ void AddToFloatKernel(float* y, const bf16* x, size_t n) {
  GRID_STRIDE(i, n) y[i] += L(x[i]);
}
__global__ void AddKernel(bf16* y, const bf16* x, size_t n) {
  GRID_STRIDE(i, n) y[i] = S(L(y[i]) + L(x[i]));
}
__global__ void AddBiasKernel(bf16* x, const bf16* bias, size_t n, int c) {
  GRID_STRIDE(i, n) x[i] = S(L(x[i]) + L(bias[i % c]));
}

// out[j] += sum of rows [r0, r0 + chunk) of column j (of d, and when x is given of d's product with
// x's normalisation: dgamma's sum of dout * (x - mean) * rstd).
constexpr int kRowChunk = 64;
__global__ void ColumnSumKernel(const bf16* d, const bf16* x, const float* mean, const float* rstd,
                                int n, int c, float* out_d, float* out_dn) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= c) return;
  const int r0 = blockIdx.y * kRowChunk, r1 = min(n, r0 + kRowChunk);
  float s = 0, sn = 0;
  for (int i = r0; i < r1; ++i) {
    const size_t at = static_cast<size_t>(i) * c + j;
    const float di = L(d[at]);
    s += di;
    if (x != nullptr) sn += di * (L(x[at]) - mean[i]) * rstd[i];
  }
  atomicAdd(out_d + j, s);
  if (x != nullptr) atomicAdd(out_dn + j, sn);
}
void LaunchColumnSums(cudaStream_t s, const bf16* d, const bf16* x, const float* mean,
                      const float* rstd, int n, int c, float* out_d, float* out_dn) {
  if (n <= 0 || c <= 0) return;
  const dim3 grid((c + kThreads - 1) / kThreads, (n + kRowChunk - 1) / kRowChunk);
  ColumnSumKernel<<<grid, kThreads, 0, s>>>(d, x, mean, rstd, n, c, out_d, out_dn);
}

__global__ void EmbeddingForwardKernel(const int32_t* tokens, size_t total, int t, const bf16* wte,
                                       int vocab_start, int rows, const bf16* wpe, int c,
                                       bf16* out) {
  GRID_STRIDE(idx, total) {
    const size_t i = idx / c;
    const int j = static_cast<int>(idx % c);
    const int row = tokens[i] - vocab_start;
    float v = row >= 0 && row < rows ? L(wte[static_cast<size_t>(row) * c + j]) : 0.0f;
    if (wpe != nullptr) v += L(wpe[static_cast<size_t>(i % t) * c + j]);
    out[idx] = S(v);
  }
}
__global__ void EmbeddingBackwardKernel(const int32_t* tokens, size_t total, int t,
                                        const bf16* dout, int vocab_start, int rows, int c,
                                        float* dwte, float* dwpe) {
  GRID_STRIDE(idx, total) {
    const size_t i = idx / c;
    const int j = static_cast<int>(idx % c);
    const int row = tokens[i] - vocab_start;
    const float d = L(dout[idx]);
    if (row >= 0 && row < rows) atomicAdd(dwte + static_cast<size_t>(row) * c + j, d);
    if (dwpe != nullptr) atomicAdd(dwpe + static_cast<size_t>(i % t) * c + j, d);
  }
}
__global__ void AddPositionsKernel(bf16* x, const bf16* wpe, size_t total, int t, int c) {
  GRID_STRIDE(idx, total) {
    const size_t i = idx / c;
    x[idx] = S(L(x[idx]) + L(wpe[static_cast<size_t>(i % t) * c + idx % c]));
  }
}

// A block per row. With delta, the row's residual add is done first and stored (each thread
// reads back only what it stored itself), so the norm sees the rounded residual stream as the
// next op will.
__global__ void LayerNormForwardKernel(bf16* x, const bf16* delta, const bf16* bias,
                                       const bf16* gamma, const bf16* beta, int c, bf16* out,
                                       float* mean, float* rstd) {
  const size_t row = blockIdx.x;
  bf16* xi = x + row * c;
  if (delta != nullptr) {
    const bf16* di = delta + row * c;
    for (int j = threadIdx.x; j < c; j += blockDim.x) {
      const float v = L(xi[j]) + L(di[j]) + (bias != nullptr ? L(bias[j]) : 0.0f);
      xi[j] = S(v);
    }
  }
  float s = 0;
  for (int j = threadIdx.x; j < c; j += blockDim.x) s += L(xi[j]);
  const float mu = BlockReduce<false>(s) / static_cast<float>(c);
  float v = 0;
  for (int j = threadIdx.x; j < c; j += blockDim.x) v += (L(xi[j]) - mu) * (L(xi[j]) - mu);
  const float rs = rsqrtf(BlockReduce<false>(v) / static_cast<float>(c) + 1e-5f);
  bf16* oi = out + row * c;
  for (int j = threadIdx.x; j < c; j += blockDim.x)
    oi[j] = S((L(xi[j]) - mu) * rs * L(gamma[j]) + L(beta[j]));
  if (threadIdx.x == 0) {
    mean[row] = mu;
    rstd[row] = rs;
  }
}
__global__ void LayerNormBackwardKernel(const bf16* dout, const bf16* x, const bf16* gamma,
                                        const float* mean, const float* rstd, int c, bf16* dx) {
  const size_t row = blockIdx.x;
  const bf16* d = dout + row * c;
  const bf16* xi = x + row * c;
  const float mu = mean[row], rs = rstd[row];
  float a = 0, b = 0;
  for (int j = threadIdx.x; j < c; j += blockDim.x) {
    const float dn = L(d[j]) * L(gamma[j]);
    a += dn;
    b += dn * (L(xi[j]) - mu) * rs;
  }
  const float dnorm_mean = BlockReduce<false>(a) / static_cast<float>(c);
  const float dnorm_norm_mean = BlockReduce<false>(b) / static_cast<float>(c);
  bf16* o = dx + row * c;
  for (int j = threadIdx.x; j < c; j += blockDim.x) {
    const float norm = (L(xi[j]) - mu) * rs;
    o[j] = S(L(o[j]) + (L(d[j]) * L(gamma[j]) - dnorm_mean - norm * dnorm_norm_mean) * rs);
  }
}

__global__ void GeluForwardKernel(const bf16* x, size_t n, bf16* out) {
  GRID_STRIDE(i, n) out[i] = S(Gelu(L(x[i])));
}
__global__ void GeluBackwardKernel(const bf16* dout, const bf16* x, size_t n, bf16* dx) {
  GRID_STRIDE(i, n) dx[i] = S(GeluGrad(L(x[i])) * L(dout[i]));
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

__global__ void SplitHeadsKernel(const bf16* qkv, size_t total, int t, int h, int d, bf16* q,
                                 bf16* k, bf16* v) {
  const int width = 3 * h * d;
  GRID_STRIDE(idx, total) {
    q[idx] = qkv[HeadIndex(idx, t, h, d, width, 0).row_major];
    k[idx] = qkv[HeadIndex(idx, t, h, d, width, h * d).row_major];
    v[idx] = qkv[HeadIndex(idx, t, h, d, width, 2 * h * d).row_major];
  }
}
__global__ void AddMergedHeadGradsKernel(const bf16* dq, const bf16* dk, const bf16* dv,
                                         size_t total, int t, int h, int d, bf16* dqkv) {
  const int width = 3 * h * d;
  GRID_STRIDE(idx, total) {
    const size_t iq = HeadIndex(idx, t, h, d, width, 0).row_major;
    const size_t ik = HeadIndex(idx, t, h, d, width, h * d).row_major;
    const size_t iv = HeadIndex(idx, t, h, d, width, 2 * h * d).row_major;
    dqkv[iq] = S(L(dqkv[iq]) + L(dq[idx]));
    dqkv[ik] = S(L(dqkv[ik]) + L(dk[idx]));
    dqkv[iv] = S(L(dqkv[iv]) + L(dv[idx]));
  }
}
__global__ void MergeHeadsKernel(const bf16* y, size_t total, int t, int h, int d, bf16* out) {
  GRID_STRIDE(idx, total) out[HeadIndex(idx, t, h, d, h * d, 0).row_major] = y[idx];
}
__global__ void SplitHeadGradKernel(const bf16* dout, size_t total, int t, int h, int d, bf16* dy) {
  GRID_STRIDE(idx, total) dy[idx] = dout[HeadIndex(idx, t, h, d, h * d, 0).row_major];
}

// A warp per row of T scores; the row's query position is row % T.
__global__ void CausalSoftmaxKernel(bf16* att, int rows, int t) {
  const int row = blockIdx.x * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= rows) return;
  bf16* a = att + static_cast<size_t>(row) * t;
  const int last = row % t;
  float mx = -INFINITY;
  for (int j = lane; j <= last; j += kWarp) mx = fmaxf(mx, L(a[j]));
  mx = WarpMax(mx);
  float sum = 0;
  for (int j = lane; j <= last; j += kWarp) sum += expf(L(a[j]) - mx);
  sum = WarpSum(sum);
  for (int j = lane; j < t; j += kWarp) a[j] = S(j <= last ? expf(L(a[j]) - mx) / sum : 0.0f);
}
__global__ void CausalSoftmaxBackwardKernel(const bf16* att, bf16* datt, int rows, int t,
                                            float scale) {
  const int row = blockIdx.x * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= rows) return;
  const bf16* a = att + static_cast<size_t>(row) * t;
  bf16* g = datt + static_cast<size_t>(row) * t;
  const int last = row % t;
  float dot = 0;
  for (int j = lane; j <= last; j += kWarp) dot += L(a[j]) * L(g[j]);
  dot = WarpSum(dot);
  for (int j = lane; j < t; j += kWarp)
    g[j] = S(j <= last ? L(a[j]) * (L(g[j]) - dot) * scale : 0.0f);
}

// A block per row: each thread keeps a running (max, sum of exp(x - max)) over its columns, then
// the block merges them onto the row's max.
__global__ void CrossEntropyForwardKernel(const bf16* logits, const int32_t* targets, int cols,
                                          int vocab_start, float* max, float* sumexp,
                                          float* target_logit) {
  const size_t row = blockIdx.x;
  const bf16* xr = logits + row * cols;
  float m = -INFINITY, s = 0;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) {
    const float v = L(xr[j]);
    if (v > m) {
      s = s * expf(m - v) + 1.0f;
      m = v;
    } else {
      s += expf(v - m);
    }
  }
  const float gm = BlockReduce<true>(m);
  const float total = BlockReduce<false>(m == -INFINITY ? 0.0f : s * expf(m - gm));
  if (threadIdx.x == 0) {
    max[row] = gm;
    sumexp[row] = total;
    const int col = targets[row] - vocab_start;
    target_logit[row] = col >= 0 && col < cols ? L(xr[col]) : 0.0f;
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
__global__ void CrossEntropyBackwardKernel(bf16* logits, const int32_t* targets, const float* max,
                                           const float* sumexp, size_t total, int cols,
                                           int vocab_start, float scale) {
  GRID_STRIDE(idx, total) {
    const size_t r = idx / cols;
    const int j = static_cast<int>(idx % cols);
    const float p = expf(L(logits[idx]) - max[r]) / sumexp[r];
    logits[idx] = S(scale * (p - (targets[r] == vocab_start + j ? 1.0f : 0.0f)));
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
void Scale(cudaStream_t s, float* x, size_t n, float f) {
  if (n) ScaleKernel<<<Blocks(n), kThreads, 0, s>>>(x, n, f);
}
void SumSquares(cudaStream_t s, const float* x, size_t n, double* acc) {
  if (n) SumSquaresKernel<<<Blocks(n), kThreads, 0, s>>>(x, n, acc);
}
void AdamW(cudaStream_t s, float* param, const float* grad, float* m, float* v, size_t n, float lr,
           float beta1, float beta2, float eps, float weight_decay, float bc1, float bc2) {
  if (n)
    AdamWKernel<<<Blocks(n), kThreads, 0, s>>>(param, grad, m, v, n, lr, beta1, beta2, eps,
                                               weight_decay, bc1, bc2);
}
void RescaleSumExp(cudaStream_t s, float* sumexp, float* max, const float* gmax, int rows) {
  if (rows > 0) RescaleSumExpKernel<<<Blocks(rows), kThreads, 0, s>>>(sumexp, max, gmax, rows);
}
void LossSum(cudaStream_t s, const float* sumexp, const float* max, const float* target_logit,
             int rows, double* acc) {
  if (rows > 0)
    LossSumKernel<<<Blocks(rows), kThreads, 0, s>>>(sumexp, max, target_logit, rows, acc);
}

void ToBf16(cudaStream_t s, const float* x, size_t n, bf16* out) {
  if (n) ToBf16Kernel<<<Blocks(n), kThreads, 0, s>>>(x, n, out);
}
void ToFloat(cudaStream_t s, const bf16* x, size_t n, float* out) {
  if (n) ToFloatKernel<<<Blocks(n), kThreads, 0, s>>>(x, n, out);
}
void AddToFloat(cudaStream_t s, float* y, const bf16* x, size_t n) {
  if (n) AddToFloatKernel<<<Blocks(n), kThreads, 0, s>>>(y, x, n);
}

void Add(cudaStream_t s, bf16* y, const bf16* x, size_t n) {
  if (n) AddKernel<<<Blocks(n), kThreads, 0, s>>>(y, x, n);
}
void AddBias(cudaStream_t s, bf16* x, const bf16* bias, int n, int c) {
  const size_t total = static_cast<size_t>(n) * c;
  if (total) AddBiasKernel<<<Blocks(total), kThreads, 0, s>>>(x, bias, total, c);
}
void ColumnSum(cudaStream_t s, const bf16* x, int n, int c, float* out) {
  LaunchColumnSums(s, x, nullptr, nullptr, nullptr, n, c, out, nullptr);
}
void EmbeddingForward(cudaStream_t s, const int32_t* tokens, int n, int t, const bf16* wte,
                      int vocab_start, int rows, const bf16* wpe, int c, bf16* out) {
  const size_t total = static_cast<size_t>(n) * c;
  if (total)
    EmbeddingForwardKernel<<<Blocks(total), kThreads, 0, s>>>(tokens, total, t, wte, vocab_start,
                                                              rows, wpe, c, out);
}
void EmbeddingBackward(cudaStream_t s, const int32_t* tokens, int n, int t, const bf16* dout,
                       int vocab_start, int rows, int c, float* dwte, float* dwpe) {
  const size_t total = static_cast<size_t>(n) * c;
  if (total)
    EmbeddingBackwardKernel<<<Blocks(total), kThreads, 0, s>>>(tokens, total, t, dout, vocab_start,
                                                               rows, c, dwte, dwpe);
}
void AddPositions(cudaStream_t s, bf16* x, const bf16* wpe, int n, int t, int c) {
  const size_t total = static_cast<size_t>(n) * c;
  if (total) AddPositionsKernel<<<Blocks(total), kThreads, 0, s>>>(x, wpe, total, t, c);
}
void LayerNormForward(cudaStream_t s, const bf16* x, const bf16* gamma, const bf16* beta, int n,
                      int c, bf16* out, float* mean, float* rstd) {
  // Without a delta the kernel only reads x.
  if (n > 0)
    LayerNormForwardKernel<<<n, kThreads, 0, s>>>(const_cast<bf16*>(x), nullptr, nullptr, gamma,
                                                  beta, c, out, mean, rstd);
}
void ResidualLayerNormForward(cudaStream_t s, bf16* x, const bf16* delta, const bf16* bias,
                              const bf16* gamma, const bf16* beta, int n, int c, bf16* out,
                              float* mean, float* rstd) {
  if (n > 0)
    LayerNormForwardKernel<<<n, kThreads, 0, s>>>(x, delta, bias, gamma, beta, c, out, mean, rstd);
}
void LayerNormBackward(cudaStream_t s, const bf16* dout, const bf16* x, const bf16* gamma,
                       const float* mean, const float* rstd, int n, int c, bf16* dx, float* dgamma,
                       float* dbeta) {
  if (n <= 0) return;
  LayerNormBackwardKernel<<<n, kThreads, 0, s>>>(dout, x, gamma, mean, rstd, c, dx);
  LaunchColumnSums(s, dout, x, mean, rstd, n, c, dbeta, dgamma);
}
void GeluForward(cudaStream_t s, const bf16* x, size_t n, bf16* out) {
  if (n) GeluForwardKernel<<<Blocks(n), kThreads, 0, s>>>(x, n, out);
}
void GeluBackward(cudaStream_t s, const bf16* dout, const bf16* x, size_t n, bf16* dx) {
  if (n) GeluBackwardKernel<<<Blocks(n), kThreads, 0, s>>>(dout, x, n, dx);
}

void SplitHeads(cudaStream_t s, const bf16* qkv, int b, int t, int h, int d, bf16* q, bf16* k,
                bf16* v) {
  const size_t total = static_cast<size_t>(b) * h * t * d;
  if (total) SplitHeadsKernel<<<Blocks(total), kThreads, 0, s>>>(qkv, total, t, h, d, q, k, v);
}
void AddMergedHeadGrads(cudaStream_t s, const bf16* dq, const bf16* dk, const bf16* dv, int b,
                        int t, int h, int d, bf16* dqkv) {
  const size_t total = static_cast<size_t>(b) * h * t * d;
  if (total)
    AddMergedHeadGradsKernel<<<Blocks(total), kThreads, 0, s>>>(dq, dk, dv, total, t, h, d, dqkv);
}
void MergeHeads(cudaStream_t s, const bf16* y, int b, int t, int h, int d, bf16* out) {
  const size_t total = static_cast<size_t>(b) * h * t * d;
  if (total) MergeHeadsKernel<<<Blocks(total), kThreads, 0, s>>>(y, total, t, h, d, out);
}
void SplitHeadGrad(cudaStream_t s, const bf16* dout, int b, int t, int h, int d, bf16* dy) {
  const size_t total = static_cast<size_t>(b) * h * t * d;
  if (total) SplitHeadGradKernel<<<Blocks(total), kThreads, 0, s>>>(dout, total, t, h, d, dy);
}
void CausalSoftmax(cudaStream_t s, bf16* att, int rows, int t) {
  constexpr int kRowsPerBlock = kThreads / kWarp;
  if (rows > 0)
    CausalSoftmaxKernel<<<(rows + kRowsPerBlock - 1) / kRowsPerBlock, kThreads, 0, s>>>(att, rows,
                                                                                        t);
}
void CausalSoftmaxBackward(cudaStream_t s, const bf16* att, bf16* datt, int rows, int t,
                           float scale) {
  constexpr int kRowsPerBlock = kThreads / kWarp;
  if (rows > 0)
    CausalSoftmaxBackwardKernel<<<(rows + kRowsPerBlock - 1) / kRowsPerBlock, kThreads, 0, s>>>(
        att, datt, rows, t, scale);
}

void CrossEntropyForward(cudaStream_t s, const bf16* logits, const int32_t* targets, int rows,
                         int cols, int vocab_start, float* max, float* sumexp,
                         float* target_logit) {
  if (rows > 0)
    CrossEntropyForwardKernel<<<rows, kThreads, 0, s>>>(logits, targets, cols, vocab_start, max,
                                                        sumexp, target_logit);
}
void CrossEntropyBackward(cudaStream_t s, bf16* logits, const int32_t* targets, const float* max,
                          const float* sumexp, int rows, int cols, int vocab_start, float scale) {
  const size_t total = static_cast<size_t>(rows) * cols;
  if (total)
    CrossEntropyBackwardKernel<<<Blocks(total), kThreads, 0, s>>>(logits, targets, max, sumexp,
                                                                  total, cols, vocab_start, scale);
}

}  // namespace megascope::kernels::cuda
