#include "megascope/kernels/cpu.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace megascope::kernels {

void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
          const float* b, float beta, float* c) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, trans_a ? m : k, b,
              trans_b ? k : n, beta, c, n);
}

void SetBlasThreads(int n) { openblas_set_num_threads(n); }

void EmbeddingForward(const int32_t* tokens, int n, int t, const float* wte, int vocab_start,
                      int rows, const float* wpe, int c, float* out) {
  for (int i = 0; i < n; ++i) {
    float* o = out + static_cast<size_t>(i) * c;
    const int row = tokens[i] - vocab_start;
    if (row >= 0 && row < rows) {
      std::memcpy(o, wte + static_cast<size_t>(row) * c, sizeof(float) * c);
    } else {
      std::memset(o, 0, sizeof(float) * c);
    }
    if (wpe != nullptr) {
      const float* p = wpe + static_cast<size_t>(i % t) * c;
      for (int j = 0; j < c; ++j) o[j] += p[j];
    }
  }
}

void EmbeddingBackward(const int32_t* tokens, int n, int t, const float* dout, int vocab_start,
                       int rows, int c, float* dwte, float* dwpe) {
  for (int i = 0; i < n; ++i) {
    const float* d = dout + static_cast<size_t>(i) * c;
    const int row = tokens[i] - vocab_start;
    if (row >= 0 && row < rows) {
      float* w = dwte + static_cast<size_t>(row) * c;
      for (int j = 0; j < c; ++j) w[j] += d[j];
    }
    if (dwpe != nullptr) {
      float* p = dwpe + static_cast<size_t>(i % t) * c;
      for (int j = 0; j < c; ++j) p[j] += d[j];
    }
  }
}

void LayerNormForward(const float* x, const float* gamma, const float* beta, int n, int c,
                      float* out, float* mean, float* rstd) {
  constexpr float kEps = 1e-5f;
  for (int i = 0; i < n; ++i) {
    const float* xi = x + static_cast<size_t>(i) * c;
    double mu = 0, var = 0;
    for (int j = 0; j < c; ++j) mu += xi[j];
    mu /= c;
    for (int j = 0; j < c; ++j) var += (xi[j] - mu) * (xi[j] - mu);
    var /= c;
    const float rs = 1.0f / std::sqrt(static_cast<float>(var) + kEps);
    float* oi = out + static_cast<size_t>(i) * c;
    for (int j = 0; j < c; ++j) oi[j] = (xi[j] - static_cast<float>(mu)) * rs * gamma[j] + beta[j];
    mean[i] = static_cast<float>(mu);
    rstd[i] = rs;
  }
}

void LayerNormBackward(const float* dout, const float* x, const float* gamma, const float* mean,
                       const float* rstd, int n, int c, float* dx, float* dgamma, float* dbeta) {
  for (int i = 0; i < n; ++i) {
    const float* d = dout + static_cast<size_t>(i) * c;
    const float* xi = x + static_cast<size_t>(i) * c;
    float dnorm_mean = 0, dnorm_norm_mean = 0;
    for (int j = 0; j < c; ++j) {
      const float norm = (xi[j] - mean[i]) * rstd[i];
      const float dnorm = d[j] * gamma[j];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
      dgamma[j] += d[j] * norm;
      dbeta[j] += d[j];
    }
    dnorm_mean /= c;
    dnorm_norm_mean /= c;
    float* o = dx + static_cast<size_t>(i) * c;
    for (int j = 0; j < c; ++j) {
      const float norm = (xi[j] - mean[i]) * rstd[i];
      o[j] += (d[j] * gamma[j] - dnorm_mean - norm * dnorm_norm_mean) * rstd[i];
    }
  }
}

namespace {
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
}

void GeluForward(const float* x, size_t n, float* out) {
  for (size_t i = 0; i < n; ++i) {
    const float u = kGeluScale * (x[i] + 0.044715f * x[i] * x[i] * x[i]);
    out[i] = 0.5f * x[i] * (1.0f + std::tanh(u));
  }
}

void GeluBackward(const float* dout, const float* x, size_t n, float* dx) {
  for (size_t i = 0; i < n; ++i) {
    const float xi = x[i];
    const float u = kGeluScale * (xi + 0.044715f * xi * xi * xi);
    const float th = std::tanh(u);
    const float sech2 = 1.0f - th * th;
    const float grad =
        0.5f * (1.0f + th) + 0.5f * xi * sech2 * kGeluScale * (1.0f + 3.0f * 0.044715f * xi * xi);
    dx[i] += grad * dout[i];
  }
}

void AttentionForward(const float* qkv, int b, int t, int h, int d, float* out, float* att) {
  const int row = 3 * h * d;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (int bi = 0; bi < b; ++bi) {
    for (int hi = 0; hi < h; ++hi) {
      for (int i = 0; i < t; ++i) {
        const float* q = qkv + static_cast<size_t>(bi * t + i) * row + hi * d;
        float* a = att + ((static_cast<size_t>(bi) * h + hi) * t + i) * t;
        float mx = -INFINITY;
        for (int j = 0; j <= i; ++j) {
          const float* k = qkv + static_cast<size_t>(bi * t + j) * row + h * d + hi * d;
          float s = 0;
          for (int e = 0; e < d; ++e) s += q[e] * k[e];
          a[j] = s * scale;
          mx = std::max(mx, a[j]);
        }
        float sum = 0;
        for (int j = 0; j <= i; ++j) {
          a[j] = std::exp(a[j] - mx);
          sum += a[j];
        }
        for (int j = 0; j <= i; ++j) a[j] /= sum;
        for (int j = i + 1; j < t; ++j) a[j] = 0;
        float* o = out + static_cast<size_t>(bi * t + i) * h * d + hi * d;
        std::fill(o, o + d, 0.0f);
        for (int j = 0; j <= i; ++j) {
          const float* v = qkv + static_cast<size_t>(bi * t + j) * row + 2 * h * d + hi * d;
          for (int e = 0; e < d; ++e) o[e] += a[j] * v[e];
        }
      }
    }
  }
}

void AttentionBackward(const float* dout, const float* qkv, const float* att, int b, int t, int h,
                       int d, float* dqkv) {
  const int row = 3 * h * d;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  std::vector<float> datt(t);
  for (int bi = 0; bi < b; ++bi) {
    for (int hi = 0; hi < h; ++hi) {
      for (int i = 0; i < t; ++i) {
        const float* a = att + ((static_cast<size_t>(bi) * h + hi) * t + i) * t;
        const float* dout_i = dout + static_cast<size_t>(bi * t + i) * h * d + hi * d;
        // d(att) and d(v)
        for (int j = 0; j <= i; ++j) {
          const float* v = qkv + static_cast<size_t>(bi * t + j) * row + 2 * h * d + hi * d;
          float* dv = dqkv + static_cast<size_t>(bi * t + j) * row + 2 * h * d + hi * d;
          float s = 0;
          for (int e = 0; e < d; ++e) {
            s += dout_i[e] * v[e];
            dv[e] += a[j] * dout_i[e];
          }
          datt[j] = s;
        }
        // softmax backward: dpre_j = a_j * (datt_j - sum_k a_k datt_k)
        float dot = 0;
        for (int j = 0; j <= i; ++j) dot += a[j] * datt[j];
        const float* q = qkv + static_cast<size_t>(bi * t + i) * row + hi * d;
        float* dq = dqkv + static_cast<size_t>(bi * t + i) * row + hi * d;
        for (int j = 0; j <= i; ++j) {
          const float dpre = a[j] * (datt[j] - dot) * scale;
          const float* k = qkv + static_cast<size_t>(bi * t + j) * row + h * d + hi * d;
          float* dk = dqkv + static_cast<size_t>(bi * t + j) * row + h * d + hi * d;
          for (int e = 0; e < d; ++e) {
            dq[e] += dpre * k[e];
            dk[e] += dpre * q[e];
          }
        }
      }
    }
  }
}

void RowMaxSumExp(const float* x, int rows, int cols, float* max, float* sumexp) {
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + static_cast<size_t>(r) * cols;
    float mx = -INFINITY;
    for (int j = 0; j < cols; ++j) mx = std::max(mx, xr[j]);
    max[r] = mx;
    float s = 0;
    for (int j = 0; j < cols; ++j) s += std::exp(xr[j] - mx);
    sumexp[r] = s;
  }
}

void CrossEntropyBackward(const float* logits, const int32_t* targets, const float* max,
                          const float* sumexp, int rows, int cols, int vocab_start, float scale,
                          float* dlogits) {
  for (int r = 0; r < rows; ++r) {
    const float* l = logits + static_cast<size_t>(r) * cols;
    float* d = dlogits + static_cast<size_t>(r) * cols;
    for (int j = 0; j < cols; ++j) {
      const float p = std::exp(l[j] - max[r]) / sumexp[r];
      d[j] += scale * (p - (targets[r] == vocab_start + j ? 1.0f : 0.0f));
    }
  }
}

void AdamWUpdate(float* param, const float* grad, float* m, float* v, size_t n, const AdamW& opt,
                 int64_t t, bool decay) {
  const float bc1 = 1.0f - std::pow(opt.beta1, static_cast<float>(t));
  const float bc2 = 1.0f - std::pow(opt.beta2, static_cast<float>(t));
  for (size_t i = 0; i < n; ++i) {
    m[i] = opt.beta1 * m[i] + (1 - opt.beta1) * grad[i];
    v[i] = opt.beta2 * v[i] + (1 - opt.beta2) * grad[i] * grad[i];
    const float update = (m[i] / bc1) / (std::sqrt(v[i] / bc2) + opt.eps);
    param[i] -= opt.lr * (update + (decay ? opt.weight_decay * param[i] : 0.0f));
  }
}

}  // namespace megascope::kernels
