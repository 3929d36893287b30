// A floor under the stack size that libraries ask for their threads.
//
// glibc places a thread's static TLS (the initial-exec TLS of every library loaded at start) on
// that thread's stack and refuses to create a thread whose requested stack cannot hold it.
// Debian's civetweb asks 100 KB for each server thread, and the CUDA build links cuBLASLt, whose
// static TLS alone is 92 KB (with CUDA's runtime and NCCL, 110 KB): every HTTP server of that build
// (the agent's, the controller's control endpoint) failed to start a thread. Defined in the
// executable, this interposes on the libraries' calls and gives them at least kFloor.
#include <dlfcn.h>
#include <pthread.h>

#include <cstddef>

namespace {

constexpr size_t kFloor = size_t{1} << 20;

using SetStackSize = int (*)(pthread_attr_t*, size_t);

SetStackSize Real() {
  static const SetStackSize real =
      reinterpret_cast<SetStackSize>(dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  return real;
}

}  // namespace

extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, size_t size) noexcept {
  const SetStackSize real = Real();
  if (real == nullptr) return 0;  // the attribute keeps its default size (8 MiB), which is safe
  return real(attr, size < kFloor ? kFloor : size);
}
