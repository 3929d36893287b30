// Error checks for the CUDA backend. CUDA reports errors late and sticky (a failed kernel shows up
// at a later call), so the backend keeps the first error it sees with the call that returned it,
// CUDA's own message and file:line, and does nothing more once it has one; the runtime turns it
// into a Status at the next Synchronize.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <string>

namespace megascope::kernels::cuda {

// The first error of a backend instance ("" while there is none).
class StickyError {
 public:
  bool ok() const { return message_.empty(); }
  const std::string& message() const { return message_; }
  // Records `what` at file:line unless an earlier error is kept; returns ok().
  bool Set(const std::string& what, const char* file, int line) {
    if (message_.empty()) message_ = what + " (" + file + ":" + std::to_string(line) + ")";
    return false;
  }
  bool Check(cudaError_t e, const char* call, const char* file, int line) {
    if (e == cudaSuccess) return true;
    // The runtime also keeps a failed call's error as the thread's last error, which the next
    // launch check would read as its own (and another backend's, after this one is gone): the
    // error is kept here, so it is taken from there.
    (void)cudaGetLastError();
    return Set(std::string(call) + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e), file,
               line);
  }
  bool Check(cublasStatus_t s, const char* call, const char* file, int line) {
    if (s == CUBLAS_STATUS_SUCCESS) return true;
    return Set(
        std::string(call) + ": " + cublasLtGetStatusName(s) + ": " + cublasLtGetStatusString(s),
        file, line);
  }

 private:
  std::string message_;
};

}  // namespace megascope::kernels::cuda

// Evaluates a CUDA runtime or cuBLASLt call and records a failure in `err` (a StickyError);
// evaluates to whether the call succeeded.
#define MEGASCOPE_CUDA_TRY(err, call) ((err).Check((call), #call, __FILE__, __LINE__))
// Records the launch error of the kernel just launched, if any.
#define MEGASCOPE_CUDA_LAUNCHED(err) \
  ((err).Check(cudaGetLastError(), "kernel launch", __FILE__, __LINE__))
