// Clocks for the tracer. The hot path reads cheap raw ticks (the invariant TSC where the CPU has
// one, else CLOCK_MONOTONIC); a ClockCalibration maps ticks to Unix-epoch nanoseconds off the hot
// path (one epoch offset per process). FakeClock is the seam tests use to control time.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>

namespace megascope::tracer {

// Maps raw ticks to epoch ns: ns = base_ns + (ticks - base_ticks) * ns_per_tick.
struct ClockCalibration {
  int64_t base_ticks = 0;
  int64_t base_ns = 0;
  double ns_per_tick = 1.0;

  int64_t ToNs(int64_t ticks) const {
    const int64_t delta = ticks - base_ticks;
    if (ns_per_tick == 1.0) return base_ns + delta;  // exact, whatever the magnitude
    return base_ns + static_cast<int64_t>(static_cast<double>(delta) * ns_per_tick);
  }
};

// Thread-safe. Ticks() is the hot-path call; everything else is slow-path.
class Clock {
 public:
  virtual ~Clock() = default;
  // Raw ticks; monotonic non-decreasing within a process.
  virtual int64_t Ticks() = 0;
  // The current ticks -> epoch-ns mapping.
  virtual ClockCalibration Calibration() const = 0;
  // Short name for logs and ring headers ("tsc", "monotonic", "fake").
  virtual const char* Name() const = 0;
  int64_t NowNs() { return Calibration().ToNs(Ticks()); }
};

// CLOCK_MONOTONIC nanoseconds; epoch offset (CLOCK_REALTIME - CLOCK_MONOTONIC) taken once.
class MonotonicClock final : public Clock {
 public:
  MonotonicClock();
  int64_t Ticks() override;
  ClockCalibration Calibration() const override { return cal_; }
  const char* Name() const override { return "monotonic"; }

 private:
  ClockCalibration cal_;
};

// rdtsc ticks, calibrated against CLOCK_MONOTONIC at construction (a ~5 ms measurement) and by
// every Recalibrate() call, which refines the rate over the whole time since construction.
class TscClock final : public Clock {
 public:
  TscClock();
  int64_t Ticks() override;
  ClockCalibration Calibration() const override;
  const char* Name() const override { return "tsc"; }
  void Recalibrate();

 private:
  mutable std::mutex mu_;
  int64_t start_tsc_ = 0;
  int64_t start_mono_ns_ = 0;
  int64_t epoch_offset_ns_ = 0;
  ClockCalibration cal_;  // guarded by mu_
};

// Time moves only when the test says so. Ticks are epoch ns.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(int64_t start_ns = 1'763'700'000'000'000'000) : now_(start_ns) {}
  int64_t Ticks() override { return now_.load(std::memory_order_relaxed); }
  ClockCalibration Calibration() const override { return {}; }
  const char* Name() const override { return "fake"; }
  void Set(int64_t ns) { now_.store(ns); }
  void Advance(int64_t ns) { now_.fetch_add(ns); }

 private:
  std::atomic<int64_t> now_;
};

// True when the CPU reports an invariant TSC (constant_tsc and nonstop_tsc).
bool TscIsInvariant();
// A TscClock where the TSC is invariant, else a MonotonicClock.
std::unique_ptr<Clock> MakeDefaultClock();
// Epoch ns from CLOCK_REALTIME (slow path; for dumps and logs).
int64_t WallNowNs();

}  // namespace megascope::tracer
