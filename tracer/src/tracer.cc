#include "megascope/tracer/tracer.h"

#include <algorithm>

namespace megascope::tracer {
namespace {

class SpinGuard {
 public:
  explicit SpinGuard(std::atomic_flag& f) : f_(f) {
    while (f_.test_and_set(std::memory_order_acquire)) {
    }
  }
  ~SpinGuard() { f_.clear(std::memory_order_release); }

 private:
  std::atomic_flag& f_;
};

}  // namespace

Result<std::unique_ptr<Tracer>> Tracer::Create(const RingOptions& options,
                                               std::shared_ptr<Clock> clock) {
  if (!clock) clock = MakeDefaultClock();
  ASSIGN_OR_RETURN(auto ring, RingWriter::Create(options, *clock));
  std::unique_ptr<Tracer> t(new Tracer());
  t->tsc_ = dynamic_cast<TscClock*>(clock.get()) != nullptr;
  t->clock_ = std::move(clock);
  t->ring_ = std::move(ring);
  t->flight_cap_ = t->ring_->flight_capacity();
  t->mirror_ = std::make_unique<SharedFlightEntry[]>(t->flight_cap_);
  t->groups_ = std::make_unique<std::unique_ptr<GroupState>[]>(options.max_groups);
  t->Touch();
  return t;
}

Tracer::~Tracer() {
  if (ring_) ring_->MarkClosed();
}

Result<GroupId> Tracer::RegisterGroup(std::string_view name, std::string_view kind,
                                      const RankList& ranks) {
  std::lock_guard<std::mutex> lock(groups_mu_);
  ASSIGN_OR_RETURN(GroupId id, ring_->RegisterGroup(name, kind, ranks));
  if (id < num_groups_.load(std::memory_order_relaxed)) return id;  // same group again
  auto g = std::make_unique<GroupState>();
  g->ranks = ranks;
  groups_[id] = std::move(g);
  num_groups_.store(id + 1, std::memory_order_release);
  return id;
}

void Tracer::Recalibrate() {
  if (auto* tsc = dynamic_cast<TscClock*>(clock_.get())) tsc->Recalibrate();
  ring_->PublishCalibration(clock_->Calibration());
}

std::atomic<uint64_t>* Tracer::P2PSeq(GroupState& g) {
  std::atomic<uint64_t>* seq = g.p2p_seq.load(std::memory_order_acquire);
  if (seq != nullptr) return seq;
  std::lock_guard<std::mutex> lock(groups_mu_);
  if (!g.p2p_owned) {
    g.p2p_owned = std::make_unique<std::atomic<uint64_t>[]>(2 * g.ranks.size());
    g.p2p_seq.store(g.p2p_owned.get(), std::memory_order_release);
  }
  return g.p2p_owned.get();
}

SharedFlightEntry* Tracer::Local(OpHandle h) {
  if (h == 0) return nullptr;
  SharedFlightEntry* e = &mirror_[(h - 1) % flight_cap_];
  return e->id == h ? e : nullptr;  // nullptr: overwritten by a newer op (out of the window)
}

OpHandle Tracer::Enqueue(GroupId group, OpType op, uint64_t bytes, DType dtype, int32_t peer) {
  if (!enabled_.load(std::memory_order_relaxed) ||
      group >= num_groups_.load(std::memory_order_acquire))
    return 0;
  GroupState& g = *groups_[group];
  uint64_t seq;
  if (IsP2P(op)) {
    const int idx = g.ranks.IndexOf(peer);
    if (idx < 0) return 0;
    auto& counter =
        P2PSeq(g)[static_cast<size_t>(idx) + (op == OpType::kSend ? 0 : g.ranks.size())];
    seq = counter.fetch_add(1, std::memory_order_relaxed);
  } else {
    seq = g.coll_seq.fetch_add(1, std::memory_order_relaxed);
    peer = -1;
  }
  const uint64_t id = ring_->AllocateFlightId();
  SharedFlightEntry& e = mirror_[(id - 1) % flight_cap_];
  e = SharedFlightEntry{};
  e.id = id;
  e.seq = seq;
  e.bytes = bytes;
  e.enqueued_ticks = Ticks();
  e.bytes_sent = -1;
  e.bytes_received = -1;
  e.peer = peer;
  e.group = group;
  e.op = op;
  e.state = OpState::kEnqueued;
  e.dtype = dtype;
  ring_->WriteFlight(e);
  return id;
}

void Tracer::Start(OpHandle h) {
  SharedFlightEntry* e = Local(h);
  if (e == nullptr) return;
  e->state = OpState::kStarted;
  e->started_ticks = Ticks();
  ring_->WriteFlight(*e);
}

void Tracer::Progress(OpHandle h, int64_t bytes_sent, int64_t bytes_received) {
  SharedFlightEntry* e = Local(h);
  if (e == nullptr) return;
  e->bytes_sent = bytes_sent;
  e->bytes_received = bytes_received;
  ring_->WriteFlight(*e);
}

void Tracer::SetWaiting(OpHandle h, WaitSide side) {
  SharedFlightEntry* e = Local(h);
  if (e == nullptr || e->waiting_on == side) return;
  e->waiting_on = side;
  ring_->WriteFlight(*e);
}

void Tracer::Finish(OpHandle h, OpState state) {
  SharedFlightEntry* e = Local(h);
  if (e == nullptr) return;
  e->state = state;
  e->completed_ticks = Ticks();
  e->waiting_on = WaitSide::kNone;  // nothing waits any more
  ring_->WriteFlight(*e);
  if (Record* r = ring_->Claim()) {
    CollectiveRecord& c = r->collective;
    c.type = RecordType::kCollective;
    c.op = e->op;
    c.state = state;
    c.dtype = e->dtype;
    c.group = e->group;
    c.peer = e->peer;
    c.step = static_cast<int32_t>(step_.load(std::memory_order_relaxed));
    c.seq = e->seq;
    c.bytes = e->bytes;
    c.enqueued_ticks = e->enqueued_ticks;
    c.started_ticks = e->started_ticks;
    c.completed_ticks = e->completed_ticks;
    c.entry_id = e->id;
    ring_->Publish();
  }
}

void Tracer::WriteHeartbeatLocked(int64_t ticks) {
  ring_->WriteHeartbeat(hb_step_, hb_phase_, ticks);
}

void Tracer::SetPhase(int64_t step, Phase phase) {
  const int64_t now = Ticks();
  {
    SpinGuard guard(hb_lock_);
    hb_step_ = step;
    hb_phase_ = phase;
    step_.store(step, std::memory_order_relaxed);
    WriteHeartbeatLocked(now);
  }
  if (Record* r = ring_->Claim()) {
    r->heartbeat.type = RecordType::kHeartbeat;
    r->heartbeat.phase = phase;
    r->heartbeat.step = step;
    r->heartbeat.ticks = now;
    ring_->Publish();
  }
}

void Tracer::Touch() {
  const int64_t now = Ticks();
  SpinGuard guard(hb_lock_);
  WriteHeartbeatLocked(now);
}

void Tracer::RecordMetric(NameId name, double value) {
  if (!enabled_.load(std::memory_order_relaxed)) return;
  if (Record* r = ring_->Claim()) {
    r->metric.type = RecordType::kMetric;
    r->metric.name = name;
    r->metric.ticks = Ticks();
    r->metric.value = value;
    ring_->Publish();
  }
}

}  // namespace megascope::tracer
