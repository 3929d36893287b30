// Private: the layout of a ring segment, shared by RingWriter and RingReader. Everything is at a
// fixed offset from the mapping's base, so processes may map it at different addresses.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "megascope/tracer/ring.h"

namespace megascope::tracer {

// A seqlock over N words: one writer at a time; readers retry while a write is in flight.
// Data words are relaxed atomics so the pattern is race-free under the C++ memory model (TSan).
template <size_t N>
struct SeqBlock {
  std::atomic<uint64_t> seq;
  std::atomic<uint64_t> words[N];

  template <typename T>
  void Store(const T& value) {
    static_assert(sizeof(T) == N * 8 && std::is_trivially_copyable_v<T>);
    uint64_t w[N];
    std::memcpy(w, &value, sizeof(w));
    uint64_t s = seq.load(std::memory_order_relaxed);
    seq.store(s + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    for (size_t i = 0; i < N; ++i) words[i].store(w[i], std::memory_order_relaxed);
    seq.store(s + 2, std::memory_order_release);
  }

  // One attempt; false when a write was in flight (retry).
  template <typename T>
  bool TryLoad(T* out) const {
    static_assert(sizeof(T) == N * 8 && std::is_trivially_copyable_v<T>);
    uint64_t s1 = seq.load(std::memory_order_acquire);
    if (s1 & 1) return false;
    uint64_t w[N];
    for (size_t i = 0; i < N; ++i) w[i] = words[i].load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (seq.load(std::memory_order_relaxed) != s1) return false;
    std::memcpy(out, w, sizeof(w));
    return true;
  }

  // Retries a bounded number of times (a writer that died mid-write leaves the block torn).
  template <typename T>
  bool Load(T* out) const {
    for (int i = 0; i < 100000; ++i) {
      if (TryLoad(out)) return true;
    }
    return false;
  }
};

struct NameSlot {
  char name[64];
};
struct GroupSlot {
  char name[48];
  char kind[8];
  uint32_t offset;  // first of its runs in the run pool
  uint32_t count;   // runs
};
static_assert(sizeof(GroupSlot) == 64);
// Group members as arithmetic runs (RankList's): a world of any size is one.
struct RunSlot {
  int32_t first;
  int32_t stride;
  uint32_t count;
};
static_assert(sizeof(RunSlot) == 12);

struct LaneControl {
  alignas(64) std::atomic<uint64_t> head;     // written by the lane's producer
  alignas(64) std::atomic<uint64_t> tail;     // written by the consumer
  alignas(64) std::atomic<uint64_t> dropped;  // written by the lane's producer
};

struct CalibrationWords {
  int64_t base_ticks;
  int64_t base_ns;
  double ns_per_tick;
};
struct HeartbeatWords {
  int64_t step;
  uint64_t phase;
  int64_t ticks;
  uint64_t reserved;
};

struct SegmentHeader {
  std::atomic<uint64_t> magic;  // stored last by the creator
  uint32_t version;
  uint32_t record_version;
  uint64_t total_size;
  uint32_t lanes, lane_capacity, flight_entries, max_names, max_groups, rank_runs;
  uint64_t names_off, groups_off, pool_off, flight_off, lanes_off, slots_off;
  char job[64];
  char node[64];
  char clock_name[16];
  int32_t rank, world_size, local_rank, attempt, pid, dp, pp, tp;
  uint64_t pid_start_time;  // /proc/<pid>/stat starttime, to tell a reused pid
  int64_t created_ns;
  std::atomic<int64_t> clock_offset_ns;
  std::atomic<uint32_t> num_names;
  std::atomic<uint32_t> num_groups;
  uint32_t runs_used;  // creator-only
  std::atomic<uint32_t> closed;
  std::atomic<uint64_t> flight_head;  // flight-recorder ids handed out so far
  std::atomic<uint64_t> unlaned_dropped;
  SeqBlock<3> calibration;
  SeqBlock<4> heartbeat;
};
static_assert(sizeof(SegmentHeader) <= 4096);

struct Segment {
  SegmentHeader hdr;

  const char* base() const { return reinterpret_cast<const char*>(this); }
  char* base() { return reinterpret_cast<char*>(this); }
  NameSlot* names() { return reinterpret_cast<NameSlot*>(base() + hdr.names_off); }
  const NameSlot* names() const {
    return reinterpret_cast<const NameSlot*>(base() + hdr.names_off);
  }
  GroupSlot* groups() { return reinterpret_cast<GroupSlot*>(base() + hdr.groups_off); }
  const GroupSlot* groups() const {
    return reinterpret_cast<const GroupSlot*>(base() + hdr.groups_off);
  }
  RunSlot* pool() { return reinterpret_cast<RunSlot*>(base() + hdr.pool_off); }
  const RunSlot* pool() const { return reinterpret_cast<const RunSlot*>(base() + hdr.pool_off); }
  SeqBlock<10>* flight() { return reinterpret_cast<SeqBlock<10>*>(base() + hdr.flight_off); }
  const SeqBlock<10>* flight() const {
    return reinterpret_cast<const SeqBlock<10>*>(base() + hdr.flight_off);
  }
  LaneControl* lanes() { return reinterpret_cast<LaneControl*>(base() + hdr.lanes_off); }
  const LaneControl* lanes() const {
    return reinterpret_cast<const LaneControl*>(base() + hdr.lanes_off);
  }
  Record* slots(uint32_t lane) {
    return reinterpret_cast<Record*>(base() + hdr.slots_off) + size_t{lane} * hdr.lane_capacity;
  }
  const Record* slots(uint32_t lane) const {
    return reinterpret_cast<const Record*>(base() + hdr.slots_off) +
           size_t{lane} * hdr.lane_capacity;
  }
};

ClockCalibration LoadCalibration(const Segment& s);
RankSnapshot TakeSnapshot(const Segment& s);
// /proc/<pid>/stat start time (clock ticks since boot), 0 if the process does not exist.
uint64_t ProcessStartTime(int pid);

}  // namespace megascope::tracer
