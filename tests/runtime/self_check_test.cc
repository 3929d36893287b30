// The self-check's housekeeping (rings left behind by self-checks that were killed), and a pair of
// real `megascope self-check` processes over a link that moves nothing.
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

// A link that moves nothing (the link seam holds rank 1's data for an hour, as a link dropping its
// packets or crawling at a few bytes a second would): the check fails within its probe time,
// saying so, instead of waiting out the one-minute collective timeout (15 s where Gloo's connect
// met unanswered SYNs on the testbed).
TEST(SelfCheckTest, ALinkThatMovesNothingFailsWithinTheProbeTime) {
  megascope::testing::TempDir dir;
  std::ofstream(dir.path() + "/link") << "rate_mbps=0.001\n";
  const std::string check = std::string(MEGASCOPE_BIN) + " self-check --dir " + dir.path() +
                            "/store --timeout 60000 --connect-timeout 1500 --gemm-seconds 0.05";
  const std::string cmd = "cd " + dir.path() + " && (MEGASCOPE_LINK_SEAM=" + dir.path() + "/link " +
                          check + " --rank 1 >r1.log 2>&1 & " + check +
                          " --rank 0 >r0.log 2>&1; echo $? >rc0; wait $!; echo $? >rc1)";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  auto read = [&](const std::string& name) {
    std::ifstream f(dir.path() + "/" + name);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  };
  // Both fail; the one whose probe time runs out first says why (the other may then see its
  // partner gone first).
  EXPECT_EQ(read("rc0"), "1\n") << read("r0.log");
  EXPECT_EQ(read("rc1"), "1\n") << read("r1.log");
  const std::string said = "moved nothing with its neighbour within 1500 ms";
  EXPECT_TRUE(read("r0.log").find(said) != std::string::npos ||
              read("r1.log").find(said) != std::string::npos)
      << read("r0.log") << read("r1.log");
}

}  // namespace
}  // namespace megascope::runtime
