// The per-rank tracer used by the training runtime: spans (RAII scope or explicit begin/end),
// the collective flight recorder (docs/formats.md sequence-number rules, enqueued -> started ->
// completed/failed, progress bytes), the heartbeat and metric samples, all written into the
// rank's shared-memory segment. Hot-path calls cost tens of nanoseconds and never block.
#pragma once

#include <atomic>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

#include "megascope/tracer/clock.h"
#include "megascope/tracer/rank_list.h"
#include "megascope/tracer/ring.h"
#include "megascope/tracer/status.h"

namespace megascope::tracer {

// Identifies one flight-recorder entry (its 1-based id); 0 is "no op".
using OpHandle = uint64_t;

class Tracer {
 public:
  // Creates the rank's segment. `clock` defaults to MakeDefaultClock().
  static Result<std::unique_ptr<Tracer>> Create(const RingOptions& options,
                                                std::shared_ptr<Clock> clock = nullptr);
  ~Tracer();

  // --- set-up (slow path, thread-safe) ---
  Result<NameId> InternName(std::string_view name) { return ring_->InternName(name); }
  Result<GroupId> RegisterGroup(std::string_view name, std::string_view kind,
                                const RankList& ranks);
  Result<GroupId> RegisterGroup(std::string_view name, std::string_view kind,
                                std::span<const int32_t> ranks) {
    return RegisterGroup(name, kind, RankList(ranks.begin(), ranks.end()));
  }
  void SetClockOffset(int64_t offset_ns) { ring_->SetClockOffset(offset_ns); }
  // Re-measures the clock rate (TSC) and publishes it to readers. Call every few seconds.
  void Recalibrate();

  // --- spans (hot path) ---
  int64_t Ticks() {
#if defined(__x86_64__)
    if (tsc_) return static_cast<int64_t>(__rdtsc());  // skips the virtual call
#endif
    return clock_->Ticks();
  }
  void RecordSpan(SpanKind kind, NameId name, int64_t step, int32_t microbatch, int64_t start_ticks,
                  int64_t end_ticks) {
    if (ClaimSpan(kind, name, step, microbatch, start_ticks, end_ticks) != nullptr)
      ring_->Publish();
  }
  // Where a device span ran and what launched it (SpanRecord's device fields).
  struct DeviceInfo {
    uint32_t correlation = 0, device = 0, stream = 0;
    uint64_t bytes = 0;
  };
  // A span of device activity (a kind for which IsDeviceSpan holds), in this tracer's ticks.
  void RecordDeviceSpan(SpanKind kind, NameId name, int64_t step, int64_t start_ticks,
                        int64_t end_ticks, const DeviceInfo& info) {
    Record* r = ClaimSpan(kind, name, step, -1, start_ticks, end_ticks);
    if (r == nullptr) return;
    r->span.correlation = info.correlation;
    r->span.device = info.device;
    r->span.stream = info.stream;
    r->span.bytes = info.bytes;
    ring_->Publish();
  }
  // Explicit begin/end: a Span holds its start time and ends once.
  struct Span {
    SpanKind kind;
    NameId name;
    int32_t microbatch;
    int64_t step;
    int64_t start_ticks;
  };
  Span BeginSpan(SpanKind kind, NameId name, int64_t step, int32_t microbatch = -1) {
    return {kind, name, microbatch, step, Ticks()};
  }
  void EndSpan(const Span& s) {
    RecordSpan(s.kind, s.name, s.step, s.microbatch, s.start_ticks, Ticks());
  }
  // RAII: records [construction, destruction).
  class Scope {
   public:
    Scope(Tracer* t, SpanKind kind, NameId name, int64_t step, int32_t microbatch = -1)
        : t_(t), span_(t->BeginSpan(kind, name, step, microbatch)) {}
    ~Scope() { t_->EndSpan(span_); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Tracer* t_;
    Span span_;
  };

  // --- flight recorder (hot path; an op's calls come from one thread at a time) ---
  // Collectives: seq counts this rank's collectives in `group`. Send/recv: seq counts ops to
  // (send) or from (recv) `peer` in `group`. Returns 0 for an unknown group or peer.
  OpHandle Enqueue(GroupId group, OpType op, uint64_t bytes, DType dtype, int32_t peer = -1);
  void Start(OpHandle h);
  void Progress(OpHandle h, int64_t bytes_sent, int64_t bytes_received);
  // Where the op's data waits now (GPU side or network side), for a hang's evidence.
  void SetWaiting(OpHandle h, WaitSide side);
  void Complete(OpHandle h) { Finish(h, OpState::kCompleted); }
  void Fail(OpHandle h) { Finish(h, OpState::kFailed); }

  // --- heartbeat and metrics ---
  // Sets step and phase and refreshes the heartbeat time; also pushes a heartbeat record.
  void SetPhase(int64_t step, Phase phase);
  // Refreshes the heartbeat time only (a liveness tick from a background thread).
  void Touch();
  void RecordMetric(NameId name, double value);
  // The step of the last SetPhase (0 before any).
  int64_t step() const { return step_.load(std::memory_order_relaxed); }

  // --- reading back ---
  RankSnapshot Snapshot() const { return ring_->Snapshot(); }
  // The docs/formats.md section 1 dump of this rank, alive. Defined by megascope::tracer (JSON,
  // stacks), not by the capture core: a process that links only the core never calls these.
  // With `stacks`, the dump carries every thread's backtrace but the caller's (stacks.h): what a
  // rank asked by SIGUSR1 writes, for grouping ranks by what their threads are doing.
  std::string DumpJson(bool stacks = false) const;
  Status WriteDump(const std::string& path, bool stacks = false) const;

  RingWriter& ring() { return *ring_; }
  // Tracing off: spans, flight-recorder entries and metrics are skipped (the heartbeat still
  // beats; an op enqueued while on still completes). For measuring what tracing costs; not for
  // production. May be switched while other threads record (the bench alternates it by step).
  void set_enabled(bool on) { enabled_.store(on, std::memory_order_relaxed); }
  Clock& clock() { return *clock_; }

 private:
  Tracer() = default;
  void Finish(OpHandle h, OpState state);
  // A span record claimed and filled but not yet published; null when tracing is off or the ring
  // is full.
  Record* ClaimSpan(SpanKind kind, NameId name, int64_t step, int32_t microbatch,
                    int64_t start_ticks, int64_t end_ticks) {
    if (!enabled_.load(std::memory_order_relaxed)) return nullptr;
    Record* r = ring_->Claim();
    if (r == nullptr) return nullptr;
    r->span.type = RecordType::kSpan;
    r->span.kind = kind;
    r->span.name = name;
    r->span.microbatch = microbatch;
    r->span.step = step;
    r->span.start_ticks = start_ticks;
    r->span.end_ticks = end_ticks;
    return r;
  }
  SharedFlightEntry* Local(OpHandle h);
  void WriteHeartbeatLocked(int64_t ticks);

  struct GroupState {
    RankList ranks;
    std::atomic<uint64_t> coll_seq{0};
    // Point-to-point sequence numbers by member index, sends then receives: made at the group's
    // first send or receive (a world of 100,000 ranks that only ever all-reduces needs none).
    std::atomic<std::atomic<uint64_t>*> p2p_seq{nullptr};
    std::unique_ptr<std::atomic<uint64_t>[]> p2p_owned;  // guarded by groups_mu_
  };
  std::atomic<uint64_t>* P2PSeq(GroupState& g);

  std::shared_ptr<Clock> clock_;
  bool tsc_ = false;  // clock_ is a TscClock
  std::atomic<bool> enabled_{true};
  std::unique_ptr<RingWriter> ring_;
  std::mutex groups_mu_;
  std::unique_ptr<std::unique_ptr<GroupState>[]> groups_;  // max_groups slots; append-only
  std::atomic<size_t> num_groups_{0};
  std::unique_ptr<SharedFlightEntry[]> mirror_;  // process-local copy of each slot
  uint32_t flight_cap_ = 0;
  std::atomic_flag hb_lock_ = ATOMIC_FLAG_INIT;  // the heartbeat has one writer at a time
  int64_t hb_step_ = 0;                          // guarded by hb_lock_
  std::atomic<int64_t> step_{0};                 // hb_step_, for other threads' records
  Phase hb_phase_ = Phase::kInit;
};

}  // namespace megascope::tracer
