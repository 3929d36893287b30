// The fixture of the `megascope launch` end-to-end tests (launch_test.cc, testbed_test.cc): a
// token file prepared once, the launch command, reference losses of an uninterrupted run, the
// events of control.db, and a launch run in the background until its events say enough.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "megascope/controller/control_db.h"
#include "megascope/launch/process.h"
#include "megascope/runtime/data.h"
#include "megascope/tracer/run_layout.h"
#include "sqlite_util.h"
#include "test_util.h"

namespace megascope::controller {

namespace fs = std::filesystem;
using megascope::testing::CommandResult;
using megascope::testing::RunCommand;
using megascope::testing::TempDir;

inline constexpr int kSteps = 12;
inline const char* kModel =
    " --layers 2 --width 64 --heads 4 --seq 32 --batch 4 --microbatches 2 --hang-after 2 --tick "
    "0.1";

class LaunchTest : public ::testing::Test {
 public:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    data_ = dir_->path() + "/notes.bin";
    ASSERT_TRUE(
        runtime::PrepareByteTokens(MEGASCOPE_TEST_DATA "/text/notes_on_training.txt", data_).ok());
  }
  static void TearDownTestSuite() { delete dir_; }
  // A launch that was stopped keeps its in-memory snapshots (tmpfs) for a resume: not the tests'.
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(MemoryRoot("/dev/shm", Job()), ec);
  }

  // Short: job names are stored in fixed-size ring headers.
  std::string Job() const {
    return "l" + std::to_string(::getpid()) + "_" +
           std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
           std::to_string(std::hash<std::string>()(
                              ::testing::UnitTest::GetInstance()->current_test_info()->name()) %
                          100000);
  }
  std::string Run() const {
    return dir_->path() + "/" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }

  std::string LaunchCmd(const std::string& layout, const std::string& extra,
                        int steps = kSteps) const {
    // Self-checks measure real throughput; with other tests sharing the two cores a healthy node
    // can measure at a third of its launch figure, so the tests pass nodes at a fifth unless they
    // set the ratio themselves (a degraded node is injected 16x slower).
    const std::string ratios = extra.find("--min-gemm-ratio") == std::string::npos
                                   ? " --min-gemm-ratio 0.2 --min-bandwidth-ratio 0.1"
                                   : "";
    return std::string(MEGASCOPE_BIN) + " launch " + layout + " --data " + data_ + " --run-dir " +
           Run() + " --job " + Job() + " --steps " + std::to_string(steps) + kModel + ratios + " " +
           extra;
  }
  CommandResult Launch(const std::string& layout, const std::string& extra,
                       int steps = kSteps) const {
    CommandResult r = RunCommand(LaunchCmd(layout, extra, steps));
    std::ifstream report(Run() + "/report.md");
    std::cout << report.rdbuf() << "\n";  // the stage times of every incident, in the test log
    return r;
  }

  // Losses of an uninterrupted run of the same job (per layout, computed once).
  static const std::map<int64_t, double>& Reference(const std::string& layout) {
    static std::map<std::string, std::map<int64_t, double>> cache;
    auto it = cache.find(layout);
    if (it != cache.end()) return it->second;
    const std::string run = dir_->path() + "/reference" + std::to_string(cache.size());
    CommandResult r =
        RunCommand(std::string(MEGASCOPE_BIN) + " train " + layout + " --data " + data_ +
                   " --run-dir " + run + " --job ref" + std::to_string(::getpid()) +
                   std::to_string(cache.size()) + " --steps " + std::to_string(kSteps) +
                   " --layers 2 --width 64 --heads 4 --seq 32 --batch 4 --microbatches 2");
    EXPECT_EQ(r.code, 0) << r.out;
    return cache[layout] = Losses(run);
  }
  // step -> loss of the step's last (kept) run.
  static std::map<int64_t, double> Losses(const std::string& run) {
    std::map<int64_t, double> out;
    std::ifstream in(run + "/progress.jsonl");
    for (std::string line; std::getline(in, line);) {
      auto j = nlohmann::json::parse(line);
      if (!j.contains("event")) out[j["step"].get<int64_t>()] = j["loss"].get<double>();
    }
    return out;
  }
  void ExpectLossesContinue(const std::string& layout) const {
    const auto& want = Reference(layout);
    const auto got = Losses(Run());
    ASSERT_EQ(got.size(), want.size());
    for (const auto& [step, loss] : want)
      EXPECT_NEAR(got.at(step), loss, 1e-5 * std::fabs(loss)) << "step " << step;
  }
  // Polls `done` every 100 ms while `launch` runs, for at most a minute: whether it holds.
  static bool PollWhileRunning(launch::Process& launch, const std::function<bool()>& done) {
    for (int i = 0; i < 600 && !done(); ++i) {
      if (launch.Poll()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return done();
  }
  std::string RunDir() const { return Run(); }
  std::vector<Event> AllEvents() const { return Events(); }
  static std::string ReadLog(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string s = ss.str();
    return s.size() > 6000 ? s.substr(s.size() - 6000) : s;
  }
  // The events so far: none while control.db is not there or not set up yet (a test polls while
  // the launch starts; the controller creates the file before its tables), so a test's own
  // assertions on them say what is missing.
  std::vector<Event> Events() const {
    auto db = ControlDb::Open(Run() + "/control.db", true);
    if (!db.ok()) return {};
    auto ev = (*db)->Events();
    return ev.ok() ? *ev : std::vector<Event>{};
  }
  static std::vector<Event> Of(const std::vector<Event>& all, const std::string& kind) {
    std::vector<Event> out;
    for (const Event& e : all) {
      if (e.kind_name == kind) out.push_back(e);
    }
    return out;
  }
  // Every span row is in a trace.db once: no (rank, attempt, step, microbatch, kind, name) twice.
  void ExpectNoDuplicateRows() const {
    for (const auto& node : fs::directory_iterator(Run() + "/nodes")) {
      EXPECT_EQ(fs::status(node.path() / "trace.db").permissions() & fs::perms::all,
                fs::perms::owner_read | fs::perms::owner_write)
          << "trace databases are private to the run's owner";
      const std::vector<int64_t> n = megascope::testing::FirstRow(
          (node.path() / "trace.db").string(),
          "SELECT COUNT(*), (SELECT COUNT(*) FROM (SELECT DISTINCT rank, attempt, step, "
          "microbatch, kind, name, start_ns FROM spans)) FROM spans");
      ASSERT_EQ(n.size(), 2u) << node.path();
      EXPECT_GT(n[0], 0) << node.path();
      EXPECT_EQ(n[0], n[1]) << node.path() << ": duplicated span rows";
    }
  }

  static inline TempDir* dir_ = nullptr;
  static inline std::string data_;
};

// Four nodes doing the same work (the detector needs four peers) and a spare.
inline std::string EvidenceCmd(const std::string& run, const std::string& job,
                               const std::string& data, const std::string& layout, int steps,
                               const std::string& extra) {
  return std::string(MEGASCOPE_BIN) + " launch " + layout + " --spares 1 --data " + data +
         " --run-dir " + run + " --job " + job + " --steps " + std::to_string(steps) +
         " --layers 2 --width 64 --heads 4 --seq 32 --batch 8 --microbatches 2 --hang-after 2"
         " --tick 0.1 --min-gemm-ratio 0.2 --min-bandwidth-ratio 0.1 --detector-warmup 20 " +
         extra;
}

// Runs the launch in the background until `done` holds on control.db's events (or `seconds`
// pass), then stops it.
inline std::vector<Event> RunUntil(LaunchTest* t, const std::string& cmd, const std::string& log,
                                   const std::function<bool(const std::vector<Event>&)>& done,
                                   int seconds) {
  auto launch = launch::Process::Spawn({{"/bin/sh", "-c", "exec " + cmd}, log});
  EXPECT_TRUE(launch.ok());
  if (!launch.ok()) return {};
  for (int i = 0; i < seconds * 10; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (fs::exists(t->RunDir() + "/control.db") && done(t->AllEvents())) break;
    if ((*launch)->Poll()) break;
  }
  RunCommand(std::string(MEGASCOPE_BIN) + " stop --run-dir " + t->RunDir());
  (*launch)->WaitFor(std::chrono::seconds(60));
  return t->AllEvents();
}

}  // namespace megascope::controller
