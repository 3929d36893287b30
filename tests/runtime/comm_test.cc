// Real Gloo over TCP loopback: 4 ranks as threads of this process, each with its own ring.
#include "megascope/runtime/comm.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <numeric>
#include <thread>

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
      auto c = CreateGlooCommunicator(r, layout, o, t->get());
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
  EXPECT_EQ(g[3].kind, "mp");
  EXPECT_EQ(g[3].ranks, (std::vector<int32_t>{2, 3, 6, 7}));
  EXPECT_EQ(g[4].kind, "emb");
  EXPECT_EQ(g[5].kind, "world");
}

TEST(GlooCommTest, CollectivesAndP2PAreCorrectAndTraced) {
  TempDir dir;
  Layout layout{1, 2, 2};  // tp=2, pp=2
  RunRanks(layout, dir, "commtest", [&](int r, Communicator& c, tracer::Tracer& t) {
    const int tp = c.Find("tp"), pp = c.Find("pp"), world = c.Find("world");
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
        const int dp = c.Find("dp");
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

}  // namespace
}  // namespace megascope::runtime
