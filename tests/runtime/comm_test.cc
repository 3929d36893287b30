// Real Gloo over TCP loopback: 4 ranks as threads of this process, each with its own ring.
#include "megascope/runtime/comm.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <cstring>
#include <latch>
#include <numeric>
#include <thread>

#include "megascope/launch/exit_codes.h"
#include "test_util.h"

namespace megascope::runtime {
namespace {

using megascope::testing::TempDir;

struct Rank {
  std::unique_ptr<tracer::Tracer> tracer;
  std::unique_ptr<Communicator> comm;
};

// Runs `body(rank, comm, tracer)` on every rank of `layout` concurrently.
void RunRanks(const Layout& layout, const TempDir& dir, const std::string& job,
              const std::function<void(int, Communicator&, tracer::Tracer&)>& body,
              GlooOptions opts = {}) {
  std::vector<std::thread> threads;
  threads.reserve(layout.world());
  for (int r = 0; r < layout.world(); ++r) {
    threads.emplace_back([&, r] {
      tracer::RingOptions ro;
      ro.dir = dir.path();
      ro.job = job;
      ro.rank = r;
      ro.world_size = layout.world();
      ro.coords = layout.CoordsOf(r);
      ro.lane_capacity = 1024;
      auto t = tracer::Tracer::Create(ro);
      ASSERT_TRUE(t.ok()) << t.status().ToString();
      GlooOptions o = opts;
      o.rendezvous_dir = dir.path() + "/rdzv";
      auto g = CreateGlooCommunicator(r, layout, o);
      ASSERT_TRUE(g.ok()) << g.status().ToString();
      auto c = TraceCommunicator(std::move(*g), t->get());
      ASSERT_TRUE(c.ok()) << c.status().ToString();
      body(r, **c, **t);
    });
  }
  for (auto& t : threads) t.join();
}

TEST(LayoutTest, MegatronOrderAndGroupNames) {
  Layout l{2, 2, 2};  // dp, tp, pp
  EXPECT_EQ(l.CoordsOf(3).dp, 1);
  EXPECT_EQ(l.CoordsOf(3).tp, 1);
  EXPECT_EQ(l.CoordsOf(3).pp, 0);
  EXPECT_EQ(l.CoordsOf(7).pp, 1);
  for (int r = 0; r < 8; ++r) EXPECT_EQ(l.RankOf(l.CoordsOf(r)), r);
  auto g = l.GroupsOf(3);
  EXPECT_EQ(g[0].name, "tp.0.1");
  EXPECT_EQ(g[0].ranks, (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(g[1].name, "dp.0.1");
  EXPECT_EQ(g[1].ranks, (std::vector<int32_t>{1, 3}));
  EXPECT_EQ(g[2].name, "pp.1.1");
  EXPECT_EQ(g[2].ranks, (std::vector<int32_t>{3, 7}));
  EXPECT_EQ(g[3].kind, GroupKind::kMp);
  EXPECT_EQ(g[3].ranks, (std::vector<int32_t>{2, 3, 6, 7}));
  EXPECT_EQ(g[4].kind, GroupKind::kEmb);
  EXPECT_EQ(g[5].kind, GroupKind::kWorld);
}

TEST(GlooCommTest, CollectivesAndP2PAreCorrectAndTraced) {
  TempDir dir;
  Layout layout{1, 2, 2};  // tp=2, pp=2
  RunRanks(layout, dir, "commtest", [&](int r, Communicator& c, tracer::Tracer& t) {
    const int tp = c.Find(GroupKind::kTp), pp = c.Find(GroupKind::kPp),
              world = c.Find(GroupKind::kWorld);
    std::vector<float> x = {static_cast<float>(r), 1.0f};
    ASSERT_TRUE(c.AllReduce(world, x.data(), 2, ReduceOp::kSum).ok());
    EXPECT_EQ(x[0], 0 + 1 + 2 + 3);
    EXPECT_EQ(x[1], 4);
    std::vector<float> m = {static_cast<float>(r)};
    ASSERT_TRUE(c.AllReduce(tp, m.data(), 1, ReduceOp::kMax).ok());
    EXPECT_EQ(m[0], static_cast<float>(r | 1));
    std::vector<float> all(4), mine = {static_cast<float>(r)};
    ASSERT_TRUE(c.AllGather(world, mine.data(), 1, all.data()).ok());
    EXPECT_EQ(all, (std::vector<float>{0, 1, 2, 3}));
    std::vector<float> b = {r == 1 ? 42.0f : 0.0f};
    ASSERT_TRUE(c.Broadcast(world, b.data(), 1, 1).ok());
    EXPECT_EQ(b[0], 42.0f);
    std::vector<float> rs_in = {1, 2}, rs_out(1);
    ASSERT_TRUE(c.ReduceScatter(tp, rs_in.data(), 2, rs_out.data()).ok());
    EXPECT_EQ(rs_out[0], 2.0f * (r % 2 + 1));
    ASSERT_TRUE(c.Barrier(world).ok());
    // Pipeline neighbours swap 1,000 floats both ways (send first: sends are asynchronous).
    const int peer = r < 2 ? r + 2 : r - 2;
    std::vector<float> out(1000), in(1000);
    std::iota(out.begin(), out.end(), static_cast<float>(r * 1000));
    ASSERT_TRUE(c.Send(pp, peer, out.data(), out.size()).ok());
    ASSERT_TRUE(c.Recv(pp, peer, in.data(), in.size()).ok());
    ASSERT_TRUE(c.WaitSends().ok());
    EXPECT_EQ(in[0], peer * 1000.0f);
    EXPECT_EQ(in[999], peer * 1000.0f + 999);
    tracer::RankSnapshot s = t.Snapshot();
    int completed = 0;
    for (const auto& e : s.entries) completed += e.state == tracer::OpState::kCompleted ? 1 : 0;
    EXPECT_EQ(completed, static_cast<int>(s.entries.size()));
    EXPECT_EQ(s.entries.back().op, tracer::OpType::kRecv);
    EXPECT_EQ(s.entries.back().peer, peer);
    EXPECT_EQ(s.entries.back().bytes_received, 4000);
  });
}

TEST(GlooCommTest, ADeadPeerFailsTheOpAndTheFlightRecorderSaysSo) {
  // As in the worker (worker.cc): a write to the dead peer's socket must fail the op, not raise
  // SIGPIPE and kill the process. Whether the write comes before the peer's close is a race.
  struct IgnoreSigpipe {
    void (*old)(int) = ::signal(SIGPIPE, SIG_IGN);
    ~IgnoreSigpipe() { ::signal(SIGPIPE, old); }
  } ignore_sigpipe;
  TempDir dir;
  Layout layout{2, 1, 1};
  GlooOptions opts;
  opts.timeout = std::chrono::milliseconds(3000);
  RunRanks(
      layout, dir, "commfail",
      [&](int r, Communicator& c, tracer::Tracer& t) {
        const int dp = c.Find(GroupKind::kDp);
        std::vector<float> x(16, 1.0f);
        ASSERT_TRUE(c.AllReduce(dp, x.data(), x.size(), ReduceOp::kSum).ok());
        if (r == 1) return;  // rank 1 leaves: its communicator closes its connections
        Status st = c.AllReduce(dp, x.data(), x.size(), ReduceOp::kSum);
        EXPECT_FALSE(st.ok());
        EXPECT_NE(st.message().find("allreduce in dp.0.0 failed"), std::string::npos)
            << st.ToString();
        EXPECT_EQ(t.Snapshot().entries.back().state, tracer::OpState::kFailed);
      },
      opts);
}

// A peer that never comes to the rendezvous: connecting fails as unreachable and names that peer
// in the words the controller reads (launch::CannotReachPeer), so the node that cannot be reached
// is the suspect, not the one left waiting.
TEST(GlooCommTest, APeerThatNeverArrivesIsNamedAsTheOneNotReached) {
  TempDir dir;
  GlooOptions o;
  o.rendezvous_dir = dir.path() + "/rdzv";
  o.connect_timeout = std::chrono::milliseconds(300);
  auto c = CreateGlooCommunicator(0, Layout{2, 1, 1}, o);  // rank 1 never starts
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(launch::CannotReachPeer(c.status().message()), 1) << c.status().ToString();
}

// bf16 is the top half of an fp32: exact for these small values.
uint16_t Bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return static_cast<uint16_t>(u >> 16);
}

TEST(GlooCommTest, EachDtypeReducesAsItselfAndTheRecordSaysWhichItWas) {
  TempDir dir;
  Layout layout{2, 1, 1};
  RunRanks(layout, dir, "dtypes", [&](int r, Communicator& c, tracer::Tracer& t) {
    const int dp = c.Find(GroupKind::kDp);
    std::vector<uint16_t> h = {Bf16(1.5f), Bf16(static_cast<float>(r)), Bf16(-2.0f)};
    CommOp sum{OpType::kAllreduce, dp, h.data(), h.data(), h.size(), DType::kBf16};
    ASSERT_TRUE(c.Run(sum).ok());
    EXPECT_EQ(h, (std::vector<uint16_t>{Bf16(3.0f), Bf16(1.0f), Bf16(-4.0f)}));
    EXPECT_EQ(t.Snapshot().entries.back().dtype, DType::kBf16);
    EXPECT_EQ(t.Snapshot().entries.back().bytes, 6u);
    std::vector<uint16_t> m = {Bf16(static_cast<float>(r) - 0.5f)};
    CommOp max{OpType::kAllreduce, dp, m.data(), m.data(), 1, DType::kBf16, ReduceOp::kMax};
    ASSERT_TRUE(c.Run(max).ok());
    EXPECT_EQ(m[0], Bf16(0.5f));
    std::vector<double> d = {0.1 * (r + 1)};  // 0.1 + 0.2 as doubles, not floats
    ASSERT_TRUE(c.Run({OpType::kAllreduce, dp, d.data(), d.data(), 1, DType::kF64}).ok());
    EXPECT_EQ(d[0], 0.1 + 0.2);
    std::vector<uint8_t> bytes = {static_cast<uint8_t>(r + 7)}, both(2);  // a byte move: any type
    ASSERT_TRUE(c.Run({OpType::kAllgather, dp, bytes.data(), both.data(), 1, DType::kU8}).ok());
    EXPECT_EQ(both, (std::vector<uint8_t>{7, 8}));
    std::vector<int32_t> ints = {1};
    Status refused = c.Run({OpType::kAllreduce, dp, ints.data(), ints.data(), 1, DType::kI32});
    EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument) << refused.ToString();
    EXPECT_NE(refused.message().find("cannot reduce i32"), std::string::npos) << refused.ToString();
    EXPECT_EQ(t.Snapshot().entries.back().state, tracer::OpState::kFailed);
  });
}

TEST(GlooCommTest, AbortEndsAReceiveInFlightAndEveryLaterOp) {
  TempDir dir;
  Layout layout{2, 1, 1};
  GlooOptions opts;
  opts.timeout = std::chrono::milliseconds(120000);  // only Abort can end the receive in time
  std::latch done(2);  // rank 1 keeps its connections open until rank 0 has seen the abort
  RunRanks(
      layout, dir, "abort",
      [&](int r, Communicator& c, tracer::Tracer& t) {
        const int dp = c.Find(GroupKind::kDp);
        if (r == 1) {
          done.arrive_and_wait();
          return;
        }
        std::vector<float> in(64);
        CommOp recv{OpType::kRecv, dp, nullptr, in.data(), in.size()};
        recv.peer = 1;  // which never sends
        std::unique_ptr<Work> w = c.Post(recv, nullptr);
        std::thread watchdog([&] { c.Abort(); });
        Status st = w->Wait();
        watchdog.join();
        EXPECT_EQ(st.code(), StatusCode::kAborted) << st.ToString();
        EXPECT_NE(st.message().find("recv from rank 1 in dp.0.0 aborted"), std::string::npos)
            << st.ToString();
        EXPECT_EQ(t.Snapshot().entries.back().op, tracer::OpType::kRecv);
        EXPECT_EQ(t.Snapshot().entries.back().state, tracer::OpState::kFailed);
        Status later = c.Barrier(dp);
        EXPECT_EQ(later.code(), StatusCode::kAborted) << later.ToString();
        EXPECT_EQ(c.Rebuild(1).code(), StatusCode::kFailedPrecondition);
        done.arrive_and_wait();
      },
      opts);
}

// The tracing decorator over a transport that is not Gloo: what the transport reports, and only
// that, is in the flight recorder, from whichever thread reports it.
class ScriptedTransport final : public Communicator {
 public:
  ScriptedTransport() { groups_.push_back({"tp.0.0", GroupKind::kTp, {0, 1}}); }
  const std::vector<GroupSpec>& groups() const override { return groups_; }
  std::unique_ptr<Work> Post(const CommOp& op, std::shared_ptr<OpObserver> obs) override {
    if (op.type == OpType::kBarrier) return DoneWork(Internal("refused"));  // says nothing
    obs->Started();
    if (op.type == OpType::kAllreduce) {  // over by the time Post returns
      obs->Moved(static_cast<int64_t>(op.bytes()), static_cast<int64_t>(op.bytes()));
      obs->Finished(true);
    } else {  // stream-ordered: the end is reported later, by someone else
      later_ = std::move(obs);
    }
    return DoneWork(Status::Ok());
  }
  void Abort() override {}
  std::shared_ptr<OpObserver> later_;

 private:
  std::vector<GroupSpec> groups_;
};

TEST(TraceCommunicatorTest, TheRecordFollowsWhatAnyTransportReports) {
  TempDir dir;
  tracer::RingOptions ro;
  ro.dir = dir.path();
  ro.job = "decorator";
  ro.world_size = 2;
  ro.lane_capacity = 64;
  auto t = tracer::Tracer::Create(ro);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  auto owned = std::make_unique<ScriptedTransport>();
  ScriptedTransport* transport = owned.get();
  auto c = TraceCommunicator(std::move(owned), t->get());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  std::vector<float> x(8);
  ASSERT_TRUE((*c)->AllReduce(0, x.data(), x.size(), ReduceOp::kSum).ok());
  ASSERT_TRUE((*c)->Send(0, 1, x.data(), 4).ok());
  ASSERT_TRUE((*c)->WaitSends().ok());
  tracer::RankSnapshot s = (*t)->Snapshot();
  ASSERT_EQ(s.entries.size(), 2u);
  EXPECT_EQ(s.entries[0].state, tracer::OpState::kCompleted);
  EXPECT_EQ(s.entries[0].bytes_received, 32);
  EXPECT_EQ(s.entries[1].state, tracer::OpState::kStarted);  // waited for, not yet over
  EXPECT_EQ(s.entries[1].peer, 1);
  std::thread([&] { transport->later_->Finished(false); }).join();  // a watchdog's verdict
  EXPECT_EQ((*t)->Snapshot().entries[1].state, tracer::OpState::kFailed);
  EXPECT_FALSE((*c)->Barrier(0).ok());
  EXPECT_EQ((*t)->Snapshot().entries.back().op, tracer::OpType::kBarrier);
  EXPECT_EQ((*t)->Snapshot().entries.back().state, tracer::OpState::kFailed);
  EXPECT_EQ((*t)->Snapshot().entries.back().started_at_ns, 0);  // it never started
}

}  // namespace
}  // namespace megascope::runtime
