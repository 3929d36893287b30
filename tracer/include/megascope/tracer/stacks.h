// Backtraces of every thread of this process, taken in-process (libunwind): what each rank's
// threads are doing at a hang, so that ranks can be grouped by stack and the odd one found
// (MegaScale, ByteRobust). Each thread unwinds itself in a signal handler that only does what
// libunwind documents as async-signal-safe (unw_init_local2, unw_step, unw_get_reg) into static
// storage; names are looked up afterwards, on the calling thread.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace megascope::tracer {

struct ThreadStack {
  int tid = 0;
  std::string name;                 // /proc/self/task/<tid>/comm
  std::vector<std::string> frames;  // innermost first: "function+0x1c (module)"
};

// Every thread's stack but the caller's, in thread-id order. A thread that does not answer within
// `per_thread` (it blocks the signal, or is stopped) is listed with no frames. One capture at a
// time per process; safe to call from any thread that is not a signal handler.
std::vector<ThreadStack> CaptureThreadStacks(
    std::chrono::milliseconds per_thread = std::chrono::milliseconds(200), int max_frames = 64);

// A frame without its offset and module ("function"): stacks of different processes of the same
// program compare equal by these.
std::string FrameFunction(const std::string& frame);

}  // namespace megascope::tracer
