// A kernel that keeps a stream busy for a while (scripts/gpu-check.sh's NCCL test): what a
// collective queued behind a long or stuck kernel sees.
#include <cuda_runtime.h>

namespace megascope::runtime {
namespace {

__global__ void SpinKernel(int ms) {
  for (int i = 0; i < ms; ++i) {
    for (int j = 0; j < 10; ++j) __nanosleep(100000);  // 0.1 ms at most each
  }
}

}  // namespace

bool SpinOnStream(void* stream, int ms) {
  SpinKernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(ms);
  return cudaGetLastError() == cudaSuccess;
}

}  // namespace megascope::runtime
