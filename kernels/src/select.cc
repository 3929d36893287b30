// The one place the compute backend is chosen (kineto's rule; DESIGN.md section 3).
#include "megascope/kernels/kernels.h"

#ifdef MEGASCOPE_HAVE_CUDA
#include "cuda/cuda_kernels.h"
#endif

namespace megascope::kernels {

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
