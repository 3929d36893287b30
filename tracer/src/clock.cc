#include "megascope/tracer/clock.h"

#include <time.h>
#include <x86intrin.h>

#include <fstream>
#include <string>

namespace megascope::tracer {
namespace {

int64_t ReadClock(clockid_t id) {
  timespec ts;
  clock_gettime(id, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// CLOCK_REALTIME - CLOCK_MONOTONIC, read with the tightest bracket of three tries.
int64_t EpochOffsetNs() {
  int64_t best_gap = INT64_MAX, offset = 0;
  for (int i = 0; i < 3; ++i) {
    int64_t m0 = ReadClock(CLOCK_MONOTONIC);
    int64_t r = ReadClock(CLOCK_REALTIME);
    int64_t m1 = ReadClock(CLOCK_MONOTONIC);
    if (m1 - m0 < best_gap) {
      best_gap = m1 - m0;
      offset = r - (m0 + (m1 - m0) / 2);
    }
  }
  return offset;
}

// A (tsc, monotonic ns) pair read as close together as possible.
std::pair<int64_t, int64_t> TscMonoPair() {
  int64_t best_gap = INT64_MAX, tsc = 0, mono = 0;
  for (int i = 0; i < 5; ++i) {
    int64_t t0 = static_cast<int64_t>(__rdtsc());
    int64_t m = ReadClock(CLOCK_MONOTONIC);
    int64_t t1 = static_cast<int64_t>(__rdtsc());
    if (t1 - t0 < best_gap) {
      best_gap = t1 - t0;
      tsc = t0 + (t1 - t0) / 2;
      mono = m;
    }
  }
  return {tsc, mono};
}

}  // namespace

int64_t WallNowNs() { return ReadClock(CLOCK_REALTIME); }

MonotonicClock::MonotonicClock() { cal_ = {0, EpochOffsetNs(), 1.0}; }  // ns = ticks + offset

int64_t MonotonicClock::Ticks() { return ReadClock(CLOCK_MONOTONIC); }

TscClock::TscClock() {
  epoch_offset_ns_ = EpochOffsetNs();
  auto [t0, m0] = TscMonoPair();
  start_tsc_ = t0;
  start_mono_ns_ = m0;
  // A 5 ms baseline gives the rate to ~1e-5; Recalibrate() refines it over longer spans.
  timespec pause{0, 5'000'000};
  nanosleep(&pause, nullptr);
  Recalibrate();
}

int64_t TscClock::Ticks() { return static_cast<int64_t>(__rdtsc()); }

ClockCalibration TscClock::Calibration() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cal_;
}

void TscClock::Recalibrate() {
  auto [t, m] = TscMonoPair();
  std::lock_guard<std::mutex> lock(mu_);
  if (t <= start_tsc_) return;
  cal_.ns_per_tick = static_cast<double>(m - start_mono_ns_) / static_cast<double>(t - start_tsc_);
  cal_.base_ticks = t;
  cal_.base_ns = m + epoch_offset_ns_;
}

bool TscIsInvariant() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) == 0) {
      return line.find(" constant_tsc") != std::string::npos &&
             line.find(" nonstop_tsc") != std::string::npos;
    }
  }
  return false;
}

std::unique_ptr<Clock> MakeDefaultClock() {
  if (TscIsInvariant()) return std::make_unique<TscClock>();
  return std::make_unique<MonotonicClock>();
}

}  // namespace megascope::tracer
