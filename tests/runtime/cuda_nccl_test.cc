// The NCCL transport on the one GPU of a lent machine (label gpu: scripts/gpu-check.sh runs it).
// One GPU holds one NCCL rank, so these are one-rank groups: enough to prove the stream-ordered
// ops, the flight recorder's "started on the device" from the watchdog, the deadline that aborts an
// op stuck behind a kernel and reports it instead of hanging, and the rebuild after an abort. (A
// one-rank op cannot wait for a peer, and NCCL refuses a send to itself that nobody receives.)
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "megascope/kernels/kernels.h"
#include "megascope/runtime/comm.h"
#include "test_util.h"

namespace megascope::runtime {
namespace {

using megascope::testing::TempDir;

}  // namespace
bool SpinOnStream(void* stream, int ms);  // cuda/spin.cu
namespace {

class NcclTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    k_ = kernels::CreateKernels(kernels::Backend::kCuda, 0, &why);
    ASSERT_NE(k_, nullptr) << why;
    tracer::RingOptions ro;
    ro.dir = dir_.path();
    ro.job = "nccl";
    ro.world_size = 1;
    ro.lane_capacity = 256;
    auto t = tracer::Tracer::Create(ro);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    tracer_ = std::move(*t);
  }

  std::unique_ptr<Communicator> Connect(std::chrono::milliseconds timeout) {
    NcclOptions o;
    o.rendezvous_dir = dir_.path() + "/rdzv";
    o.timeout = timeout;
    o.stream = k_->stream();
    auto n = CreateNcclCommunicator(0, Layout{1, 1, 1}, o);
    EXPECT_TRUE(n.ok()) << n.status().ToString();
    if (!n.ok()) return nullptr;
    auto c = TraceCommunicator(std::move(*n), tracer_.get());
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(*c) : nullptr;
  }

  // The watchdog reports asynchronously: the last record's state, once it is `want` (10 s cap).
  tracer::OpState LastStateOnce(tracer::OpState want) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    tracer::OpState s = tracer::OpState::kUnknown;
    while (std::chrono::steady_clock::now() < until) {
      s = tracer_->Snapshot().entries.back().state;
      if (s == want) break;
      std::this_thread::yield();
    }
    return s;
  }

  TempDir dir_;
  std::unique_ptr<kernels::Kernels> k_;
  std::unique_ptr<tracer::Tracer> tracer_;
};

TEST_F(NcclTest, OpsRunOnTheStreamAndTheRecordCompletesFromTheWatchdog) {
  auto c = Connect(std::chrono::milliseconds(30000));
  ASSERT_NE(c, nullptr);
  const int world = c->Find(GroupKind::kWorld);
  kernels::Buffer<float> x(k_.get(), 1 << 20);
  k_->Fill(x.data(), x.size(), 2.0f);
  ASSERT_TRUE(c->AllReduce(world, x.data(), x.size(), ReduceOp::kSum).ok());
  std::vector<float> h(x.size());
  k_->Download(h.data(), x.data(), h.size() * sizeof(float));
  EXPECT_EQ(h[0], 2.0f);  // one rank: the sum is itself
  EXPECT_EQ(h.back(), 2.0f);
  EXPECT_EQ(LastStateOnce(tracer::OpState::kCompleted), tracer::OpState::kCompleted);
  EXPECT_GT(tracer_->Snapshot().entries.back().started_at_ns, 0);
  float host = 3.0f;  // host memory goes through a device scratch and back
  ASSERT_TRUE(c->AllReduce(world, &host, 1, ReduceOp::kMax).ok());
  EXPECT_EQ(host, 3.0f);
  ASSERT_TRUE(c->Barrier(world).ok());
}

TEST_F(NcclTest, AHungOpIsAbortedAtTheDeadlineReportedAndTheCommunicatorRebuilt) {
  auto c = Connect(std::chrono::milliseconds(1500));
  ASSERT_NE(c, nullptr);
  const int world = c->Find(GroupKind::kWorld);
  kernels::Buffer<float> x(k_.get(), 1024);
  // The all-reduce waits on the stream behind a kernel that runs for 3 s: past the deadline, the
  // watchdog aborts it and reports it, never started on the device.
  ASSERT_TRUE(SpinOnStream(k_->stream(), 3000));
  ASSERT_TRUE(c->AllReduce(world, x.data(), x.size(), ReduceOp::kSum).ok());  // stream-ordered
  EXPECT_EQ(LastStateOnce(tracer::OpState::kFailed), tracer::OpState::kFailed);
  EXPECT_EQ(tracer_->Snapshot().entries.back().started_at_ns, 0);
  Status later = c->AllReduce(world, x.data(), x.size(), ReduceOp::kSum);
  EXPECT_EQ(later.code(), StatusCode::kDeadlineExceeded) << later.ToString();
  EXPECT_NE(later.message().find("allreduce in world not done after 1500 ms (never started)"),
            std::string::npos)
      << later.ToString();
  EXPECT_EQ(k_->Synchronize(), "");  // the kernel ends; the stream is free again
  ASSERT_TRUE(c->Rebuild(1).ok());
  k_->Fill(x.data(), x.size(), 1.0f);
  ASSERT_TRUE(c->AllReduce(world, x.data(), x.size(), ReduceOp::kSum).ok());
  std::vector<float> h(x.size());
  k_->Download(h.data(), x.data(), h.size() * sizeof(float));
  EXPECT_EQ(h[7], 1.0f);
}

}  // namespace
}  // namespace megascope::runtime
