// Collective and point-to-point communication behind one interface.
//
// A communicator is a stack: a transport at the bottom (Gloo over TCP, NCCL on the device), then
// decorators, each adding one thing to every op of any transport:
//   TraceCommunicator   every op in the rank's flight recorder (enqueued -> started ->
//                       completed/failed, progress bytes); the record is also its comm span
//   StageThroughHost    device memory through pinned host buffers, for a host transport
//   DelayLinks          the link fault seam: a rank whose data leaves late (launch/link_seam.h)
// An op is posted (Post) and completed by its Work; the blocking forms (AllReduce, ...) post and
// wait. Errors (a dead peer, a timeout, Abort) come back as a Status naming the op and group.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "megascope/kernels/kernels.h"
#include "megascope/launch/link_seam.h"
#include "megascope/runtime/layout.h"
#include "megascope/tracer/records.h"
#include "megascope/tracer/status.h"
#include "megascope/tracer/tracer.h"

namespace megascope::runtime {

using tracer::DType;
using tracer::OpType;

enum class ReduceOp { kSum, kMax };

// One op. Group handles are indices into the rank's Layout::GroupsOf list; `count` is in elements
// of `dtype`:
//   allreduce, broadcast    `out` in place, count elements; broadcast from member index `root`
//   allgather               `in` count elements, `out` count x group size
//   reduce_scatter          `in` count elements (divisible by the group size), `out` count / size
//   barrier                 no data
//   send / recv             `in` / `out`, count elements, to / from global rank `peer`
struct CommOp {
  OpType type = OpType::kBarrier;
  int group = 0;
  const void* in = nullptr;
  void* out = nullptr;
  size_t count = 0;
  DType dtype = DType::kF32;
  ReduceOp reduce = ReduceOp::kSum;
  int root = 0;
  int peer = -1;

  size_t bytes() const { return count * tracer::DTypeSize(dtype); }
};

// What a transport reports about its op, to whoever traces it: the op started (on a device: its
// start event completed, the op runs there), how many bytes moved (-1: not known), and that it
// finished, once. Calls for one op come from one thread at a time (the poster's, a waiter's or a
// device transport's watchdog, handed over in order), possibly after its Work is gone: a transport
// holds the observer as long as it needs it.
class OpObserver {
 public:
  virtual ~OpObserver() = default;
  virtual void Started() = 0;
  virtual void Moved(int64_t sent, int64_t received) = 0;
  virtual void Finished(bool ok) = 0;
};

// What an op is, in errors of every transport: "send to rank 3 in pp.0.1", "allreduce in dp.0.0".
std::string Describe(const CommOp& op, const GroupSpec& group);

// An op in flight. Wait() blocks until the op's result may be used, or fails; call it once. On a
// host transport that is when the op is over; on a device transport (NCCL) when it is ordered
// before any later work on the compute stream: the watchdog reports its end, and an op that fails
// on the device fails the next op posted.
class Work {
 public:
  virtual ~Work() = default;
  virtual Status Wait() = 0;
};
// A Work that is already over (an op run inline, or refused).
std::unique_ptr<Work> DoneWork(Status status);

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual const std::vector<GroupSpec>& groups() const = 0;
  // Posts an op; `observer` (may be null) hears how it goes.
  virtual std::unique_ptr<Work> Post(const CommOp& op, std::shared_ptr<OpObserver> observer) = 0;
  // Thread-safe, from any thread (a watchdog): every op in flight and every later one fails
  // instead of waiting. A communicator stays aborted.
  virtual void Abort() = 0;
  // After an abort, new connections for the same groups: every member calls it with the same
  // `generation` (> 0, one more each time). NCCL only; others say Unimplemented.
  virtual Status Rebuild(int generation);

  int Find(GroupKind kind) const;  // -1 if this rank is not in a group of that kind

  // Blocking forms over fp32 data (CommOp above says what each reads and writes).
  Status Run(const CommOp& op) { return Post(op, nullptr)->Wait(); }
  Status AllReduce(int group, float* data, size_t n, ReduceOp op);
  Status AllGather(int group, const float* in, size_t n, float* out);
  Status Broadcast(int group, float* data, size_t n, int root_index);
  Status ReduceScatter(int group, const float* in, size_t n, float* out);
  Status Barrier(int group);
  Status Recv(int group, int peer, float* data, size_t n);
  // Sends are asynchronous: Send posts (the transport keeps a copy or the caller keeps `data`
  // unchanged, see the transport), WaitSends completes every posted send, first error first.
  Status Send(int group, int peer, const float* data, size_t n);
  Status WaitSends();

 private:
  std::vector<std::unique_ptr<Work>> sends_;
};

// Fault hooks the runtime's communicators obey (leveldb's fault-injection Env, not methods of the
// production interface): the link seam named by MEGASCOPE_LINK_SEAM, and a send that stops
// part-way. One per process, owned by the worker, shared by the transport and DelayLinks.
class CommFaults {
 public:
  // `tracer` (may be null) records the time a held link costs as a "link" comm span.
  explicit CommFaults(tracer::Tracer* tracer);
  void set_step(int64_t step) { step_ = step; }
  // The next send stops after a quarter of its data and never finishes, as a dead link would
  // (bytes_sent stays partial) until the communicator is aborted.
  void ArmSendStall() { stall_next_send_ = true; }
  bool TakeSendStall() { return std::exchange(stall_next_send_, false); }
  // Sleeps as long as the link seam holds `bytes` back, recorded as a comm span.
  void HoldForLink(size_t bytes);

 private:
  tracer::Tracer* tracer_;
  tracer::NameId link_name_{};
  launch::LinkSeam link_;
  int64_t step_ = 0;
  bool stall_next_send_ = false;
};

struct GlooOptions {
  std::string rendezvous_dir;  // FileStore directory shared by all ranks of the attempt
  std::chrono::milliseconds timeout{30000};
  // How long connecting to the peers may take (0: `timeout`): a probe fails fast on a dead link
  // without shortening its ops' timeout.
  std::chrono::milliseconds connect_timeout{0};
  CommFaults* faults = nullptr;  // the stalled send; none: runs clean
};

// Gloo over TCP (host memory). Collectives run inline in Post; sends and receives are posted and
// complete in Wait (a send keeps a copy of its data). Abort closes every connection.
Result<std::unique_ptr<Communicator>> CreateGlooCommunicator(int rank, const Layout& layout,
                                                             const GlooOptions& options);

struct NcclOptions {
  std::string rendezvous_dir;  // where each group's root publishes its ncclUniqueId
  // The watchdog: an op (or the communicators' creation) not done by then is aborted and reported
  // as a failed op instead of hanging.
  std::chrono::milliseconds timeout{30000};
  void* stream = nullptr;  // the cudaStream_t ops run on (the compute stream: ordered with it)
};

// NCCL on device memory (needs the CUDA backend and one GPU per rank): non-blocking communicators,
// one per group; every op brackets itself with CUDA events on `stream`, is "started" when its
// start event has completed on the device, and is waited for by polling under the watchdog.
// Abort aborts every communicator; Rebuild makes new ones for the same groups. A build without
// CUDA says so (FailedPrecondition).
Result<std::unique_ptr<Communicator>> CreateNcclCommunicator(int rank, const Layout& layout,
                                                             const NcclOptions& options);

// Decorators, each wrapping any communicator (the comment at the top of this file).
Result<std::unique_ptr<Communicator>> TraceCommunicator(std::unique_ptr<Communicator> inner,
                                                        tracer::Tracer* tracer);
// On the CPU backend, `inner` itself.
std::unique_ptr<Communicator> StageThroughHost(std::unique_ptr<Communicator> inner,
                                               kernels::Kernels* k);
std::unique_ptr<Communicator> DelayLinks(std::unique_ptr<Communicator> inner, CommFaults* faults);

}  // namespace megascope::runtime
