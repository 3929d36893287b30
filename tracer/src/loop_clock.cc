#include "megascope/tracer/loop_clock.h"

#include <thread>

#include "megascope/tracer/clock.h"

namespace megascope::tracer {
namespace {

class RealClock final : public LoopClock {
 public:
  TimePoint Now() override { return std::chrono::steady_clock::now(); }
  int64_t WallNs() override { return WallNowNs(); }
  void Sleep(std::chrono::duration<double> d) override { std::this_thread::sleep_for(d); }
};

}  // namespace

LoopClock& RealLoopClock() {
  static RealClock clock;
  return clock;
}

}  // namespace megascope::tracer
