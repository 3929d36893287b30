#include "gemm.h"

#include <string>

namespace megascope::kernels::cuda {
namespace {

size_t Bytes(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }

// The largest power of two (at most 256) that divides every address the plan will see.
int Alignment(const void* a, const void* b, const void* c, const void* bias, const void* aux,
              int64_t sa, int64_t sb, int64_t sc, int batch, LtGemm::Types t) {
  uintptr_t bits = reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b) |
                   reinterpret_cast<uintptr_t>(c) | reinterpret_cast<uintptr_t>(bias) |
                   reinterpret_cast<uintptr_t>(aux) | 256;
  if (batch > 1) {
    bits |= static_cast<uintptr_t>(sa * Bytes(t.ab)) | static_cast<uintptr_t>(sb * Bytes(t.ab)) |
            static_cast<uintptr_t>(sc * Bytes(t.c));
  }
  return static_cast<int>(bits & (~bits + 1));
}

cublasLtEpilogue_t LtEpilogue(Epilogue e) {
  switch (e) {
    case Epilogue::kBias:
      return CUBLASLT_EPILOGUE_BIAS;
    case Epilogue::kGeluAuxBias:
      return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case Epilogue::kDGeluBGrad:
      return CUBLASLT_EPILOGUE_DGELU_BGRAD;
    case Epilogue::kNone:
      break;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

}  // namespace

LtGemm::~LtGemm() {
  for (auto& kv : plans_) Destroy(&kv.second);
  if (workspace_ != nullptr) cudaFree(workspace_);
  if (handle_ != nullptr) cublasLtDestroy(handle_);
}

void LtGemm::Destroy(Plan* p) {
  if (p->a != nullptr) cublasLtMatrixLayoutDestroy(p->a);
  if (p->b != nullptr) cublasLtMatrixLayoutDestroy(p->b);
  if (p->c != nullptr) cublasLtMatrixLayoutDestroy(p->c);
  if (p->op != nullptr) cublasLtMatmulDescDestroy(p->op);
}

bool LtGemm::Init(StickyError* err, cudaStream_t stream) {
  err_ = err;
  stream_ = stream;
  return MEGASCOPE_CUDA_TRY(*err_, cublasLtCreate(&handle_)) &&
         MEGASCOPE_CUDA_TRY(*err_, cudaMalloc(&workspace_, kWorkspaceBytes));
}

// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLASLt's A is our B and its
// B our A, each seen column-major (a row-major r x c matrix is a column-major c x r one).
bool LtGemm::SetPointers(const Plan& p, Epilogue e, int n, void* bias, void* aux) {
  if (e == Epilogue::kNone) return true;
  const cublasLtEpilogue_t epi = LtEpilogue(e);
  bool ok =
      MEGASCOPE_CUDA_TRY(*err_, cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                               &epi, sizeof(epi))) &&
      MEGASCOPE_CUDA_TRY(*err_, cublasLtMatmulDescSetAttribute(
                                    p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  if (ok && aux != nullptr) {
    const int64_t ld = n;  // aux is [M,N] row-major: cuBLASLt's N x M with leading dimension N
    ok =
        MEGASCOPE_CUDA_TRY(
            *err_, cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                  &aux, sizeof(aux))) &&
        MEGASCOPE_CUDA_TRY(*err_, cublasLtMatmulDescSetAttribute(
                                      p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof(ld)));
  }
  return ok;
}

bool LtGemm::Choose(const Plan& p, uint32_t align_bytes, bool epilogue,
                    cublasLtMatmulHeuristicResult_t* result, int* found) {
  const uint64_t ws = kWorkspaceBytes;
  cublasLtMatmulPreference_t pref = nullptr;
  bool ok = MEGASCOPE_CUDA_TRY(*err_, cublasLtMatmulPreferenceCreate(&pref));
  if (ok) {
    for (auto attr :
         {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
          CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
      ok = ok && MEGASCOPE_CUDA_TRY(*err_, cublasLtMatmulPreferenceSetAttribute(
                                               pref, attr, &align_bytes, sizeof(align_bytes)));
    }
    ok = ok && MEGASCOPE_CUDA_TRY(
                   *err_, cublasLtMatmulPreferenceSetAttribute(
                              pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    if (ok && epilogue) {
      // An epilogue this cuBLASLt or this shape does not support is not an error: unfused ops
      // do the same work.
      if (cublasLtMatmulAlgoGetHeuristic(handle_, p.op, p.a, p.b, p.c, p.c, pref, 1, result,
                                         found) != CUBLAS_STATUS_SUCCESS)
        *found = 0;
    } else {
      ok = ok &&
           MEGASCOPE_CUDA_TRY(*err_, cublasLtMatmulAlgoGetHeuristic(handle_, p.op, p.a, p.b, p.c,
                                                                    p.c, pref, 1, result, found));
    }
  }
  if (pref != nullptr) cublasLtMatmulPreferenceDestroy(pref);
  return ok;
}

const LtGemm::Plan* LtGemm::Find(const Key& key, void* bias, void* aux) {
  if (auto it = plans_.find(key); it != plans_.end()) return &it->second;
  const auto [ta, tb, m, n, k, batch, sa, sb, sc, align, ab_type, c_type, epilogue] = key;
  const auto ab = static_cast<cudaDataType_t>(ab_type), ct = static_cast<cudaDataType_t>(c_type);
  const cublasComputeType_t compute =
      ab == CUDA_R_32F ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F;
  const cudaDataType_t scale_type = CUDA_R_32F;
  Plan p;
  const cublasOperation_t op_a = tb ? CUBLAS_OP_T : CUBLAS_OP_N;  // on our B
  const cublasOperation_t op_b = ta ? CUBLAS_OP_T : CUBLAS_OP_N;  // on our A
  const uint64_t a_rows = tb ? k : n, a_cols = tb ? n : k;
  const uint64_t b_rows = ta ? m : k, b_cols = ta ? k : m;
  const uint32_t align_bytes = static_cast<uint32_t>(align);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  bool ok =
      MEGASCOPE_CUDA_TRY(*err_, cublasLtMatmulDescCreate(&p.op, compute, scale_type)) &&
      MEGASCOPE_CUDA_TRY(*err_, cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA,
                                                               &op_a, sizeof(op_a))) &&
      MEGASCOPE_CUDA_TRY(*err_, cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB,
                                                               &op_b, sizeof(op_b))) &&
      MEGASCOPE_CUDA_TRY(*err_, cublasLtMatrixLayoutCreate(&p.a, ab, a_rows, a_cols, a_rows)) &&
      MEGASCOPE_CUDA_TRY(*err_, cublasLtMatrixLayoutCreate(&p.b, ab, b_rows, b_cols, b_rows)) &&
      MEGASCOPE_CUDA_TRY(*err_, cublasLtMatrixLayoutCreate(&p.c, ct, n, m, n)) &&
      SetPointers(p, static_cast<Epilogue>(epilogue), n, bias, aux);
  if (ok && batch > 1) {
    const int32_t count = batch;
    for (auto [layout, stride] : {std::pair{p.a, sb}, std::pair{p.b, sa}, std::pair{p.c, sc}}) {
      ok = ok &&
           MEGASCOPE_CUDA_TRY(
               *err_, cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                       &count, sizeof(count))) &&
           MEGASCOPE_CUDA_TRY(*err_, cublasLtMatrixLayoutSetAttribute(
                                         layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                         &stride, sizeof(stride)));
    }
  }
  ok = ok &&
       Choose(p, align_bytes, static_cast<Epilogue>(epilogue) != Epilogue::kNone, &result, &found);
  if (ok && found == 0 && static_cast<Epilogue>(epilogue) != Epilogue::kNone) {
    Destroy(&p);
    p = Plan{};
    p.supported = false;  // the caller runs the ops unfused
    return &plans_.emplace(key, p).first->second;
  }
  if (ok && found == 0) {
    ok = err_->Set("cublasLtMatmulAlgoGetHeuristic: no algorithm for a " + std::to_string(m) + "x" +
                       std::to_string(n) + "x" + std::to_string(k) + " GEMM (batch " +
                       std::to_string(batch) + ", alignment " + std::to_string(align) + ")",
                   __FILE__, __LINE__);
  }
  if (!ok) {
    Destroy(&p);
    return nullptr;
  }
  p.algo = result.algo;
  return &plans_.emplace(key, p).first->second;
}

bool LtGemm::Run(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const void* a,
                 int64_t stride_a, const void* b, int64_t stride_b, float beta, void* c,
                 int64_t stride_c, int batch, Types types, Epilogue epilogue, void* bias,
                 void* aux) {
  if (!err_->ok() || m == 0 || n == 0 || batch == 0) return true;
  if (batch == 1) stride_a = stride_b = stride_c = 0;
  const Key key{trans_a,
                trans_b,
                m,
                n,
                k,
                batch,
                stride_a,
                stride_b,
                stride_c,
                Alignment(a, b, c, bias, aux, stride_a, stride_b, stride_c, batch, types),
                static_cast<int>(types.ab),
                static_cast<int>(types.c),
                static_cast<int>(epilogue)};
  const Plan* p = Find(key, bias, aux);
  if (p == nullptr) return true;  // the error is kept
  if (!p->supported) return false;
  if (!SetPointers(*p, epilogue, n, bias, aux)) return true;
  MEGASCOPE_CUDA_TRY(
      *err_, cublasLtMatmul(handle_, p->op, &alpha, b, p->a, a, p->b, &beta, c, p->c, c, p->c,
                            &p->algo, workspace_, kWorkspaceBytes, stream_));
  return true;
}

}  // namespace megascope::kernels::cuda
