#include "megascope/tracer/dump.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "megascope/launch/process.h"
#include "megascope/tracer/file_util.h"
#include "megascope/tracer/tracer.h"
#include "test_util.h"

namespace megascope::tracer {
namespace {

using megascope::testing::TempDir;
using nlohmann::json;

class DumpTest : public ::testing::Test {
 protected:
  RingOptions Options() {
    RingOptions o;
    o.dir = dir_.path();
    o.job = "dumptest";
    o.node = "node1";
    o.rank = 3;
    o.world_size = 8;
    o.attempt = 2;
    o.coords = {1, 0, 1};
    o.lane_capacity = 64;
    o.flight_entries = 256;
    return o;
  }
  // Rank 3 with a finished tp all-reduce, a finished send and an all-reduce still running.
  std::unique_ptr<Tracer> MakeTracer() {
    auto t = Tracer::Create(Options(), clock_);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    Tracer& tr = **t;
    GroupId tp = *tr.RegisterGroup("tp.0.1", "tp", std::vector<int32_t>{2, 3});
    GroupId pp = *tr.RegisterGroup("pp.1.1", "pp", std::vector<int32_t>{3, 7});
    tr.SetPhase(17, Phase::kBackward);
    OpHandle a = tr.Enqueue(tp, OpType::kAllreduce, 65536, DType::kF32);
    tr.Start(a);
    tr.Complete(a);
    OpHandle s = tr.Enqueue(pp, OpType::kSend, 1024, DType::kBf16, 7);
    tr.Start(s);
    tr.Progress(s, 1024, 0);
    tr.Complete(s);
    clock_->Advance(100);
    OpHandle open = tr.Enqueue(tp, OpType::kAllreduce, 65536, DType::kF32);
    clock_->Advance(100);
    tr.Start(open);
    tr.Progress(open, 32768, 16384);
    return std::move(t).value();
  }

  TempDir dir_;
  std::shared_ptr<FakeClock> clock_ = std::make_shared<FakeClock>();
};

TEST_F(DumpTest, MatchesFormatsSection1) {
  auto t = MakeTracer();
  json j = json::parse(t->DumpJson());
  EXPECT_EQ(j["format"], "megascope-flight-recorder");
  EXPECT_EQ(j["version"], 1);
  EXPECT_EQ(j["job"], "dumptest");
  EXPECT_EQ(j["attempt"], 2);
  EXPECT_EQ(j["rank"], 3);
  EXPECT_EQ(j["world_size"], 8);
  EXPECT_EQ(j["node"], "node1");
  EXPECT_EQ(j["pid"], ::getpid());
  EXPECT_EQ(j["coords"], json({{"dp", 1}, {"pp", 0}, {"tp", 1}}));
  EXPECT_TRUE(j["dumped_at_ns"].is_number_integer());
  EXPECT_EQ(j["alive"], true);
  EXPECT_EQ(j["heartbeat"]["step"], 17);
  EXPECT_EQ(j["heartbeat"]["phase"], "backward");
  EXPECT_TRUE(j["heartbeat"]["updated_at_ns"].is_number_integer());
  ASSERT_EQ(j["groups"].size(), 2u);
  EXPECT_EQ(j["groups"][1], json({{"name", "pp.1.1"}, {"kind", "pp"}, {"ranks", {3, 7}}}));
  ASSERT_EQ(j["entries"].size(), 3u);
  const json& send = j["entries"][1];
  EXPECT_EQ(send["group"], "pp.1.1");
  EXPECT_EQ(send["op"], "send");
  EXPECT_EQ(send["peer"], 7);
  EXPECT_EQ(send["dtype"], "bf16");
  EXPECT_EQ(send["seq"], 0);
  const json& open = j["entries"][2];
  EXPECT_EQ(open["seq"], 1);
  EXPECT_TRUE(open["peer"].is_null());
  EXPECT_EQ(open["state"], "started");
  EXPECT_TRUE(open["completed_at_ns"].is_null());
  EXPECT_EQ(open["started_at_ns"].get<int64_t>() - open["enqueued_at_ns"].get<int64_t>(), 100);
  EXPECT_EQ(open["bytes_sent"], 32768);
  EXPECT_EQ(open["bytes_received"], 16384);
  EXPECT_TRUE(j["entries"][0]["bytes_sent"].is_null());  // never reported: unknown
  for (const char* key : {"group", "seq", "op", "peer", "bytes", "dtype", "state", "enqueued_at_ns",
                          "started_at_ns", "completed_at_ns", "bytes_sent", "bytes_received"}) {
    EXPECT_TRUE(open.contains(key)) << key;
  }
}

// The agent's /dumps form: the same dump on one line (NDJSON), read back to the same dump.
TEST_F(DumpTest, TheOneLineFormIsTheSameDumpOnOneLine) {
  auto t = MakeTracer();
  Dump d{t->Snapshot(), true, 1763700000000000000, {}, {}};
  d.stacks.push_back({42, "main", {"frame a", "frame \"b\"\nwith a newline"}});
  std::string line = "kept ";  // appended to what the buffer holds
  AppendDumpJson(d, &line, /*one_line=*/true);
  ASSERT_EQ(line.rfind("kept ", 0), 0u);
  line.erase(0, 5);
  EXPECT_EQ(line.find('\n'), line.size() - 1) << line;
  auto back = ParseDump(line, "line 1");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(json::parse(line), json::parse(DumpToJson(d)));
  EXPECT_EQ(back->snapshot.entries.size(), 3u);
  ASSERT_EQ(back->stacks.size(), 1u);
  EXPECT_EQ(back->stacks[0].frames, d.stacks[0].frames);
}

TEST_F(DumpTest, ParsesBackToTheSameSnapshot) {
  auto t = MakeTracer();
  RankSnapshot before = t->Snapshot();
  auto d = ParseDump(t->DumpJson(), "rank_3.json");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  const RankSnapshot& after = d->snapshot;
  EXPECT_TRUE(d->alive);
  EXPECT_EQ(after.info.rank, 3);
  EXPECT_EQ(after.info.coords.pp, 0);
  EXPECT_EQ(after.heartbeat.phase, Phase::kBackward);
  ASSERT_EQ(after.groups.size(), before.groups.size());
  EXPECT_EQ(after.groups[1].ranks, before.groups[1].ranks);
  ASSERT_EQ(after.entries.size(), before.entries.size());
  for (size_t i = 0; i < after.entries.size(); ++i) {
    const FlightEntry &a = after.entries[i], &b = before.entries[i];
    EXPECT_EQ(a.group, b.group);
    EXPECT_EQ(a.seq, b.seq);
    EXPECT_EQ(a.op, b.op);
    EXPECT_EQ(a.peer, b.peer);
    EXPECT_EQ(a.bytes, b.bytes);
    EXPECT_EQ(a.dtype, b.dtype);
    EXPECT_EQ(a.state, b.state);
    EXPECT_EQ(a.enqueued_at_ns, b.enqueued_at_ns);
    EXPECT_EQ(a.started_at_ns, b.started_at_ns);
    EXPECT_EQ(a.completed_at_ns, b.completed_at_ns);
    EXPECT_EQ(a.bytes_sent, b.bytes_sent);
    EXPECT_EQ(a.bytes_received, b.bytes_received);
  }
}

TEST_F(DumpTest, BadDumpsGetErrorsThatSayWhere) {
  auto t = MakeTracer();
  json good = json::parse(t->DumpJson());
  auto error_of = [](const std::string& text) {
    auto d = ParseDump(text, "dumps/rank_3.json");
    return d.ok() ? std::string("(parsed)") : d.status().message();
  };
  EXPECT_NE(error_of("{\"format\": ").find("dumps/rank_3.json: malformed JSON at byte"),
            std::string::npos);
  // Found by fuzz_dump: a number beyond double's range threw past the reader and aborted it.
  EXPECT_NE(error_of("{\"format\": 6e5536}").find("dumps/rank_3.json: unreadable JSON"),
            std::string::npos);
  json j = good;
  j["format"] = "pytorch";
  EXPECT_NE(error_of(j.dump()).find("format is 'pytorch'"), std::string::npos);
  j = good;
  j["version"] = 2;
  EXPECT_NE(error_of(j.dump()).find("version 2 is not supported"), std::string::npos);
  j = good;
  j["entries"][1].erase("seq");
  EXPECT_NE(error_of(j.dump()).find("entries[1]: missing field 'seq'"), std::string::npos);
  j = good;
  j["entries"][0]["group"] = "tp.9.9";
  EXPECT_NE(error_of(j.dump()).find("group 'tp.9.9' is not listed"), std::string::npos);
  j = good;
  j["entries"][0]["op"] = 7;
  EXPECT_NE(error_of(j.dump()).find("entries[0]: field 'op' should be a string"),
            std::string::npos);
  j = good;
  j["rank"] = "3";
  EXPECT_NE(error_of(j.dump()).find("field 'rank' should be an integer, not string"),
            std::string::npos);
  j = good;
  j["rank"] = 8;
  EXPECT_NE(error_of(j.dump()).find("outside world_size"), std::string::npos);
}

TEST_F(DumpTest, UnknownValuesOfKnownFieldsAreKeptAndExtraFieldsIgnored) {
  auto t = MakeTracer();
  json j = json::parse(t->DumpJson());
  ASSERT_GE(j["entries"].size(), 1u);
  j["heartbeat"]["phase"] = "warmup";
  j["entries"][0]["op"] = "allreduce_coalesced";
  j["entries"][0]["future_field"] = {1, 2};
  j["newer_top_level"] = "x";
  auto d = ParseDump(j.dump(), "rank_3.json");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->snapshot.heartbeat.phase, Phase::kUnknown);
  EXPECT_EQ(d->snapshot.entries[0].op, OpType::kUnknown);
  ASSERT_EQ(d->unknown_values.size(), 2u);
  EXPECT_EQ(d->unknown_values[0].where, "heartbeat");
  EXPECT_EQ(d->unknown_values[0].field, "phase");
  EXPECT_EQ(d->unknown_values[0].value, "warmup");
  EXPECT_EQ(d->unknown_values[1].where, "entries[0]");
  EXPECT_EQ(d->unknown_values[1].value, "allreduce_coalesced");
}

TEST_F(DumpTest, ALargeGroupIsWrittenAsRangesAndReadBackWhole) {
  Dump d;
  d.snapshot.info = {"big", "node0", 5, 12288, 5, 0, 1, {0, 0, 5}, 0};
  GroupInfo world{"world", "world", {}}, mp{"mp.0", "mp", {}}, odd{"odd", "ep", {}};
  world.ranks.AppendRun(0, 12288, 1);
  for (int p = 0; p < 16; ++p) mp.ranks.AppendRun(768 * p, 8, 1);
  for (int r = 0; r < 100; ++r) odd.ranks.push_back(r * r % 12288);  // no runs to speak of
  d.snapshot.groups = {GroupInfo{"tp.0.0", "tp", {0, 1, 2, 3, 4, 5, 6, 7}}, world, mp, odd};
  const json j = json::parse(DumpToJson(d));
  EXPECT_EQ(j["groups"][0]["ranks"], json({0, 1, 2, 3, 4, 5, 6, 7}));  // small: listed as before
  EXPECT_FALSE(j["groups"][0].contains("rank_ranges"));
  EXPECT_EQ(j["groups"][1]["rank_ranges"], json::parse("[[0, 12288, 1]]"));
  EXPECT_FALSE(j["groups"][1].contains("ranks"));
  EXPECT_EQ(j["groups"][2]["rank_ranges"].size(), 16u);
  EXPECT_EQ(j["groups"][2]["rank_ranges"][1], json({768, 776, 1}));
  EXPECT_LT(DumpToJson(d).size(), 4000u);  // the world is not listed
  auto back = ParseDump(j.dump(), "rank_5.json");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_EQ(back->snapshot.groups.size(), 4u);
  for (size_t g = 0; g < 4; ++g) {
    EXPECT_EQ(back->snapshot.groups[g].ranks.ToVector(), d.snapshot.groups[g].ranks.ToVector())
        << g;
  }
  // Python's range semantics, a descending one included (a user's script reads them with range()).
  json k = j;
  k["groups"][1]["rank_ranges"] = json::parse("[[7, -1, -2], [8, 11, 1]]");
  back = ParseDump(k.dump(), "rank_5.json");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->snapshot.groups[1].ranks.ToVector(),
            (std::vector<int32_t>{7, 5, 3, 1, 8, 9, 10}));
  for (const char* bad : {"[[0, 10, 0]]", "[[5, 5, 1]]", "[[0, 10]]", "[[-3, 2, 1]]",
                          "[[0, 99999999999999, 1]]", "[[\"0\", 4, 1]]", "{}"}) {
    k["groups"][1]["rank_ranges"] = json::parse(bad);
    auto e = ParseDump(k.dump(), "dumps/rank_5.json");
    ASSERT_FALSE(e.ok()) << bad;
    EXPECT_NE(e.status().message().find("dumps/rank_5.json: groups[1]"), std::string::npos)
        << e.status().message();
  }
  k["groups"][1].erase("rank_ranges");
  auto none = ParseDump(k.dump(), "rank_5.json");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("needs 'ranks'"), std::string::npos);
}

// ParseDump reads well-formed dumps the fast way (simdjson) and everything else the reference way;
// both must give the same dump. Every dump in the repository's data, and each spoiled.
TEST_F(DumpTest, TheFastReadingAgreesWithTheReferenceOnEveryDumpOfTheRepository) {
  auto same = [](const Dump& a, const Dump& b) {
    EXPECT_EQ(DumpToJson(a), DumpToJson(b));
    ASSERT_EQ(a.unknown_values.size(), b.unknown_values.size());
    for (size_t i = 0; i < a.unknown_values.size(); ++i) {
      EXPECT_EQ(a.unknown_values[i].where, b.unknown_values[i].where);
      EXPECT_EQ(a.unknown_values[i].value, b.unknown_values[i].value);
    }
  };
  int read_fast = 0, spoiled = 0;
  for (const auto& f :
       std::filesystem::recursive_directory_iterator(MEGASCOPE_SOURCE_DIR "/tests/data/hang")) {
    if (f.path().extension() != ".json" || f.path().parent_path().filename() != "dumps") continue;
    const std::string text = *ReadFile(f.path().string());
    auto ref = ParseDumpReference(text, f.path().string());
    ASSERT_TRUE(ref.ok()) << ref.status().ToString();
    auto fast = ParseDumpFast(text);
    ASSERT_TRUE(fast.has_value()) << f.path() << " should be read the fast way";
    same(*fast, *ref);
    if (read_fast++ % 4 != 0) continue;  // a quarter of them spoiled, to keep the test short
    // Spoiled: what the reference refuses, the fast reading leaves to it; what it reads (an
    // unknown value, an extra field), both read alike.
    json j = json::parse(text);
    for (int k = 0; k < 6; ++k) {
      json s = j;
      if (k == 0) s["entries"].push_back({{"group", "nowhere"}});
      if (k == 1) s["heartbeat"]["phase"] = "warmup";
      if (k == 2) s["groups"][0]["ranks"] = json::array({0, 1.5});
      if (k == 3) s["rank"] = s["world_size"];
      if (k == 4) s["future"] = {{"x", 1}};
      if (k == 5 && !s["entries"].empty()) s["entries"][0]["bytes"] = "many";
      const std::string t = s.dump();
      auto r = ParseDumpReference(t, "x.json");
      auto q = ParseDumpFast(t);
      if (!r.ok()) {
        EXPECT_FALSE(q.has_value()) << f.path() << " spoiled " << k;
      } else {
        ASSERT_TRUE(q.has_value()) << f.path() << " spoiled " << k;
        same(*q, *r);
      }
      ++spoiled;
    }
  }
  EXPECT_GT(read_fast, 40);
  EXPECT_GT(spoiled, 40 * 6);
}

TEST_F(DumpTest, ReaderDumpsARankWhoseProcessIsGone) {
  auto rank = megascope::launch::Process::Fork([&] {
    auto t = MakeTracer();
    ::_exit(0);  // dies with an all-reduce in flight
    return 0;
  });
  ASSERT_TRUE(rank.ok());
  ASSERT_TRUE((*rank)->Wait().success());
  auto r = RingReader::Attach(dir_.path() + "/" + RingFileName("dumptest", 2, 3),
                              RingReader::Mode::kSnapshotOnly);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE((*r)->WriterAlive());
  Dump d{(*r)->Snapshot(), (*r)->WriterAlive(), WallNowNs(), {}, {}};
  std::string path = dir_.path() + "/dumps/attempt_2/rank_3.json";
  ASSERT_TRUE(WriteFileAtomic(path, DumpToJson(d)).ok());
  auto back = ReadDumpFile(path);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_FALSE(back->alive);
  EXPECT_EQ(back->snapshot.info.pid, (*rank)->pid());
  ASSERT_EQ(back->snapshot.entries.size(), 3u);
  EXPECT_EQ(back->snapshot.entries.back().state, OpState::kStarted);
}

TEST_F(DumpTest, Sigusr1RunsTheDumpOnItsOwnThread) {
  auto t = MakeTracer();
  std::mutex mu;
  std::condition_variable cv;
  int dumps = 0;
  std::thread::id dump_thread;
  const std::string path = dir_.path() + "/rank_3.json";
  auto dumper = SignalDumper::Start([&] {
    ASSERT_TRUE(t->WriteDump(path).ok());
    std::lock_guard<std::mutex> lock(mu);
    ++dumps;
    dump_thread = std::this_thread::get_id();
    cv.notify_all();
  });
  ASSERT_TRUE(dumper.ok()) << dumper.status().ToString();
  EXPECT_FALSE(SignalDumper::Start([] {}).ok());  // one per process
  ASSERT_EQ(::raise(SIGUSR1), 0);
  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return dumps == 1; }));
  EXPECT_NE(dump_thread, std::this_thread::get_id());
  auto d = ReadDumpFile(path);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->snapshot.entries.size(), 3u);
}

TEST_F(DumpTest, WriteFileAtomicReportsUnwritablePlaces) {
  Status st = WriteFileAtomic("/proc/megascope/dump.json", "{}");
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("/proc/megascope"), std::string::npos);
  auto missing = ReadDumpFile(dir_.path() + "/nope.json");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace megascope::tracer
