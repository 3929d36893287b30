// What the benchmarks that record share: a tracer on a ring in /dev/shm (removed at close), and a
// thread that drains the ring as the agent would, so that recording never runs into a full ring.
#pragma once

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "megascope/tracer/tracer.h"

namespace megascope::tracer {

inline RingOptions BenchOptions(uint32_t capacity) {
  RingOptions o;
  o.dir = "/dev/shm";
  o.job = "bench-" + std::to_string(::getpid());
  o.lanes = 1;
  o.lane_capacity = capacity;
  o.flight_entries = 1024;
  return o;
}

inline std::unique_ptr<Tracer> MakeTracer(uint32_t capacity) {
  auto t = Tracer::Create(BenchOptions(capacity));
  if (!t.ok()) {
    std::fprintf(stderr, "%s\n", t.status().ToString().c_str());
    std::abort();
  }
  (*t)->ring().set_unlink_on_close(true);
  return std::move(t).value();
}

// Drains the ring on the other core while the benchmark records, as the agent would.
class BackgroundDrain {
 public:
  explicit BackgroundDrain(const std::string& path)
      : reader_(std::move(RingReader::Attach(path, RingReader::Mode::kConsume)).value()),
        thread_([this] {
          std::vector<Record> buf(4096);
          // Like the agent: drain everything there is, then wait for the next poll.
          while (!stop_.load(std::memory_order_relaxed)) {
            while (reader_->Drain(buf) > 0) {
            }
            std::this_thread::sleep_for(std::chrono::microseconds(200));
          }
        }) {}
  ~BackgroundDrain() {
    stop_.store(true);
    thread_.join();
  }
  uint64_t Dropped() const { return reader_->Dropped(); }

 private:
  std::unique_ptr<RingReader> reader_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace megascope::tracer
