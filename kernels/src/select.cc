// The one place the compute backend is chosen (kineto's rule; docs/architecture.md section 3).
#include "megascope/kernels/kernels.h"

#ifdef MEGASCOPE_HAVE_CUDA
#include "cuda/cuda_kernels.h"
#endif

namespace megascope::kernels {

const char* BackendName(Backend b) { return b == Backend::kCuda ? "cuda" : "cpu"; }

bool ParseBackend(const std::string& name, Backend* out) {
  if (name == "cpu") {
    *out = Backend::kCpu;
  } else if (name == "cuda") {
    *out = Backend::kCuda;
  } else {
    return false;
  }
  return true;
}

bool CudaCompiledIn() {
#ifdef MEGASCOPE_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

std::unique_ptr<Kernels> CreateKernels(Backend backend, int device, std::string* error) {
  if (backend == Backend::kCpu) return CreateCpuKernels();
#ifdef MEGASCOPE_HAVE_CUDA
  return CreateCudaKernels(device, error);
#else
  (void)device;
  *error =
      "this megascope was built without CUDA: configure with the cuda preset (cmake --preset "
      "cuda, or -DMEGASCOPE_CUDA=ON) on a machine with nvcc";
  return nullptr;
#endif
}

}  // namespace megascope::kernels
