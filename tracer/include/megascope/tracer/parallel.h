// Runs fn(i) for every i in [0, n) on up to `workers` threads, the caller's among them; each index
// once. For reading many dump files or asking many agents side by side (the analyzer's live input,
// the controller's polls).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <thread>
#include <vector>

namespace megascope::tracer {

template <typename Fn>
void ParallelFor(size_t n, size_t workers, const Fn& fn) {
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < n; i = next++) fn(i);
  };
  std::vector<std::thread> pool;
  for (size_t w = 1; w < std::min(workers, n); ++w) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
}

}  // namespace megascope::tracer
