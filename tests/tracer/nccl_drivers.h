// Real processes that play NCCL against the profiler plugin (nccl_plugin_driver), and their rings
// read back as the node's agent reads them: the NCCL plugin tests' harness.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "megascope/tracer/clock.h"
#include "megascope/tracer/dump.h"
#include "megascope/tracer/ring.h"
#include "test_util.h"

namespace megascope::nccl_test {

namespace fs = std::filesystem;

// A driver process: its stdin held open until the test is done with its ring.
struct Driver {
  pid_t pid = -1;
  int to_child = -1;
  FILE* from_child = nullptr;
};

Driver Spawn(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env) {
  // Close-on-exec: a later driver must not hold an earlier one's stdin open.
  int in[2], out[2];
  EXPECT_EQ(::pipe2(in, O_CLOEXEC), 0);
  EXPECT_EQ(::pipe2(out, O_CLOEXEC), 0);
  Driver d;
  d.pid = ::fork();
  if (d.pid == 0) {
    ::dup2(in[0], 0);
    ::dup2(out[1], 1);
    ::close(in[1]);
    ::close(out[0]);
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  ::close(in[0]);
  ::close(out[1]);
  d.to_child = in[1];
  d.from_child = ::fdopen(out[0], "r");
  return d;
}

// The first line the driver prints ("ready" once it has played its part).
std::string FirstLine(Driver& d) {
  char buf[256] = {};
  if (std::fgets(buf, sizeof(buf), d.from_child) == nullptr) return "";
  return buf;
}

int Finish(Driver& d) {
  ::close(d.to_child);
  std::fclose(d.from_child);
  int status = 0;
  ::waitpid(d.pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Runs NCCL-playing drivers of API version GetParam().
class NcclPluginTest : public ::testing::TestWithParam<int> {
 protected:
  // Runs `world` drivers of API version GetParam(); rank `hung` never issues the last all-reduce.
  // Returns every rank's ring as the agent would dump it, alive.
  // `env` is added to each driver's.
  // `flags` are the driver's (sym, ras).
  std::vector<std::pair<std::string, tracer::Dump>> Run(
      int world, int ops, int hung, const std::map<std::string, std::string>& env = {},
      const std::vector<std::string>& flags = {}) {
    std::vector<Driver> drivers;
    for (int r = 0; r < world; ++r) {
      std::map<std::string, std::string> e = {{"MEGASCOPE_SHM_DIR", dir_.path()},
                                              {"MEGASCOPE_JOB", "plugin"},
                                              {"MEGASCOPE_NODE", "node" + std::to_string(r / 2)},
                                              {"RANK", std::to_string(r)},
                                              {"WORLD_SIZE", std::to_string(world)},
                                              {"LOCAL_RANK", std::to_string(r % 2)}};
      e.insert(env.begin(), env.end());
      std::vector<std::string> argv = {MEGASCOPE_NCCL_DRIVER,      MEGASCOPE_NCCL_PLUGIN,
                                       std::to_string(GetParam()), std::to_string(r),
                                       std::to_string(world),      std::to_string(ops),
                                       std::to_string(hung)};
      argv.insert(argv.end(), flags.begin(), flags.end());
      drivers.push_back(Spawn(argv, e));
    }
    for (Driver& d : drivers) EXPECT_EQ(FirstLine(d), "ready\n");
    std::vector<std::pair<std::string, tracer::Dump>> dumps;
    for (const auto& f : fs::directory_iterator(dir_.path())) {
      auto reader =
          tracer::RingReader::Attach(f.path().string(), tracer::RingReader::Mode::kSnapshotOnly);
      EXPECT_TRUE(reader.ok()) << reader.status().ToString();
      if (!reader.ok()) continue;
      tracer::Dump d{(*reader)->Snapshot(), (*reader)->WriterAlive(), tracer::WallNowNs(), {}, {}};
      dumps.emplace_back(f.path().filename().string(), std::move(d));
    }
    for (Driver& d : drivers) EXPECT_EQ(Finish(d), 0);
    return dumps;
  }
  megascope::testing::TempDir dir_;
};

}  // namespace megascope::nccl_test
