// The NCCL profiler plugin, loaded as NCCL loads it: four real processes each dlopen the .so and
// drive it as NCCL's threads do (nccl_plugin_driver), one of them never issuing the fifth
// all-reduce the others hang in; their rings hold every op as docs/formats.md numbers them. (The
// hang analysis over the same rings: tests/analyzer/nccl_plugin_hang_test.cc.)
#include <dlfcn.h>

#include "tracer/nccl_drivers.h"

namespace megascope::nccl_test {
namespace {

TEST_P(NcclPluginTest, EveryOpIsRecordedNumberedAndCompletedFromItsChildEvents) {
  constexpr int kWorld = 4, kOps = 4, kHung = 2;
  auto dumps = Run(kWorld, kOps, kHung);
  ASSERT_EQ(dumps.size(), static_cast<size_t>(kWorld));
  for (const auto& [file, d] : dumps) {
    const int rank = d.snapshot.info.rank;
    EXPECT_TRUE(d.alive) << file;
    ASSERT_EQ(d.snapshot.groups.size(), 1u) << file;
    EXPECT_EQ(d.snapshot.groups[0].kind, "world");
    EXPECT_EQ(d.snapshot.groups[0].ranks.size(), static_cast<size_t>(kWorld));
    // The all-reduces numbered 0, 1, ... in the group, completed from their kernels and proxies;
    // the last one open (started on its device) on every rank but the hung one.
    std::vector<const tracer::FlightEntry*> colls;
    for (const auto& e : d.snapshot.entries) {
      if (e.op == tracer::OpType::kAllreduce) colls.push_back(&e);
    }
    ASSERT_EQ(colls.size(), static_cast<size_t>(rank == kHung ? kOps : kOps + 1)) << file;
    for (size_t i = 0; i < colls.size(); ++i) {
      EXPECT_EQ(colls[i]->seq, i);
      EXPECT_EQ(colls[i]->bytes, 4096u);
      EXPECT_EQ(colls[i]->dtype, tracer::DType::kF32);
      const bool last_open = rank != kHung && i == static_cast<size_t>(kOps);
      EXPECT_EQ(colls[i]->state,
                last_open ? tracer::OpState::kStarted : tracer::OpState::kCompleted)
          << file << " #" << i;
      // Where the open one's proxy steps wait: on the network (the peer never came).
      EXPECT_EQ(colls[i]->waiting_on,
                last_open ? tracer::WaitSide::kNetwork : tracer::WaitSide::kNone);
      if (!last_open) {
        EXPECT_GE(colls[i]->completed_at_ns, colls[i]->started_at_ns);
        EXPECT_EQ(colls[i]->bytes_sent, 4096) << "two proxy steps of 2048 bytes";
      }
    }
    // Rank 0's send to rank 1 and rank 1's receive: the first of that pair.
    for (const auto& e : d.snapshot.entries) {
      if (!tracer::IsP2P(e.op)) continue;
      EXPECT_TRUE(rank == 0 || rank == 1) << file;
      EXPECT_EQ(e.op, rank == 0 ? tracer::OpType::kSend : tracer::OpType::kRecv);
      EXPECT_EQ(e.peer, 1 - rank);
      EXPECT_EQ(e.seq, 0u);
      EXPECT_EQ(e.state, tracer::OpState::kCompleted);
      EXPECT_EQ(rank == 0 ? e.bytes_sent : e.bytes_received, 4096);
    }
  }
}

// The CUDA driver loads the same file as its injection library (libmegascope-cupti.so, a link):
// each process has the library once, so NCCL's ops and CUPTI's spans share the rank's one ring.
// (Without a GPU, CUPTI does not start: the driver checks InitializeInjection still succeeds.)
TEST_P(NcclPluginTest, TheInjectionLibraryIsTheSameObjectAndTheRankKeepsOneRing) {
  const fs::path inject = fs::path(MEGASCOPE_NCCL_PLUGIN).parent_path() / "libmegascope-cupti.so";
  if (!fs::exists(inject)) GTEST_SKIP() << "built without CUPTI's headers: no injection library";
  constexpr int kWorld = 2, kOps = 3;
  auto dumps = Run(kWorld, kOps, /*hung=*/-1, {{"CUDA_INJECTION64_PATH", inject.string()}});
  ASSERT_EQ(dumps.size(), static_cast<size_t>(kWorld)) << "one ring per rank, not two";
  for (const auto& [file, d] : dumps) {
    int completed = 0;
    for (const auto& e : d.snapshot.entries)
      completed += e.op == tracer::OpType::kAllreduce && e.state == tracer::OpState::kCompleted;
    EXPECT_EQ(completed, kOps) << file;
  }
}

TEST_P(NcclPluginTest, OnlyTheProfilerSymbolsAreExported) {
  void* lib = dlopen(MEGASCOPE_NCCL_PLUGIN, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(lib, nullptr) << dlerror();
  const std::string symbol = "ncclProfiler_v" + std::to_string(GetParam());
  EXPECT_NE(dlsym(lib, symbol.c_str()), nullptr);
  if (fs::exists(fs::path(MEGASCOPE_NCCL_PLUGIN).parent_path() / "libmegascope-cupti.so")) {
    EXPECT_NE(dlsym(lib, "InitializeInjection"), nullptr);
  }
  // The capture core stays inside: a process that links megascope never binds to its copy.
  EXPECT_EQ(dlsym(lib,
                  "_ZN9megascope6tracer6Tracer6CreateERKNS0_11RingOptionsESt10shared_ptrINS0_"
                  "5ClockEE"),
            nullptr);
  dlclose(lib);
}

// NCCL's RAS rewrites the event mask halfway through (kernel channels and proxy events off, the API
// events on, their descriptors saying rank 0): the ops issued since finish without child events,
// so each is recorded completed when issued instead of open for ever (a hang that is not one); the
// numbering and the peers go on as before, taken from init, not from a descriptor.
TEST_P(NcclPluginTest, AnEventMaskRewrittenWhileTheJobRunsLeavesNoFinishedOpOpen) {
  constexpr int kWorld = 2, kOps = 4;
  auto dumps = Run(kWorld, kOps, /*hung=*/-1, {}, {"ras"});
  ASSERT_EQ(dumps.size(), static_cast<size_t>(kWorld));
  for (const auto& [file, d] : dumps) {
    const int rank = d.snapshot.info.rank;
    std::vector<const tracer::FlightEntry*> colls, p2p;
    for (const auto& e : d.snapshot.entries) {
      if (e.op == tracer::OpType::kAllreduce) colls.push_back(&e);
      if (tracer::IsP2P(e.op)) p2p.push_back(&e);
    }
    ASSERT_EQ(colls.size(), static_cast<size_t>(kOps + 1)) << file;
    for (size_t i = 0; i < colls.size(); ++i) {
      EXPECT_EQ(colls[i]->seq, i) << file;
      EXPECT_EQ(colls[i]->state, tracer::OpState::kCompleted) << file << " #" << i;
    }
    ASSERT_EQ(p2p.size(), 1u) << file;
    EXPECT_EQ(p2p[0]->op, rank == 0 ? tracer::OpType::kSend : tracer::OpType::kRecv) << file;
    EXPECT_EQ(p2p[0]->peer, 1 - rank) << file;
    EXPECT_EQ(p2p[0]->state, tracer::OpState::kCompleted) << file;
  }
}

INSTANTIATE_TEST_SUITE_P(Api, NcclPluginTest, ::testing::Values(5, 6, 7),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return "v" + std::to_string(i.param);
                         });

// v7's symmetric-memory plans: two all-reduces a plan, the kernel channels (and their KernelPhase
// sub-events) reported against the first only, the second carrying no channels. The second
// finishes with the first, not when issued; a plan hung on its device leaves both open. The
// phases are no ops.
class NcclPluginV7Test : public NcclPluginTest {};

TEST_P(NcclPluginV7Test, ASymmetricPlansOpsFinishWithItsHeadAndItsPhasesAreNoOps) {
  constexpr int kWorld = 2, kOps = 3, kHung = 1;
  auto dumps = Run(kWorld, kOps, kHung, {}, {"sym"});
  ASSERT_EQ(dumps.size(), static_cast<size_t>(kWorld));
  for (const auto& [file, d] : dumps) {
    const int rank = d.snapshot.info.rank;
    std::vector<const tracer::FlightEntry*> colls;
    for (const auto& e : d.snapshot.entries) {
      EXPECT_TRUE(e.op == tracer::OpType::kAllreduce || tracer::IsP2P(e.op)) << file;
      if (e.op == tracer::OpType::kAllreduce) colls.push_back(&e);
    }
    const size_t plans = rank == kHung ? kOps : kOps + 1;
    ASSERT_EQ(colls.size(), 2 * plans) << file;
    for (size_t i = 0; i < colls.size(); ++i) {
      EXPECT_EQ(colls[i]->seq, i) << file;
      const bool hung_plan = rank != kHung && i / 2 == kOps;
      const tracer::OpState want = !hung_plan   ? tracer::OpState::kCompleted
                                   : i % 2 == 0 ? tracer::OpState::kStarted
                                                : tracer::OpState::kEnqueued;
      EXPECT_EQ(colls[i]->state, want) << file << " #" << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Api, NcclPluginV7Test, ::testing::Values(7),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return "v" + std::to_string(i.param);
                         });

}  // namespace
}  // namespace megascope::nccl_test
