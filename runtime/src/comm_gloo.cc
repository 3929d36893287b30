// Gloo over TCP: the host transport. Rendezvous through a FileStore in the run directory.
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <utility>

#include "megascope/launch/supervisor.h"
#include "megascope/runtime/comm.h"

namespace megascope::runtime {

namespace {

// P2P slots live above Gloo's own collective slot prefixes (0x01-0x08 in the top byte).
constexpr uint64_t kP2PSlotPrefix = uint64_t{0x40} << 56;
// A send or receive moves in this many chunks: its progress bytes say how far it got.
constexpr int kChunks = 4;
using ReduceFn = void (*)(void*, const void*, const void*, size_t);

float Bf16ToFloat(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
uint16_t FloatToBf16(float f) {  // round to nearest even (NaN stays NaN)
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
void Bf16Sum(void* c, const void* a, const void* b, size_t n) {
  auto* out = static_cast<uint16_t*>(c);
  const auto *x = static_cast<const uint16_t*>(a), *y = static_cast<const uint16_t*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = FloatToBf16(Bf16ToFloat(x[i]) + Bf16ToFloat(y[i]));
}
void Bf16Max(void* c, const void* a, const void* b, size_t n) {
  auto* out = static_cast<uint16_t*>(c);
  const auto *x = static_cast<const uint16_t*>(a), *y = static_cast<const uint16_t*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = Bf16ToFloat(x[i]) >= Bf16ToFloat(y[i]) ? x[i] : y[i];
}

// The reduction for `dtype`, or null when Gloo cannot reduce it here.
ReduceFn ReduceFor(DType dtype, ReduceOp op) {
  const bool sum = op == ReduceOp::kSum;
  switch (dtype) {
    case DType::kF32:
      return sum ? static_cast<ReduceFn>(&gloo::sum<float>)
                 : static_cast<ReduceFn>(&gloo::max<float>);
    case DType::kF64:
      return sum ? static_cast<ReduceFn>(&gloo::sum<double>)
                 : static_cast<ReduceFn>(&gloo::max<double>);
    case DType::kBf16:
      return sum ? &Bf16Sum : &Bf16Max;
    default:
      return nullptr;
  }
}

// The store a group's rendezvous goes through, noting whose address was asked for last: Gloo's
// connectFullMesh waits for, reads and connects to one peer at a time, keyed by the peer's index in
// the group, so when connecting fails that is the peer it could not reach.
class WatchedStore final : public gloo::rendezvous::Store {
 public:
  explicit WatchedStore(gloo::rendezvous::Store& inner) : inner_(inner) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    inner_.set(key, data);
  }
  std::vector<char> get(const std::string& key) override {
    Note({key});
    return inner_.get(key);
  }
  void wait(const std::vector<std::string>& keys) override {
    Note(keys);
    inner_.wait(keys);
  }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    Note(keys);
    inner_.wait(keys, timeout);
  }
  // The group index of the peer asked for last; -1 for none, several, or a key not an index.
  int LastPeer() const { return last_peer_; }

 private:
  void Note(const std::vector<std::string>& keys) {
    last_peer_ = -1;
    if (keys.size() != 1 || keys[0].empty() ||
        keys[0].find_first_not_of("0123456789") != std::string::npos || keys[0].size() > 6)
      return;
    last_peer_ = std::stoi(keys[0]);
  }
  gloo::rendezvous::Store& inner_;
  int last_peer_ = -1;
};

class GlooCommunicator;

// A send or receive in flight: Wait waits for its chunks, reporting the bytes moved.
class P2PWork final : public Work {
 public:
  P2PWork(GlooCommunicator* c, bool send, std::string what, std::shared_ptr<OpObserver> obs,
          size_t bytes)
      : c_(c), send_(send), what_(std::move(what)), obs_(std::move(obs)), bytes_(bytes) {}
  ~P2PWork() override;
  Status Wait() override;
  Status WaitChunks();

  std::vector<uint8_t> copy;  // a send's own copy of its data
  std::unique_ptr<gloo::transport::UnboundBuffer> buffer;
  int posted = 0;  // chunks handed to Gloo
  int done = 0;    // chunks waited for

 private:
  GlooCommunicator* c_;
  bool send_;
  std::string what_;
  std::shared_ptr<OpObserver> obs_;
  size_t bytes_;
};

class GlooCommunicator final : public Communicator {
 public:
  const std::vector<GroupSpec>& groups() const override { return groups_; }

  Status Init(int rank, const Layout& layout, const GlooOptions& o) {
    rank_ = rank;
    opts_ = o;
    groups_ = layout.GroupsOf(rank);
    std::error_code ec;
    std::filesystem::create_directories(o.rendezvous_dir, ec);
    if (ec)
      return IoError("cannot create rendezvous directory " + o.rendezvous_dir + ": " +
                     ec.message());
    try {
      gloo::transport::tcp::attr attr;
      // A node on its own host binds that host's backend address (or its training interface's);
      // one machine: loopback.
      const char* bind = std::getenv(launch::kBindAddrEnv);
      const char* iface = std::getenv(launch::kBindIfaceEnv);
      if (bind != nullptr && *bind != '\0') {
        attr.hostname = bind;
      } else if (iface != nullptr && *iface != '\0') {
        attr.iface = iface;
      } else {
        attr.hostname = "127.0.0.1";
      }
      device_ = gloo::transport::tcp::CreateDevice(attr);
      store_ = std::make_unique<gloo::rendezvous::FileStore>(o.rendezvous_dir);
      for (const GroupSpec& g : groups_) {
        gloo::rendezvous::PrefixStore prefix(g.name, *store_);
        WatchedStore watched(prefix);
        auto ctx = std::make_shared<gloo::rendezvous::Context>(g.IndexOf(rank),
                                                               static_cast<int>(g.ranks.size()));
        ctx->setTimeout(o.connect_timeout.count() > 0 ? o.connect_timeout : o.timeout);
        try {
          ctx->connectFullMesh(watched, device_);
        } catch (const std::exception& e) {
          const int peer = watched.LastPeer();
          if (peer < 0 || peer >= static_cast<int>(g.ranks.size()) || peer == g.IndexOf(rank))
            throw;
          return Status(StatusCode::kUnavailable,
                        "[gloo] rendezvous failed: " +
                            launch::CannotReach(g.ranks[static_cast<size_t>(peer)]) + " in " +
                            g.name + ": " + e.what());
        }
        ctx->setTimeout(o.timeout);
        contexts_.push_back(ctx);
        send_seq_.emplace_back(g.ranks.size(), 0);
        recv_seq_.emplace_back(g.ranks.size(), 0);
      }
    } catch (const std::exception& e) {
      return Status(StatusCode::kUnavailable, std::string("[gloo] rendezvous failed: ") + e.what());
    }
    return Status::Ok();
  }

  std::unique_ptr<Work> Post(const CommOp& op, std::shared_ptr<OpObserver> obs) override {
    if (op.group < 0 || op.group >= static_cast<int>(groups_.size()))
      return DoneWork(InvalidArgument("[gloo] no group " + std::to_string(op.group)));
    if (aborted_.load()) return DoneWork(AbortedStatus(op));
    if (op.type == OpType::kSend || op.type == OpType::kRecv) return PostP2P(op, obs);
    if (obs != nullptr) obs->Started();  // a collective runs here, now
    Status st;
    try {
      st = RunCollective(op);
    } catch (const std::exception& e) {
      st = aborted_.load()
               ? AbortedStatus(op)
               : Status(StatusCode::kUnavailable, "[gloo] " + What(op) + " failed: " + e.what());
    }
    if (obs != nullptr) {
      const auto bytes = static_cast<int64_t>(op.bytes());
      if (st.ok()) obs->Moved(bytes, bytes);
      obs->Finished(st.ok());
    }
    return DoneWork(std::move(st));
  }

  void Abort() override {
    aborted_.store(true);
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (P2PWork* w : live_) {
        if (w->buffer == nullptr) continue;
        w->buffer->abortWaitSend();
        w->buffer->abortWaitRecv();
      }
    }
    abort_cv_.notify_all();
    for (auto& ctx : contexts_) {
      try {
        ctx->closeConnections();
      } catch (const std::exception&) {  // closing is best effort: the ops fail either way
      }
    }
  }

  std::chrono::milliseconds Timeout() const { return opts_.timeout; }
  bool IsAborted() const { return aborted_.load(); }
  void Forget(P2PWork* w) {
    std::lock_guard<std::mutex> lock(mu_);
    live_.erase(std::remove(live_.begin(), live_.end(), w), live_.end());
  }
  Status AbortedStatus(const CommOp& op) const {
    return Status(StatusCode::kAborted, "[gloo] " + What(op) + " aborted");
  }

 private:
  std::string What(const CommOp& op) const { return Describe(op, groups_[op.group]); }

  // Runs a collective to its end (Gloo's collectives are blocking).
  Status RunCollective(const CommOp& op) {
    const auto& ctx = contexts_[op.group];
    const size_t size = groups_[op.group].ranks.size(), esize = tracer::DTypeSize(op.dtype);
    auto* out = static_cast<uint8_t*>(op.out);
    switch (op.type) {
      case OpType::kAllreduce:
      case OpType::kReduceScatter: {
        const ReduceFn fn = ReduceFor(op.dtype, op.reduce);
        if (fn == nullptr)
          return InvalidArgument("[gloo] cannot reduce " + std::string(tracer::Name(op.dtype)));
        // Gloo 0.5 has no options-style reduce-scatter: all-reduce, keep our slice.
        std::vector<uint8_t> tmp;
        uint8_t* data = out;
        if (op.type == OpType::kReduceScatter) {
          if (op.count % size != 0)
            return InvalidArgument("[gloo] reduce_scatter of " + std::to_string(op.count) +
                                   " elements over " + std::to_string(size) + " ranks");
          const auto* in = static_cast<const uint8_t*>(op.in);
          tmp.assign(in, in + op.bytes());
          data = tmp.data();
        }
        gloo::AllreduceOptions o(ctx);
        if (esize == 2) {  // Gloo sizes elements by type; the reduction knows what they are
          o.setOutput(reinterpret_cast<uint16_t*>(data), op.count);
        } else if (esize == 4) {
          o.setOutput(reinterpret_cast<float*>(data), op.count);
        } else {
          o.setOutput(reinterpret_cast<double*>(data), op.count);
        }
        o.setReduceFunction(fn);
        o.setTimeout(opts_.timeout);
        gloo::allreduce(o);
        if (op.type == OpType::kReduceScatter) {
          const size_t slice = op.bytes() / size;
          std::memcpy(out, tmp.data() + ctx->rank * slice, slice);
        }
        return Status::Ok();
      }
      case OpType::kAllgather: {
        gloo::AllgatherOptions o(ctx);
        o.setInput(const_cast<uint8_t*>(static_cast<const uint8_t*>(op.in)), op.bytes());
        o.setOutput(out, op.bytes() * size);
        o.setTimeout(opts_.timeout);
        gloo::allgather(o);
        return Status::Ok();
      }
      case OpType::kBroadcast: {
        gloo::BroadcastOptions o(ctx);
        if (ctx->rank == op.root) o.setInput(out, op.bytes());
        o.setOutput(out, op.bytes());
        o.setRoot(op.root);
        o.setTimeout(opts_.timeout);
        gloo::broadcast(o);
        return Status::Ok();
      }
      case OpType::kBarrier: {
        gloo::BarrierOptions o(ctx);
        o.setTimeout(opts_.timeout);
        gloo::barrier(o);
        return Status::Ok();
      }
      default:
        return InvalidArgument("[gloo] no " + std::string(tracer::Name(op.type)) + " here");
    }
  }

  std::unique_ptr<Work> PostP2P(const CommOp& op, const std::shared_ptr<OpObserver>& obs) {
    const bool send = op.type == OpType::kSend;
    const int g = op.group, index = groups_[g].IndexOf(op.peer);
    if (index < 0)
      return DoneWork(InvalidArgument("rank " + std::to_string(op.peer) + " is not in group " +
                                      groups_[g].name));
    const uint64_t seq = (send ? send_seq_ : recv_seq_)[g][index]++;
    const size_t bytes = op.bytes();
    if (obs != nullptr) obs->Started();
    auto w = std::make_unique<P2PWork>(this, send, What(op), obs, bytes);
    const bool stall = send && opts_.faults != nullptr && opts_.faults->TakeSendStall();
    try {
      uint8_t* data = static_cast<uint8_t*>(op.out);
      if (send) {
        const auto* in = static_cast<const uint8_t*>(op.in);
        w->copy.assign(in, in + bytes);
        data = w->copy.data();
      }
      w->buffer = contexts_[g]->createUnboundBuffer(data, bytes);
      {
        std::lock_guard<std::mutex> lock(mu_);
        live_.push_back(w.get());
      }
      const size_t chunk = (bytes + kChunks - 1) / kChunks;
      for (int c = 0; c < kChunks; ++c) {
        const size_t off = c * chunk, len = off >= bytes ? 0 : std::min(chunk, bytes - off);
        const uint64_t slot = send ? Slot(rank_, op.peer, seq, c) : Slot(op.peer, rank_, seq, c);
        if (send) {
          w->buffer->send(index, slot, off, len);
        } else {
          w->buffer->recv(index, slot, off, len);
        }
        ++w->posted;
        if (stall) return StallAfterFirstChunk(op, obs, *w, len);
      }
    } catch (const std::exception& e) {
      if (obs != nullptr) obs->Finished(false);
      return DoneWork(
          Status(StatusCode::kUnavailable, "[gloo] " + What(op) + " failed: " + e.what()));
    }
    return w;
  }

  // The fault seam's dead link: the first chunk leaves, then nothing, until an abort.
  std::unique_ptr<Work> StallAfterFirstChunk(const CommOp& op,
                                             const std::shared_ptr<OpObserver>& obs, P2PWork& w,
                                             size_t len) {
    w.buffer->waitSend(opts_.timeout);
    ++w.done;
    if (obs != nullptr) obs->Moved(static_cast<int64_t>(len), 0);
    std::unique_lock<std::mutex> lock(mu_);
    abort_cv_.wait(lock, [&] { return aborted_.load(); });
    lock.unlock();
    if (obs != nullptr) obs->Finished(false);
    return DoneWork(AbortedStatus(op));
  }

  static uint64_t Slot(int src, int dst, uint64_t seq, int chunk) {
    return kP2PSlotPrefix | (static_cast<uint64_t>(src & 0xfff) << 44) |
           (static_cast<uint64_t>(dst & 0xfff) << 32) | ((seq & 0x3fffffff) << 2) |
           static_cast<uint64_t>(chunk);
  }

  int rank_ = 0;
  GlooOptions opts_;
  std::vector<GroupSpec> groups_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::unique_ptr<gloo::rendezvous::FileStore> store_;
  std::vector<std::shared_ptr<gloo::Context>> contexts_;
  std::vector<std::vector<uint64_t>> send_seq_, recv_seq_;
  std::atomic<bool> aborted_{false};
  std::mutex mu_;  // guards live_; abort_cv_ waits on it
  std::condition_variable abort_cv_;
  std::vector<P2PWork*> live_;  // sends and receives not yet destroyed (Abort interrupts them)
};

P2PWork::~P2PWork() { c_->Forget(this); }

Status P2PWork::Wait() {
  Status s = WaitChunks();
  if (obs_ != nullptr) obs_->Finished(s.ok());
  return s;
}

Status P2PWork::WaitChunks() {
  const std::string failed = "[gloo] " + what_ + " failed: ";
  const size_t chunk = (bytes_ + kChunks - 1) / kChunks;
  try {
    for (; done < posted; ++done) {
      if (c_->IsAborted()) return Status(StatusCode::kAborted, "[gloo] " + what_ + " aborted");
      const bool ok = send_ ? buffer->waitSend(c_->Timeout()) : buffer->waitRecv(c_->Timeout());
      if (!ok) return Status(StatusCode::kAborted, "[gloo] " + what_ + " aborted");
      if (!send_ && obs_ != nullptr)
        obs_->Moved(-1, static_cast<int64_t>(std::min(bytes_, (done + 1) * chunk)));
    }
  } catch (const std::exception& e) {
    if (c_->IsAborted()) return Status(StatusCode::kAborted, "[gloo] " + what_ + " aborted");
    return Status(StatusCode::kUnavailable, failed + e.what());
  }
  if (send_ && obs_ != nullptr) obs_->Moved(static_cast<int64_t>(bytes_), -1);
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<Communicator>> CreateGlooCommunicator(int rank, const Layout& layout,
                                                             const GlooOptions& options) {
  auto c = std::make_unique<GlooCommunicator>();
  RETURN_IF_ERROR(c->Init(rank, layout, options));
  return std::unique_ptr<Communicator>(std::move(c));
}

}  // namespace megascope::runtime
