// The CUDA backend (built with -DMEGASCOPE_CUDA=ON); chosen only by CreateKernels (select.cc).
#pragma once

#include <memory>
#include <string>

#include "megascope/kernels/kernels.h"

namespace megascope::kernels {

// nullptr with *error set when the device cannot be used (no GPU, a driver too old, ...).
std::unique_ptr<Kernels> CreateCudaKernels(int device, std::string* error);

}  // namespace megascope::kernels
