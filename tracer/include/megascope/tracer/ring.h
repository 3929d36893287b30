// A rank's shared-memory segment (a file in /dev/shm, mode 0600): a header naming the rank,
// a name table, a group table, the heartbeat, the flight recorder's last N entries (each behind
// its own seqlock) and L single-producer/single-consumer record lanes (one per recording thread).
// RingWriter is the rank's side (the hot path: no locks, no allocation, no syscalls; a full lane
// drops the record and counts it). RingReader is the agent's side: drain lanes, take snapshots.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "megascope/tracer/clock.h"
#include "megascope/tracer/rank_list.h"
#include "megascope/tracer/records.h"
#include "megascope/tracer/snapshot.h"
#include "megascope/tracer/status.h"

namespace megascope::tracer {

inline constexpr uint64_t kRingMagic = 0x4d45474153434f50ULL;  // "MEGASCOP"
inline constexpr uint32_t kRingVersion = 2;                    // 2: group members as runs

struct RingOptions {
  std::string dir = "/dev/shm";  // where ring files live
  std::string job = "default";   // [A-Za-z0-9_-]{1,48}
  std::string node = "node0";
  int32_t rank = 0;
  int32_t world_size = 1;
  int32_t local_rank = 0;
  int32_t attempt = 0;
  Coords coords;
  uint32_t lanes = 4;  // recording threads; a further thread's records are dropped and counted
  uint32_t lane_capacity = 16384;  // records per lane, a power of two
  uint32_t flight_entries = 1024;  // flight-recorder entries kept, >= 256
  uint32_t max_names = 512;
  uint32_t max_groups = 64;
  uint32_t rank_runs = 4096;  // runs of group members (RankList) over all groups
};

// "megascope.<job>.a<attempt>.r<rank>"; RingFilePrefix(job) is what every ring of a job starts
// with.
std::string RingFileName(const std::string& job, int32_t attempt, int32_t rank);
std::string RingFilePrefix(const std::string& job);

struct Segment;  // private layout

// One group-table or name-table id.
using NameId = uint16_t;
using GroupId = uint16_t;

// The raw flight-recorder slot contents shared with readers (times in ticks).
struct SharedFlightEntry {
  uint64_t id;
  uint64_t seq;
  uint64_t bytes;
  int64_t enqueued_ticks;
  int64_t started_ticks;
  int64_t completed_ticks;
  int64_t bytes_sent;
  int64_t bytes_received;
  int32_t peer;
  uint16_t group;
  OpType op;
  OpState state;
  DType dtype;
  WaitSide waiting_on;  // zero (kNone) in rings of writers older than it
  uint8_t reserved[6];
};
static_assert(sizeof(SharedFlightEntry) == 80);

class RingWriter;
namespace detail {
// The calling thread's lane in the writer it used last: a one-entry cache, so the hot path needs
// no lookup; a miss takes the writer's mutex once.
struct LaneCursor {
  std::atomic<uint64_t>* head = nullptr;     // shared: producer position
  std::atomic<uint64_t>* tail = nullptr;     // shared: consumer position
  std::atomic<uint64_t>* dropped = nullptr;  // shared: records dropped on this lane
  Record* slots = nullptr;
  uint64_t mask = 0;
  uint64_t pos = 0;  // local copy of *head
  uint64_t cached_tail = 0;
  uint64_t drops = 0;
};
struct ThreadLane {
  uint64_t writer_uid = 0;
  LaneCursor* cursor = nullptr;  // nullptr with a matching uid: no lane left for this thread
};
inline thread_local constinit ThreadLane t_lane{};
}  // namespace detail

class RingWriter {
 public:
  // Creates the segment. A leftover file of a dead process with the same name is replaced; one
  // held by a live process is AlreadyExists. The file stays after the writer is gone (the agent
  // drains it and removes it) unless unlink_on_close is set.
  static Result<std::unique_ptr<RingWriter>> Create(const RingOptions& options, const Clock& clock);
  ~RingWriter();
  RingWriter(const RingWriter&) = delete;
  RingWriter& operator=(const RingWriter&) = delete;

  // Hot path. Reserves the calling thread's next slot, or returns nullptr (and counts a drop)
  // when its lane is full. Fill the record, then Publish(). One claim at a time per thread.
  Record* Claim() {
    const detail::ThreadLane& tl = detail::t_lane;
    detail::LaneCursor* c = tl.writer_uid == uid_ ? tl.cursor : AcquireLane();
    if (c == nullptr) [[unlikely]]
      return DropUnlaned();
    if (c->pos - c->cached_tail > c->mask) [[unlikely]] {
      if (!RefreshTail(c)) return nullptr;
    }
    return &c->slots[c->pos & c->mask];
  }
  void Publish() {
    detail::LaneCursor* c = detail::t_lane.cursor;
    c->head->store(++c->pos, std::memory_order_release);
  }
  bool Push(const Record& r) {
    Record* slot = Claim();
    if (slot == nullptr) return false;
    *slot = r;
    Publish();
    return true;
  }

  // Slow path, thread-safe. Ids are stable for the life of the segment.
  Result<NameId> InternName(std::string_view name);
  Result<GroupId> RegisterGroup(std::string_view name, std::string_view kind,
                                const RankList& ranks);

  // Flight-recorder slots. AllocateFlightId is thread-safe; an entry must be written by one
  // thread at a time.
  uint64_t AllocateFlightId();
  void WriteFlight(const SharedFlightEntry& e);
  uint32_t flight_capacity() const;

  // Single writer at a time (Tracer serialises).
  void WriteHeartbeat(int64_t step, Phase phase, int64_t ticks);
  void PublishCalibration(const ClockCalibration& cal);
  void SetClockOffset(int64_t offset_ns);
  // Marks the segment as closed cleanly (the rank finished).
  void MarkClosed();

  const std::string& path() const { return path_; }
  const RingOptions& options() const { return options_; }
  // Local view: same as a reader's snapshot of this segment.
  RankSnapshot Snapshot() const;
  void set_unlink_on_close(bool v) { unlink_on_close_ = v; }

 private:
  RingWriter() = default;
  detail::LaneCursor* AcquireLane();
  Record* DropUnlaned();
  // Re-reads the consumer's tail; false (and a drop counted) when the lane is still full.
  bool RefreshTail(detail::LaneCursor* c);

  RingOptions options_;
  std::string path_;
  Segment* seg_ = nullptr;
  size_t size_ = 0;
  bool unlink_on_close_ = false;
  uint64_t uid_ = 0;  // distinguishes writers in thread-local lane caches
  std::unique_ptr<detail::LaneCursor[]> cursors_;
  std::mutex mu_;  // slow path: lane assignment, names, groups
  std::vector<std::pair<std::thread::id, uint32_t>> lane_owners_;
  std::vector<std::string> names_;
  std::atomic<uint64_t> unlaned_dropped_{0};
};

// Reads records of drained lanes. `lane_tails` are the tails to commit.
struct ReadBatch {
  std::vector<uint64_t> lane_tails;
  size_t count = 0;
};

class RingReader {
 public:
  enum class Mode {
    kConsume,       // drains records; one consumer per ring (an exclusive lock, freed if it dies)
    kSnapshotOnly,  // reads header state only; any number at once
  };
  static Result<std::unique_ptr<RingReader>> Attach(const std::string& path, Mode mode);
  ~RingReader();
  RingReader(const RingReader&) = delete;
  RingReader& operator=(const RingReader&) = delete;

  // Copies up to out.size() unconsumed records (lane by lane, oldest first) without consuming
  // them; Commit(batch) consumes them. A reader that dies before Commit loses nothing.
  size_t Read(std::span<Record> out, ReadBatch* batch);
  void Commit(const ReadBatch& batch);
  size_t Drain(std::span<Record> out) {
    ReadBatch b;
    size_t n = Read(out, &b);
    Commit(b);
    return n;
  }

  // Converts record ticks to epoch ns with the ring's latest calibration.
  ClockCalibration Calibration() const;
  // The interned name, or "?<id>" for an id the table does not hold.
  std::string NameOf(NameId id);
  RankSnapshot Snapshot() const;
  const RankInfo& info() const { return info_; }
  // Names this ring's incarnation (file name, writer pid and start time): a rerun that reuses
  // the file name is another ring.
  std::string Incarnation() const;
  // True while the writer process (pid and start time) still exists.
  bool WriterAlive() const;
  bool Closed() const;
  // Records the writer dropped so far (ring full or too many threads).
  uint64_t Dropped() const;
  const std::string& path() const { return path_; }

 private:
  RingReader() = default;
  std::string path_;
  const Segment* seg_ = nullptr;
  Segment* mut_seg_ = nullptr;
  size_t size_ = 0;
  int lock_fd_ = -1;
  RankInfo info_;
  uint64_t writer_start_time_ = 0;
  std::vector<std::string> names_;
};

}  // namespace megascope::tracer
