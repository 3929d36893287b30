// Collective and point-to-point communication behind one interface, every operation traced
// through the rank's flight recorder (enqueued -> started -> completed/failed, progress bytes)
// and timed as a comm span. GlooCommunicator runs over TCP with a FileStore rendezvous in the run
// directory. Errors (a dead peer, a timeout) come back as a Status; the op is marked failed first.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "megascope/kernels/kernels.h"
#include "megascope/runtime/layout.h"
#include "megascope/tracer/status.h"
#include "megascope/tracer/tracer.h"

namespace megascope::runtime {

enum class ReduceOp { kSum, kMax };

// Group handles are indices into the rank's Layout::GroupsOf list.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual const std::vector<GroupSpec>& groups() const = 0;
  int Find(const std::string& kind) const;  // -1 if this rank is not in a group of that kind

  virtual Status AllReduce(int group, float* data, size_t n, ReduceOp op) = 0;
  virtual Status AllGather(int group, const float* in, size_t n, float* out) = 0;
  virtual Status Broadcast(int group, float* data, size_t n, int root_index) = 0;
  // Each member gets its 1/size slice of the sum in `out` (n divisible by the group size).
  virtual Status ReduceScatter(int group, const float* in, size_t n, float* out) = 0;
  virtual Status Barrier(int group) = 0;
  // Starts sending a copy of data to `peer` (a global rank); completes in WaitSends().
  virtual Status Send(int group, int peer, const float* data, size_t n) = 0;
  virtual Status Recv(int group, int peer, float* data, size_t n) = 0;
  virtual Status WaitSends() = 0;
  // The training step that comm spans are attributed to.
  virtual void set_step(int64_t step) = 0;
  // Fault hook for tests and demos: the next Send stops after a quarter of its data and never
  // finishes, as a dead link would (bytes_sent stays partial).
  virtual void ArmSendStall() = 0;
};

struct GlooOptions {
  std::string rendezvous_dir;  // FileStore directory shared by all ranks of the attempt
  std::chrono::milliseconds timeout{30000};
};

// A communicator over host memory (Gloo) for a backend whose data lives on a device: every op on
// device memory is copied through pinned host buffers (device -> host, the op, host -> device);
// host memory (a scalar on the stack) goes straight through. On the CPU backend, `inner` itself.
// DESIGN.md section 3: how several ranks share the one GPU of a lent machine.
std::unique_ptr<Communicator> StageThroughHost(std::unique_ptr<Communicator> inner,
                                               kernels::Kernels* k);

Result<std::unique_ptr<Communicator>> CreateGlooCommunicator(int rank, const Layout& layout,
                                                             const GlooOptions& options,
                                                             tracer::Tracer* tracer);

}  // namespace megascope::runtime
