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

  Status AllReduce(int group, float* data, size_t n, ReduceOp op) override {
    return InPlace(data, n, [&](float* d) { return inner_->AllReduce(group, d, n, op); });
  }
  Status AllGather(int group, const float* in, size_t n, float* out) override {
    if (!k_->IsDevicePointer(in)) return inner_->AllGather(group, in, n, out);
    const size_t total = n * inner_->groups()[group].ranks.size();
    ASSIGN_OR_RETURN(float* h_in, ToHost(0, in, n));
    ASSIGN_OR_RETURN(float* h_out, Stage(1, total));
    RETURN_IF_ERROR(inner_->AllGather(group, h_in, n, h_out));
    return ToDevice(out, h_out, total);
  }
  Status Broadcast(int group, float* data, size_t n, int root_index) override {
    return InPlace(data, n, [&](float* d) { return inner_->Broadcast(group, d, n, root_index); });
  }
  Status ReduceScatter(int group, const float* in, size_t n, float* out) override {
    if (!k_->IsDevicePointer(in)) return inner_->ReduceScatter(group, in, n, out);
    const size_t part = n / inner_->groups()[group].ranks.size();
    ASSIGN_OR_RETURN(float* h_in, ToHost(0, in, n));
    ASSIGN_OR_RETURN(float* h_out, Stage(1, part));
    RETURN_IF_ERROR(inner_->ReduceScatter(group, h_in, n, h_out));
    return ToDevice(out, h_out, part);
  }
  Status Barrier(int group) override { return inner_->Barrier(group); }
  Status Send(int group, int peer, const float* data, size_t n) override {
    if (!k_->IsDevicePointer(data)) return inner_->Send(group, peer, data, n);
    ASSIGN_OR_RETURN(float* h, ToHost(0, data, n));
    return inner_->Send(group, peer, h, n);  // sends a copy: the staging is free again
  }
  Status Recv(int group, int peer, float* data, size_t n) override {
    if (!k_->IsDevicePointer(data)) return inner_->Recv(group, peer, data, n);
    ASSIGN_OR_RETURN(float* h, Stage(0, n));
    RETURN_IF_ERROR(inner_->Recv(group, peer, h, n));
    return ToDevice(data, h, n);
  }
  Status WaitSends() override { return inner_->WaitSends(); }
  void set_step(int64_t step) override { inner_->set_step(step); }
  void ArmSendStall() override { inner_->ArmSendStall(); }

 private:
  struct Staging {
    float* p = nullptr;
    size_t n = 0;
  };
  // Pinned buffer `i` of at least n floats (grown, never shrunk).
  Result<float*> Stage(int i, size_t n) {
    Staging& s = staging_[i];
    if (n > s.n) {
      if (s.p != nullptr) k_->FreeHost(s.p);
      s.p = static_cast<float*>(k_->AllocateHost(n * sizeof(float)));
      s.n = s.p != nullptr ? n : 0;
      if (s.p == nullptr)
        return Internal("pinned staging buffer of " + std::to_string(n) +
                        " floats: " + k_->error());
    }
    return s.p;
  }
  Result<float*> ToHost(int i, const float* device, size_t n) {
    ASSIGN_OR_RETURN(float* h, Stage(i, n));
    k_->Download(h, device, n * sizeof(float));  // waits for the work that produced it
    if (std::string e = k_->error(); !e.empty()) return Internal("device -> host: " + e);
    return h;
  }
  // An op that reads and writes `data` in place, run on its staged copy when it is device memory.
  template <typename Op>
  Status InPlace(float* data, size_t n, Op&& op) {
    if (!k_->IsDevicePointer(data)) return op(data);
    ASSIGN_OR_RETURN(float* h, ToHost(0, data, n));
    RETURN_IF_ERROR(op(h));
    return ToDevice(data, h, n);
  }
  // Waits for the copy: the staging buffer is written by the next op's transport.
  Status ToDevice(float* device, const float* h, size_t n) {
    k_->Upload(device, h, n * sizeof(float));
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
