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

#include "hang_cases.h"
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

class HangScenario : public ::testing::TestWithParam<std::string> {};

TEST_P(HangScenario, NamesTheRootAndNoOneElse) {
  const std::string dir = GetParam();
  auto in = LoadDumpDirectory(dir + "/dumps");
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  ExpectVerdicts(dir, *in);
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
