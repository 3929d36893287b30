// The self-check's housekeeping (rings left behind by self-checks that were killed), and a pair of
// real `megascope self-check` processes over a link that moves nothing, crawls, or whose other end
// starts late.
#include "megascope/runtime/self_check.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "megascope/tracer/ring.h"
#include "test_util.h"

namespace megascope::runtime {
namespace {

namespace fs = std::filesystem;

TEST(SelfCheckTest, RingsOfKilledSelfChecksAreRemovedAndOthersKept) {
  megascope::testing::TempDir dir;
  const pid_t gone = ::fork();  // a pid that existed and is gone (reaped)
  if (gone == 0) ::_exit(0);
  ASSERT_GT(gone, 0);
  ASSERT_EQ(::waitpid(gone, nullptr, 0), gone);
  auto ring = [&](const std::string& job, int rank) {
    std::string path = dir.path() + "/" + tracer::RingFileName(job, 0, rank);
    std::ofstream(path) << "x";
    return path;
  };
  const std::string dead0 = ring("selfcheck-" + std::to_string(gone), 0);
  const std::string dead1 = ring("selfcheck-" + std::to_string(gone), 1);
  const std::string live = ring("selfcheck-" + std::to_string(::getpid()), 0);
  const std::string job = ring("train", 0);  // a job's ring, whatever its writer
  const std::string odd = ring("selfcheck-x", 0);
  EXPECT_EQ(RemoveStaleSelfCheckRings(dir.path()), 2);
  EXPECT_FALSE(fs::exists(dead0));
  EXPECT_FALSE(fs::exists(dead1));
  EXPECT_TRUE(fs::exists(live));
  EXPECT_TRUE(fs::exists(job));
  EXPECT_TRUE(fs::exists(odd));
}

// Two real `megascope self-check` processes in `dir` with `flags`: rank 1's link held to
// `seam_rate` MB/s by the link seam (0: healthy), rank 1 started `late` (a shell command, or "").
// Their exit codes and what they said.
struct PairRun {
  std::string rc0, rc1, log0, log1;
  bool Said(const std::string& what) const {
    return log0.find(what) != std::string::npos || log1.find(what) != std::string::npos;
  }
};
PairRun RunPair(const std::string& dir, const std::string& flags, const char* seam_rate,
                const std::string& late = "") {
  const std::string check = std::string(MEGASCOPE_BIN) + " self-check --dir " + dir +
                            "/store --timeout 60000 --gemm-seconds 0.05 " + flags;
  std::string seam;
  if (seam_rate != nullptr) {
    std::ofstream(dir + "/link") << "rate_mbps=" << seam_rate << "\n";
    seam = "MEGASCOPE_LINK_SEAM=" + dir + "/link ";
  }
  const std::string cmd = "cd " + dir + " && (" + check + " --rank 0 >r0.log 2>&1 & " + late +
                          seam + check +
                          " --rank 1 >r1.log 2>&1; echo $? >rc1; wait $!; echo $? >rc0)";
  EXPECT_EQ(std::system(cmd.c_str()), 0);
  auto read = [&](const std::string& name) {
    std::ifstream f(dir + "/" + name);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  };
  return {read("rc0"), read("rc1"), read("r0.log"), read("r1.log")};
}

// A link that moves nothing (the link seam holds rank 1's data for an hour, as a link dropping its
// packets or crawling at a few bytes a second would): the check fails within its probe time,
// saying so, instead of waiting out the one-minute collective timeout (15 s where Gloo's connect
// met unanswered SYNs on the testbed).
TEST(SelfCheckTest, ALinkThatMovesNothingFailsWithinTheProbeTime) {
  megascope::testing::TempDir dir;
  const PairRun r = RunPair(dir.path(), "--connect-timeout 1500", "0.001");
  // Both fail; the one whose probe time runs out first says why (the other may then see its
  // partner gone first).
  EXPECT_EQ(r.rc0, "1\n") << r.log0;
  EXPECT_EQ(r.rc1, "1\n") << r.log1;
  EXPECT_TRUE(r.Said("moved nothing with its neighbour within")) << r.log0 << r.log1;
}

// A link that moves data, but slowly (the seam holds rank 1's data to 8 MB/s): under a floor of
// 0.5 GB/s the check fails once its all-reduces have run 0.5 s, saying so, instead of crawling on
// through seconds of them (no one all-reduce stalls past its deadline).
TEST(SelfCheckTest, AllReducesUnderTheFloorFailTheCheckAtOnce) {
  megascope::testing::TempDir dir;
  const PairRun r = RunPair(dir.path(), "--min-gbps 0.5", "8");
  EXPECT_EQ(r.rc0, "1\n") << r.log0;
  EXPECT_EQ(r.rc1, "1\n") << r.log1;
  EXPECT_TRUE(r.Said("under half of the 0.500 GB/s floor")) << r.log0 << r.log1;
}

// A neighbour that starts 2 s late (a loaded host spawns it slowly) is no dead link: the connect
// deadline (1.5 s) counts from when both are there, so the check passes.
TEST(SelfCheckTest, ANeighbourThatStartsLateIsNoDeadLink) {
  megascope::testing::TempDir dir;
  const PairRun r = RunPair(dir.path(), "--connect-timeout 1500", nullptr, "sleep 2; ");
  EXPECT_EQ(r.rc0, "0\n") << r.log0;
  EXPECT_EQ(r.rc1, "0\n") << r.log1;
  EXPECT_NE(r.log0.find("allreduce_gbps"), std::string::npos) << r.log0;
}

}  // namespace
}  // namespace megascope::runtime
