// NCCL: the device transport (comm.h). One non-blocking communicator per group, made together
// (ncclGroupStart/End) from ids that each group's first member publishes in a FileStore under the
// rendezvous directory. Every op runs on the compute stream between two CUDA events; a watchdog
// thread follows the events (never the thread that must report a hang), tells the observer when
// the op started and finished on the device, and aborts every communicator when one is not done
// by the deadline or NCCL reports an asynchronous error. Ops posted afterwards fail with that
// error until Rebuild.
#include <cuda_runtime.h>
#include <gloo/rendezvous/file_store.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <mutex>
#include <thread>
#include <utility>

#include "megascope/runtime/comm.h"

namespace megascope::runtime {
namespace {

using Clock = std::chrono::steady_clock;

// The element type, or false when NCCL has none for it.
bool ToNccl(DType d, ncclDataType_t* out) {
  switch (d) {
    case DType::kF32:
      *out = ncclFloat32;
      return true;
    case DType::kF16:
      *out = ncclFloat16;
      return true;
    case DType::kBf16:
      *out = ncclBfloat16;
      return true;
    case DType::kF64:
      *out = ncclFloat64;
      return true;
    case DType::kI32:
      *out = ncclInt32;
      return true;
    case DType::kI64:
      *out = ncclInt64;
      return true;
    case DType::kU8:
      *out = ncclUint8;
      return true;
    default:
      return false;
  }
}

std::string CudaText(cudaError_t e) { return std::string(cudaGetErrorString(e)); }

// One op the watchdog follows, in posting order.
struct InFlight {
  cudaEvent_t start = nullptr, end = nullptr;
  std::shared_ptr<OpObserver> obs;
  std::string what;
  int64_t bytes = 0;
  bool started = false;
  Clock::time_point deadline;
};

class NcclCommunicator;

// A send's Work: waiting issues the deferred sends (stream-ordered from then on).
class SendWork final : public Work {
 public:
  explicit SendWork(NcclCommunicator* c) : c_(c) {}
  Status Wait() override;

 private:
  NcclCommunicator* c_;
};

class NcclCommunicator final : public Communicator {
 public:
  ~NcclCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    DropComms(/*abort=*/aborted_.load());
    for (InFlight& f : in_flight_) Recycle(f);
    for (Ready& x : deferred_) {  // sends nobody waited for
      if (x.owned != nullptr) cudaFreeAsync(x.owned, stream_);
      Recycle(x.f);
    }
    for (cudaEvent_t e : free_events_) cudaEventDestroy(e);  // a pending one is freed when done
    for (cudaEvent_t e : draining_) cudaEventDestroy(e);
    if (scratch_ != nullptr) cudaFree(scratch_);
  }

  const std::vector<GroupSpec>& groups() const override { return groups_; }

  Status Init(int rank, const Layout& layout, const NcclOptions& o) {
    rank_ = rank;
    opts_ = o;
    stream_ = static_cast<cudaStream_t>(o.stream);
    groups_ = layout.GroupsOf(rank);
    if (cudaError_t e = cudaGetDevice(&device_); e != cudaSuccess)
      return FailedPrecondition("[nccl] no CUDA device: " + CudaText(e));
    RETURN_IF_ERROR(Connect(0));
    watchdog_ = std::thread([this] { Watch(); });
    return Status::Ok();
  }

  std::unique_ptr<Work> Post(const CommOp& op, std::shared_ptr<OpObserver> obs) override {
    Status st = Launch(op, obs);
    if (!st.ok() && obs != nullptr) obs->Finished(false);
    if (st.ok() && op.type == OpType::kSend) return std::make_unique<SendWork>(this);
    return DoneWork(std::move(st));  // stream-ordered: later work on the stream runs after it
  }

  void Abort() override {
    std::lock_guard<std::mutex> lock(mu_);
    AbortLocked(Status(StatusCode::kAborted, "[nccl] aborted"));
  }

  Status Rebuild(int generation) override {
    if (generation <= 0) return InvalidArgument("[nccl] a rebuild's generation must be > 0");
    if (!aborted_.load()) return FailedPrecondition("[nccl] rebuild needs an aborted communicator");
    cudaStreamSynchronize(stream_);  // the aborted kernels have left the stream
    std::lock_guard<std::mutex> lock(mu_);
    free_events_.insert(free_events_.end(), draining_.begin(), draining_.end());
    draining_.clear();
    DropComms(/*abort=*/true);
    RETURN_IF_ERROR(Connect(generation));
    error_ = Status::Ok();
    aborted_.store(false);
    return Status::Ok();
  }

 private:
  // Makes this generation's communicators, every group at once, under the deadline.
  Status Connect(int generation) {
    const auto deadline = Clock::now() + opts_.timeout;
    const std::string dir = opts_.rendezvous_dir + "/nccl";
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return IoError("cannot create " + dir + ": " + ec.message());
    std::vector<ncclUniqueId> ids(groups_.size());
    try {
      gloo::rendezvous::FileStore store(dir);
      auto key = [&](const GroupSpec& g) { return std::to_string(generation) + "." + g.name; };
      for (size_t i = 0; i < groups_.size(); ++i) {    // publish first, then wait: no member waits
        if (groups_[i].IndexOf(rank_) != 0) continue;  // on a member that waits for it
        if (ncclResult_t r = ncclGetUniqueId(&ids[i]); r != ncclSuccess)
          return Internal("[nccl] ncclGetUniqueId: " + std::string(ncclGetErrorString(r)));
        const char* p = reinterpret_cast<const char*>(&ids[i]);
        store.set(key(groups_[i]), std::vector<char>(p, p + sizeof(ncclUniqueId)));
      }
      for (size_t i = 0; i < groups_.size(); ++i) {
        if (groups_[i].IndexOf(rank_) == 0) continue;
        store.wait({key(groups_[i])}, opts_.timeout);
        std::vector<char> v = store.get(key(groups_[i]));
        if (v.size() != sizeof(ncclUniqueId))
          return DataLoss("[nccl] the id of " + groups_[i].name + " in " + dir + " is damaged");
        std::memcpy(&ids[i], v.data(), sizeof(ncclUniqueId));
      }
    } catch (const std::exception& e) {
      return Status(StatusCode::kDeadlineExceeded,
                    "[nccl] rendezvous in " + dir + " failed: " + e.what());
    }
    comms_.assign(groups_.size(), nullptr);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // a peer that never comes cannot hang us: we poll, under the deadline
    ncclGroupStart();
    for (size_t i = 0; i < groups_.size(); ++i) {
      config.commName = groups_[i].name.c_str();
      ncclResult_t r = ncclCommInitRankConfig(&comms_[i], static_cast<int>(groups_[i].ranks.size()),
                                              ids[i], groups_[i].IndexOf(rank_), &config);
      if (r != ncclSuccess && r != ncclInProgress) {
        ncclGroupEnd();
        return Internal("[nccl] creating " + groups_[i].name + ": " + ncclGetErrorString(r));
      }
    }
    if (ncclResult_t r = ncclGroupEnd(); r != ncclSuccess && r != ncclInProgress)
      return Internal(std::string("[nccl] creating the communicators: ") + ncclGetErrorString(r));
    for (size_t i = 0; i < groups_.size(); ++i) {
      RETURN_IF_ERROR(Settle(i, "creating " + groups_[i].name, deadline));
    }
    return Status::Ok();
  }

  // Waits until communicator i has finished its last (non-blocking) call.
  Status Settle(size_t i, const std::string& what, Clock::time_point deadline) {
    for (;;) {
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(comms_[i], &state);
      if (state == ncclSuccess) return Status::Ok();
      if (state != ncclInProgress)
        return Status(StatusCode::kUnavailable, "[nccl] " + what + ": " +
                                                    ncclGetErrorString(state) + " (" +
                                                    ncclGetLastError(comms_[i]) + ")");
      if (Clock::now() > deadline) {
        return Status(
            StatusCode::kDeadlineExceeded,
            "[nccl] " + what + ": not done after " + std::to_string(opts_.timeout.count()) + " ms");
      }
      std::this_thread::yield();
    }
  }

  void DropComms(bool abort) {
    for (ncclComm_t& c : comms_) {
      if (c == nullptr) continue;
      if (abort) {
        ncclCommAbort(c);
      } else {
        ncclCommFinalize(c);  // flushes what was issued; non-blocking: wait for it, briefly
        const auto until = Clock::now() + std::chrono::seconds(5);
        ncclResult_t state = ncclInProgress;
        while (state == ncclInProgress && Clock::now() < until) ncclCommGetAsyncError(c, &state);
        if (state == ncclSuccess) {
          ncclCommDestroy(c);
        } else {
          ncclCommAbort(c);
        }
      }
      c = nullptr;
    }
  }

  std::string What(const CommOp& op) const { return Describe(op, groups_[op.group]); }

  static bool OnDevice(const void* p) {
    cudaPointerAttributes a{};
    if (p == nullptr || cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      cudaGetLastError();  // a plain host pointer is no error to keep
      return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
  }

  Result<void*> Scratch(size_t bytes) {
    if (bytes > scratch_bytes_) {
      if (scratch_ != nullptr) cudaFree(scratch_);
      scratch_ = nullptr;
      scratch_bytes_ = 0;
      if (cudaError_t e = cudaMalloc(&scratch_, bytes); e != cudaSuccess)
        return Internal("[nccl] device scratch of " + std::to_string(bytes) +
                        " bytes: " + CudaText(e));
      scratch_bytes_ = bytes;
    }
    return scratch_;
  }

  cudaEvent_t Event() {
    if (!free_events_.empty()) {
      cudaEvent_t e = free_events_.back();
      free_events_.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    return e;
  }
  void Recycle(InFlight& f) {  // under mu_
    if (f.start != nullptr) free_events_.push_back(f.start);
    if (f.end != nullptr) free_events_.push_back(f.end);
    f.start = f.end = nullptr;
  }

  // One op ready for NCCL: its buffers on the device, its events, its observer.
  struct Ready {
    CommOp op;
    ncclDataType_t dt;
    int peer = -1;  // member index, send/recv
    const void* in = nullptr;
    void* out = nullptr;
    void* owned = nullptr;  // a send's own copy (freed in stream order after it)
    InFlight f;
  };

  // Issues ops as one NCCL group: their start events, the calls, their end events (under mu_).
  // A group lets a send and a receive progress together: a deferred send goes out with the next
  // receive, so two stages sending to each other at once (1F1B) do not wait on each other.
  Status IssueGroup(std::vector<Ready>& batch) {
    for (Ready& r : batch) cudaEventRecord(r.f.start, stream_);
    ncclGroupStart();
    ncclResult_t r = ncclSuccess;
    std::string what;
    for (Ready& x : batch) {
      r = Call(x);
      if (r != ncclSuccess && r != ncclInProgress) {
        what = x.f.what;
        break;
      }
    }
    ncclResult_t end = ncclGroupEnd();
    if (r == ncclSuccess || r == ncclInProgress) r = end;
    if (r != ncclSuccess && r != ncclInProgress)
      return Status(
          StatusCode::kUnavailable,
          "[nccl] " + (what.empty() ? batch.back().f.what : what) + ": " + ncclGetErrorString(r));
    const auto deadline = Clock::now() + opts_.timeout;
    for (Ready& x : batch)
      RETURN_IF_ERROR(Settle(static_cast<size_t>(x.op.group), x.f.what, deadline));
    for (Ready& x : batch) {
      cudaEventRecord(x.f.end, stream_);
      if (x.owned != nullptr) cudaFreeAsync(x.owned, stream_);
      x.owned = nullptr;
      x.f.deadline = Clock::now() + opts_.timeout;
      in_flight_.push_back(std::move(x.f));
    }
    return Status::Ok();
  }

  ncclResult_t Call(const Ready& x) {
    const CommOp& op = x.op;
    ncclComm_t comm = comms_[op.group];
    const size_t size = groups_[op.group].ranks.size();
    const ncclRedOp_t red = op.reduce == ReduceOp::kMax ? ncclMax : ncclSum;
    switch (op.type) {
      case OpType::kAllreduce:
        return ncclAllReduce(x.in, x.out, op.count, x.dt, red, comm, stream_);
      case OpType::kBarrier:  // one float summed: every member has arrived
        return ncclAllReduce(x.in, x.out, 1, ncclFloat32, ncclSum, comm, stream_);
      case OpType::kAllgather:
        return ncclAllGather(x.in, x.out, op.count, x.dt, comm, stream_);
      case OpType::kBroadcast:
        return ncclBroadcast(x.in, x.out, op.count, x.dt, op.root, comm, stream_);
      case OpType::kReduceScatter:
        return ncclReduceScatter(x.in, x.out, op.count / size, x.dt, red, comm, stream_);
      case OpType::kSend:
        return ncclSend(x.in, op.count, x.dt, x.peer, comm, stream_);
      case OpType::kRecv:
        return ncclRecv(x.out, op.count, x.dt, x.peer, comm, stream_);
      default:
        return ncclInvalidArgument;
    }
  }

  // Issues the deferred sends (with `also`, when given, in the same group). Under mu_.
  Status FlushLocked(Ready* also) {
    std::vector<Ready> batch = std::move(deferred_);
    deferred_.clear();
    if (also != nullptr) batch.push_back(std::move(*also));
    if (batch.empty()) return Status::Ok();
    Status st = IssueGroup(batch);
    if (!st.ok()) {
      for (Ready& x : batch) {
        if (x.f.obs != nullptr) x.f.obs->Finished(false);
        if (x.owned != nullptr) cudaFreeAsync(x.owned, stream_);
        Recycle(x.f);
      }
    }
    return st;
  }

 public:
  // What a send's Work does when waited for: the sends still deferred go out now.
  Status Flush() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_.ok()) return error_;
      RETURN_IF_ERROR(FlushLocked(nullptr));
    }
    cv_.notify_all();
    return Status::Ok();
  }

 private:
  // Host memory (a scalar) goes through a device scratch and back, waiting for the op; a send is
  // copied and deferred to the next receive, collective or wait (FlushLocked).
  Status Launch(const CommOp& op, const std::shared_ptr<OpObserver>& obs) {
    if (op.group < 0 || op.group >= static_cast<int>(groups_.size()))
      return InvalidArgument("[nccl] no group " + std::to_string(op.group));
    Ready x;
    x.op = op;
    if (!ToNccl(op.dtype, &x.dt))
      return InvalidArgument("[nccl] no " + std::string(tracer::Name(op.dtype)) + " in NCCL");
    const GroupSpec& g = groups_[op.group];
    const size_t size = g.ranks.size();
    if (tracer::IsP2P(op.type) && (x.peer = g.IndexOf(op.peer)) < 0)
      return InvalidArgument("rank " + std::to_string(op.peer) + " is not in group " + g.name);
    if (op.type == OpType::kReduceScatter && op.count % size != 0)
      return InvalidArgument("[nccl] reduce_scatter of " + std::to_string(op.count) +
                             " elements over " + std::to_string(size) + " ranks");
    size_t out_bytes = op.bytes();
    if (op.type == OpType::kAllgather) out_bytes *= size;
    if (op.type == OpType::kReduceScatter) out_bytes /= size;
    x.in = op.in != nullptr ? op.in : op.out;
    x.out = op.out;
    const bool send = op.type == OpType::kSend, barrier = op.type == OpType::kBarrier;
    const bool host = !barrier && !OnDevice(op.out != nullptr ? op.out : op.in);
    std::unique_lock<std::mutex> lock(mu_);
    if (!error_.ok()) return error_;
    if (send) {  // its own copy: the caller may reuse its buffer before the send goes out
      if (cudaError_t e = cudaMallocAsync(&x.owned, op.bytes(), stream_); e != cudaSuccess)
        return Internal("[nccl] a copy for " + What(op) + ": " + CudaText(e));
      cudaMemcpyAsync(x.owned, x.in, op.bytes(), cudaMemcpyDefault, stream_);
      x.in = x.owned;
    } else if (host || barrier) {
      const size_t in_bytes = barrier ? sizeof(float) : op.bytes();
      ASSIGN_OR_RETURN(void* s, Scratch(in_bytes + out_bytes + sizeof(float)));
      if (!barrier && op.type != OpType::kRecv)
        cudaMemcpyAsync(s, x.in, op.bytes(), cudaMemcpyHostToDevice, stream_);
      const bool in_place = op.type == OpType::kAllreduce || op.type == OpType::kBroadcast;
      x.in = s;
      x.out = in_place || barrier ? s : static_cast<char*>(s) + in_bytes;
    }
    x.f.start = Event();
    x.f.end = Event();
    x.f.obs = obs;
    x.f.what = What(op);
    x.f.bytes = static_cast<int64_t>(op.bytes());
    if (send) {
      deferred_.push_back(std::move(x));
      return Status::Ok();
    }
    // A receive goes out with the deferred sends; a collective after them.
    if (op.type != OpType::kRecv) RETURN_IF_ERROR(FlushLocked(nullptr));
    void* host_out = (host && op.out != nullptr) ? op.out : nullptr;
    void* device_out = x.out;
    RETURN_IF_ERROR(FlushLocked(&x));
    cv_.notify_all();
    if (host || barrier) {
      if (host_out != nullptr)
        cudaMemcpyAsync(host_out, device_out, out_bytes, cudaMemcpyDeviceToHost, stream_);
      // The host reads the result now: wait for it (the watchdog ends a hang by aborting).
      lock.unlock();
      cudaError_t e = cudaStreamSynchronize(stream_);
      lock.lock();
      if (e != cudaSuccess) return Internal("[nccl] " + What(op) + ": " + CudaText(e));
      if (!error_.ok()) return error_;
    }
    return Status::Ok();
  }

  // The watchdog: follows the ops in order; aborts at a deadline or an asynchronous error.
  void Watch() {
    cudaSetDevice(device_);
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      if (in_flight_.empty()) {
        cv_.wait(lock, [&] { return stop_ || !in_flight_.empty(); });
        continue;
      }
      while (!in_flight_.empty()) {
        InFlight& f = in_flight_.front();
        if (!f.started && cudaEventQuery(f.start) == cudaSuccess) {
          f.started = true;
          if (f.obs != nullptr) f.obs->Started();  // on the device now: FR's "started"
        }
        if (cudaEventQuery(f.end) != cudaSuccess) break;
        if (!f.started && f.obs != nullptr) f.obs->Started();
        if (f.obs != nullptr) {
          f.obs->Moved(f.bytes, f.bytes);
          f.obs->Finished(true);
        }
        Recycle(f);
        in_flight_.pop_front();
      }
      if (in_flight_.empty()) continue;
      const InFlight& f = in_flight_.front();
      if (Clock::now() > f.deadline) {
        AbortLocked(Status(StatusCode::kDeadlineExceeded,
                           "[nccl] " + f.what + " not done after " +
                               std::to_string(opts_.timeout.count()) + " ms (" +
                               (f.started ? "started on the device" : "never started") +
                               "): every NCCL communicator of the rank aborted"));
        continue;
      }
      for (size_t i = 0; i < comms_.size(); ++i) {
        ncclResult_t state = ncclSuccess;
        if (comms_[i] == nullptr) continue;
        ncclCommGetAsyncError(comms_[i], &state);
        if (state != ncclSuccess && state != ncclInProgress) {
          AbortLocked(Status(StatusCode::kUnavailable, "[nccl] " + groups_[i].name + ": " +
                                                           ncclGetErrorString(state) + " (" +
                                                           ncclGetLastError(comms_[i]) + ")"));
          break;
        }
      }
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(50));  // a poll, not a wait
      lock.lock();
    }
  }

  // Every op in flight fails, every communicator aborts, `why` answers every later op.
  void AbortLocked(Status why) {  // under mu_
    if (aborted_.exchange(true)) return;
    error_ = std::move(why);
    for (ncclComm_t c : comms_) {
      if (c != nullptr) ncclCommAbort(c);
    }
    comms_.assign(comms_.size(), nullptr);
    for (InFlight& f : in_flight_) {
      if (f.obs != nullptr) f.obs->Finished(false);
      draining_.push_back(f.start);  // the stream may still pass them: recycled at Rebuild
      draining_.push_back(f.end);
    }
    in_flight_.clear();
    for (Ready& x : deferred_) {  // never issued
      if (x.f.obs != nullptr) x.f.obs->Finished(false);
      if (x.owned != nullptr) cudaFreeAsync(x.owned, stream_);
      Recycle(x.f);
    }
    deferred_.clear();
  }

  int rank_ = 0;
  int device_ = 0;
  NcclOptions opts_;
  cudaStream_t stream_ = nullptr;
  std::vector<GroupSpec> groups_;
  std::vector<ncclComm_t> comms_;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  std::mutex mu_;  // guards everything below, and comms_ against the watchdog's abort
  std::condition_variable cv_;
  std::deque<InFlight> in_flight_;
  std::vector<cudaEvent_t> free_events_;
  std::vector<cudaEvent_t> draining_;  // the events of ops failed by an abort
  std::vector<Ready> deferred_;        // sends not yet issued
  Status error_;
  std::atomic<bool> aborted_{false};
  bool stop_ = false;
  std::thread watchdog_;
};

Status SendWork::Wait() { return c_->Flush(); }

}  // namespace

Result<std::unique_ptr<Communicator>> CreateNcclCommunicator(int rank, const Layout& layout,
                                                             const NcclOptions& options) {
  auto c = std::make_unique<NcclCommunicator>();
  RETURN_IF_ERROR(c->Init(rank, layout, options));
  return std::unique_ptr<Communicator>(std::move(c));
}

}  // namespace megascope::runtime
