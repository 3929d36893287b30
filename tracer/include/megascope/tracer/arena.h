// Memory for many arrays that are filled once and freed together: the index of every rank's ops in
// a 100,000-rank live hang analysis (analyzer/hang.h RankOps, 0.7 GB). Touching that much fresh
// memory a 4-KB page fault at a time is most of the cost of holding it (bench/touch_cost on our
// paravirtualised build VM: 2.5 GB in 9-11.5 s from the heap, 5.3-6.3 s from an Arena, most of that
// the VM backing memory it had returned to its host; 0.16 s where it had not). An Arena hands out
// memory from regions that double from 256 KB to 64 MB; those of 2 MB and more are backed by
// transparent huge pages and faulted in ahead of use, 2 MB at a time (MADV_POPULATE_WRITE; plain
// faults where the kernel lacks it), so a small arena costs no more than the heap. Nothing is
// returned before the arena is destroyed. One thread allocates from an arena at a time; what it
// handed out may be used and dropped from any thread.
#pragma once

#include <cstddef>
#include <memory>
#include <type_traits>
#include <vector>

namespace megascope::tracer {

class Arena {
 public:
  Arena() = default;
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // `bytes` aligned to `align` (a power of two no larger than 4096); throws std::bad_alloc.
  void* Allocate(size_t bytes, size_t align);
  size_t bytes_allocated() const { return allocated_; }
  size_t bytes_mapped() const;

  static constexpr size_t kHugePage = size_t{2} << 20;
  static constexpr size_t kFirstRegion = size_t{256} << 10;
  static constexpr size_t kRegion = size_t{64} << 20;  // the largest reserved at a time

 private:
  struct Region {
    char* base;
    size_t size;
  };
  std::vector<Region> regions_;
  char* next_ = nullptr;       // the first free byte of the newest region
  char* populated_ = nullptr;  // faulted in up to here
  char* end_ = nullptr;
  bool huge_ = false;  // the newest region's
  size_t allocated_ = 0;
};

// A standard allocator over an Arena (or the heap when it has none). Moving a container moves its
// arena with it; copying one copies onto the heap, so that a copy never keeps an arena alive.
template <typename T>
class ArenaAllocator {
 public:
  using value_type = T;
  using propagate_on_container_move_assignment = std::true_type;
  using propagate_on_container_swap = std::true_type;
  using is_always_equal = std::false_type;

  ArenaAllocator() noexcept = default;
  explicit ArenaAllocator(std::shared_ptr<Arena> arena) noexcept : arena_(std::move(arena)) {}
  template <typename U>
  ArenaAllocator(const ArenaAllocator<U>& other) noexcept  // NOLINT(google-explicit-constructor)
      : arena_(other.arena()) {}

  T* allocate(size_t n) {
    if (!arena_) return std::allocator<T>().allocate(n);
    return static_cast<T*>(arena_->Allocate(n * sizeof(T), alignof(T)));
  }
  void deallocate(T* p, size_t n) noexcept {
    if (!arena_) std::allocator<T>().deallocate(p, n);
  }
  ArenaAllocator select_on_container_copy_construction() const { return {}; }
  // By value: get_allocator() returns a temporary, and a reference into it would dangle.
  std::shared_ptr<Arena> arena() const { return arena_; }

  template <typename U>
  bool operator==(const ArenaAllocator<U>& other) const {
    return arena_ == other.arena();
  }
  template <typename U>
  bool operator!=(const ArenaAllocator<U>& other) const {
    return !(*this == other);
  }

 private:
  std::shared_ptr<Arena> arena_;
};

}  // namespace megascope::tracer
