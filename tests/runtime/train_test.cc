// End-to-end training runs through the real megascope binary: real worker processes talking Gloo
// over TCP loopback, real checkpoints on disk, real faults injected into real processes.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>
#include <utility>

#include "megascope/launch/process.h"
#include "megascope/runtime/data.h"
#include "sqlite_util.h"
#include "test_util.h"

namespace megascope::runtime {
namespace {

namespace fs = std::filesystem;
using megascope::testing::TempDir;

using megascope::testing::CommandResult;

CommandResult Megascope(const std::string& args) {
  return megascope::testing::RunCommand(std::string(MEGASCOPE_BIN) + " " + args);
}

class TrainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    data_ = dir_.path() + "/notes.bin";
    ASSERT_TRUE(PrepareByteTokens(MEGASCOPE_TEST_DATA "/text/notes_on_training.txt", data_).ok());
  }
  // A small model so that every layout runs in a couple of seconds.
  std::string Args(const std::string& layout, const std::string& run, int steps) {
    return "train " + layout + " --data " + data_ + " --run-dir " + dir_.path() + "/" + run +
           " --job t" + std::to_string(::getpid()) + run + " --steps " + std::to_string(steps) +
           " --layers 2 --width 64 --heads 4 --seq 32 --batch 4 --microbatches 2";
  }
  std::vector<double> Losses(const std::string& run) {
    std::vector<double> losses;
    std::ifstream in(dir_.path() + "/" + run + "/progress.jsonl");
    for (std::string line; std::getline(in, line);) {
      auto j = nlohmann::json::parse(line);
      if (!j.contains("event"))
        losses.push_back(j["loss"]);  // event lines (ready, fault) carry no loss
    }
    return losses;
  }

  TempDir dir_;
  std::string data_;
};

// Page faults of the processes this test started and waited for since the last call.
int64_t ChildFaults() {
  static int64_t before = 0;
  rusage ru{};
  ::getrusage(RUSAGE_CHILDREN, &ru);
  return ru.ru_minflt - std::exchange(before, ru.ru_minflt);
}

TEST_F(TrainTest, AStepReusesItsMemoryInsteadOfFaultingItIn) {
  // Steps 10..59 of a job against its first 10: what a step costs in page faults. glibc's default
  // thresholds made every step map and fault its buffers in again (about 350 faults a step here).
  ChildFaults();
  ASSERT_EQ(Megascope(Args("--dp 1 --tp 1 --pp 1", "short", 10)).code, 0);
  const int64_t short_run = ChildFaults();
  ASSERT_EQ(Megascope(Args("--dp 1 --tp 1 --pp 1", "long", 60)).code, 0);
  const int64_t long_run = ChildFaults();
  EXPECT_LT((long_run - short_run) / 50, 20)
      << "page faults: " << short_run << " in 10 steps, " << long_run << " in 60";
}

TEST_F(TrainTest, EveryLayoutComputesTheSameLosses) {
  CommandResult base = Megascope(Args("--dp 1 --tp 1 --pp 1", "base", 20));
  ASSERT_EQ(base.code, 0) << base.out;
  const std::vector<double> want = Losses("base");
  ASSERT_EQ(want.size(), 20u);
  for (const std::string layout : {"--dp 2 --tp 1 --pp 1", "--dp 1 --tp 2 --pp 1",
                                   "--dp 1 --tp 1 --pp 2", "--dp 2 --tp 2 --pp 2 --nodes 2"}) {
    CommandResult r = Megascope(Args(layout, "other", 20));
    ASSERT_EQ(r.code, 0) << layout << "\n" << r.out;
    const std::vector<double> got = Losses("other");
    ASSERT_EQ(got.size(), want.size()) << layout;
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_LE(std::fabs(got[i] - want[i]) / want[i], 1e-4) << layout << " step " << i + 1;
    }
    fs::remove_all(dir_.path() + "/other");
  }
}

TEST_F(TrainTest, ParallelBlockIsLayoutIndependentToo) {
  ASSERT_EQ(Megascope(Args("--parallel-block", "a", 8)).code, 0);
  CommandResult r = Megascope(Args("--parallel-block --tp 2 --pp 2", "b", 8));
  ASSERT_EQ(r.code, 0) << r.out;
  auto a = Losses("a"), b = Losses("b");
  ASSERT_EQ(a.size(), 8u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_LE(std::fabs(a[i] - b[i]) / a[i], 1e-4);
  CommandResult seq = Megascope(Args("", "c", 8));
  EXPECT_NE(Losses("c")[7], a[7]);  // it is a different model
}

TEST_F(TrainTest, LossGoesDownOnRealText) {
  CommandResult r = Megascope(Args("--dp 2", "learn", 60) + " --lr 3e-3");
  ASSERT_EQ(r.code, 0) << r.out;
  auto l = Losses("learn");
  ASSERT_EQ(l.size(), 60u);
  EXPECT_GT(l.front(), 5.0);  // about ln(256) at the start
  EXPECT_LT(l.back(), l.front() - 1.5) << r.out;
  EXPECT_NE(r.out.find("tokens/s"), std::string::npos);
}

// Resuming from a disk checkpoint continues bit for bit as if the job had never stopped. The
// checkpoint is the straight run's own step 5, put where an interrupted run would have left it:
// a crash at step 7 (as this test once did) may or may not leave step 5 complete, depending on
// whether every rank's background write had finished -- a write in flight dies with its process.
TEST_F(TrainTest, ResumeContinuesExactlyAsIfUninterrupted) {
  ASSERT_EQ(Megascope(Args("--tp 2 --pp 2", "straight", 10) + " --checkpoint-every 5").code, 0);
  const auto want = Losses("straight");
  ASSERT_TRUE(fs::exists(dir_.path() + "/straight/checkpoints/step_5/manifest.json"));
  fs::create_directories(dir_.path() + "/resumed/checkpoints");
  fs::copy(dir_.path() + "/straight/checkpoints/step_5",
           dir_.path() + "/resumed/checkpoints/step_5", fs::copy_options::recursive);
  CommandResult resumed = Megascope(Args("--tp 2 --pp 2", "resumed", 10) + " --checkpoint-every 5");
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  const auto got = Losses("resumed");
  ASSERT_EQ(got.size(), 5u);  // steps 6-10
  for (size_t i = 0; i < got.size(); ++i) EXPECT_DOUBLE_EQ(got[i], want[5 + i]) << "step " << 6 + i;
  std::ifstream log(dir_.path() + "/resumed/ranks/0/worker.log");
  std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("resumed after step 5 from disk"), std::string::npos);
}

// A stop (SIGTERM, as `megascope stop`, Ctrl-C or Slurm's scancel send it) lets the checkpoint
// in flight finish within the grace, as a user stopping a job expects of its newest checkpoint:
// rank 1's writes take 2 s (a slow filesystem), the job is stopped while step 3's is in flight,
// and step 3 is complete afterwards.
TEST_F(TrainTest, AStopLetsTheCheckpointInFlightFinish) {
  const std::string run = dir_.path() + "/stopped";
  auto train = launch::Process::Spawn(
      {{"/bin/sh", "-c",
        "exec " + std::string(MEGASCOPE_BIN) + " " + Args("--dp 2", "stopped", 100000) +
            " --checkpoint-every 3 --fault slow-checkpoint:rank=1,step=3,seconds=2"},
       dir_.path() + "/stopped.log"});
  ASSERT_TRUE(train.ok());
  // Rank 0's shard of step 3 is on disk; rank 1's is still being written.
  const std::string shard0 = run + "/checkpoints/step_3/rank_0.bin.sum";
  for (int i = 0; i < 3000 && !fs::exists(shard0) && (*train)->running(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(fs::exists(shard0));
  EXPECT_FALSE(fs::exists(run + "/checkpoints/step_3/manifest.json"));
  ASSERT_TRUE((*train)->Signal(SIGTERM));
  auto end = (*train)->WaitFor(std::chrono::seconds(30));
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->code(), 130);
  EXPECT_TRUE(fs::exists(run + "/checkpoints/step_3/manifest.json"));
}

TEST_F(TrainTest, ACorruptCheckpointIsReportedAndSkipped) {
  ASSERT_EQ(Megascope(Args("", "c", 6) + " --checkpoint-every 2").code, 0);
  {
    std::fstream f(dir_.path() + "/c/checkpoints/step_4/rank_0.bin",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x7f');
  }
  fs::remove(dir_.path() +
             "/c/checkpoints/step_2/manifest.json");  // as if the job died mid-checkpoint
  std::string log;
  // step_4 corrupt, step_2 partial: nothing to resume from.
  CommandResult r = Megascope(Args("", "c", 6) + " --checkpoint-every 2");
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream in(dir_.path() + "/c/ranks/0/worker.log");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("skipping step_4: rank_0.bin is corrupt (checksum mismatch)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("skipping step_2: no manifest (partial)"), std::string::npos) << text;
  EXPECT_EQ(Losses("c").size(), 6u);  // trained from scratch
}

// A long run with --checkpoint-every keeps only the newest complete checkpoints on disk.
TEST_F(TrainTest, OnlyTheNewestCheckpointsAreKept) {
  ASSERT_EQ(
      Megascope(Args("--dp 2", "keep", 9) + " --checkpoint-every 2 --keep-checkpoints 2").code, 0);
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir_.path() + "/keep/checkpoints"))
    left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"step_6", "step_8"}));
  EXPECT_TRUE(fs::exists(dir_.path() + "/keep/checkpoints/step_8/manifest.json"));
}

TEST_F(TrainTest, ACheckpointCanBeRequestedForAStep) {
  fs::create_directories(dir_.path() + "/req");
  std::ofstream(dir_.path() + "/req/checkpoint.request") << "3\n";
  ASSERT_EQ(Megascope(Args("--dp 2", "req", 5)).code, 0);
  EXPECT_TRUE(fs::exists(dir_.path() + "/req/checkpoints/step_3/manifest.json"));
  EXPECT_FALSE(fs::exists(dir_.path() + "/req/checkpoints/step_2"));
}

TEST_F(TrainTest, ACrashNamesTheRankAndStopsEveryone) {
  CommandResult r = Megascope(Args("--dp 2 --tp 2 --pp 2 --nodes 2", "crash", 6) +
                              " --fault crash:rank=5,step=2");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("rank 5 (node1) was killed by signal 6"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("injected crash at step 2"), std::string::npos);
}

TEST_F(TrainTest, AHangMakesPeersTimeOutFailAndDump) {
  CommandResult r = Megascope(Args("--dp 2 --tp 2 --pp 2 --nodes 2", "hang", 6) +
                              " --timeout 2000 --fault hang:rank=5,step=2");
  EXPECT_EQ(r.code, 1);
  // Some peer's collective timed out (which one the launcher names first depends on timing).
  std::string logs;
  for (int rank = 0; rank < 8; ++rank) {
    std::ifstream in(dir_.path() + "/hang/ranks/" + std::to_string(rank) + "/worker.log");
    logs.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  EXPECT_NE(logs.find("Timed out"), std::string::npos) << r.out;
  const std::string dumps = dir_.path() + "/hang/dumps/attempt_0";
  int failed = 0;
  for (int rank = 0; rank < 8; ++rank) {
    const std::string f = dumps + "/rank_" + std::to_string(rank) + ".json";
    ASSERT_TRUE(fs::exists(f)) << f;  // the hung rank too: the launcher asks survivors to dump
    std::ifstream in(f);
    auto j = nlohmann::json::parse(in);
    EXPECT_EQ(j["format"], "megascope-flight-recorder");
    for (const auto& e : j["entries"]) failed += e["state"] == "failed" ? 1 : 0;
  }
  EXPECT_GT(failed, 0);
}

TEST_F(TrainTest, AStalledSendLeavesPartialProgressInTheFlightRecorder) {
  CommandResult r =
      Megascope(Args("--pp 2", "stall", 4) + " --timeout 2000 --fault stall-send:rank=0,step=1");
  EXPECT_EQ(r.code, 1);
  std::ifstream in(dir_.path() + "/stall/dumps/attempt_0/rank_1.json");
  auto j = nlohmann::json::parse(in);
  const auto& last = j["entries"].back();
  EXPECT_EQ(last["op"], "recv");
  EXPECT_EQ(last["peer"], 0);
  EXPECT_EQ(last["state"], "failed");
  EXPECT_LT(last["bytes_received"].get<int64_t>(), last["bytes"].get<int64_t>());
  EXPECT_GT(last["bytes_received"].get<int64_t>(), 0);
  std::ifstream sender(dir_.path() + "/stall/dumps/attempt_0/rank_0.json");
  auto s = nlohmann::json::parse(sender);
  bool partial_send = false;
  for (const auto& e : s["entries"]) {
    partial_send |= e["op"] == "send" && e["state"] == "started" && e["bytes_sent"].is_number() &&
                    e["bytes_sent"].get<int64_t>() < e["bytes"].get<int64_t>();
  }
  EXPECT_TRUE(partial_send) << s.dump(1);
}

TEST_F(TrainTest, TraceAlternateTracesEveryOtherPairOfBlocksAndWritesEachStepsCost) {
  // Blocks of 2 steps, on, off, off, on: steps 0, 1, 6 and 7 traced.
  CommandResult r = Megascope(Args("--dp 2", "alt", 8) + " --trace-alternate 2");
  ASSERT_EQ(r.code, 0) << r.out;
  for (int rank = 0; rank < 2; ++rank) {
    std::ifstream in(dir_.path() + "/alt/ranks/" + std::to_string(rank) + "/step_costs.csv");
    std::string line;
    ASSERT_TRUE(std::getline(in, line));
    EXPECT_EQ(line, "step,traced,wall_ns,cpu_ns");
    std::string traced;
    for (int step = 0; std::getline(in, line); ++step) {
      long long s = -1, wall = 0, cpu = 0;
      int t = -1;
      ASSERT_EQ(std::sscanf(line.c_str(), "%lld,%d,%lld,%lld", &s, &t, &wall, &cpu), 4) << line;
      EXPECT_EQ(s, step);
      EXPECT_GT(wall, 0) << line;
      EXPECT_GT(cpu, 0) << line;
      traced += std::to_string(t);
    }
    EXPECT_EQ(traced, "11000011") << "rank " << rank;
  }
  // What the agent stored: forward spans of the traced steps only (bit s set for step s).
  const std::vector<int64_t> steps =
      megascope::testing::FirstRow(dir_.path() + "/alt/nodes/node0/trace.db",
                                   "SELECT SUM(1 << step), COUNT(*) FROM (SELECT DISTINCT step "
                                   "FROM spans WHERE name = 'forward')");
  EXPECT_EQ(steps, (std::vector<int64_t>{1 + 2 + 64 + 128, 4}));
}

TEST_F(TrainTest, BadConfigurationIsRefusedBeforeAnyWorkerStarts) {
  struct Case {
    std::string args, message;
  } cases[] = {
      {"--tp 3", "tp 3 does not divide heads 4"},
      {"--pp 3", "pp 3 is larger than the number of layers 2"},
      {"--dp 3", "global batch 4 is not divisible by dp"},
      {"--dp 2 --nodes 3", "--nodes must be between 1 and the world size 2"},
      {"--fault crash:rank=9,step=1", "fault rank 9 is outside world size 1"},
      {"--fault explode:rank=0",
       "kind must be one of crash, hang, freeze, stall-send, slow, slow-checkpoint"},
      {"--no-trace --trace-alternate 2", "--trace-alternate and --no-trace exclude each other"},
  };
  for (const Case& c : cases) {
    CommandResult r = Megascope(Args(c.args, "bad", 2));
    EXPECT_EQ(r.code, 2) << c.args;
    EXPECT_NE(r.out.find(c.message), std::string::npos) << c.args << "\n" << r.out;
    EXPECT_FALSE(fs::exists(dir_.path() + "/bad/run.json")) << c.args;
  }
  CommandResult unwritable = Megascope("train --data " + data_ + " --run-dir /proc/megascope-run");
  EXPECT_EQ(unwritable.code, 2);
  EXPECT_NE(unwritable.out.find("is not writable"), std::string::npos) << unwritable.out;
  CommandResult nodata =
      Megascope("train --data " + dir_.path() + "/none.bin --run-dir " + dir_.path() + "/x");
  EXPECT_EQ(nodata.code, 2);
  EXPECT_NE(nodata.out.find("does not exist"), std::string::npos);
}

TEST(TokenFileTest, BadFilesGetClearErrors) {
  TempDir dir;
  std::ofstream(dir.path() + "/garbage.bin") << std::string(2000, 'x');
  auto g = TokenFile::Open(dir.path() + "/garbage.bin");
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("is not a token file"), std::string::npos);
  std::ofstream(dir.path() + "/short.bin") << "abc";
  EXPECT_NE(TokenFile::Open(dir.path() + "/short.bin").status().message().find("too short"),
            std::string::npos);
  std::ofstream(dir.path() + "/t.txt") << "hello world, hello tokens";
  ASSERT_TRUE(PrepareByteTokens(dir.path() + "/t.txt", dir.path() + "/t.bin").ok());
  fs::resize_file(dir.path() + "/t.bin", 1024 + 10);
  auto t = TokenFile::Open(dir.path() + "/t.bin");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("is truncated: header says 25 tokens, file holds 5"),
            std::string::npos)
      << t.status().message();
  EXPECT_EQ(TokenFile::Open(dir.path() + "/missing.bin").status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace megascope::runtime
