// The arena behind live hang analysis' entries: aligned, non-overlapping memory across regions,
// containers that move with their arena and copy onto the heap, memory that outlives its first
// owner.
#include "megascope/tracer/arena.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <new>
#include <utility>
#include <vector>

namespace megascope::tracer {
namespace {

TEST(ArenaTest, AllocationsAreAlignedDisjointAndSpanRegions) {
  Arena arena;
  struct Block {
    unsigned char* p;
    size_t n;
  };
  std::vector<Block> blocks;
  // 30 MB, then odd sizes and alignments, then 100 MB (larger than a region): several regions.
  const std::vector<std::pair<size_t, size_t>> asks = {
      {30u << 20, 8}, {3, 1}, {17, 16}, {30u << 20, 64}, {4096, 4096}, {100u << 20, 8}, {5, 2}};
  for (auto [n, align] : asks) {
    auto* p = static_cast<unsigned char*>(arena.Allocate(n, align));
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % align, 0u) << n;
    std::memset(p, static_cast<int>(blocks.size() + 1), n);
    blocks.push_back({p, n});
  }
  // Every block still holds its own byte from end to end: none overlapped another.
  for (size_t i = 0; i < blocks.size(); ++i) {
    const unsigned char want = static_cast<unsigned char>(i + 1);
    EXPECT_EQ(blocks[i].p[0], want) << i;
    EXPECT_EQ(blocks[i].p[blocks[i].n / 2], want) << i;
    EXPECT_EQ(blocks[i].p[blocks[i].n - 1], want) << i;
  }
  size_t total = 0;
  for (const Block& b : blocks) total += b.n;
  EXPECT_EQ(arena.bytes_allocated(), total);
  EXPECT_GE(arena.bytes_mapped(), total);
  EXPECT_LT(arena.bytes_mapped(), 2 * total);
  EXPECT_THROW(arena.Allocate(size_t{1} << 50, 8), std::bad_alloc);
}

TEST(ArenaTest, ASmallArenaMapsLittle) {
  Arena arena;
  for (int i = 0; i < 1000; ++i) arena.Allocate(80, 8);
  EXPECT_EQ(arena.bytes_mapped(), Arena::kFirstRegion);
  // Regions double: 1 MB more is two more (512 KB, 1 MB), not a 64-MB one.
  for (int i = 0; i < 1024; ++i) arena.Allocate(1024, 8);
  EXPECT_EQ(arena.bytes_mapped(), Arena::kFirstRegion + (size_t{3} << 19));
}

TEST(ArenaTest, ContainersMoveWithTheirArenaAndCopyOntoTheHeap) {
  auto arena = std::make_shared<Arena>();
  using Vec = std::vector<int64_t, ArenaAllocator<int64_t>>;
  Vec v{ArenaAllocator<int64_t>(arena)};
  for (int64_t i = 0; i < 100000; ++i) v.push_back(i * 3);  // grows: old storage stays unused
  EXPECT_GE(arena->bytes_allocated(), v.size() * sizeof(int64_t));

  const Vec copy = v;
  EXPECT_EQ(copy.get_allocator().arena(), nullptr);  // a copy never keeps an arena alive
  EXPECT_EQ(copy, v);

  Vec moved;
  moved = std::move(v);
  EXPECT_EQ(moved.get_allocator().arena(), arena);
  const size_t before = arena->bytes_allocated();
  moved.shrink_to_fit();  // reallocates from the arena it moved with
  EXPECT_GT(arena->bytes_allocated(), before);

  // The arena lives as long as the last container on it.
  std::weak_ptr<Arena> alive = arena;
  arena.reset();
  EXPECT_FALSE(alive.expired());
  for (size_t i = 0; i < moved.size(); i += 997) ASSERT_EQ(moved[i], static_cast<int64_t>(i) * 3);
  moved = Vec();
  EXPECT_TRUE(alive.expired());
}

TEST(ArenaTest, WithoutAnArenaItIsTheHeap) {
  std::vector<int, ArenaAllocator<int>> v(1000, 7);
  EXPECT_EQ(v.get_allocator().arena(), nullptr);
  EXPECT_EQ(v[999], 7);
  EXPECT_EQ(ArenaAllocator<int>(), ArenaAllocator<char>());
  EXPECT_NE(ArenaAllocator<int>(std::make_shared<Arena>()), ArenaAllocator<int>());
}

}  // namespace
}  // namespace megascope::tracer
