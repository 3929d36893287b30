// Time as a loop sees it (the controller's, the agent's): monotonic time for when things are due,
// wall time for what it records, and its waits. Loops take one so that tests drive their
// decisions with a fake (tests/controller/fake_fleet.h, tests/tracer/agent/agent_test.cc).
#pragma once

#include <chrono>
#include <cstdint>

namespace megascope::tracer {

class LoopClock {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  virtual ~LoopClock() = default;
  virtual TimePoint Now() = 0;
  virtual int64_t WallNs() = 0;  // ns since the epoch
  virtual void Sleep(std::chrono::duration<double> d) = 0;
};

// steady_clock, the system's wall clock, this_thread::sleep_for.
LoopClock& RealLoopClock();

}  // namespace megascope::tracer
