// Hang root cause: data-driven scenarios (tests/data/hang/<name>/dumps + expected.json, made by
// tests/data/hang/generate.py) and bad input. Live runs are in hang_live_test.cc (label e2e).
#include "megascope/analyzer/hang.h"

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

using Outcome =
    std::set<std::tuple<std::string, std::string, std::vector<int32_t>>>;  // kind, cause, roots

class HangScenario : public ::testing::TestWithParam<std::string> {};

// The verdicts `analyze` gives against <dir>/expected.json: the same set of (kind, cause, root
// ranks); where a case says, who waits and what mismatched.
void ExpectVerdicts(const std::string& dir,
                    const std::function<std::vector<Verdict>(const HangOptions&)>& analyze) {
  std::ifstream f(dir + "/expected.json");
  auto expected = nlohmann::json::parse(f);
  Outcome want, got;
  for (const auto& v : expected["verdicts"]) {
    want.insert({v.value("kind", "hang"), v["cause"].is_null() ? "" : v["cause"].get<std::string>(),
                 v["root_ranks"].get<std::vector<int32_t>>()});
  }
  HangOptions options;  // a case recorded from a job with short thresholds says its own
  options.min_wait_s = expected.value("min_wait_s", options.min_wait_s);
  const auto verdicts = analyze(options);
  std::string text;
  for (const Verdict& v : verdicts) {
    got.insert({std::string(Name(v.kind)), v.cause, v.root_ranks});
    for (const auto& e : expected["verdicts"]) {  // who waits, where a case says
      if (e.contains("waiting_ranks") &&
          e["root_ranks"].get<std::vector<int32_t>>() == v.root_ranks) {
        EXPECT_EQ(v.waiting_ranks, e["waiting_ranks"].get<std::vector<int32_t>>());
      }
      if (e.contains("mismatch") && e["root_ranks"].get<std::vector<int32_t>>() == v.root_ranks &&
          e.value("cause", "") == v.cause) {
        EXPECT_EQ(v.mismatch, e["mismatch"].get<std::string>()) << VerdictToJson(v);
      }
    }
    text += VerdictToJson(v) + "\n";
    auto j = nlohmann::json::parse(VerdictToJson(v));  // the docs/formats.md section 2 shape
    for (const char* key : {"format", "version", "kind", "cause", "root_ranks", "root_nodes",
                            "group", "seq", "op", "waiting_ranks", "detected_at_ns", "onset_at_ns",
                            "confidence", "explanation", "evidence"}) {
      EXPECT_TRUE(j.contains(key)) << key;
    }
    EXPECT_EQ(VerdictToJsonValue(v), j) << "the value a document embeds is the line's";
    EXPECT_EQ(v.root_ranks.size(), v.root_nodes.size());
    if (v.kind == VerdictKind::kHang) {
      EXPECT_FALSE(v.explanation.empty());
    }
  }
  EXPECT_EQ(got, want) << text;
}

void ExpectVerdicts(const std::string& dir, const HangInput& in) {
  ExpectVerdicts(dir, [&](const HangOptions& o) { return AnalyzeHang(in, o); });
}

TEST_P(HangScenario, NamesTheRootAndNoOneElse) {
  const std::string dir = GetParam();
  auto in = LoadDumpDirectory(dir + "/dumps");
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  ExpectVerdicts(dir, *in);
}

// The live input keeps each rank's index and drops its entries: the analysis reads nothing else.
void DropEntries(HangInput* in) {
  for (RankView& v : in->ranks) v.dump.snapshot.entries = {};
}

TEST_P(HangScenario, TheIndexAloneGivesTheSameVerdicts) {
  const std::string dir = GetParam();
  auto in = LoadDumpDirectory(dir + "/dumps");
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  DropEntries(&*in);
  ExpectVerdicts(dir, *in);
}

// A root many ranks wait on shows four of them and counts the rest (seven wait on rank 3 here).
TEST(HangExplanationTest, TheWaitersPastTheFirstFourAreCounted) {
  auto in = LoadDumpDirectory(MEGASCOPE_TEST_DATA "/hang/dead_missing_dump_8x1x1/dumps");
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  const auto verdicts = AnalyzeHang(*in);
  ASSERT_EQ(verdicts.size(), 1u);
  EXPECT_EQ(verdicts[0].waiting_ranks.size(), 7u);
  EXPECT_NE(verdicts[0].explanation.find("waits in allreduce #2 in dp.0.0 for"), std::string::npos);
  EXPECT_NE(verdicts[0].explanation.find("; and 3 more."), std::string::npos)
      << verdicts[0].explanation;
}

std::vector<std::string> Scenarios(const char* root = MEGASCOPE_TEST_DATA "/hang") {
  std::vector<std::string> dirs;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    if (fs::exists(e.path() / "expected.json")) dirs.push_back(e.path().string());
  }
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

INSTANTIATE_TEST_SUITE_P(Data, HangScenario, ::testing::ValuesIn(Scenarios()),
                         [](const auto& info) { return fs::path(info.param).filename().string(); });

TEST(HangScenarioCount, AtLeastFifteenCoveringEveryCause) {
  std::set<std::string> causes;
  for (const auto& d : Scenarios()) {
    std::ifstream f(d + "/expected.json");
    const auto expected = nlohmann::json::parse(f);
    for (const auto& v : expected["verdicts"]) {
      causes.insert(v["cause"].is_null() ? "healthy" : v["cause"].get<std::string>());
    }
  }
  EXPECT_GE(Scenarios().size(), 15u);
  for (const char* c :
       {"rank_dead", "rank_not_joined", "op_mismatch", "link_stall", "order_mismatch", "healthy"}) {
    EXPECT_TRUE(causes.count(c)) << c;
  }
}

// A bad dump (cut short, here at a fifth of rank 2's) is named and skipped: the others are
// analysed and still name the root; only a directory with no readable dump is an error.
TEST(HangLoadTest, ATruncatedDumpIsSkippedWithAWarningAndTheRootIsStillNamed) {
  TempDir dir;
  fs::copy(MEGASCOPE_TEST_DATA "/hang/cascade_from_stage0_2x2x2/dumps", dir.path(),
           fs::copy_options::recursive);
  const std::string bad = dir.path() + "/rank_2.json";
  const std::string text = tracer::ReadFile(bad).value();
  std::ofstream(bad, std::ios::trunc) << text.substr(0, text.size() / 5);
  auto in = LoadDumpDirectory(dir.path());
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  ASSERT_FALSE(in->warnings.empty());
  EXPECT_NE(in->warnings[0].find(bad), std::string::npos) << in->warnings[0];
  EXPECT_NE(in->warnings[0].find("skipped"), std::string::npos) << in->warnings[0];
  EXPECT_FALSE(in->ranks.at(2).present);
  const std::vector<Verdict> v = AnalyzeHang(*in, HangOptions{});
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].cause, "rank_not_joined");
  EXPECT_EQ(v[0].root_ranks, std::vector<int32_t>{0});

  for (const auto& e : fs::directory_iterator(dir.path()))
    std::ofstream(e.path(), std::ios::trunc) << "{";
  auto none = LoadDumpDirectory(dir.path());
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("no dump of " + dir.path() + " could be read"),
            std::string::npos)
      << none.status().message();
}

// What an incident writes beside its dumps: read back as the thresholds it decided with, never
// read as a dump; a newer version is refused with the file named.
TEST(IncidentThresholdsTest, RoundTripAndNotADump) {
  TempDir dir;
  fs::copy(MEGASCOPE_TEST_DATA "/hang/not_joined_2x2x2/dumps", dir.path(),
           fs::copy_options::recursive);
  auto none = ReadIncidentThresholds(dir.path());
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_FALSE(none->has_value());
  HangOptions o;
  o.min_wait_s = 1.5;
  o.stale_heartbeat_s = 7;
  ASSERT_TRUE(WriteIncidentThresholds(dir.path(), "hang", "no step for 3 s", 0, o).ok());
  auto read = ReadIncidentThresholds(dir.path());
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  ASSERT_TRUE(read->has_value());
  EXPECT_EQ((*read)->options.min_wait_s, 1.5);
  EXPECT_EQ((*read)->options.stale_heartbeat_s, 7);
  EXPECT_EQ((*read)->trigger, "hang");
  EXPECT_TRUE(LoadDumpDirectory(dir.path()).ok());  // incident.json is not taken for a dump
  std::ofstream(dir.path() + "/" + kIncidentFile)
      << R"({"format": "megascope-incident", "version": 2})";
  auto newer = ReadIncidentThresholds(dir.path());
  ASSERT_FALSE(newer.ok());
  EXPECT_NE(newer.status().message().find("version 2 is not one this build knows"),
            std::string::npos)
      << newer.status().message();
}

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

class HangBadInput : public ::testing::Test {
 protected:
  void Copy(const std::string& scenario) {
    fs::copy(MEGASCOPE_TEST_DATA "/hang/" + scenario + "/dumps", dir_.path(),
             fs::copy_options::recursive);
  }
  std::string Error() {
    auto in = LoadDumpDirectory(dir_.path());
    return in.ok() ? "(loaded)" : in.status().message();
  }
  TempDir dir_;
};

TEST_F(HangBadInput, MalformedJsonIsSkippedWithTheFileNamed) {
  Copy("not_joined_2x2x2");
  std::ofstream(dir_.path() + "/rank_3.json") << "{\"format\": \"megascope-flight-recorder\", ";
  auto in = LoadDumpDirectory(dir_.path());
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  ASSERT_FALSE(in->warnings.empty());
  EXPECT_NE(in->warnings[0].find("rank_3.json: malformed JSON"), std::string::npos)
      << in->warnings[0];
}

TEST_F(HangBadInput, WrongFormatOrVersionNamesTheFile) {
  Copy("not_joined_2x2x2");
  std::ifstream in(dir_.path() + "/rank_2.json");
  auto j = nlohmann::json::parse(in);
  j["version"] = 7;
  std::ofstream(dir_.path() + "/rank_2.json") << j.dump();
  EXPECT_NE(Error().find("rank_2.json: dump version 7 is not supported"), std::string::npos)
      << Error();
  j["version"] = 1;
  j["format"] = "pytorch-flight-recorder";
  std::ofstream(dir_.path() + "/rank_2.json") << j.dump();
  EXPECT_NE(Error().find("rank_2.json: format is 'pytorch-flight-recorder'"), std::string::npos)
      << Error();
}

TEST_F(HangBadInput, UnknownValuesAreWarnedOnceAndTheAnalysisGoesOn) {
  // A newer writer: heartbeat phases, an op, a state and a dtype this build does not know, and
  // fields it has never heard of. The root (rank 5, never joined) is still named.
  Copy("not_joined_2x2x2");
  for (int r : {0, 1, 2}) {
    const std::string path = dir_.path() + "/rank_" + std::to_string(r) + ".json";
    std::ifstream in(path);
    auto j = nlohmann::json::parse(in);
    j["heartbeat"]["phase"] = "warmup";
    j["heartbeat"]["microstep"] = 3;
    j["compression"] = {{"kind", "zstd"}};
    if (r == 1) {
      j["entries"][0]["dtype"] = "fp8_e4m3";
      j["entries"][0]["state"] = "scheduled";
      j["entries"][0]["stream"] = 7;
    }
    std::ofstream(path) << j.dump();
  }
  auto in = LoadDumpDirectory(dir_.path());
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  ASSERT_EQ(in->warnings.size(), 3u);
  EXPECT_NE(in->warnings[0].find("unknown dtype 'fp8_e4m3' in 1 dump"), std::string::npos)
      << in->warnings[0];
  EXPECT_NE(in->warnings[1].find("unknown phase 'warmup' in 3 dumps"), std::string::npos)
      << in->warnings[1];
  EXPECT_NE(in->warnings[1].find("rank_0.json: heartbeat"), std::string::npos) << in->warnings[1];
  EXPECT_NE(in->warnings[2].find("unknown state 'scheduled' in 1 dump"), std::string::npos)
      << in->warnings[2];
  EXPECT_EQ(in->ranks[0].dump.snapshot.heartbeat.phase, tracer::Phase::kUnknown);
  const auto verdicts = AnalyzeHang(*in, {});
  ASSERT_FALSE(verdicts.empty());
  EXPECT_EQ(verdicts[0].cause, "rank_not_joined");
  EXPECT_EQ(verdicts[0].root_ranks, std::vector<int>{5});
  auto cli = RunCommand(std::string(MEGASCOPE_BIN) + " analyze hang " + dir_.path());
  EXPECT_EQ(cli.code, 0) << cli.out;
  EXPECT_NE(cli.out.find("warning: unknown phase 'warmup' in 3 dumps"), std::string::npos)
      << cli.out;
}

TEST_F(HangBadInput, GroupsWhoseMembershipDisagreeNameBothFiles) {
  Copy("not_joined_2x2x2");
  std::ifstream in(dir_.path() + "/rank_1.json");
  auto j = nlohmann::json::parse(in);
  j["groups"][0]["ranks"] = {0, 1, 7};
  std::ofstream(dir_.path() + "/rank_1.json") << j.dump();
  const std::string e = Error();
  EXPECT_NE(e.find("group 'tp.0.0' has different members in"), std::string::npos) << e;
  EXPECT_NE(e.find("rank_1.json"), std::string::npos) << e;
}

TEST_F(HangBadInput, EmptyOrMissingDirectories) {
  EXPECT_NE(Error().find("no flight-recorder dumps"), std::string::npos) << Error();
  auto missing = LoadDumpDirectory(dir_.path() + "/nope");
  EXPECT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("is not a directory"), std::string::npos);
  auto cli = RunCommand(std::string(MEGASCOPE_BIN) + " analyze hang " + dir_.path());
  EXPECT_EQ(cli.code, 1);
  EXPECT_NE(cli.out.find("no flight-recorder dumps"), std::string::npos);
}

// The per-rank index keys a collective by (group, seq) whatever order the recorder kept: a copy of
// a seq recorded twice reads as its newest, and a group's seqs out of order are still found with
// the one before each. Rank 1 recorded an all-reduce as a#2 (an older copy), then a#1, then an
// all-gather as a#2: its newest a#2 departs from its own a#1, so it is the rank named.
TEST(HangIndexTest, TheNewestCopyOfACollectiveCountsWhateverOrderItWasRecordedIn) {
  const int64_t t0 = 1'763'700'000'000'000'000;
  auto dump = [&](int rank) {
    tracer::Dump d;
    d.snapshot.info = {
        "index", "node" + std::to_string(rank), rank, 2, rank, 0, 100 + rank, {0, 0, rank}, 0};
    d.snapshot.groups = {{"b", "dp", {0, 1}}, {"a", "tp", {0, 1}}};
    d.snapshot.heartbeat = {3, tracer::Phase::kBackward, 0, t0 + 29'000'000'000};
    d.dumped_at_ns = t0 + 30'000'000'000;
    return d;
  };
  auto entry = [&](int32_t group, uint64_t seq, tracer::OpType op, bool open) {
    tracer::FlightEntry e;
    e.group = group;
    e.seq = seq;
    e.op = op;
    e.bytes = 64;
    e.state = open ? tracer::OpState::kStarted : tracer::OpState::kCompleted;
    e.enqueued_at_ns = e.started_at_ns = t0 + static_cast<int64_t>(seq) * 1'000'000'000;
    e.completed_at_ns = open ? 0 : e.started_at_ns + 1'000'000;
    return e;
  };
  using tracer::OpType;
  tracer::Dump r0 = dump(0), r1 = dump(1);
  r0.snapshot.entries = {
      entry(0, 0, OpType::kAllreduce, false), entry(1, 0, OpType::kAllreduce, false),
      entry(0, 1, OpType::kAllreduce, false), entry(1, 1, OpType::kAllreduce, false),
      entry(1, 2, OpType::kAllreduce, true)};
  r1.snapshot.entries = {
      entry(1, 0, OpType::kAllreduce, false), entry(0, 0, OpType::kAllreduce, false),
      entry(1, 2, OpType::kAllreduce, false), entry(1, 1, OpType::kAllreduce, false),
      entry(0, 1, OpType::kAllreduce, false), entry(1, 2, OpType::kAllgather, true)};
  for (tracer::Dump* d : {&r0, &r1}) {
    for (size_t i = 0; i < d->snapshot.entries.size(); ++i) d->snapshot.entries[i].id = i + 1;
  }
  auto in = MakeHangInput({{"rank_0.json", r0}, {"rank_1.json", r1}});
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  const auto verdicts = AnalyzeHang(*in);
  ASSERT_EQ(verdicts.size(), 1u) << FormatHangReport(verdicts);
  EXPECT_EQ(verdicts[0].cause, "op_mismatch") << FormatHangReport(verdicts);
  EXPECT_EQ(verdicts[0].root_ranks, std::vector<int32_t>{1}) << FormatHangReport(verdicts);
  EXPECT_EQ(verdicts[0].group, "a");
  EXPECT_EQ(verdicts[0].seq, 2);
}

tracer::RankList FirstRanks(int n) {
  tracer::RankList l;
  l.AppendRun(0, static_cast<uint32_t>(n), 1);
  return l;
}

// Views of one job added from many threads in any order make one input: each rank in its place,
// of two dumps of a rank the newer, of two as new the first by source.
TEST(HangInputBuilderTest, ViewsFromManyThreadsInAnyOrderMakeOneInput) {
  constexpr int kWorld = 64;
  auto view = [](int rank, int64_t dumped_at, const std::string& source) {
    RankView v;
    v.source = source;
    v.dump.snapshot.info.rank = rank;
    v.dump.snapshot.info.world_size = kWorld;
    v.dump.snapshot.groups = {{"world", "world", FirstRanks(kWorld)}};
    v.dump.dumped_at_ns = dumped_at;
    tracer::FlightEntry e;
    e.seq = static_cast<uint64_t>(dumped_at);
    v.dump.snapshot.entries = {e};
    v.ops = IndexOps(v.dump);
    return v;
  };
  std::vector<RankView> views;
  for (int r = 0; r < kWorld; ++r) {
    views.push_back(view(r, 10, "b" + std::to_string(r)));
    views.push_back(view(r, 10, "a" + std::to_string(r)));  // as new: "a" first by source
    if (r % 2 == 0) views.push_back(view(r, 20, "c" + std::to_string(r)));  // newer
  }
  for (uint32_t seed : {1u, 2u, 3u}) {
    std::vector<RankView> order = views;
    std::shuffle(order.begin(), order.end(), std::mt19937(seed));
    HangInputBuilder builder;
    std::vector<std::thread> threads;
    threads.reserve(4);
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        for (size_t i = t; i < order.size(); i += 4) ASSERT_TRUE(builder.Add(order[i]).ok());
      });
    }
    for (auto& t : threads) t.join();
    auto in = std::move(builder).Finish();
    ASSERT_TRUE(in.ok()) << in.status().ToString();
    ASSERT_EQ(in->ranks.size(), static_cast<size_t>(kWorld));
    for (int r = 0; r < kWorld; ++r) {
      const RankView& v = in->ranks[r];
      ASSERT_TRUE(v.present);
      EXPECT_EQ(v.source, (r % 2 == 0 ? "c" : "a") + std::to_string(r)) << "seed " << seed;
      EXPECT_EQ(v.ops.colls.at(0).seq, r % 2 == 0 ? 20 : 10);
    }
  }
  HangInputBuilder builder;
  ASSERT_TRUE(builder.Add(view(0, 10, "first")).ok());
  RankView other = view(1, 10, "other");
  other.dump.snapshot.info.world_size = kWorld * 2;
  const Status s = builder.Add(std::move(other));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("other: world_size 128 disagrees with 64"), std::string::npos)
      << s.ToString();
  EXPECT_EQ(HangInputBuilder().Finish().status().code(), StatusCode::kInvalidArgument);
}

// An index built in an arena is the one built on the heap, its arrays in that arena.
TEST(HangIndexTest, AnIndexInAnArenaIsTheSameAsOnTheHeap) {
  tracer::Dump d;
  d.snapshot.info.world_size = 4;
  d.snapshot.groups = {{"tp", "tp", FirstRanks(2)}, {"pp", "pp", FirstRanks(4)}};
  for (int i = 0; i < 300; ++i) {
    tracer::FlightEntry e;
    e.group = i % 3 == 0 ? 1 : 0;
    e.op = i % 3 == 0 ? (i % 2 ? tracer::OpType::kSend : tracer::OpType::kRecv)
                      : tracer::OpType::kAllreduce;
    e.peer = i % 3 == 0 ? 2 : -1;
    e.seq = static_cast<uint64_t>(i);
    e.bytes = 1000 + i;
    e.bytes_sent = i % 5 == 0 ? -1 : (i % 5 == 1 ? 7 : static_cast<int64_t>(e.bytes));
    e.state = i == 299 ? tracer::OpState::kStarted : tracer::OpState::kCompleted;
    d.snapshot.entries.push_back(e);
  }
  const auto arena = std::make_shared<tracer::Arena>();
  const RankOps heap = IndexOps(d), in_arena = IndexOps(d, arena);
  EXPECT_EQ(in_arena.colls.get_allocator().arena(), arena);
  EXPECT_EQ(in_arena.history.get_allocator().arena(), arena);
  EXPECT_EQ(in_arena.sends.get_allocator().arena(), arena);
  EXPECT_EQ(heap.colls.get_allocator().arena(), nullptr);
  ASSERT_EQ(heap.colls.size(), 200u);
  ASSERT_EQ(in_arena.colls.size(), heap.colls.size());
  for (size_t i = 0; i < heap.colls.size(); ++i) {
    EXPECT_EQ(in_arena.colls[i].seq, heap.colls[i].seq);
    EXPECT_EQ(in_arena.BytesSent(in_arena.colls[i]), heap.BytesSent(heap.colls[i]));
    // What the entry said, whichever way it was stored.
    const tracer::FlightEntry& e = d.snapshot.entries[heap.colls[i].seq];
    EXPECT_EQ(heap.BytesSent(heap.colls[i]), e.bytes_sent);
    EXPECT_EQ(heap.colls[i].bytes, e.bytes);
  }
  EXPECT_EQ(std::vector<int32_t>(in_arena.history.begin(), in_arena.history.end()),
            std::vector<int32_t>(heap.history.begin(), heap.history.end()));
  EXPECT_EQ(in_arena.sends.size(), 50u);
  EXPECT_EQ(in_arena.recvs.size(), 50u);
  ASSERT_TRUE(in_arena.blocking.has_value());
  EXPECT_EQ(in_arena.blocking->seq, 299u);
  EXPECT_TRUE(in_arena.in_op);
  EXPECT_GE(arena->bytes_allocated(), 200 * sizeof(RankOps::Collective));
}

}  // namespace
}  // namespace megascope::analyzer
