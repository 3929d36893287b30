// libnccl-profiler-megascope.so: NCCL's profiler plugin (v5, v6, v7) writing megascope's flight
// recorder. Every collective and point-to-point op of every communicator becomes a flight-recorder
// entry in this process's ring (the capture core), which the node's agent drains and dumps like a
// megascope rank's: a communicator is a group (its members' global ranks), collectives are
// numbered per group and sends/recvs per peer pair (docs/formats.md), and an op goes enqueued ->
// started -> completed from its child events: NCCL's stop of a Coll event only means "enqueued";
// the device started it at its first kernel-channel (or proxy) event and finished it when every
// channel's kernel stopped and every proxy op ended. Byte progress comes from the proxy steps, and
// where an open op's step waits (GPU side or network side) is its entry's waiting_on.
//
// v7 (NCCL 2.31): a symmetric-memory plan posts its kernel channels against its head op only
// (the others carry nChannels 0), so its other ops complete with the head, linked through the
// plan's Group event. A KernelPhase sub-event is not recorded. NCCL's RAS may change the event mask
// while the job runs (ncclProfilerSetRasOverride writes the mask variable NCCL handed init): an op
// issued while kernel channels are off cannot be seen to finish and is completed when issued, as a
// copy-engine op is, rather than left open as if hung; events of types not asked for are ignored.
// Every event's rank is taken from init, never from a descriptor (API events carry 0: NCCL #2300).
//
// Callbacks come from the user's thread (Coll, P2p), the proxy thread (ProxyOp, ProxyStep,
// KernelCh) and CUDA host-callback threads: no lock and no allocation after init -- events live
// in a pool made at the first communicator, taken and returned through a lock-free stack. Nothing
// here ever returns an error to NCCL or changes what it does; a plugin that cannot start turns its
// events off.
//
// The ring is the process's (process_recorder.h: its environment). Also read here:
// MEGASCOPE_NCCL_MASK (event types, added to Coll|P2p|KernelCh), MEGASCOPE_NCCL_EVENTS (pool size,
// 65536), MEGASCOPE_NCCL=0 turns the plugin off.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "megascope/tracer/tracer.h"
#include "process_recorder.h"
#include "profiler_abi.h"

namespace megascope::nccl {
namespace {

using tracer::DType;
using tracer::OpType;

using inproc::Env;
using inproc::EnvInt;

// The plugin's settings, from the environment.
struct Config {
  uint64_t mask = kColl | kP2p | kProxyOp | kProxyStep | kKernelCh | kCeColl;
  uint32_t events = 65536;
  bool off = false;
};

Config ReadConfig() {
  Config c;
  c.off = Env("MEGASCOPE_NCCL") == "0";
  if (const std::string m = Env("MEGASCOPE_NCCL_MASK"); !m.empty())
    c.mask = std::strtoull(m.c_str(), nullptr, 0);
  c.mask |= kColl | kP2p | kKernelCh;  // an op's completion is read from its kernel channels
  c.events = static_cast<uint32_t>(std::max(1024, EnvInt({"MEGASCOPE_NCCL_EVENTS"}, 65536)));
  return c;
}

enum class Kind : uint8_t { kOp, kProxyOp, kProxyStep, kKernelCh, kGroup };

// One NCCL event. An op (Coll, P2p, CeColl) is referenced by NCCL's own handle until its stopEvent
// and by each child (ProxyOp, KernelCh) from its start to its stop; completion holds one more
// reference, so an op still running on the device (or hung) is never reused.
struct Event {
  Kind kind = Kind::kOp;
  Event* parent = nullptr;  // a child's op; a proxy step's proxy op
  // An op.
  tracer::OpHandle fr = 0;
  int channels = 0;
  std::atomic<int> kernels_done{0};
  std::atomic<int> proxies_open{0};
  std::atomic<int64_t> sent{0}, received{0};
  std::atomic<bool> started{false}, completed{false};
  std::atomic<int> refs{0};
  // A symmetric plan's op without channels: finished with the plan's head (`followers`), not when
  // issued. The head's followers, each holding a reference, completed when it completes.
  bool follows_head = false;
  std::atomic<Event*> followers{nullptr};
  Event* next_follower = nullptr;
  // A group (a plan): its symmetric head op, referenced while the group lives.
  Event* head = nullptr;
  // A proxy op.
  bool is_send = false;
  // A proxy step.
  size_t trans = 0;
  std::atomic<uint32_t> next{0};  // the free list's link (index + 1)
};

// Events made once; Get and Put are a lock-free stack over their indices, tagged against ABA.
class Pool {
 public:
  explicit Pool(uint32_t n) : events_(new Event[n]), n_(n) {
    for (uint32_t i = 0; i < n; ++i) events_[i].next.store(i + 1 < n ? i + 2 : 0);
    head_.store(n > 0 ? 1 : 0);
  }
  Event* Get() {
    uint64_t h = head_.load(std::memory_order_acquire);
    for (;;) {
      const uint32_t top = static_cast<uint32_t>(h);
      if (top == 0) return nullptr;
      Event* e = &events_[top - 1];
      const uint64_t next =
          (h >> 32 << 32) + (uint64_t{1} << 32) + e->next.load(std::memory_order_relaxed);
      if (head_.compare_exchange_weak(h, next, std::memory_order_acq_rel)) return e;
    }
  }
  void Put(Event* e) {
    const uint32_t index = static_cast<uint32_t>(e - events_.get()) + 1;
    uint64_t h = head_.load(std::memory_order_relaxed);
    do {
      e->next.store(static_cast<uint32_t>(h), std::memory_order_relaxed);
    } while (!head_.compare_exchange_weak(h, (h >> 32 << 32) + (uint64_t{1} << 32) + index,
                                          std::memory_order_release, std::memory_order_relaxed));
  }
  bool Owns(const void* p) const {
    const auto* e = static_cast<const Event*>(p);
    return e >= events_.get() && e < events_.get() + n_;
  }

 private:
  std::unique_ptr<Event[]> events_;
  uint32_t n_;
  std::atomic<uint64_t> head_{0};
};

// One communicator: the group its ops are recorded in.
struct Comm {
  tracer::GroupId group = 0;
  std::vector<int32_t> members;  // global rank by rank in the communicator
  int rank = 0;                  // init's: the one the plugin trusts
  // The mask variable NCCL handed init: NCCL's own, which its RAS may rewrite while the job runs
  // (read relaxed, as NCCL writes it). Null: the mask is what init set.
  const int* live_mask = nullptr;
  Logger log = nullptr;
  std::atomic<bool> said_unobserved{false};  // the log line about kernel channels being off
};

// The plugin's state: made at the first communicator, never destroyed (NCCL may call into it from
// its threads until the process ends).
struct Recorder {
  Config config;
  const inproc::Process* process = nullptr;
  tracer::Tracer* tracer = nullptr;  // the process's
  std::unique_ptr<Pool> pool;
  std::atomic<uint64_t> events_dropped{0};
  std::string error;  // why it could not start ("" when it did)
};

Recorder* TheRecorder() {
  static Recorder* r = [] {
    auto* rec = new Recorder;
    rec->config = ReadConfig();
    if (rec->config.off) {
      rec->error = "MEGASCOPE_NCCL=0";
      return rec;
    }
    rec->process = &inproc::TheProcess();
    if (rec->process->tracer == nullptr) {
      rec->error = rec->process->error;
      return rec;
    }
    rec->tracer = rec->process->tracer;
    rec->pool = std::make_unique<Pool>(rec->config.events);
    return rec;
  }();
  return r;
}

OpType OpOf(const char* func) {
  const std::string_view f = func != nullptr ? func : "";
  if (f == "AllReduce") return OpType::kAllreduce;
  if (f == "AllGather") return OpType::kAllgather;
  if (f == "ReduceScatter") return OpType::kReduceScatter;
  if (f == "Broadcast") return OpType::kBroadcast;
  if (f == "Reduce") return OpType::kReduce;
  if (f == "AlltoAll") return OpType::kAlltoall;
  if (f == "Send") return OpType::kSend;
  if (f == "Recv") return OpType::kRecv;
  return OpType::kUnknown;  // Gather, Scatter: no op of docs/formats.md names them
}

// The datatype's formats.md spelling and its size in bytes.
std::pair<DType, int> TypeOf(const char* datatype) {
  const std::string_view d = datatype != nullptr ? datatype : "";
  if (d == "ncclFloat32") return {DType::kF32, 4};
  if (d == "ncclBfloat16") return {DType::kBf16, 2};
  if (d == "ncclFloat16") return {DType::kF16, 2};
  if (d == "ncclFloat64") return {DType::kF64, 8};
  if (d == "ncclInt32") return {DType::kI32, 4};
  if (d == "ncclInt64") return {DType::kI64, 8};
  if (d == "ncclUint8") return {DType::kU8, 1};
  if (d == "ncclUint32" || d == "ncclInt8" || d == "ncclFloat8e4m3" || d == "ncclFloat8e5m2")
    return {DType::kUnknown, d == "ncclUint32" ? 4 : 1};
  return {DType::kUnknown, d == "ncclUint64" ? 8 : 1};
}

void Release(Recorder* rec, Event* e) {
  if (e->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) rec->pool->Put(e);
}

void MarkStarted(Recorder* rec, Event* op) {
  bool expected = false;
  if (op->started.compare_exchange_strong(expected, true)) rec->tracer->Start(op->fr);
}

// Completes `op` once (its completion's reference released).
void Finish(Recorder* rec, Event* op) {
  bool expected = false;
  if (!op->completed.compare_exchange_strong(expected, true)) return;
  rec->tracer->Complete(op->fr);
  Release(rec, op);
}

// The followers linked to `head` so far, started and completed with it (each list reference
// released).
void FinishFollowers(Recorder* rec, Event* head) {
  for (Event* f = head->followers.exchange(nullptr, std::memory_order_acq_rel); f != nullptr;) {
    Event* next = f->next_follower;
    MarkStarted(rec, f);
    Finish(rec, f);
    Release(rec, f);
    f = next;
  }
}

// Completes the op once every channel's kernel stopped and no proxy op is open.
void MaybeComplete(Recorder* rec, Event* op) {
  if (op->kernels_done.load(std::memory_order_acquire) < op->channels ||
      op->proxies_open.load(std::memory_order_acquire) > 0)
    return;
  Finish(rec, op);
  FinishFollowers(rec, op);
}

// `follower` finishes with `head`: on its list (holding a reference), or at once where the head
// has finished already.
void Follow(Recorder* rec, Event* head, Event* follower) {
  follower->follows_head = true;
  follower->refs.fetch_add(1, std::memory_order_acq_rel);
  Event* top = head->followers.load(std::memory_order_relaxed);
  do {
    follower->next_follower = top;
  } while (!head->followers.compare_exchange_weak(top, follower, std::memory_order_release,
                                                  std::memory_order_relaxed));
  if (head->completed.load(std::memory_order_acquire)) FinishFollowers(rec, head);
}

// A new op of `comm`: its flight-recorder entry enqueued.
Event* StartOp(Recorder* rec, const Comm& comm, const char* func, const char* datatype,
               size_t count, int peer, int channels) {
  const OpType op = OpOf(func);
  if (op == OpType::kUnknown) return nullptr;
  int32_t global_peer = -1;
  if (tracer::IsP2P(op)) {
    if (peer < 0 || peer >= static_cast<int>(comm.members.size())) return nullptr;
    global_peer = comm.members[static_cast<size_t>(peer)];
    if (global_peer < 0) return nullptr;  // a member whose global rank is not known
  }
  Event* e = rec->pool->Get();
  if (e == nullptr) {
    rec->events_dropped.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  const auto [dtype, size] = TypeOf(datatype);
  e->kind = Kind::kOp;
  e->parent = nullptr;
  e->fr =
      rec->tracer->Enqueue(comm.group, op, count * static_cast<size_t>(size), dtype, global_peer);
  e->channels = channels;
  e->kernels_done.store(0, std::memory_order_relaxed);
  e->proxies_open.store(0, std::memory_order_relaxed);
  e->sent.store(0, std::memory_order_relaxed);
  e->received.store(0, std::memory_order_relaxed);
  e->started.store(false, std::memory_order_relaxed);
  e->completed.store(false, std::memory_order_relaxed);
  e->follows_head = false;
  e->followers.store(nullptr, std::memory_order_relaxed);
  e->head = nullptr;
  e->refs.store(2, std::memory_order_release);  // NCCL's handle and completion
  return e;
}

// Kernel channels are off in NCCL's mask now (its RAS changed it): an op issued now is never seen
// to finish. Said once per communicator.
bool ChannelsUnobserved(Comm& comm) {
  if (comm.live_mask == nullptr ||
      (__atomic_load_n(comm.live_mask, __ATOMIC_RELAXED) & static_cast<int>(kKernelCh)) != 0)
    return false;
  if (!comm.said_unobserved.exchange(true) && comm.log != nullptr)
    comm.log(2, ~0UL, __FILE__, __LINE__,
             "megascope profiler: NCCL's event mask has kernel channels off (RAS override): ops "
             "are recorded completed when issued until they are back");
  return true;
}

// v7's Coll: a symmetric plan's ops finish with its head (the one op its channels report to).
template <typename Descr>
void LinkSymmetric(Recorder* rec, const Descr* d, Event* e) {
  if constexpr (std::is_same_v<Descr, DescrV7>) {
    void* g = d->coll.parentGroup;
    if (e == nullptr || !d->coll.isSymColl || g == nullptr || !rec->pool->Owns(g)) return;
    auto* group = static_cast<Event*>(g);
    if (group->kind != Kind::kGroup) return;
    if (e->channels > 0 && group->head == nullptr) {
      group->head = e;
      e->refs.fetch_add(1, std::memory_order_acq_rel);  // the group's
    } else if (e->channels == 0 && group->head != nullptr) {
      Follow(rec, group->head, e);
    }
  }
}

Event* StartChild(Recorder* rec, Kind kind, void* parent_handle) {
  if (parent_handle == nullptr || !rec->pool->Owns(parent_handle)) return nullptr;
  auto* parent = static_cast<Event*>(parent_handle);
  Event* e = rec->pool->Get();
  if (e == nullptr) {
    rec->events_dropped.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  e->kind = kind;
  e->parent = parent;
  e->trans = 0;
  e->refs.store(1, std::memory_order_relaxed);
  parent->refs.fetch_add(1, std::memory_order_acq_rel);
  return e;
}

template <typename Descr>
int StartEvent(void* context, void** handle, Descr* d) {
  *handle = nullptr;
  Recorder* rec = TheRecorder();
  if (context == nullptr || rec->tracer == nullptr || d == nullptr) return kSuccess;
  auto& comm = *static_cast<Comm*>(context);
  Event* e = nullptr;
  switch (d->type) {
    case kGroup:
      if constexpr (std::is_same_v<Descr, DescrV7>) {  // a plan, for its symmetric ops
        e = rec->pool->Get();
        if (e == nullptr) {
          rec->events_dropped.fetch_add(1, std::memory_order_relaxed);
          break;
        }
        e->kind = Kind::kGroup;
        e->parent = nullptr;
        e->head = nullptr;
        e->refs.store(1, std::memory_order_release);  // NCCL's handle
      }
      break;
    case kColl:
      e = StartOp(rec, comm, d->coll.func, d->coll.datatype, d->coll.count, -1,
                  ChannelsUnobserved(comm) ? 0 : d->coll.nChannels);
      LinkSymmetric(rec, d, e);
      break;
    case kP2p:
      e = StartOp(rec, comm, d->p2p.func, d->p2p.datatype, d->p2p.count, d->p2p.peer,
                  ChannelsUnobserved(comm) ? 0 : d->p2p.nChannels);
      break;
    case kProxyOp:
      e = StartChild(rec, Kind::kProxyOp, d->parentObj);
      if (e != nullptr) {
        e->is_send = d->proxyOp.isSend != 0;
        e->parent->proxies_open.fetch_add(1, std::memory_order_acq_rel);
        MarkStarted(rec, e->parent);
      }
      break;
    case kProxyStep:
      // A step's parent is its proxy op, whose parent is the op.
      if (d->parentObj != nullptr && rec->pool->Owns(d->parentObj) &&
          static_cast<Event*>(d->parentObj)->kind == Kind::kProxyOp)
        e = StartChild(rec, Kind::kProxyStep, d->parentObj);
      break;
    case kKernelCh:
      e = StartChild(rec, Kind::kKernelCh, d->parentObj);
      if (e != nullptr) MarkStarted(rec, e->parent);
      break;
    default:  // KernelPhase and the API events: not recorded
      if constexpr (!std::is_same_v<Descr, DescrV5>) {
        if (d->type == kCeColl)  // copy-engine collective: its completion is not observed here
          e = StartOp(rec, comm, d->ceColl.func, d->ceColl.datatype, d->ceColl.count, -1, 0);
      }
      break;
  }
  *handle = e;
  return kSuccess;
}

int StopEvent(void* handle) {
  Recorder* rec = TheRecorder();
  if (handle == nullptr || rec->pool == nullptr || !rec->pool->Owns(handle)) return kSuccess;
  auto* e = static_cast<Event*>(handle);
  Event* op = e->parent;
  switch (e->kind) {
    case Kind::kOp:
      // Enqueued only: the device finishes it later. An op without channels (a copy-engine
      // collective) is done when NCCL has issued it -- unless it finishes with its symmetric
      // plan's head.
      if (e->channels == 0 && !e->follows_head) {
        MarkStarted(rec, e);
        MaybeComplete(rec, e);
      }
      break;
    case Kind::kGroup:
      if (e->head != nullptr) Release(rec, e->head);
      break;
    case Kind::kKernelCh:
      op->kernels_done.fetch_add(1, std::memory_order_acq_rel);
      MaybeComplete(rec, op);
      Release(rec, op);
      break;
    case Kind::kProxyOp:
      op->proxies_open.fetch_sub(1, std::memory_order_acq_rel);
      MaybeComplete(rec, op);
      Release(rec, op);
      break;
    case Kind::kProxyStep: {
      Event* owner = op->parent;  // the op the step's proxy op moves bytes for
      if (owner != nullptr && e->trans > 0) {
        auto& total = op->is_send ? owner->sent : owner->received;
        total.fetch_add(static_cast<int64_t>(e->trans), std::memory_order_relaxed);
        rec->tracer->Progress(owner->fr, owner->sent.load(std::memory_order_relaxed),
                              owner->received.load(std::memory_order_relaxed));
      }
      Release(rec, op);
      break;
    }
  }
  Release(rec, e);
  return kSuccess;
}

int RecordEventState(void* handle, int state, StateArgs* args) {
  Recorder* rec = TheRecorder();
  if (handle == nullptr || rec->pool == nullptr || !rec->pool->Owns(handle)) return kSuccess;
  auto* e = static_cast<Event*>(handle);
  if (e->kind != Kind::kProxyStep) return kSuccess;
  if (args != nullptr && args->proxyStep.transSize > 0) e->trans = args->proxyStep.transSize;
  // Where the step waits: for its own GPU (to fill a send buffer, or to drain or flush a
  // received one) or for its peer and the network.
  tracer::WaitSide side = tracer::WaitSide::kNone;
  switch (state) {
    case kProxyStepSendGpuWait:
    case kProxyStepRecvGpuWait:
    case kProxyStepRecvFlushWait:
      side = tracer::WaitSide::kGpu;
      break;
    case kProxyStepSendPeerWait:
    case kProxyStepSendWait:
    case kProxyStepRecvWait:
      side = tracer::WaitSide::kNetwork;
      break;
    default:
      return kSuccess;
  }
  if (Event* owner = e->parent->parent) rec->tracer->SetWaiting(owner->fr, side);
  return kSuccess;
}

// The communicator's members' global ranks: the world's are its own ranks; a sub-communicator's
// are exchanged through MEGASCOPE_RUN_DIR/nccl/<id>/<rank in it> (every member is in init at
// once), waited for a few seconds at most. An unknown member is -1.
std::vector<int32_t> Members(const inproc::Process& c, uint64_t comm_id, int n_ranks, int rank) {
  std::vector<int32_t> members(static_cast<size_t>(n_ranks), -1);
  if (n_ranks == c.ring.world_size) {
    for (int i = 0; i < n_ranks; ++i) members[static_cast<size_t>(i)] = i;
    return members;
  }
  members[static_cast<size_t>(rank)] = c.ring.rank;
  if (c.run_dir.empty()) return members;
  char id[32];
  std::snprintf(id, sizeof(id), "%016llx", static_cast<unsigned long long>(comm_id));
  const std::string dir = c.run_dir + "/nccl/" + id;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  {
    const std::string tmp = dir + "/." + std::to_string(rank);
    std::ofstream(tmp) << c.ring.rank << "\n";
    std::filesystem::rename(tmp, dir + "/" + std::to_string(rank), ec);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    int known = 0;
    for (int i = 0; i < n_ranks; ++i) {
      int32_t& m = members[static_cast<size_t>(i)];
      if (m < 0) {
        std::ifstream in(dir + "/" + std::to_string(i));
        if (!(in >> m)) m = -1;
      }
      known += m >= 0;
    }
    if (known == n_ranks || std::chrono::steady_clock::now() > deadline) return members;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

int Init(void** context, uint64_t comm_id, int* mask, const char* comm_name, int /*n_nodes*/,
         int n_ranks, int rank, Logger log) {
  *context = nullptr;
  Recorder* rec = TheRecorder();
  if (rec->tracer == nullptr || n_ranks <= 0 || rank < 0 || rank >= n_ranks) {
    *mask = 0;
    if (log != nullptr && !rec->error.empty())
      log(2, ~0UL, __FILE__, __LINE__, "megascope profiler: off (%s)", rec->error.c_str());
    return kSuccess;
  }
  auto comm = std::make_unique<Comm>();
  comm->rank = rank;
  comm->members = Members(*rec->process, comm_id, n_ranks, rank);
  tracer::RankList ranks;
  if (n_ranks == rec->process->ring.world_size) {
    ranks.AppendRun(0, static_cast<uint32_t>(n_ranks), 1);
  } else {
    for (int32_t m : comm->members) {
      if (m >= 0) ranks.AppendRun(m, 1, 1);
    }
  }
  char name[64];
  const bool named = comm_name != nullptr && *comm_name != '\0';
  std::snprintf(name, sizeof(name), "%.40s.%08llx", named ? comm_name : "nccl",
                static_cast<unsigned long long>(comm_id & 0xffffffffULL));
  auto group = rec->tracer->RegisterGroup(
      name, n_ranks == rec->process->ring.world_size ? "world" : "nccl", ranks);
  if (!group.ok()) {
    *mask = 0;
    if (log != nullptr)
      log(2, ~0UL, __FILE__, __LINE__, "megascope profiler: communicator %s not recorded: %s", name,
          group.status().message().c_str());
    return kSuccess;
  }
  comm->group = *group;
  *mask = static_cast<int>(rec->config.mask);
  comm->live_mask = mask;
  comm->log = log;
  *context = comm.release();
  return kSuccess;
}

int Finalize(void* context) {
  delete static_cast<Comm*>(context);
  return kSuccess;
}

}  // namespace
}  // namespace megascope::nccl

// The symbols NCCL looks up (the newest it knows first).
extern "C" {
__attribute__((visibility("default"))) megascope::nccl::ProfilerV7 ncclProfiler_v7 = {
    "megascope",
    megascope::nccl::Init,
    megascope::nccl::StartEvent<megascope::nccl::DescrV7>,
    megascope::nccl::StopEvent,
    megascope::nccl::RecordEventState,
    megascope::nccl::Finalize};
__attribute__((visibility("default"))) megascope::nccl::ProfilerV6 ncclProfiler_v6 = {
    "megascope",
    megascope::nccl::Init,
    megascope::nccl::StartEvent<megascope::nccl::DescrV6>,
    megascope::nccl::StopEvent,
    megascope::nccl::RecordEventState,
    megascope::nccl::Finalize};
__attribute__((visibility("default"))) megascope::nccl::ProfilerV5 ncclProfiler_v5 = {
    "megascope",
    megascope::nccl::Init,
    megascope::nccl::StartEvent<megascope::nccl::DescrV5>,
    megascope::nccl::StopEvent,
    megascope::nccl::RecordEventState,
    megascope::nccl::Finalize};
}
