#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>
#include <utility>

#include "megascope/launch/link_seam.h"
#include "megascope/launch/supervisor.h"
#include "megascope/runtime/comm.h"

namespace megascope::runtime {

int Communicator::Find(const std::string& kind) const {
  const auto& g = groups();
  for (size_t i = 0; i < g.size(); ++i) {
    if (g[i].kind == kind) return static_cast<int>(i);
  }
  return -1;
}

namespace {

using tracer::DType;
using tracer::OpHandle;
using tracer::OpType;

// P2P slots live above Gloo's own collective slot prefixes (0x01-0x08 in the top byte).
constexpr uint64_t kP2PSlotPrefix = uint64_t{0x40} << 56;
constexpr int kSendChunks = 4;
using ReduceFn = void (*)(void*, const void*, const void*, size_t);

class GlooCommunicator final : public Communicator {
 public:
  const std::vector<GroupSpec>& groups() const override { return groups_; }

  Status Init(int rank, const Layout& layout, const GlooOptions& o, tracer::Tracer* t) {
    rank_ = rank;
    opts_ = o;
    tracer_ = t;
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
        auto ctx = std::make_shared<gloo::rendezvous::Context>(g.IndexOf(rank),
                                                               static_cast<int>(g.ranks.size()));
        ctx->setTimeout(o.timeout);
        ctx->connectFullMesh(prefix, device_);
        contexts_.push_back(ctx);
        ASSIGN_OR_RETURN(tracer::GroupId id, t->RegisterGroup(g.name, g.kind, g.ranks));
        group_ids_.push_back(id);
        send_seq_.emplace_back(g.ranks.size(), 0);
        recv_seq_.emplace_back(g.ranks.size(), 0);
      }
    } catch (const std::exception& e) {
      return Status(StatusCode::kUnavailable, std::string("[gloo] rendezvous failed: ") + e.what());
    }
    ASSIGN_OR_RETURN(link_name_, t->InternName("link"));
    return Status::Ok();
  }

  Status AllReduce(int g, float* data, size_t n, ReduceOp op) override {
    return Traced(g, OpType::kAllreduce, n * 4, -1, [&](OpHandle) {
      gloo::AllreduceOptions opts(contexts_[g]);
      opts.setOutput(data, n);
      opts.setReduceFunction(op == ReduceOp::kSum ? static_cast<ReduceFn>(&gloo::sum<float>)
                                                  : static_cast<ReduceFn>(&gloo::max<float>));
      opts.setTimeout(opts_.timeout);
      gloo::allreduce(opts);
    });
  }

  Status AllGather(int g, const float* in, size_t n, float* out) override {
    return Traced(g, OpType::kAllgather, n * 4, -1, [&](OpHandle) {
      gloo::AllgatherOptions opts(contexts_[g]);
      opts.setInput(const_cast<float*>(in), n);
      opts.setOutput(out, n * groups_[g].ranks.size());
      opts.setTimeout(opts_.timeout);
      gloo::allgather(opts);
    });
  }

  Status Broadcast(int g, float* data, size_t n, int root_index) override {
    return Traced(g, OpType::kBroadcast, n * 4, -1, [&](OpHandle) {
      gloo::BroadcastOptions opts(contexts_[g]);
      if (contexts_[g]->rank == root_index) opts.setInput(data, n);
      opts.setOutput(data, n);
      opts.setRoot(root_index);
      opts.setTimeout(opts_.timeout);
      gloo::broadcast(opts);
    });
  }

  Status ReduceScatter(int g, const float* in, size_t n, float* out) override {
    // Gloo 0.5 has no options-style reduce-scatter (NOTES.md): all-reduce, keep our slice.
    const size_t size = groups_[g].ranks.size(), slice = n / size;
    std::vector<float> tmp(in, in + n);
    return Traced(g, OpType::kReduceScatter, n * 4, -1, [&](OpHandle) {
      gloo::AllreduceOptions opts(contexts_[g]);
      opts.setOutput(tmp.data(), n);
      opts.setReduceFunction(static_cast<ReduceFn>(&gloo::sum<float>));
      opts.setTimeout(opts_.timeout);
      gloo::allreduce(opts);
      std::memcpy(out, tmp.data() + contexts_[g]->rank * slice, slice * sizeof(float));
    });
  }

  Status Barrier(int g) override {
    return Traced(g, OpType::kBarrier, 0, -1, [&](OpHandle) {
      gloo::BarrierOptions opts(contexts_[g]);
      opts.setTimeout(opts_.timeout);
      gloo::barrier(opts);
    });
  }

  Status Send(int g, int peer, const float* data, size_t n) override {
    const int dst = groups_[g].IndexOf(peer);
    if (dst < 0)
      return InvalidArgument("rank " + std::to_string(peer) + " is not in group " +
                             groups_[g].name);
    const uint64_t seq = send_seq_[g][dst]++;
    HoldForLink(n * 4);
    PendingSend p;
    p.data.assign(data, data + n);
    p.group = g;
    p.bytes = n * 4;
    p.handle = tracer_->Enqueue(group_ids_[g], OpType::kSend, p.bytes, DType::kF32, peer);
    tracer_->Start(p.handle);
    const bool stall = std::exchange(stall_next_send_, false);
    try {
      p.buffer = contexts_[g]->createUnboundBuffer(p.data.data(), p.bytes);
      const size_t chunk = (p.bytes + kSendChunks - 1) / kSendChunks;
      for (int c = 0; c < kSendChunks; ++c) {
        const size_t off = c * chunk, len = off >= p.bytes ? 0 : std::min(chunk, p.bytes - off);
        p.buffer->send(dst, Slot(rank_, peer, seq, c), off, len);
        if (stall) {  // the link dies after the first chunk: the op stays started, forever
          p.buffer->waitSend(opts_.timeout);
          tracer_->Progress(p.handle, static_cast<int64_t>(len), 0);
          for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
        }
      }
    } catch (const std::exception& e) {
      tracer_->Fail(p.handle);
      return Status(StatusCode::kUnavailable, "[gloo] send to rank " + std::to_string(peer) +
                                                  " in " + groups_[g].name +
                                                  " failed: " + e.what());
    }
    pending_.push_back(std::move(p));
    return Status::Ok();
  }

  Status Recv(int g, int peer, float* data, size_t n) override {
    const int src = groups_[g].IndexOf(peer);
    if (src < 0)
      return InvalidArgument("rank " + std::to_string(peer) + " is not in group " +
                             groups_[g].name);
    const uint64_t seq = recv_seq_[g][src]++;
    const size_t bytes = n * 4;
    return Traced(g, OpType::kRecv, bytes, peer, [&](OpHandle h) {
      auto buf = contexts_[g]->createUnboundBuffer(data, bytes);
      const size_t chunk = (bytes + kSendChunks - 1) / kSendChunks;
      size_t got = 0;
      for (int c = 0; c < kSendChunks; ++c) {
        const size_t off = c * chunk, len = off >= bytes ? 0 : std::min(chunk, bytes - off);
        buf->recv(src, Slot(peer, rank_, seq, c), off, len);
        if (!buf->waitRecv(opts_.timeout)) throw std::runtime_error("recv timed out");
        got += len;
        tracer_->Progress(h, -1, static_cast<int64_t>(got));
      }
    });
  }

  Status WaitSends() override {
    Status result;
    for (PendingSend& p : pending_) {
      try {
        for (int c = 0; c < kSendChunks; ++c) {
          if (!p.buffer->waitSend(opts_.timeout)) throw std::runtime_error("send timed out");
        }
        tracer_->Progress(p.handle, static_cast<int64_t>(p.bytes), -1);
        tracer_->Complete(p.handle);  // the collective record is also its comm span
      } catch (const std::exception& e) {
        tracer_->Fail(p.handle);
        if (result.ok()) {
          result = Status(StatusCode::kUnavailable,
                          "[gloo] send in " + groups_[p.group].name + " failed: " + e.what());
        }
      }
    }
    pending_.clear();
    return result;
  }

  void set_step(int64_t step) override { step_ = step; }
  void ArmSendStall() override { stall_next_send_ = true; }

 private:
  struct PendingSend {
    std::vector<float> data;
    std::unique_ptr<gloo::transport::UnboundBuffer> buffer;
    OpHandle handle = 0;
    int group = 0;
    size_t bytes = 0;
  };

  static uint64_t Slot(int src, int dst, uint64_t seq, int chunk) {
    return kP2PSlotPrefix | (static_cast<uint64_t>(src & 0xfff) << 44) |
           (static_cast<uint64_t>(dst & 0xfff) << 32) | ((seq & 0x3fffffff) << 2) |
           static_cast<uint64_t>(chunk);
  }

  // The link fault seam (launch/link_seam.h): this rank's data leaves late, in a comm span of its
  // own ("link"), so the time shows as network time and not as compute.
  void HoldForLink(size_t bytes) {
    const auto delay = link_.DelayFor(bytes);
    if (delay.count() <= 0) return;
    const int64_t start = tracer_->Ticks();
    std::this_thread::sleep_for(delay);
    tracer_->RecordSpan(tracer::SpanKind::kComm, link_name_, step_, -1, start, tracer_->Ticks());
  }

  template <typename F>
  Status Traced(int g, OpType op, size_t bytes, int peer, F&& body) {
    if (op != OpType::kRecv) HoldForLink(bytes);
    OpHandle h = tracer_->Enqueue(group_ids_[g], op, bytes, DType::kF32, peer);
    tracer_->Start(h);
    try {
      body(h);
    } catch (const std::exception& e) {
      tracer_->Fail(h);
      return Status(StatusCode::kUnavailable, "[gloo] " + std::string(tracer::Name(op)) + " in " +
                                                  groups_[g].name + " failed: " + e.what());
    }
    tracer_->Progress(h, static_cast<int64_t>(bytes), static_cast<int64_t>(bytes));
    tracer_->Complete(h);  // the collective record is also its comm span (trace_schema.h)
    return Status::Ok();
  }

  int rank_ = 0;
  GlooOptions opts_;
  tracer::Tracer* tracer_ = nullptr;
  std::vector<GroupSpec> groups_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::unique_ptr<gloo::rendezvous::FileStore> store_;
  std::vector<std::shared_ptr<gloo::Context>> contexts_;
  std::vector<tracer::GroupId> group_ids_;
  tracer::NameId link_name_{};
  std::vector<std::vector<uint64_t>> send_seq_, recv_seq_;
  std::vector<PendingSend> pending_;
  bool stall_next_send_ = false;
  launch::LinkSeam link_;  // MEGASCOPE_LINK_SEAM: a slowed link, when injected
  int64_t step_ = 0;
};

}  // namespace

Result<std::unique_ptr<Communicator>> CreateGlooCommunicator(int rank, const Layout& layout,
                                                             const GlooOptions& options,
                                                             tracer::Tracer* tracer) {
  auto c = std::make_unique<GlooCommunicator>();
  RETURN_IF_ERROR(c->Init(rank, layout, options, tracer));
  return std::unique_ptr<Communicator>(std::move(c));
}

}  // namespace megascope::runtime
