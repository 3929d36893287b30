// Backtraces of every thread, taken in-process: a thread parked in a known function is found
// there, by name, and the capturing thread is left out.
#include "megascope/tracer/stacks.h"

#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace megascope::tracer {
namespace {

std::mutex mu;
std::condition_variable cv;
bool release = false;
std::atomic<int> parked_tid{0};

__attribute__((noinline)) void ParkedInAKnownPlace() {
  parked_tid = static_cast<int>(::syscall(SYS_gettid));
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [] { return release; });
  asm volatile("");  // keeps the frame from being a tail call
}

TEST(StacksTest, AParkedThreadIsFoundInItsFunctionByName) {
  std::thread t([] { ParkedInAKnownPlace(); });
  while (parked_tid.load() == 0) std::this_thread::yield();
  // The thread may not be in its wait yet: capture until it is (at most a few rounds).
  bool found = false;
  std::vector<ThreadStack> stacks;
  for (int round = 0; round < 100 && !found; ++round) {
    stacks = CaptureThreadStacks();
    for (const ThreadStack& s : stacks) {
      if (s.tid != parked_tid) continue;
      for (const std::string& f : s.frames)
        found |= FrameFunction(f).find("ParkedInAKnownPlace") != std::string::npos;
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
  }
  cv.notify_all();
  t.join();
  EXPECT_TRUE(found);
  const int self = static_cast<int>(::syscall(SYS_gettid));
  for (const ThreadStack& s : stacks) {
    EXPECT_NE(s.tid, self) << "the capturing thread is left out";
    if (s.tid == parked_tid) {
      ASSERT_FALSE(s.frames.empty());
      EXPECT_NE(s.frames.back().find('('), std::string::npos) << "frames name their module";
    }
  }
}

TEST(StacksTest, AFrameComparesByItsFunctionAlone) {
  EXPECT_EQ(FrameFunction("megascope::runtime::Worker::Step(long)+0x1c (megascope)"),
            "megascope::runtime::Worker::Step(long)");
  EXPECT_EQ(FrameFunction("std::function<void ()>::operator()() const+0x2 (megascope)"),
            "std::function<void ()>::operator()() const");
  EXPECT_EQ(FrameFunction("??+0x1234 (libc.so.6)"), "??");
  EXPECT_EQ(FrameFunction("all_reduce at /x/distributed_c10d.py:2050"),
            "all_reduce at /x/distributed_c10d.py:2050");
}

}  // namespace
}  // namespace megascope::tracer
