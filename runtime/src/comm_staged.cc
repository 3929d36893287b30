// Device data over a host-memory communicator, through pinned staging buffers.
#include <utility>

#include "megascope/runtime/comm.h"

namespace megascope::runtime {
namespace {

class HostStagedCommunicator final : public Communicator {
 public:
  HostStagedCommunicator(std::unique_ptr<Communicator> inner, kernels::Kernels* k)
      : inner_(std::move(inner)), k_(k) {}
  ~HostStagedCommunicator() override {
    for (Staging& s : staging_) {
      if (s.p != nullptr) k_->FreeHost(s.p);
    }
  }

  const std::vector<GroupSpec>& groups() const override { return inner_->groups(); }
  void Abort() override { inner_->Abort(); }
  Status Rebuild(int generation) override { return inner_->Rebuild(generation); }

  std::unique_ptr<Work> Post(const CommOp& op, std::shared_ptr<OpObserver> obs) override {
    const bool on_device = k_->IsDevicePointer(op.in != nullptr ? op.in : op.out);
    if (!on_device || op.type == OpType::kBarrier) return inner_->Post(op, std::move(obs));
    if (op.type == OpType::kSend) {  // the transport sends a copy: the staging is free again
      Result<void*> h = ToHost(0, op.in, op.bytes());
      if (!h.ok()) return DoneWork(h.status());
      CommOp staged = op;
      staged.in = *h;
      return inner_->Post(staged, std::move(obs));
    }
    return DoneWork(RunStaged(op, obs));
  }

 private:
  struct Staging {
    void* p = nullptr;
    size_t bytes = 0;
  };

  // Everything but a send: its input downloaded, the op run on host memory, its output uploaded.
  Status RunStaged(const CommOp& op, std::shared_ptr<OpObserver> obs) {
    const size_t size = inner_->groups()[op.group].ranks.size();
    size_t out_bytes = op.bytes();  // allreduce, broadcast, recv
    if (op.type == OpType::kAllgather) out_bytes = op.bytes() * size;
    if (op.type == OpType::kReduceScatter) out_bytes = op.bytes() / size;
    const bool in_place = op.type == OpType::kAllreduce || op.type == OpType::kBroadcast;
    CommOp staged = op;
    if (op.type == OpType::kRecv) {
      ASSIGN_OR_RETURN(staged.out, Stage(0, out_bytes));
    } else if (in_place) {
      ASSIGN_OR_RETURN(staged.out, ToHost(0, op.out, out_bytes));
      staged.in = staged.out;
    } else {
      ASSIGN_OR_RETURN(staged.in, ToHost(0, op.in, op.bytes()));
      ASSIGN_OR_RETURN(staged.out, Stage(1, out_bytes));
    }
    RETURN_IF_ERROR(inner_->Post(staged, std::move(obs))->Wait());
    return ToDevice(op.out, staged.out, out_bytes);
  }
  // Pinned buffer `i` of at least `bytes` (grown, never shrunk).
  Result<void*> Stage(int i, size_t bytes) {
    Staging& s = staging_[i];
    if (bytes > s.bytes) {
      if (s.p != nullptr) k_->FreeHost(s.p);
      s.p = k_->AllocateHost(bytes);
      s.bytes = s.p != nullptr ? bytes : 0;
      if (s.p == nullptr)
        return Internal("pinned staging buffer of " + std::to_string(bytes) +
                        " bytes: " + k_->error());
    }
    return s.p;
  }
  Result<void*> ToHost(int i, const void* device, size_t bytes) {
    ASSIGN_OR_RETURN(void* h, Stage(i, bytes));
    k_->Download(h, device, bytes);  // waits for the work that produced it
    if (std::string e = k_->error(); !e.empty()) return Internal("device -> host: " + e);
    return h;
  }
  // Waits for the copy: the staging buffer is written by the next op's transport.
  Status ToDevice(void* device, const void* h, size_t bytes) {
    k_->Upload(device, h, bytes);
    if (std::string e = k_->Synchronize(); !e.empty()) return Internal("host -> device: " + e);
    return Status::Ok();
  }

  std::unique_ptr<Communicator> inner_;
  kernels::Kernels* k_;
  Staging staging_[2];
};
}  // namespace

std::unique_ptr<Communicator> StageThroughHost(std::unique_ptr<Communicator> inner,
                                               kernels::Kernels* k) {
  if (k->backend() == kernels::Backend::kCpu) return inner;  // host memory already
  return std::make_unique<HostStagedCommunicator>(std::move(inner), k);
}

}  // namespace megascope::runtime
