#include "megascope/tracer/arena.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <new>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

namespace megascope::tracer {
namespace {

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

// `size` bytes of address space; with `huge`, aligned to a huge page and marked for transparent
// huge pages.
char* Reserve(size_t size, bool huge) {
  const size_t padded = huge ? size + Arena::kHugePage : size;
  void* p = ::mmap(nullptr, padded, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  char* raw = static_cast<char*>(p);
  if (!huge) return raw;
  char* base = reinterpret_cast<char*>(  // NOLINT(performance-no-int-to-ptr)
      RoundUp(reinterpret_cast<uintptr_t>(raw), Arena::kHugePage));
  if (base != raw) ::munmap(raw, static_cast<size_t>(base - raw));
  if (char* tail = base + size; tail != raw + padded)
    ::munmap(tail, static_cast<size_t>(raw + padded - tail));
  (void)::madvise(base, size, MADV_HUGEPAGE);  // a hint: without THP, plain pages
  return base;
}

}  // namespace

Arena::~Arena() {
  for (const Region& r : regions_) ::munmap(r.base, r.size);
}

size_t Arena::bytes_mapped() const {
  size_t n = 0;
  for (const Region& r : regions_) n += r.size;
  return n;
}

void* Arena::Allocate(size_t bytes, size_t align) {
  if (bytes == 0) bytes = 1;
  if (bytes > (size_t{1} << 46)) throw std::bad_alloc();
  auto start = [&] {
    return reinterpret_cast<char*>(  // NOLINT(performance-no-int-to-ptr)
        RoundUp(reinterpret_cast<uintptr_t>(next_), align));
  };
  if (next_ == nullptr || start() + bytes > end_) {
    // Twice the last region, from kFirstRegion up to kRegion; a larger allocation its own size.
    const size_t grown =
        regions_.empty() ? kFirstRegion : std::min(2 * regions_.back().size, kRegion);
    huge_ = std::max(bytes, grown) >= kHugePage;
    const size_t size = RoundUp(std::max(bytes, grown), huge_ ? kHugePage : 4096);
    char* base = Reserve(size, huge_);
    regions_.push_back({base, size});
    next_ = populated_ = base;
    end_ = base + size;
  }
  char* p = start();
  next_ = p + bytes;
  if (huge_ && next_ > populated_) {
    // Fault in whole huge pages ahead of use; where the kernel cannot, they fault as touched.
    char* upto = std::min(end_, reinterpret_cast<char*>(  // NOLINT(performance-no-int-to-ptr)
                                    RoundUp(reinterpret_cast<uintptr_t>(next_), kHugePage)));
    (void)::madvise(populated_, static_cast<size_t>(upto - populated_), MADV_POPULATE_WRITE);
    populated_ = upto;
  }
  allocated_ += bytes;
  return p;
}

}  // namespace megascope::tracer
