// GEMMs through cuBLASLt: fp32 matrices in memory, bf16 tensor-core products with fp32
// accumulation (CUBLAS_COMPUTE_32F_FAST_16BF), row-major as the rest of megascope. A plan (the
// operation and layout descriptors and the heuristic's algorithm) is made once per shape, stride,
// batch and pointer alignment and kept; one workspace serves every call on the stream.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <tuple>

#include "check.h"

namespace megascope::kernels::cuda {

class LtGemm {
 public:
  LtGemm() = default;
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;
  ~LtGemm();
  bool Init(StickyError* err, cudaStream_t stream);

  // C_i[m,n] = alpha * op(A_i) op(B_i) + beta * C_i for i < batch, row-major; X_i = X + i *
  // stride_x (elements).
  void Run(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
           int64_t stride_a, const float* b, int64_t stride_b, float beta, float* c,
           int64_t stride_c, int batch);
  size_t plans() const { return plans_.size(); }

 private:
  struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  // trans_a, trans_b, m, n, k, batch, stride_a, stride_b, stride_c, alignment
  using Key = std::tuple<bool, bool, int, int, int, int, int64_t, int64_t, int64_t, int>;
  const Plan* Find(const Key& key);
  static void Destroy(Plan* p);

  StickyError* err_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // cuBLAS's advice for Hopper
  std::map<Key, Plan> plans_;
};

}  // namespace megascope::kernels::cuda
