#include "megascope/tracer/clock.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace megascope::tracer {
namespace {

TEST(ClockTest, CalibrationMapsTicksLinearly) {
  ClockCalibration c{1000, 5'000'000, 0.5};
  EXPECT_EQ(c.ToNs(1000), 5'000'000);
  EXPECT_EQ(c.ToNs(3000), 5'001'000);
  EXPECT_EQ(c.ToNs(0), 4'999'500);
}

TEST(ClockTest, FakeClockMovesOnlyWhenTold) {
  FakeClock c(100);
  EXPECT_EQ(c.NowNs(), 100);
  EXPECT_EQ(c.NowNs(), 100);
  c.Advance(50);
  EXPECT_EQ(c.NowNs(), 150);
  c.Set(7);
  EXPECT_EQ(c.Ticks(), 7);
}

// Both real clocks must give Unix-epoch time (within a generous 50 ms of CLOCK_REALTIME) and never
// run backwards.
void ExpectEpochAndMonotonic(Clock& c) {
  int64_t prev = c.NowNs();
  EXPECT_LT(std::llabs(prev - WallNowNs()), 50'000'000) << c.Name();
  for (int i = 0; i < 100000; ++i) {
    int64_t t = c.Ticks();
    int64_t ns = c.Calibration().ToNs(t);
    ASSERT_GE(ns, prev - 1000) << c.Name();  // recalibration may step by < 1 us
    prev = std::max(prev, ns);
  }
}

TEST(ClockTest, MonotonicClockGivesEpochNanoseconds) {
  MonotonicClock c;
  ExpectEpochAndMonotonic(c);
}

TEST(ClockTest, TscClockGivesEpochNanoseconds) {
  if (!TscIsInvariant()) GTEST_SKIP() << "no invariant TSC on this CPU";
  TscClock c;
  ExpectEpochAndMonotonic(c);
  c.Recalibrate();
  EXPECT_LT(std::llabs(c.NowNs() - WallNowNs()), 50'000'000);
  EXPECT_GT(c.Calibration().ns_per_tick, 0.01);  // a TSC between 100 MHz and 100 GHz
  EXPECT_LT(c.Calibration().ns_per_tick, 10.0);
}

}  // namespace
}  // namespace megascope::tracer
