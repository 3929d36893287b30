// PyTorch Flight Recorder dumps through the hang analysis: recorded and generated cases
// (tests/data/ pytorch/<case>/), the reader's options, bad and old input, and the op matching
// PyTorch does.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>

#include "hang_cases.h"
#include "megascope/analyzer/hang.h"
#include "megascope/analyzer/pytorch.h"
#include "megascope/analyzer/stacks.h"
#include "megascope/tracer/clock.h"
#include "megascope/tracer/file_util.h"
#include "test_util.h"

namespace megascope::analyzer {
namespace {

namespace fs = std::filesystem;
using megascope::testing::RunCommand;
using megascope::testing::TempDir;

// PyTorch's Flight Recorder as PyTorch writes it (tests/data/pytorch/<case>/: dumps in the pickle
// form of TORCH_NCCL_DUMP_ON_TIMEOUT or the JSON form, made by tests/data/pytorch/generate.py from
// c10d's writer and tools/flight_recorder's semantics; each expected.json says where it is from).
class PyTorchCase : public ::testing::TestWithParam<std::string> {};

TEST_P(PyTorchCase, NamesTheRootAndNoOneElse) {
  const std::string dir = GetParam();
  std::ifstream f(dir + "/expected.json");
  const auto expected = nlohmann::json::parse(f);
  // PyTorch's JSON dump holds no time of its own: a reader dates it by the file's modification
  // time, which a checkout resets. A recorded case keeps each file's (dumped_at_ns), restored here
  // on a copy.
  std::string dumps = dir + "/dumps";
  TempDir copy;
  if (expected.contains("dumped_at_ns")) {
    fs::copy(dumps, copy.path(), fs::copy_options::recursive);
    dumps = copy.path();
    for (const auto& [file, ns] : expected["dumped_at_ns"].items()) {
      const struct timespec times[2] = {{ns.get<int64_t>() / 1'000'000'000, 0},
                                        {ns.get<int64_t>() / 1'000'000'000,
                                         static_cast<long>(ns.get<int64_t>() % 1'000'000'000)}};
      ASSERT_EQ(::utimensat(AT_FDCWD, (dumps + "/" + file).c_str(), times, 0), 0) << file;
    }
  }
  // How the case asks the set to be read: analyze's --transform-ft and --allow-incomplete-ranks.
  const auto asked = expected.value("options", nlohmann::json::object());
  PyTorchLoadOptions load;
  load.ft_group_world_size = asked.value("transform_ft", 0);
  const bool partial = asked.value("allow_incomplete_ranks", false);
  auto in = LoadPyTorch(dumps, load);
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  auto analyze = [&](HangOptions o) {
    o.absent_not_collected = partial;
    return AnalyzePyTorch(*in, o);
  };
  // What the case expects to be warned of (each a part of one warning), and nothing else.
  const auto warned = expected.value("warnings", std::vector<std::string>{});
  ASSERT_EQ(in->hang.warnings.size(), warned.size())
      << (in->hang.warnings.empty() ? std::string("no warning") : in->hang.warnings.front());
  for (size_t k = 0; k < warned.size(); ++k)
    EXPECT_NE(in->hang.warnings[k].find(warned[k]), std::string::npos) << in->hang.warnings[k];
  ExpectVerdicts(dir, analyze);
  DropEntries(&in->hang);
  ExpectVerdicts(dir, analyze);
}

INSTANTIATE_TEST_SUITE_P(Data, PyTorchCase,
                         ::testing::ValuesIn(Scenarios(MEGASCOPE_TEST_DATA "/pytorch")),
                         [](const auto& info) { return fs::path(info.param).filename().string(); });
// Dumps PyTorch itself wrote (scripts/record-pytorch-fr.py), each case a hang provoked for real.
INSTANTIATE_TEST_SUITE_P(Real, PyTorchCase,
                         ::testing::ValuesIn(Scenarios(MEGASCOPE_TEST_DATA "/pytorch/real")),
                         [](const auto& info) { return fs::path(info.param).filename().string(); });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(PyTorchCase);

// Read as written, the partial set names the rank without a dump dead; torchft's replicas, read
// without their transform, are not what the transform makes of them; the stack ids a recorder
// numbered are in the evidence.
TEST(PyTorchImportTest, TheReadersOptionsChangeWhatTheSetsMean) {
  auto partial =
      LoadPyTorch(MEGASCOPE_TEST_DATA "/pytorch/partial_set_allow_incomplete_ranks/dumps");
  ASSERT_TRUE(partial.ok()) << partial.status().ToString();
  auto as_gone = AnalyzePyTorch(*partial);
  ASSERT_EQ(as_gone.size(), 1u);
  EXPECT_EQ(as_gone[0].cause, "rank_dead");
  EXPECT_EQ(as_gone[0].root_ranks, std::vector<int32_t>{5});
  HangOptions not_collected;
  not_collected.absent_not_collected = true;
  auto undecided = AnalyzePyTorch(*partial, not_collected);
  ASSERT_EQ(undecided.size(), 1u);
  EXPECT_NE(undecided[0].explanation.find("wait on rank(s) 5, whose dumps are not here"),
            std::string::npos)
      << undecided[0].explanation;

  auto ft = LoadPyTorch(MEGASCOPE_TEST_DATA "/pytorch/torchft_replica_rank_not_joined/dumps");
  ASSERT_FALSE(ft.ok());
  EXPECT_NE(ft.status().message().find("read such dumps with --transform-ft N"), std::string::npos)
      << ft.status().message();

  auto stacks = LoadPyTorch(MEGASCOPE_TEST_DATA "/pytorch/op_mismatch_with_stack_ids/dumps");
  ASSERT_TRUE(stacks.ok()) << stacks.status().ToString();
  const auto v = AnalyzePyTorch(*stacks);
  ASSERT_EQ(v.size(), 1u);
  std::string evidence;
  for (const std::string& e : v[0].evidence) evidence += e + "\n";
  EXPECT_NE(evidence.find("pytorch: rank 2: nccl:broadcast"), std::string::npos) << evidence;
  EXPECT_NE(evidence.find("stack_id 7"), std::string::npos) << evidence;
  EXPECT_NE(evidence.find("stack_id 3"), std::string::npos) << evidence;
}

// The slow collective of slow_collective_progressing_healthy, dumped later: open 60 s where the
// same all-reduce took at most 25 s before, it is no longer at its usual pace and is not healthy.
// Without the recorded durations (timing off) its pace is unknown: not healthy either.
TEST(PyTorchImportTest, ASlowCollectiveOpenFarLongerThanItsUsualRunIsNotHealthy) {
  const std::string dir = MEGASCOPE_TEST_DATA "/pytorch/slow_collective_progressing_healthy";
  std::ifstream f(dir + "/expected.json");
  const auto expected = nlohmann::json::parse(f);
  for (const bool timing : {true, false}) {
    TempDir copy;
    fs::copy(dir + "/dumps", copy.path(), fs::copy_options::recursive);
    for (const auto& [file, ns] : expected["dumped_at_ns"].items()) {
      const std::string path = copy.path() + "/" + file;
      if (!timing) {
        auto j = nlohmann::json::parse(tracer::ReadFile(path).value());
        for (auto& e : j["entries"]) e.erase("duration_ms");
        std::ofstream(path, std::ios::trunc) << j.dump();
      }
      const int64_t later = ns.get<int64_t>() + (timing ? 38'000'000'000 : 0);
      const struct timespec times[2] = {{later / 1'000'000'000, 0},
                                        {later / 1'000'000'000, later % 1'000'000'000}};
      ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0) << path;
    }
    auto in = LoadPyTorch(copy.path());
    ASSERT_TRUE(in.ok()) << in.status().ToString();
    const auto verdicts = AnalyzePyTorch(*in);
    ASSERT_EQ(verdicts.size(), 1u);
    EXPECT_EQ(verdicts[0].kind, VerdictKind::kHang) << VerdictToJson(verdicts[0]);
  }
}

TEST(PyTorchImportTest, FlightRecorderDumpsGetARootCause) {
  auto in = LoadPyTorchDumps(MEGASCOPE_TEST_DATA "/pytorch/rank_not_joined/dumps");
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  EXPECT_EQ(in->world_size, 4);
  const auto& r3 = in->ranks[3].dump.snapshot;
  ASSERT_EQ(r3.groups.size(), 2u);
  EXPECT_EQ(r3.groups[0].ranks.ToVector(),
            (std::vector<int32_t>{0, 1, 2, 3}));  // parsed from PyTorch's "[0, 1, 2, 3]"
  EXPECT_EQ(r3.entries[1].op, tracer::OpType::kRecv);
  EXPECT_EQ(r3.entries[1].peer, 2);
  EXPECT_EQ(r3.entries[1].dtype, tracer::DType::kBf16);
  EXPECT_EQ(r3.entries[1].bytes, 512u * 1024u * 2u);
  const auto v = AnalyzeHang(*in);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].cause, "rank_not_joined");
  EXPECT_EQ(v[0].root_ranks, std::vector<int32_t>{2});
  EXPECT_EQ(v[0].waiting_ranks, (std::vector<int32_t>{0, 1, 3}));
  auto cli = RunCommand(std::string(MEGASCOPE_BIN) + " analyze hang --pytorch " MEGASCOPE_TEST_DATA
                                                     "/pytorch/rank_not_joined/dumps --json");
  EXPECT_EQ(cli.code, 0);
  EXPECT_NE(cli.out.find("\"root_ranks\":[2]"), std::string::npos) << cli.out;
}

// The schema of PyTorch's recorder as its own tests write it (test_c10d_nccl's FR tests and
// tools/flight_recorder's fixtures): pg_config keyed by group name with ranks as a string, states
// scheduled/started/completed, `retired`, counters sometimes as strings.
nlohmann::json PyTorchTrace(int rank, const std::vector<nlohmann::json>& entries) {
  return {{"version", "2.9"},
          {"rank", rank},
          {"pg_config", {{"0", {{"name", "0"}, {"desc", "default_pg"}, {"ranks", "[0, 1]"}}}}},
          {"pg_status",
           {{"0", {{"last_enqueued_collective", "2"}, {"last_completed_collective", "1"}}}}},
          {"entries", entries}};
}
nlohmann::json PyTorchEntry(int record, int seq, const nlohmann::json& state, bool retired,
                            const char* dtype = "Float") {
  nlohmann::json e = {{"record_id", record},
                      {"pg_id", 0},
                      {"process_group", {"0", "default_pg"}},
                      {"collective_seq_id", seq},
                      {"p2p_seq_id", 0},
                      {"op_id", seq},
                      {"profiling_name", "nccl:all_reduce"},
                      {"time_created_ns", 1724779239936775119LL + record},
                      {"input_sizes", {{3, 4}}},
                      {"input_dtypes", {dtype}},
                      {"retired", retired},
                      {"timeout_ms", 600000},
                      {"is_p2p", false}};
  if (!state.is_null()) e["state"] = state;
  return e;
}

TEST(PyTorchImportTest, RetiredOnlyRecordersUnknownStatesAndDtypes) {
  // Rank 0's recorder marks finished work only as retired (no state); its second all-reduce is
  // scheduled, a third carries a state this build does not know. Rank 1 never issued #2.
  TempDir dir;
  std::ofstream(dir.path() + "/rank_0")
      << PyTorchTrace(0, {PyTorchEntry(0, 1, nullptr, true), PyTorchEntry(1, 2, "scheduled", false),
                          PyTorchEntry(2, 3, "queued_on_host", false, "Float8_e4m3fn")})
             .dump();
  std::ofstream(dir.path() + "/rank_1")
      << PyTorchTrace(1, {PyTorchEntry(0, 1, "completed", true)}).dump();
  auto in = LoadPyTorchDumps(dir.path());
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  const auto& r0 = in->ranks[0].dump.snapshot;
  EXPECT_EQ(r0.entries[0].state, tracer::OpState::kCompleted);
  EXPECT_EQ(r0.entries[1].state, tracer::OpState::kEnqueued);
  EXPECT_EQ(r0.entries[2].state, tracer::OpState::kUnknown);
  ASSERT_EQ(in->warnings.size(), 2u);
  EXPECT_NE(in->warnings[0].find("unknown input_dtypes 'Float8_e4m3fn'"), std::string::npos)
      << in->warnings[0];
  EXPECT_NE(in->warnings[1].find("unknown state 'queued_on_host'"), std::string::npos)
      << in->warnings[1];
  const auto v = AnalyzeHang(*in);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].cause, "rank_not_joined");
  EXPECT_EQ(v[0].root_ranks, std::vector<int32_t>{1});
}

TEST(PyTorchImportTest, DumpsWithoutEntriesUsePgStatus) {
  // includeCollectives=False: only pg_status. Rank 0 enqueued collective #3, rank 1 stopped at #2.
  TempDir dir;
  for (int r : {0, 1}) {
    nlohmann::json j = PyTorchTrace(r, {});
    j.erase("entries");
    j["pg_status"]["0"] = {{"last_enqueued_collective", r == 0 ? "3" : "2"},
                           {"last_started_collective", "-1"},
                           {"last_completed_collective", "2"}};
    std::ofstream(dir.path() + "/rank_" + std::to_string(r)) << j.dump();
  }
  auto in = LoadPyTorchDumps(dir.path());
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  const auto v = AnalyzeHang(*in);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].cause, "rank_not_joined");
  EXPECT_EQ(v[0].root_ranks, std::vector<int32_t>{1});
}

TEST(PyTorchImportTest, AnOpsOwnTimeoutShortensTheWait) {
  // Rank 0 waits 3 s in all-reduce #2, which rank 1 never issued. With the ops' 1-s timeout that is
  // a hang; with PyTorch's default 10-minute timeout and our 10-s wait it is work in progress.
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  for (int timeout_ms : {1000, 600000}) {
    TempDir dir;
    auto entry = [&](int seq, const char* state) {
      nlohmann::json e = PyTorchEntry(seq - 1, seq, state, std::string(state) == "completed");
      e["time_created_ns"] = now - 3'000'000'000LL;
      e["timeout_ms"] = timeout_ms;
      return e;
    };
    std::ofstream(dir.path() + "/rank_0")
        << PyTorchTrace(0, {entry(1, "completed"), entry(2, "scheduled")}).dump();
    std::ofstream(dir.path() + "/rank_1") << PyTorchTrace(1, {entry(1, "completed")}).dump();
    auto in = LoadPyTorchDumps(dir.path());
    ASSERT_TRUE(in.ok()) << in.status().ToString();
    const auto v = AnalyzeHang(*in);
    ASSERT_EQ(v.size(), 1u);
    if (timeout_ms == 1000) {
      EXPECT_EQ(v[0].cause, "rank_not_joined");
      EXPECT_EQ(v[0].root_ranks, std::vector<int32_t>{1});
    } else {
      EXPECT_EQ(Name(v[0].kind), "healthy");
    }
  }
}

// PyTorch records the stack that issued each op (`frames`: name, filename, line). The frames of
// the op each rank is stuck at group the ranks; the rank that got there from elsewhere stands
// apart.
TEST(PyTorchImportTest, TheFramesOfTheStuckOpsGroupTheRanks) {
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  auto frames = [](const char* op, const char* caller, int line) {
    return nlohmann::json::array(
        {{{"name", op}, {"filename", "torch/distributed/distributed_c10d.py"}, {"line", 2050}},
         {{"name", caller}, {"filename", "train.py"}, {"line", line}}});
  };
  TempDir dir;
  for (int r = 0; r < 4; ++r) {
    nlohmann::json done = PyTorchEntry(0, 1, "completed", true);
    nlohmann::json stuck = PyTorchEntry(1, 2, "started", false);
    done["time_created_ns"] = stuck["time_created_ns"] = now - 30'000'000'000LL;
    done["frames"] = frames("all_reduce", "train_step", 40);
    stuck["frames"] = r == 2 ? frames("all_reduce", "clip_grad_norm", 77)
                             : frames("all_reduce", "train_step", 40);
    nlohmann::json t = PyTorchTrace(r, {done, stuck});
    t["pg_config"]["0"]["ranks"] = "[0, 1, 2, 3]";
    std::ofstream(dir.path() + "/rank_" + std::to_string(r)) << t.dump();
  }
  auto in = LoadPyTorchDumps(dir.path());
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  const auto groups = GroupByStack(*in);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].ranks, (std::vector<int32_t>{0, 1, 3}));
  EXPECT_EQ(groups[1].ranks, (std::vector<int32_t>{2}));
  EXPECT_EQ(groups[1].stack.frames.at(1), "clip_grad_norm at train.py:77");
  EXPECT_EQ(OddStackEvidence(*in, groups),
            "stacks: rank 2 stands apart, in clip_grad_norm at train.py:77, while 3 ranks are in "
            "train_step at train.py:40");
  const std::string text = FormatStackGroups(groups);
  EXPECT_NE(text.find("3 ranks [0, 1, 3]:"), std::string::npos) << text;
  EXPECT_NE(text.find("#1 clip_grad_norm at train.py:77"), std::string::npos) << text;
}

TEST(PyTorchImportTest, OneGroupNameWithDifferentMembersIsTwoGroups) {
  // DeviceMesh / split_group: on ranks 0-1 "tp" is {0,1}, on ranks 2-3 it is {2,3}. Rank 3 never
  // issues tp all-reduce #2; rank 2 waits for it.
  TempDir dir;
  for (int r = 0; r < 4; ++r) {
    const std::string tp = r < 2 ? "[0, 1]" : "[2, 3]";
    nlohmann::json j = {{"version", "2.9"},
                        {"rank", r},
                        {"pg_config",
                         {{"0", {{"name", "0"}, {"desc", "default_pg"}, {"ranks", "[0, 1, 2, 3]"}}},
                          {"tp", {{"name", "tp"}, {"desc", "mesh_tp"}, {"ranks", tp}}}}},
                        {"entries", nlohmann::json::array()}};
    for (int seq = 1; seq <= (r == 3 ? 1 : 2); ++seq) {
      nlohmann::json e = PyTorchEntry(
          seq - 1, seq, seq == 2 && r != 3 && r >= 2 ? "scheduled" : "completed", true);
      e["process_group"] = {"tp", "mesh_tp"};
      if (seq == 2 && r == 2) e["retired"] = false;
      j["entries"].push_back(e);
    }
    std::ofstream(dir.path() + "/rank_" + std::to_string(r)) << j.dump();
  }
  auto in = LoadPyTorchDumps(dir.path());
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  EXPECT_EQ(in->ranks[2].dump.snapshot.groups[1].name, "tp[2,3]");
  const auto v = AnalyzeHang(*in);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].cause, "rank_not_joined");
  EXPECT_EQ(v[0].root_ranks, std::vector<int32_t>{3});
  EXPECT_EQ(v[0].waiting_ranks, std::vector<int32_t>{2});
  EXPECT_EQ(v[0].group, "tp[2,3]");
}

TEST(PyTorchImportTest, NumbersOfTheWrongKindOrRangeAreReadOrRefusedNeverUndefined) {
  // Found by fuzz_pytorch: a float time beyond int64 was cast (undefined behaviour). Floats in
  // range are read, out of range read as absent; a field of the wrong type is a clear error.
  nlohmann::json e = PyTorchEntry(0, 1, "scheduled", false);
  e["time_created_ns"] = 1.7637e21;
  e["input_sizes"] = {{3.0, 4}};
  nlohmann::json j = PyTorchTrace(0, {e});
  j["rank"] = 1.0;
  auto d = ParsePyTorchDump(j.dump(), "rank_1.json");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->snapshot.info.rank, 1);
  EXPECT_EQ(d->snapshot.entries[0].enqueued_at_ns, 0);
  EXPECT_EQ(d->snapshot.entries[0].bytes, 48u);
  j["rank"] = 1e12;
  EXPECT_NE(ParsePyTorchDump(j.dump(), "rank_1.json")
                .status()
                .message()
                .find("rank 1000000000000 is out of range"),
            std::string::npos);
  j["rank"] = 1;
  j["entries"][0]["profiling_name"] = 7;
  const std::string err = ParsePyTorchDump(j.dump(), "rank_1.json").status().message();
  EXPECT_NE(err.find("rank_1.json: not a readable PyTorch Flight Recorder dump"), std::string::npos)
      << err;
}

TEST(PyTorchImportTest, BadFilesAreLeftOutByNameAndAloneAreRefusedByName) {
  TempDir dir;
  std::ofstream(dir.path() + "/rank_0.json") << "{\"version\": \"2.4\"}";
  auto in = LoadPyTorchDumps(dir.path());
  ASSERT_FALSE(in.ok());
  EXPECT_NE(in.status().message().find("rank_0.json: not a PyTorch Flight Recorder dump"),
            std::string::npos)
      << in.status().message();
  // Beside readable dumps, a bad file costs only its own rank, and says why.
  fs::copy(MEGASCOPE_TEST_DATA "/pytorch/rank_not_joined/dumps", dir.path(),
           fs::copy_options::overwrite_existing | fs::copy_options::recursive);
  std::ofstream(dir.path() + "/rank_0.json") << "\x80\x04\x95pickle";
  std::ofstream(dir.path() + "/train.log") << "step 10 loss 2.1\n";
  in = LoadPyTorchDumps(dir.path());
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  EXPECT_FALSE(in->ranks[0].present);
  EXPECT_TRUE(in->ranks[3].present);
  ASSERT_EQ(in->warnings.size(), 2u);
  EXPECT_NE(in->warnings[0].find("rank_0.json: pickle byte 2: FRAME"), std::string::npos)
      << in->warnings[0];
  EXPECT_NE(in->warnings[1].find("train.log: neither JSON nor a pickle"), std::string::npos)
      << in->warnings[1];
}

// PyTorch's dump carries no time of its own: the file's is used, unless the file was copied long
// after the dump (then the watchdog's firing, one timeout after the open op, stands in for it).
TEST(PyTorchImportTest, ACopiedDumpIsDatedByItsOpenOpsTimeoutNotTheCopy) {
  TempDir dir;
  nlohmann::json open = PyTorchEntry(1, 2, "started", false);
  open["timeout_ms"] = 30000;
  const std::string path = dir.path() + "/nccl_trace_rank_0";
  std::ofstream(path) << PyTorchTrace(0, {PyTorchEntry(0, 1, "completed", true), open}).dump();
  auto d = ParsePyTorchDump(*tracer::ReadFile(path), path);  // written "now", 2024's entries
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->dumped_at_ns, 1724779239936775119LL + 1 + 30000LL * 1000000);
}

TEST(PyTorchImportTest, AnEntryOfAGroupMissingFromPgConfigIsLeftOutWithAWarning) {
  TempDir dir;
  nlohmann::json stray = PyTorchEntry(1, 1, "started", false);
  stray["process_group"] = {"7", "split"};
  std::ofstream(dir.path() + "/rank_0")
      << PyTorchTrace(0, {PyTorchEntry(0, 1, "completed", true), stray}).dump();
  std::ofstream(dir.path() + "/rank_1")
      << PyTorchTrace(1, {PyTorchEntry(0, 1, "completed", true)}).dump();
  auto in = LoadPyTorchDumps(dir.path());
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  EXPECT_EQ(in->ranks[0].dump.snapshot.entries.size(), 1u);
  ASSERT_EQ(in->warnings.size(), 1u);
  EXPECT_NE(in->warnings[0].find("process group (not in pg_config) '7'"), std::string::npos)
      << in->warnings[0];
}

TEST(PyTorchImportTest, AnUnknownFormatVersionIsRefusedWithTheVersion) {
  nlohmann::json j = PyTorchTrace(0, {PyTorchEntry(0, 1, "completed", true)});
  j["version"] = "3.0";
  auto d = ParsePyTorchDump(j.dump(), "rank_0.json");
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("format version 3.0 is not one this reader knows"),
            std::string::npos)
      << d.status().message();
  j["version"] = "2.11";  // a newer minor version: read
  EXPECT_TRUE(ParsePyTorchDump(j.dump(), "rank_0.json").ok());
}

// PyTorch's own matching rules (torch/distributed/flight_recorder/components/types.py Op.match),
// held to the cases of PyTorch's test_fr_analysis.py test_match_one_event and test_all_events.
PyTorchOp Event(const std::string& name, std::vector<std::vector<int64_t>> inputs,
                std::vector<std::vector<int64_t>> outputs,
                const std::string& out_dtype = "float32") {
  nlohmann::json e = {{"profiling_name", "nccl:" + name},
                      {"input_sizes", inputs},
                      {"output_sizes", outputs},
                      {"input_dtypes", "float32"},  // test_fr_analysis writes dtypes bare
                      {"output_dtypes", out_dtype},
                      {"collective_seq_id", 1},
                      {"process_group", {"0", "default_pg"}},
                      {"state", "scheduled"}};
  nlohmann::json trace = {
      {"version", "2.10"},
      {"pg_config", {{"0", {{"name", "0"}, {"desc", "d"}, {"ranks", "[0, 1]"}}}}},
      {"rank", 0},
      {"entries", {e}}};
  TempDir dir;
  std::ofstream(dir.path() + "/rank_0") << trace.dump();
  auto in = LoadPyTorch(dir.path());
  EXPECT_TRUE(in.ok()) << in.status().ToString();
  return in.ok() && !in->ranks[0].collectives.empty() ? in->ranks[0].collectives.begin()->second
                                                      : PyTorchOp{};
}

TEST(PyTorchMatchTest, FollowsPyTorchsOpMatchInItsOrder) {
  const auto e1 = Event("all_reduce", {{4, 4}}, {{4, 4}});
  EXPECT_EQ(MatchPyTorchOps(e1, e1, 2), std::nullopt);
  EXPECT_EQ(MatchPyTorchOps(e1, Event("all_gather", {{4, 4}}, {{4, 4}}), 2), MismatchKind::kType);
  // all_to_all's sizes may differ per rank (PyTorch: UNDECIDED, then totals): no mismatch here.
  EXPECT_EQ(MatchPyTorchOps(Event("all_to_all", {{4, 4}}, {{4, 4}}),
                            Event("all_to_all", {{8, 4}}, {{2, 4}}), 2),
            std::nullopt);
  EXPECT_EQ(MatchPyTorchOps(e1, Event("all_reduce", {{5, 4}}, {{4, 4}}), 2), MismatchKind::kSize);
  EXPECT_EQ(MatchPyTorchOps(e1, Event("all_reduce", {{4, 4}}, {{5, 4}}), 2), MismatchKind::kSize);
  const auto e7 = Event("all_reduce", {{4, 4}}, {{5, 4}});  // input against the other's output
  EXPECT_EQ(MatchPyTorchOps(e7, e7, 2), MismatchKind::kSize);
  EXPECT_EQ(MatchPyTorchOps(Event("all_reduce", {{4, 4}}, {{4, 4}}, "float16"),
                            Event("all_reduce", {{4, 4}}, {{4, 4}}), 2),
            MismatchKind::kDtype);
  // gather: the root's outputs against a non-root's empty ones match.
  const auto e11 = Event("gather", {{4, 4}}, {{4, 4}, {4, 4}});
  EXPECT_EQ(MatchPyTorchOps(e11, Event("gather", {{4, 4}}, {{}}, ""), 2), std::nullopt);
  EXPECT_EQ(MatchPyTorchOps(e11, Event("gather", {{4, 4}}, {{4, 4}}, ""), 2), std::nullopt);
  // Every collective against itself, with all_gather's output and reduce_scatter's input the
  // group's size times the other side (test_all_events).
  EXPECT_EQ(MatchPyTorchOps(Event("all_gather", {{4, 4}}, {{32}}),
                            Event("all_gather", {{4, 4}}, {{32}}), 2),
            std::nullopt);
  EXPECT_EQ(MatchPyTorchOps(Event("all_gather", {{4, 4}}, {{16}}),
                            Event("all_gather", {{4, 4}}, {{16}}), 2),
            MismatchKind::kSize);
  EXPECT_EQ(MatchPyTorchOps(Event("reduce_scatter", {{4, 4}}, {{8}}),
                            Event("reduce_scatter", {{4, 4}}, {{8}}), 2),
            std::nullopt);
  for (const char* name : {"broadcast", "_broadcast_oop", "reduce", "barrier", "scatter",
                           "allreduce_coalesced", "all_reduce_barrier"}) {
    const auto op = Event(name, {{4, 4}}, {{4, 4}});
    EXPECT_EQ(MatchPyTorchOps(op, op, 2), std::nullopt) << name;
  }
  // A backend's own spelling reads as PyTorch's type.
  EXPECT_EQ(Event("AllReduce", {{4, 4}}, {{4, 4}}).type, e1.type);
}

// A dump written on an NCCL error seconds after a peer exited, long before any timeout: the
// three live ranks wait 3 s in all-reduce #2; rank 1 left no dump. PyTorch dumps from every live
// rank, so the rank without one is gone -- though its peers have waited only 3 s.
TEST(PyTorchImportTest, AnErrorDumpSecondsAfterAPeerExitedNamesThePeer) {
  const int64_t now = tracer::WallNowNs();
  TempDir dir;
  for (int r : {0, 2, 3}) {
    nlohmann::json done = PyTorchEntry(0, 1, "completed", true);
    nlohmann::json open = PyTorchEntry(1, 2, "scheduled", false);
    done["time_created_ns"] = now - 4'000'000'000LL;
    open["time_created_ns"] = now - 3'000'000'000LL;
    nlohmann::json j = PyTorchTrace(r, {done, open});
    j["pg_config"]["0"]["ranks"] = "[0, 1, 2, 3]";
    std::ofstream(dir.path() + "/rank_" + std::to_string(r)) << j.dump();
  }
  auto in = LoadPyTorch(dir.path());
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  const auto v = AnalyzePyTorch(*in);
  ASSERT_EQ(v.size(), 1u) << VerdictToJson(v[0]);
  EXPECT_EQ(v[0].cause, "rank_dead");
  EXPECT_EQ(v[0].root_ranks, std::vector<int32_t>{1});
  EXPECT_EQ(v[0].waiting_ranks, (std::vector<int32_t>{0, 2, 3}));
  // Our own dumps come from an agent that writes a dead rank's dump itself: there, 3 s is work in
  // progress.
  EXPECT_EQ(Name(AnalyzeHang(in->hang).front().kind), "healthy");
}

// What a verdict shows a PyTorch user: the op's profiling name, process group and description,
// collective_seq_id, sizes and state per rank, the stack that issued it, the backend.
TEST(PyTorchImportTest, AVerdictShowsTheOpsAsPyTorchRecordedThem) {
  const std::string dir = MEGASCOPE_TEST_DATA "/pytorch/op_mismatch_one_of_eight/dumps";
  auto in = LoadPyTorch(dir);
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  const auto v = AnalyzePyTorch(*in);
  ASSERT_EQ(v.size(), 1u);
  std::string evidence;
  for (const std::string& e : v[0].evidence) evidence += e + "\n";
  for (const char* want :
       {"pytorch: rank 6: nccl:all_reduce input_sizes [[1024]] output_sizes [[1024]] Float, "
        "collective_seq_id 4 in process group 0 (default_pg), record_id 3, state scheduled",
        "pytorch: rank 0: nccl:broadcast input_sizes [[1024]]", "pytorch: backend nccl",
        "pytorch: rank 6 issued it from all_reduce at torch/distributed/distributed_c10d.py"}) {
    EXPECT_NE(evidence.find(want), std::string::npos) << want << "\nin\n" << evidence;
  }
  EXPECT_EQ(v[0].mismatch, "COLLECTIVE_TYPE_MISMATCH");
  auto cli = RunCommand(std::string(MEGASCOPE_BIN) + " analyze hang --pytorch " + dir);
  EXPECT_EQ(cli.code, 0);
  for (const char* want : {"mismatch: COLLECTIVE_TYPE_MISMATCH", "rank 6: nccl:all_reduce",
                           "process group 0 (default_pg)", "backend nccl, dump version 2.10"}) {
    EXPECT_NE(cli.out.find(want), std::string::npos) << want << "\nin\n" << cli.out;
  }
}

// A second, independent source of dumps: jobs simulated through a model of ProcessGroupNCCL and
// its recorder (tests/data/pytorch/simulate.py: dp/tp/pp layouts, coalesced blocks, pipeline
// transfers, rings that wrap, timing on and off, the CPU queueing ahead of the device), one fault
// each. What each case must be named comes from the fault the simulator injected, never from an
// analysis.
TEST(PyTorchSimulatedJobsTest, EveryInjectedFaultIsNamedAndEveryHealthyJobIsHealthy) {
  TempDir dir;
  constexpr int kJobs = 90;
  const auto gen = RunCommand("python3 " MEGASCOPE_TEST_DATA "/pytorch/simulate.py " + dir.path() +
                              " --seeds " + std::to_string(kJobs));
  ASSERT_EQ(gen.code, 0) << gen.out;
  int checked = 0;
  for (const std::string& job : Scenarios(dir.path().c_str())) {
    SCOPED_TRACE(job);
    auto in = LoadPyTorch(job + "/dumps");
    ASSERT_TRUE(in.ok()) << in.status().ToString();
    ExpectVerdicts(job, [&](const HangOptions& o) { return AnalyzePyTorch(*in, o); });
    ++checked;
  }
  EXPECT_EQ(checked, kJobs);
}

// A recorder from before is_p2p (PyTorch 2.3-2.4): a batch_isend_irecv block of two transfers,
// recorded without events, closed by "nccl:coalesced" (completed), then an all-reduce. The closing
// entry follows transfers, so it closes them: the transfers completed, the job is healthy (read
// as a collective, it left them "scheduled" forever: a stalled link).
TEST(PyTorchImportTest, ALegacyBatchOfTransfersTakesItsClosingState) {
  TempDir dir;
  for (int r : {0, 1}) {
    auto op = [&](int record, const std::string& name, const char* state, int p2p_seq) {
      nlohmann::json e = PyTorchEntry(record, 1, state, std::string(state) == "completed");
      e.erase("is_p2p");
      e["profiling_name"] = name;
      e["p2p_seq_id"] = p2p_seq;
      e["time_created_ns"] = 1724779239936775119LL - 1'000'000'000'000LL;
      return e;
    };
    const std::string me = std::to_string(r), peer = std::to_string(1 - r);
    nlohmann::json j = PyTorchTrace(
        r, {op(0, "nccl:send " + me + "->" + peer, "scheduled", 1),
            op(1, "nccl:recv " + me + "<-" + peer, "scheduled", 1),
            op(2, "nccl:coalesced", "completed", 1), PyTorchEntry(3, 1, "completed", true)});
    j["pg_config"]["0"]["ranks"] = "[0, 1]";
    std::ofstream(dir.path() + "/rank_" + me) << j.dump();
  }
  auto in = LoadPyTorch(dir.path());
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  const auto v = AnalyzePyTorch(*in);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(Name(v[0].kind), "healthy") << VerdictToJson(v[0]);
}

TEST(PyTorchImportTest, AnUnknownOpIsKeptInItsPlaceAndReportedOnce) {
  // Rank 0's second entry is an op this reader has never seen; it still takes sequence number 2,
  // so rank 1, which stopped at #1, is the one that has not joined.
  TempDir dir;
  nlohmann::json odd = PyTorchEntry(1, 2, "scheduled", false);
  odd["profiling_name"] = "nccl:all_shuffle";
  odd["time_created_ns"] = 1724779239936775119LL - 1'000'000'000'000LL;
  std::ofstream(dir.path() + "/rank_0")
      << PyTorchTrace(0, {PyTorchEntry(0, 1, "completed", true), odd}).dump();
  std::ofstream(dir.path() + "/rank_1")
      << PyTorchTrace(1, {PyTorchEntry(0, 1, "completed", true)}).dump();
  auto in = LoadPyTorch(dir.path());
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  ASSERT_EQ(in->hang.warnings.size(), 1u);
  EXPECT_NE(in->hang.warnings[0].find("unknown op 'nccl:all_shuffle'"), std::string::npos)
      << in->hang.warnings[0];
  const auto v = AnalyzePyTorch(*in);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].cause, "rank_not_joined");
  EXPECT_EQ(v[0].root_ranks, std::vector<int32_t>{1});
}

}  // namespace
}  // namespace megascope::analyzer
