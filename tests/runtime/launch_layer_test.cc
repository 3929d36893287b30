// The process layer: Process (exit status, stop with a grace, no zombies, log), the state files
// and the resume point.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "megascope/launch/link_seam.h"
#include "megascope/launch/process.h"
#include "megascope/launch/progress.h"
#include "megascope/launch/slurm.h"
#include "megascope/launch/state_files.h"
#include "megascope/launch/supervisor.h"
#include "megascope/tracer/clock.h"
#include "test_util.h"

namespace megascope::launch {
namespace {

namespace fs = std::filesystem;
using megascope::testing::TempDir;

TEST(ProcessTest, ReportsExitCodesSignalsAndLogs) {
  TempDir dir;
  auto ok = Process::Spawn({{"/bin/sh", "-c", "echo hello; exit 7"}, dir.path() + "/log"});
  ASSERT_TRUE(ok.ok());
  ExitStatus e = (*ok)->Wait();
  EXPECT_TRUE(e.exited());
  EXPECT_EQ(e.code(), 7);
  EXPECT_EQ(e.Describe(), "exited with code 7");
  EXPECT_EQ((*ok)->LogTail(5), "    hello\n");
  auto killed = Process::Fork([] {
    ::raise(SIGABRT);
    return 0;
  });
  ASSERT_TRUE(killed.ok());
  EXPECT_EQ((*killed)->Wait().signal(), SIGABRT);
  EXPECT_NE((*killed)->Wait().Describe().find("signal 6"), std::string::npos);
  EXPECT_FALSE(Process::Spawn({{"/nonexistent/binary"}, ""}).ok());
}

TEST(ProcessTest, StopEscalatesToSigkillAfterTheGraceAndReaps) {
  // A child that ignores SIGTERM, and a grandchild in its group.
  TempDir dir;
  auto p = Process::Spawn(
      {{"/bin/sh", "-c", "trap '' TERM; sleep 1000 & echo $!; wait"}, dir.path() + "/log"});
  ASSERT_TRUE(p.ok());
  const pid_t pid = (*p)->pid();
  // The shell prints the grandchild's pid only after `trap` is in place: wait for that line
  // (a loaded machine may take long to get there; a SIGTERM before it would kill the shell).
  int grandchild = 0;
  for (int i = 0; i < 1000 && grandchild == 0; ++i) {
    std::ifstream log(dir.path() + "/log");
    if (!(log >> grandchild)) {
      grandchild = 0;
      ASSERT_FALSE((*p)->WaitFor(std::chrono::milliseconds(20)).has_value());
    }
  }
  ASSERT_NE(grandchild, 0) << "the shell never printed its grandchild's pid";
  ExitStatus e = (*p)->Stop(std::chrono::milliseconds(200));
  EXPECT_EQ(e.signal(), SIGKILL);
  EXPECT_EQ(::waitpid(pid, nullptr, WNOHANG), -1);  // reaped already: no zombie
  // The grandchild was killed with the group: gone, or a zombie until init reaps it. SIGKILL is
  // delivered at once but a dying process shows as running until it has exited, so its state is
  // read until it settles (a bounded condition; a grandchild left alive never gets there).
  std::string state = "R";
  for (int i = 0; i < 500 && state != "Z" && state != "X" && !state.empty(); ++i) {
    std::ifstream stat("/proc/" + std::to_string(grandchild) + "/stat");
    std::string pid_s, comm;
    state.clear();
    if (stat >> pid_s >> comm >> state && state != "Z" && state != "X")
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(state.empty() || state == "Z" || state == "X") << "grandchild still " << state;
}

// A child stopped whole (SIGSTOP: a frozen rank) is woken to handle its SIGTERM within the grace,
// not killed when the grace runs out: its handler (a rank's: saving its state) runs.
TEST(ProcessTest, AFrozenChildIsWokenToHandleItsStop) {
  TempDir dir;
  auto p = Process::Spawn({{"/bin/sh", "-c",
                            "trap 'exit 3' TERM; echo ready; while :; do sleep "
                            "0.05; done"},
                           dir.path() + "/log"});
  ASSERT_TRUE(p.ok());
  std::string ready;
  for (int i = 0; i < 1000 && ready != "ready"; ++i) {  // the trap is in place once it says so
    std::ifstream log(dir.path() + "/log");
    if (!(log >> ready)) {
      ASSERT_FALSE((*p)->WaitFor(std::chrono::milliseconds(20)).has_value());
    }
  }
  ASSERT_EQ(ready, "ready");
  ASSERT_TRUE((*p)->Signal(SIGSTOP));
  const ExitStatus e = (*p)->Stop(std::chrono::seconds(20));
  EXPECT_TRUE(e.exited()) << e.Describe();
  EXPECT_EQ(e.code(), 3) << e.Describe();
}

TEST(ProcessTest, DestructorStopsARunningChild) {
  pid_t pid;
  {
    auto p = Process::Spawn({{"/bin/sleep", "1000"}, ""});
    ASSERT_TRUE(p.ok());
    pid = (*p)->pid();
  }
  EXPECT_NE(::kill(pid, 0), 0);
}

std::string WriteMemoryShard(const std::string& dir, int rank, int64_t step, float value) {
  std::vector<float> a(4, value);
  std::string path = dir + "/" + MemoryShardName(rank, step);
  EXPECT_TRUE(
      WriteShard(path, EncodeShard(step, rank, 4, {a.data(), a.data(), a.data()}), false).ok());
  return path;
}

TEST(HostsFileTest, ReadsHostsAndNamesTheLineThatIsWrong) {
  megascope::testing::TempDir dir;
  const std::string path = dir.path() + "/hosts";
  std::ofstream(path)
      << "# a testbed\nh0 ns0 10.77.0.11 10.78.0.11 sw:h0\n\nh1 - 10.0.0.2 10.1.0.2\n";
  auto hosts = ReadHostsFile(path);
  ASSERT_TRUE(hosts.ok()) << hosts.status().ToString();
  ASSERT_EQ(hosts->size(), 2u);
  EXPECT_EQ((*hosts)[0].netns, "ns0");
  EXPECT_EQ((*hosts)[0].switch_netns, "sw");
  EXPECT_EQ((*hosts)[0].switch_port, "h0");
  EXPECT_EQ((*hosts)[1].netns, "") << "'-': this machine's own network";
  EXPECT_EQ((*hosts)[1].frontend_addr, "10.1.0.2");
  for (const auto& [text, where] : std::vector<std::pair<std::string, std::string>>{
           {"h0 ns0 10.0.0.1\n", ":1: expected"},
           {"h0 ns0 a b\nh1 ns1 a b c:d e\n", ":2: expected"},
           {"h0 ns0 a b\nh0 ns1 c d\n", ":2: host h0 twice"},
           {"# nothing\n", "lists no host"}}) {
    std::ofstream(path) << text;
    auto bad = ReadHostsFile(path);
    ASSERT_FALSE(bad.ok()) << text;
    EXPECT_NE(bad.status().message().find(where), std::string::npos) << bad.status().message();
  }
  EXPECT_EQ(ReadHostsFile(dir.path() + "/none").status().code(), StatusCode::kNotFound);
}

TEST(SlurmLaunchTest, NodeAddressesComeFromScontrolAndEachProcessIsANamedStepOnItsNode) {
  // `scontrol show node --oneliner` of Slurm 22.05 (shortened); a node without NodeAddr is
  // reached by its name.
  const auto addrs = ParseNodeAddrs(
      "NodeName=gpu-a17 Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 NodeAddr=10.78.203.11 "
      "NodeHostName=gpu-a17 Version=22.05.8 OS=Linux 6.18 #1 SMP RealMemory=1\n"
      "NodeName=gpu-a18 Arch=x86_64 CPUAlloc=0 NodeHostName=gpu-a18 State=IDLE\n");
  EXPECT_EQ(addrs, (std::map<std::string, std::string>{{"gpu-a17", "10.78.203.11"},
                                                       {"gpu-a18", "gpu-a18"}}));
  SupervisorOptions o;
  o.run_dir = "/tmp/none";
  o.hosts["gpu-a17"] = {"gpu-a17", "", "10.78.203.11", "10.78.203.11", "", "", "ib0", "4242"};
  Supervisor sup(o);
  const ProcessSpec spec = sup.NodeProcess("gpu-a17", "rank3", {"/bin/megascope", "worker"}, "");
  ASSERT_GE(spec.argv.size(), 3u);
  EXPECT_NE(spec.argv[0].find("srun"), std::string::npos) << spec.argv[0];
  auto has = [&](const std::string& a) {
    return std::find(spec.argv.begin(), spec.argv.end(), a) != spec.argv.end();
  };
  EXPECT_TRUE(has("--jobid=4242") && has("--nodelist=gpu-a17") && has("--job-name=rank3@gpu-a17"));
  EXPECT_EQ(spec.argv[spec.argv.size() - 2], "/bin/megascope") << "the command follows srun's";
  bool iface = false;
  for (const auto& [k, v] : spec.env) iface |= k == kBindIfaceEnv && v == "ib0";
  EXPECT_TRUE(iface) << "--iface: the rank binds its host's ib0";
  // Outside an allocation --slurm says so.
  const char* job = std::getenv("SLURM_JOB_ID");
  const std::string saved = job ? job : "";
  ::unsetenv("SLURM_JOB_ID");
  auto none = CurrentSlurmAllocation();
  if (!saved.empty()) ::setenv("SLURM_JOB_ID", saved.c_str(), 1);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("sbatch or salloc"), std::string::npos);
}

TEST(RunToolTest, ReturnsTheOutputOrSaysWhatFailed) {
  auto out = RunTool({"sh", "-c", "echo hello; echo err >&2"});
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_NE(out->find("hello"), std::string::npos);
  auto failed = RunTool({"sh", "-c", "echo why; exit 3"});
  ASSERT_EQ(failed.status().code(), StatusCode::kInternal);
  EXPECT_NE(failed.status().message().find("why"), std::string::npos) << "the tool's own words";
  EXPECT_EQ(RunTool({"no-such-tool-here"}).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(RunTool({"sleep", "5"}, "", std::chrono::milliseconds(100)).status().code(),
            StatusCode::kDeadlineExceeded);
}

TEST(StateFilesTest, ResumesFromTheNewestStepEveryRankHasOnALiveNode) {
  TempDir dir;
  const std::string n0 = dir.path() + "/node0", n1 = dir.path() + "/node1";
  // Step 4: both ranks (rank 1 only in its buddy's copy on node0). Step 5: rank 0 only.
  WriteMemoryShard(n0, 0, 4, 1);
  WriteMemoryShard(n0, 1, 4, 2);
  WriteMemoryShard(n0, 0, 5, 3);
  RunLayout layout(dir.path() + "/run");
  ResumePoint p = FindResumePoint(layout, {n0, n1}, 2);
  EXPECT_EQ(p.step, 4);
  EXPECT_EQ(p.source, "memory");
  ASSERT_EQ(p.files.size(), 2u);
  auto bytes = ReadShard(p.files[1]);
  ASSERT_TRUE(bytes.ok());
  std::vector<float> x(4), y(4), z(4);
  ASSERT_TRUE(DecodeShard(*bytes, p.files[1], 4, 1, 4, {x.data(), y.data(), z.data()}).ok());
  EXPECT_EQ(x[0], 2);
  EXPECT_FALSE(
      DecodeShard(*bytes, p.files[1], 5, 1, 4, {x.data(), y.data(), z.data()}).ok());  // wrong step
  EXPECT_FALSE(DecodeShard(*bytes, p.files[1], 4, 1, 5, {x.data(), y.data(), z.data()})
                   .ok());  // wrong model
}

// A rank whose launcher died moves its state from host memory to disk: each rank its own shards
// of the two newest steps, rank 0 (last here) the manifest of the newest step both saved. Then the
// memory areas are empty and gone, and the disk checkpoint is where a relaunch resumes.
TEST(StateFilesTest, AnOrphanedRanksMemoryStateMovesToADiskCheckpoint) {
  TempDir dir;
  const std::string root = dir.path() + "/mem", n0 = root + "/node0", n1 = root + "/node1";
  for (int step : {3, 4, 5}) {  // rank 0 on node0 (buddy node1), rank 1 on node1 (buddy node0)
    for (const std::string& n : {n0, n1})
      WriteMemoryShard(n, 0, step, static_cast<float>(10 + step));
    if (step < 5)  // rank 1 stopped a step behind
      for (const std::string& n : {n1, n0})
        WriteMemoryShard(n, 1, step, static_cast<float>(20 + step));
  }
  RunLayout layout(dir.path() + "/run");
  auto one = PersistMemoryShards(layout, {n1, n0}, root, 1, 2, 100);
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  EXPECT_NE(one->find("steps 3, 4 now on disk"), std::string::npos) << *one;
  EXPECT_TRUE(fs::exists(n0)) << "rank 0's files are still there";
  auto zero = PersistMemoryShards(layout, {n0, n1}, root, 0, 2, 100);
  ASSERT_TRUE(zero.ok()) << zero.status().ToString();
  EXPECT_NE(zero->find("steps 4, 5 now on disk"), std::string::npos) << *zero;
  EXPECT_NE(zero->find("step 5 incomplete: no shard from rank 1"), std::string::npos) << *zero;
  EXPECT_FALSE(fs::exists(root)) << "nothing left in host memory";
  const ResumePoint p = FindResumePoint(layout, {n0, n1}, 2);
  EXPECT_EQ(p.step, 4);
  EXPECT_EQ(p.source, "disk");
  ASSERT_EQ(p.files.size(), 2u);
  auto bytes = ReadShard(p.files[1]);
  ASSERT_TRUE(bytes.ok());
  std::vector<float> x(4), y(4), z(4);
  ASSERT_TRUE(DecodeShard(*bytes, p.files[1], 4, 1, 4, {x.data(), y.data(), z.data()}).ok());
  EXPECT_EQ(x[0], 24);
}

// Weeks of --checkpoint-every: the newest complete checkpoints stay, older ones and the partial
// ones a crash left go, and a partial one newer than every complete one (being written) stays.
TEST(StateFilesTest, PruningKeepsTheNewestCompleteCheckpointsAndOneBeingWritten) {
  TempDir dir;
  RunLayout layout(dir.path() + "/run");
  auto make = [&](int64_t step, bool complete) {
    const std::string d = layout.checkpoint(step);
    fs::create_directories(d);
    ASSERT_TRUE(WriteShard(d + "/rank_0.bin", EncodeShard(step, 0, 1, {}), true).ok());
    if (complete) {
      ASSERT_TRUE(WriteCheckpointManifest(layout, step, 1, 0).ok());
    }
  };
  for (int64_t s : {2, 4, 8, 10, 12}) make(s, true);
  make(6, false);                                                // a write that died
  make(14, false);                                               // the one in flight
  fs::create_directories(layout.checkpoints() + "/step_notes");  // not ours: left alone
  auto removed = PruneCheckpoints(layout, 2);
  ASSERT_TRUE(removed.ok()) << removed.status().ToString();
  EXPECT_EQ(*removed, (std::vector<int64_t>{8, 6, 4, 2}));
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(layout.checkpoints()))
    left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"step_10", "step_12", "step_14", "step_notes"}));
  EXPECT_EQ(FindDiskCheckpoint(layout, 1).step, 12);
  ASSERT_TRUE(PruneCheckpoints(layout, 0).ok());  // 0: every one kept
  EXPECT_TRUE(fs::exists(layout.checkpoint(10)));
}

TEST(StateFilesTest, ACorruptShardFallsBackToAnotherCopyOrAnOlderStep) {
  TempDir dir;
  const std::string n0 = dir.path() + "/node0", n1 = dir.path() + "/node1";
  for (const std::string& n : {n0, n1}) {
    WriteMemoryShard(n, 0, 3, 1);
    WriteMemoryShard(n, 1, 3, 1);
  }
  const std::string own = WriteMemoryShard(n0, 0, 4, 1), buddy = WriteMemoryShard(n1, 0, 4, 1);
  WriteMemoryShard(n1, 1, 4, 1);
  auto flip = [](const std::string& f) {
    std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(40);
    io.put('\x5a');
  };
  flip(own);
  ResumePoint p = FindMemorySnapshot({n0, n1}, 2);
  EXPECT_EQ(p.step, 4);  // the buddy's copy is intact
  EXPECT_EQ(p.files[0], buddy);
  flip(buddy);
  p = FindMemorySnapshot({n0, n1}, 2);
  EXPECT_EQ(p.step, 3);
  EXPECT_NE(p.log.find("checksum mismatch"), std::string::npos);
  EXPECT_EQ(FindMemorySnapshot({n1}, 3).step, -1);  // rank 2 has no state anywhere
}

TEST(LinkSeamTest, DelaysOutgoingBytesAtTheWrittenRateUntilTheFaultEnds) {
  TempDir dir;
  const std::string path = dir.path() + "/link_node1";
  EXPECT_EQ(LinkSeam(path).DelayFor(1 << 20).count(), 0) << "no file: healthy";
  ASSERT_TRUE(WriteLinkFault(path, {}).ok());
  EXPECT_EQ(LinkSeam(path).DelayFor(1 << 20).count(), 0) << "empty file: healthy";
  ASSERT_TRUE(WriteLinkFault(path, {10, 0}).ok());
  EXPECT_EQ(LinkSeam(path).DelayFor(5'000'000).count(), 500'000'000) << "5 MB at 10 MB/s";
  EXPECT_EQ(LinkSeam("").DelayFor(5'000'000).count(), 0) << "a process without the seam";
  const int64_t now = tracer::WallNowNs();
  ASSERT_TRUE(WriteLinkFault(path, {10, now + 3'600'000'000'000}).ok());
  EXPECT_GT(LinkSeam(path).DelayFor(1000).count(), 0) << "the fault has not ended";
  ASSERT_TRUE(WriteLinkFault(path, {10, now - 1}).ok());
  EXPECT_EQ(LinkSeam(path).DelayFor(1000).count(), 0) << "the fault has ended";
}

TEST(LinkSeamTest, AMalformedFaultIsRefusedWithTheFieldAndLeavesTheLinkHealthy) {
  EXPECT_EQ(ParseLinkFault("rate_mbps=2.5 until_ns=7")->rate_mbps, 2.5);
  EXPECT_EQ(ParseLinkFault("rate_mbps=2.5 until_ns=7")->until_ns, 7);
  auto bad = ParseLinkFault("rate_mbps=fast");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("rate_mbps='fast'"), std::string::npos);
  EXPECT_NE(ParseLinkFault("loss=30").status().message().find("unknown field 'loss'"),
            std::string::npos);
  TempDir dir;
  const std::string path = dir.path() + "/link";
  std::ofstream(path) << "rate_mbps=fast\n";
  EXPECT_EQ(LinkSeam(path).DelayFor(1 << 20).count(), 0);
}

// Progress lines lost to a full disk: a line cut short leaves a fragment; the writer's next line
// starts on a fresh line, so the fragment is one damaged line and the next record survives.
TEST(ProgressTest, ATornLineIsCountedAndTheNextRecordSurvivesIt) {
  TempDir dir;
  const std::string path = dir.path() + "/progress.jsonl";
  ProgressReader reader(path);
  ASSERT_TRUE(AppendProgress(path, {{"step", 1}}).ok());
  {
    std::ofstream torn(path, std::ios::app);
    torn << "{\"step\": 2, \"lo";  // what a write cut short by ENOSPC leaves
  }
  EXPECT_EQ(reader.Poll().size(), 1u);
  EXPECT_GT(reader.unterminated(), 0u) << "a fragment without its newline is still pending";
  {
    std::ofstream next(path, std::ios::app);
    next << "\n{\"step\": 3}\n";  // the writer's next line, on a fresh line
  }
  const auto lines = reader.Poll();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0]["step"], 3);
  EXPECT_EQ(reader.damaged(), 1);
  EXPECT_EQ(reader.unterminated(), 0u);
}

// A fragment another process left (an earlier attempt's rank, cut short by a full disk) is ended
// before the next line, which stays whole on its own line.
TEST(ProgressTest, AnAppendAfterAnotherWritersFragmentStartsOnAFreshLine) {
  TempDir dir;
  const std::string path = dir.path() + "/progress.jsonl";
  ASSERT_TRUE(AppendProgress(path, {{"step", 1}}).ok());
  std::ofstream(path, std::ios::app) << "{\"attempt\":0,\"grad_norm\":1.91";
  ASSERT_TRUE(AppendProgress(path, {{"event", "ready"}, {"attempt", 1}}).ok());
  ASSERT_TRUE(AppendProgress(path, {{"step", 2}}).ok());
  ProgressReader reader(path);
  const auto lines = reader.Poll();
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[1]["event"], "ready");
  EXPECT_EQ(lines[2]["step"], 2);
  EXPECT_EQ(reader.damaged(), 1);
}

TEST(ProgressTest, AFailedAppendSaysWhereAndWhy) {
  const Status st = AppendProgress("/dev/full", {{"step", 1}});
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("/dev/full"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("No space left on device"), std::string::npos) << st.message();
  const Status missing = AppendProgress("/nonexistent-dir/progress.jsonl", {{"step", 1}});
  EXPECT_NE(missing.message().find("/nonexistent-dir/progress.jsonl"), std::string::npos);
}

// Lines written while the disk is full are kept and written, in order, once it takes writes
// again (the disk is a seam: full until `free_after` writes were refused); past the bound the
// oldest are dropped and counted.
TEST(ProgressTest, LinesRefusedByAFullDiskAreWrittenInOrderOnceItFreesUp) {
  TempDir dir;
  const std::string path = dir.path() + "/progress.jsonl";
  int refusals = 0, free_after = 2;
  auto disk = [&](const std::string& p, const nlohmann::json& line) {
    if (refusals < free_after) {
      ++refusals;
      return ErrnoError("cannot append to " + p, ENOSPC);
    }
    return AppendProgress(p, line);
  };
  ProgressWriter writer(path, 3, disk);
  EXPECT_FALSE(writer.Append({{"step", 1}}).ok());
  EXPECT_FALSE(writer.Append({{"step", 2}}).ok());
  EXPECT_EQ(writer.pending(), 2u);
  ASSERT_TRUE(writer.Append({{"step", 3}}).ok());
  EXPECT_EQ(writer.pending(), 0u);
  ProgressReader reader(path);
  auto lines = reader.Poll();
  ASSERT_EQ(lines.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(lines[i]["step"], i + 1);
  // Full for five lines with room for three: the two oldest are dropped, the rest kept in order.
  refusals = 0;
  free_after = 5;
  for (int step = 4; step <= 8; ++step) EXPECT_FALSE(writer.Append({{"step", step}}).ok());
  ASSERT_TRUE(writer.Append({{"step", 9}}).ok());
  EXPECT_EQ(writer.dropped(), 3);
  lines = reader.Poll();
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0]["step"], 7);
  EXPECT_EQ(lines[2]["step"], 9);
  EXPECT_EQ(reader.damaged(), 0);
}

}  // namespace
}  // namespace megascope::launch
