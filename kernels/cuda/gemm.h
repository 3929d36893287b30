// GEMMs through cuBLASLt, row-major as the rest of megascope: bf16 matrices into the tensor cores
// with fp32 accumulation (CUBLAS_COMPUTE_32F), C in bf16 or fp32; fp32 A and B run as bf16
// products too (CUBLAS_COMPUTE_32F_FAST_16BF). Epilogues fuse a linear layer's bias and GELU into
// the forward GEMM and GELU's derivative and the bias gradient into the backward one. A plan (the
// operation and layout descriptors and the heuristic's algorithm) is made once per shape, stride,
// batch, types, epilogue and pointer alignment and kept; one workspace serves every call on the
// stream.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <tuple>

#include "check.h"

namespace megascope::kernels::cuda {

// What cuBLASLt does after the product, on D = our C (row-major [M,N], cuBLASLt's N x M):
//   kBias         C += bias[N]
//   kGeluAuxBias  aux = C + bias[N], C = GELU(aux)   (aux: [M,N], the pre-activation for backward)
//   kDGeluBGrad   C = C * GELU'(aux), bias = sum over rows of C (written, not added; type of C)
enum class Epilogue { kNone, kBias, kGeluAuxBias, kDGeluBGrad };

class LtGemm {
 public:
  LtGemm() = default;
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;
  ~LtGemm();
  bool Init(StickyError* err, cudaStream_t stream);

  struct Types {
    cudaDataType_t ab = CUDA_R_16BF;  // A and B
    cudaDataType_t c = CUDA_R_16BF;   // C (and D)
  };
  // C_i[m,n] = alpha * op(A_i) op(B_i) + beta * C_i for i < batch, row-major; X_i = X + i *
  // stride_x (elements). With an epilogue (batch 1 only), `bias` and `aux` as Epilogue says.
  // Returns false, with no error kept, when cuBLASLt has no algorithm for this epilogue here (the
  // caller runs the unfused ops); any other failure is kept in the StickyError.
  bool Run(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const void* a,
           int64_t stride_a, const void* b, int64_t stride_b, float beta, void* c, int64_t stride_c,
           int batch, Types types, Epilogue epilogue = Epilogue::kNone, void* bias = nullptr,
           void* aux = nullptr);
  size_t plans() const { return plans_.size(); }

 private:
  struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool supported = true;  // false: no algorithm for this epilogue (kept, so asked once)
  };
  // trans_a, trans_b, m, n, k, batch, stride_a, stride_b, stride_c, alignment, A/B type, C type,
  // epilogue
  using Key =
      std::tuple<bool, bool, int, int, int, int, int64_t, int64_t, int64_t, int, int, int, int>;
  // The plan for `key`; bias and aux are set on its descriptor before the heuristic runs, as
  // cuBLASLt reads their alignment from them.
  const Plan* Find(const Key& key, void* bias, void* aux);
  bool SetPointers(const Plan& p, Epilogue e, int n, void* bias, void* aux);
  // cuBLASLt's best algorithm for `p` at `align_bytes` (found 0: none). With an epilogue, none is
  // not an error: the caller runs the ops unfused.
  bool Choose(const Plan& p, uint32_t align_bytes, bool epilogue,
              cublasLtMatmulHeuristicResult_t* result, int* found);
  static void Destroy(Plan* p);

  StickyError* err_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // cuBLAS's advice for Hopper
  std::map<Key, Plan> plans_;
};

}  // namespace megascope::kernels::cuda
