// The self-check's housekeeping: rings left behind by self-checks that were killed.
#include "megascope/runtime/self_check.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

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

}  // namespace
}  // namespace megascope::runtime
