// What holding fresh memory costs before anything is computed in it: the live hang analysis of
// 100,000 ranks fills 2.5 GB of flight-recorder entries (25 million of 80 bytes). The same bytes,
// written once a page, five ways side by side in one run, rounds alternating:
//   arena      tracer::Arena (arena.h) holding one vector a rank (as the live hang analysis holds
//              its index, hang.h)
//   thp+ahead  one mmap with MADV_HUGEPAGE, then MADV_POPULATE_WRITE (Linux 5.14)
//   populate   one mmap(MAP_POPULATE) (4-KB pages faulted in by the kernel in one call)
//   thp        one mmap with MADV_HUGEPAGE (a 2-MB page fault as touched, where THP allows)
//   heap       one std::vector of 256 entries a rank (malloc; 4-KB page faults as touched)
// On a VM whose balloon reports free pages to its host (virtio free page reporting, ~2 s after a
// free), memory freed a moment ago is fast to take again and memory freed earlier is backed anew
// at first touch, as a fresh analyzer's is: each way starts PAUSE seconds after the last one ended
// so that all start from the same state (0: back to back, each getting what the one before freed).
// Usage: touch_cost [MB] [ROUNDS] [PAUSE]   (default 2500 MB, 3 rounds, 5 s; medians printed)
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "megascope/tracer/arena.h"
#include "megascope/tracer/snapshot.h"  // the entries' size

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

using megascope::tracer::Arena;
using megascope::tracer::ArenaAllocator;
using FlightEntries =
    std::vector<megascope::tracer::FlightEntry,
                megascope::tracer::ArenaAllocator<megascope::tracer::FlightEntry>>;
using megascope::tracer::FlightEntry;

namespace {

constexpr size_t kPerRank = 256;  // entries a rank, as live_scale

void TouchPages(char* p, size_t n) {
  for (size_t i = 0; i < n; i += 4096) p[i] = 1;
}

// One mmap of `n` bytes, prepared by `advise`, written once a page, unmapped.
void Mapped(size_t n, int flags, const std::function<void(char*)>& advise) {
  void* m = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | flags, -1, 0);
  if (m == MAP_FAILED) {
    std::perror("mmap");
    std::exit(1);
  }
  auto* p = static_cast<char*>(m);
  advise(p);
  TouchPages(p, n);
  ::munmap(m, n);
}

// One vector a rank, each entry written, as a reader fills them.
template <typename Vec>
void Ranks(size_t n, const std::function<Vec()>& make) {
  const size_t ranks = n / (kPerRank * sizeof(FlightEntry));
  std::vector<Vec> all;
  all.reserve(ranks);
  for (size_t r = 0; r < ranks; ++r) {
    Vec v = make();
    v.resize(kPerRank);
    for (size_t i = 0; i < kPerRank; ++i) v[i].seq = i;
    all.push_back(std::move(v));
  }
}

}  // namespace

int main(int argc, char** argv) {
  const size_t mb = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 2500;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 3;
  const int pause = argc > 3 ? std::atoi(argv[3]) : 5;
  if (mb == 0 || rounds < 1 || pause < 0) {
    std::fprintf(stderr, "usage: touch_cost [MB > 0] [ROUNDS > 0] [PAUSE >= 0 seconds]\n");
    return 2;
  }
  const size_t n = mb << 20;
  struct Way {
    std::string name;
    std::function<void()> run;
    std::vector<double> seconds;
  };
  std::vector<Way> ways = {
      {"arena",
       [&] {
         auto arena = std::make_shared<Arena>();
         Ranks<FlightEntries>(n, [&] { return FlightEntries(ArenaAllocator<FlightEntry>(arena)); });
       },
       {}},
      {"thp+ahead",
       [&] {
         Mapped(n, 0, [&](char* p) {
           ::madvise(p, n, MADV_HUGEPAGE);
           ::madvise(p, n, MADV_POPULATE_WRITE);
         });
       },
       {}},
      {"populate", [&] { Mapped(n, MAP_POPULATE, [](char*) {}); }, {}},
      {"thp", [&] { Mapped(n, 0, [&](char* p) { ::madvise(p, n, MADV_HUGEPAGE); }); }, {}},
      {"heap",
       [&] { Ranks<std::vector<FlightEntry>>(n, [] { return std::vector<FlightEntry>(); }); },
       {}},
  };
  for (int r = 0; r < rounds; ++r) {
    for (Way& w : ways) {
      std::this_thread::sleep_for(std::chrono::seconds(pause));
      const auto t0 = std::chrono::steady_clock::now();
      w.run();
      w.seconds.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  std::printf(
      "%zu MB written once a page, each way %d s after the last; median of %d "
      "alternating rounds:\n",
      mb, pause, rounds);
  std::vector<double> medians;
  for (Way& w : ways) {
    std::sort(w.seconds.begin(), w.seconds.end());
    medians.push_back(w.seconds[w.seconds.size() / 2]);
  }
  for (size_t i = 0; i < ways.size(); ++i) {
    std::printf("  %-10s %7.3f s  (x%.3f of heap; rounds %.3f..%.3f s)\n", ways[i].name.c_str(),
                medians[i], medians[i] / medians.back(), ways[i].seconds.front(),
                ways[i].seconds.back());
  }
  return 0;
}
