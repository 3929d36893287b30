// What every communicator shares: the blocking forms, the fault seam, and the decorators that
// trace ops and hold links back, whatever the transport.
#include "megascope/runtime/comm.h"

#include <atomic>
#include <thread>
#include <utility>

namespace megascope::runtime {

namespace {

class FinishedWork final : public Work {
 public:
  explicit FinishedWork(Status s) : status_(std::move(s)) {}
  Status Wait() override { return std::move(status_); }

 private:
  Status status_;
};

}  // namespace

std::unique_ptr<Work> DoneWork(Status status) {
  return std::make_unique<FinishedWork>(std::move(status));
}

std::string Describe(const CommOp& op, const GroupSpec& group) {
  std::string w(tracer::Name(op.type));
  if (tracer::IsP2P(op.type))
    w += (op.type == OpType::kSend ? " to rank " : " from rank ") + std::to_string(op.peer);
  return w + " in " + group.name;
}

int Communicator::Find(GroupKind kind) const {
  const auto& g = groups();
  for (size_t i = 0; i < g.size(); ++i) {
    if (g[i].kind == kind) return static_cast<int>(i);
  }
  return -1;
}

Status Communicator::Rebuild(int /*generation*/) {
  return FailedPrecondition("this communicator cannot be rebuilt after an abort (NCCL only)");
}

Status Communicator::AllReduce(int group, float* data, size_t n, ReduceOp op) {
  CommOp o{OpType::kAllreduce, group, data, data, n};
  o.reduce = op;
  return Run(o);
}
Status Communicator::AllGather(int group, const float* in, size_t n, float* out) {
  return Run({OpType::kAllgather, group, in, out, n});
}
Status Communicator::Broadcast(int group, float* data, size_t n, int root_index) {
  CommOp o{OpType::kBroadcast, group, data, data, n};
  o.root = root_index;
  return Run(o);
}
Status Communicator::ReduceScatter(int group, const float* in, size_t n, float* out) {
  return Run({OpType::kReduceScatter, group, in, out, n});
}
Status Communicator::Barrier(int group) { return Run({OpType::kBarrier, group}); }
Status Communicator::Recv(int group, int peer, float* data, size_t n) {
  CommOp o{OpType::kRecv, group, nullptr, data, n};
  o.peer = peer;
  return Run(o);
}
Status Communicator::Send(int group, int peer, const float* data, size_t n) {
  CommOp o{OpType::kSend, group, data, nullptr, n};
  o.peer = peer;
  sends_.push_back(Post(o, nullptr));
  return Status::Ok();  // a refused send is a finished Work: WaitSends reports it
}
Status Communicator::WaitSends() {
  Status result;
  for (auto& w : sends_) {
    Status s = w->Wait();
    if (result.ok() && !s.ok()) result = std::move(s);
  }
  sends_.clear();
  return result;
}

// --- the fault seam ---

CommFaults::CommFaults(tracer::Tracer* tracer) : tracer_(tracer) {
  if (tracer_ != nullptr) {
    auto id = tracer_->InternName("link");
    if (id.ok()) link_name_ = *id;
  }
}

void CommFaults::HoldForLink(size_t bytes) {
  const auto delay = link_.DelayFor(bytes);
  if (delay.count() <= 0) return;
  const int64_t start = tracer_ != nullptr ? tracer_->Ticks() : 0;
  std::this_thread::sleep_for(delay);
  if (tracer_ != nullptr)
    tracer_->RecordSpan(tracer::SpanKind::kComm, link_name_, step_, -1, start, tracer_->Ticks());
}

namespace {

// --- tracing: every op of any transport in the flight recorder ---

class OpRecord final : public OpObserver {
 public:
  OpRecord(tracer::Tracer* t, tracer::OpHandle h) : t_(t), h_(h) {}
  void Started() override { t_->Start(h_); }
  void Moved(int64_t sent, int64_t received) override { t_->Progress(h_, sent, received); }
  void Finished(bool ok) override {
    if (finished_.exchange(true)) return;
    if (ok) {
      t_->Complete(h_);  // the collective record is also its comm span (trace_schema.h)
    } else {
      t_->Fail(h_);
    }
  }

 private:
  tracer::Tracer* t_;
  tracer::OpHandle h_;
  std::atomic<bool> finished_{false};
};

// A failed Wait fails the record too, had the transport not said so (a refused op).
class TracedWork final : public Work {
 public:
  TracedWork(std::unique_ptr<Work> inner, std::shared_ptr<OpRecord> record)
      : inner_(std::move(inner)), record_(std::move(record)) {}
  Status Wait() override {
    Status s = inner_->Wait();
    if (!s.ok()) record_->Finished(false);
    return s;
  }

 private:
  std::unique_ptr<Work> inner_;
  std::shared_ptr<OpRecord> record_;
};

class TracingCommunicator final : public Communicator {
 public:
  TracingCommunicator(std::unique_ptr<Communicator> inner, tracer::Tracer* t)
      : inner_(std::move(inner)), t_(t) {}

  Status Init() {
    for (const GroupSpec& g : inner_->groups()) {
      ASSIGN_OR_RETURN(tracer::GroupId id, t_->RegisterGroup(g.name, Name(g.kind), g.ranks));
      ids_.push_back(id);
    }
    return Status::Ok();
  }

  const std::vector<GroupSpec>& groups() const override { return inner_->groups(); }
  // The outermost observer: a caller's own is not chained.
  std::unique_ptr<Work> Post(const CommOp& op, std::shared_ptr<OpObserver> /*observer*/) override {
    if (op.group < 0 || op.group >= static_cast<int>(ids_.size()))
      return DoneWork(InvalidArgument("no group " + std::to_string(op.group)));
    const bool p2p = tracer::IsP2P(op.type);
    auto record = std::make_shared<OpRecord>(
        t_, t_->Enqueue(ids_[op.group], op.type, op.bytes(), op.dtype, p2p ? op.peer : -1));
    return std::make_unique<TracedWork>(inner_->Post(op, record), record);
  }
  void Abort() override { inner_->Abort(); }
  Status Rebuild(int generation) override { return inner_->Rebuild(generation); }

 private:
  std::unique_ptr<Communicator> inner_;
  tracer::Tracer* t_;
  std::vector<tracer::GroupId> ids_;
};

// --- the link seam: a rank's data leaves late, before the op is posted ---

class LinkDelayingCommunicator final : public Communicator {
 public:
  LinkDelayingCommunicator(std::unique_ptr<Communicator> inner, CommFaults* f)
      : inner_(std::move(inner)), faults_(f) {}
  const std::vector<GroupSpec>& groups() const override { return inner_->groups(); }
  std::unique_ptr<Work> Post(const CommOp& op, std::shared_ptr<OpObserver> observer) override {
    // The rank reaches the op late, so its peers wait for it (a communication straggler); the
    // time is its own "link" comm span, not compute.
    if (op.type != OpType::kRecv) faults_->HoldForLink(op.bytes());
    return inner_->Post(op, std::move(observer));
  }
  void Abort() override { inner_->Abort(); }
  Status Rebuild(int generation) override { return inner_->Rebuild(generation); }

 private:
  std::unique_ptr<Communicator> inner_;
  CommFaults* faults_;
};

}  // namespace

Result<std::unique_ptr<Communicator>> TraceCommunicator(std::unique_ptr<Communicator> inner,
                                                        tracer::Tracer* tracer) {
  auto c = std::make_unique<TracingCommunicator>(std::move(inner), tracer);
  RETURN_IF_ERROR(c->Init());
  return std::unique_ptr<Communicator>(std::move(c));
}

std::unique_ptr<Communicator> DelayLinks(std::unique_ptr<Communicator> inner, CommFaults* faults) {
  return std::make_unique<LinkDelayingCommunicator>(std::move(inner), faults);
}

#ifndef MEGASCOPE_HAVE_CUDA
Result<std::unique_ptr<Communicator>> CreateNcclCommunicator(int, const Layout&,
                                                             const NcclOptions&) {
  return FailedPrecondition(
      "this megascope was built without CUDA: no NCCL (the cuda preset builds it)");
}
#endif

}  // namespace megascope::runtime
