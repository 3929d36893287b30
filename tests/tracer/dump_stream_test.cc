// The binary dump stream (dump.h; an agent's GET /dumps?form=binary): every dump reads back as
// the JSON form reads it, in pieces split anywhere; values this build does not know are kept as
// warnings; a stream of another version, cut short or corrupt, is refused saying where.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "megascope/tracer/dump.h"

namespace megascope::tracer {
namespace {

// Rank 5 of 12,288: small and large groups (one of runs, one of scattered ranks), collectives and
// p2p ops in every state, a dead rank's dump beside it.
std::vector<Dump> Dumps() {
  Dump d;
  d.snapshot.info = {"big", "node0", 5, 12288, 5, 3, 4242, {0, 1, 5}, -1234};
  d.dumped_at_ns = 1790000000123456789;
  d.snapshot.heartbeat = {17, Phase::kBackward, 0, 1790000000000000001};
  GroupInfo world{"world", "world", {}}, odd{"odd", "ep", {}};
  world.ranks.AppendRun(0, 12288, 1);
  for (int r = 0; r < 100; ++r) odd.ranks.push_back(r * r % 12288);
  d.snapshot.groups = {GroupInfo{"tp.0.0", "tp", {0, 1, 2, 3, 4, 5, 6, 7}}, world, odd,
                       GroupInfo{"pp.0.5", "pp", {5, 773}}};
  const OpState states[] = {OpState::kCompleted, OpState::kFailed, OpState::kStarted,
                            OpState::kEnqueued};
  for (int i = 0; i < 40; ++i) {
    FlightEntry e;
    e.id = static_cast<uint64_t>(i) + 1;
    e.group = i % 4;
    e.seq = static_cast<uint64_t>(i) / 4 + 1;
    e.op = e.group == 3 ? (i % 8 < 4 ? OpType::kSend : OpType::kRecv) : OpType::kAllreduce;
    e.peer = e.group == 3 ? 773 : -1;
    e.bytes = uint64_t{1} << (i % 30);
    e.dtype = i % 2 ? DType::kBf16 : DType::kF32;
    e.state = i < 36 ? OpState::kCompleted : states[i % 4];
    e.enqueued_at_ns = 1790000000000000000 + int64_t{i} * 1000;
    e.started_at_ns = e.state == OpState::kEnqueued ? 0 : e.enqueued_at_ns + 10;
    e.completed_at_ns = i < 37 ? e.enqueued_at_ns + 500 : 0;
    e.bytes_sent = e.group == 3 ? i * 100 : -1;
    e.bytes_received = e.group == 3 ? i * 50 : -1;
    if (e.state == OpState::kStarted || e.state == OpState::kEnqueued)  // as NCCL's proxy says
      e.waiting_on = i % 2 ? WaitSide::kGpu : WaitSide::kNetwork;
    d.snapshot.entries.push_back(e);
  }
  Dump dead = d;
  dead.alive = false;
  dead.snapshot.info.rank = 6;
  dead.snapshot.entries.resize(3);
  return {d, dead, Dump{}};  // and an empty one
}

std::string Stream(const std::vector<Dump>& dumps) {
  std::string s;
  AppendDumpStreamHeader(&s);
  for (const Dump& d : dumps) AppendDumpFrame(d, &s);
  return s;
}

// Reads `s` in pieces of `piece` bytes; the dumps, or the first error.
Result<std::vector<Dump>> Read(std::string_view s, size_t piece = 1 << 20) {
  std::vector<Dump> out;
  DumpStreamReader r("http://node0:9400/dumps");
  for (size_t at = 0; at < s.size(); at += piece) {
    RETURN_IF_ERROR(r.Feed(s.substr(at, piece), [&](Dump d) {
      out.push_back(std::move(d));
      return Status::Ok();
    }));
  }
  RETURN_IF_ERROR(r.Finish());
  return out;
}

// How the JSON form reads a dump: what the binary form must read too.
std::string AsJsonReadsIt(const Dump& d) {
  auto back = ParseDump(DumpToJson(d), "x.json");
  EXPECT_TRUE(back.ok()) << back.status().ToString();
  return back.ok() ? DumpToJson(*back) : "";
}

TEST(DumpStreamTest, EveryDumpReadsBackAsTheJsonFormReadsIt) {
  const std::vector<Dump> dumps = Dumps();
  const std::string s = Stream(dumps);
  for (size_t piece : {size_t{1} << 20, size_t{1}, size_t{7}, size_t{4096}}) {
    auto got = Read(s, piece);
    ASSERT_TRUE(got.ok()) << piece << ": " << got.status().ToString();
    ASSERT_EQ(got->size(), dumps.size());
    for (size_t i = 0; i < dumps.size(); ++i) {
      EXPECT_EQ(DumpToJson((*got)[i]), AsJsonReadsIt(dumps[i]))
          << "dump " << i << ", pieces of " << piece;
      EXPECT_TRUE((*got)[i].unknown_values.empty());
    }
  }
  auto got = Read(s);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)[0].snapshot.groups[1].ranks.runs().size(), 1u);  // the world is one run
  EXPECT_EQ((*got)[0].snapshot.info.clock_offset_ns, -1234);
  EXPECT_EQ((*got)[0].snapshot.info.local_rank, 5);
  EXPECT_FALSE((*got)[1].alive);
  int waits = 0;  // the open entries say where they wait, in both forms
  for (const FlightEntry& e : (*got)[0].snapshot.entries) waits += e.waiting_on != WaitSide::kNone;
  EXPECT_EQ(waits, 2);
  EXPECT_NE(DumpToJson(dumps[0]).find("\"waiting_on\":\"network\""), std::string::npos);
  // A fraction of the JSON: 40 entries and a 12,288-rank world in well under 4 KB.
  EXPECT_LT(s.size(), DumpToJson(dumps[0]).size() / 2);
}

// The header spells each code: a newer writer's op, state or phase reads as kUnknown with its
// name kept, and the dump is read on.
TEST(DumpStreamTest, AValueThisBuildDoesNotKnowIsKeptAndTheDumpReadOn) {
  std::vector<Dump> dumps = Dumps();
  std::string s = Stream(dumps);
  // The writer's op table starts with "allreduce": a newer writer calls that code "allreduce_v2".
  const std::string from = std::string("\x09\x00\x00\x00", 4) + "allreduce";
  const size_t at = s.find(from, kDumpStreamMagic.size());
  ASSERT_NE(at, std::string::npos);
  s.replace(at, from.size(), std::string("\x0c\x00\x00\x00", 4) + "allreduce_v2");
  auto got = Read(s, 5);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  const Dump& d = (*got)[0];
  EXPECT_EQ(d.snapshot.entries[0].op, OpType::kUnknown);
  EXPECT_EQ(d.snapshot.entries[3].op, OpType::kSend);
  ASSERT_FALSE(d.unknown_values.empty());
  EXPECT_EQ(d.unknown_values[0].where, "entries[0]");
  EXPECT_EQ(d.unknown_values[0].field, "op");
  EXPECT_EQ(d.unknown_values[0].value, "allreduce_v2");
}

TEST(DumpStreamTest, StreamsOfAnotherVersionCutShortOrCorruptAreRefusedSayingWhere) {
  const std::string s = Stream(Dumps());
  auto error = [](const std::string& bytes) {
    auto got = Read(bytes, 3);
    EXPECT_FALSE(got.ok());
    return got.ok() ? std::string() : got.status().message();
  };
  EXPECT_NE(error("{\"format\": \"megascope-flight-recorder\"}\n").find("not a megascope dump"),
            std::string::npos);
  std::string v1 = s;  // the version before waiting_on: its entries are a byte shorter
  v1[kDumpStreamMagic.size()] = 1;
  EXPECT_NE(error(v1).find("dump stream version 1 is not supported"), std::string::npos);
  std::string v3 = s;
  v3[kDumpStreamMagic.size()] = 3;
  EXPECT_NE(error(v3).find("dump stream version 3 is not supported"), std::string::npos);
  EXPECT_NE(error(s.substr(0, 10)).find("ended before its header"), std::string::npos);
  std::string cut = s.substr(0, s.size() - 30);  // inside the last dump
  EXPECT_NE(error(cut).find("ended inside dump"), std::string::npos) << error(cut);
  // The first entry of the first dump made to name group 9 of 4.
  std::string bad = s;
  Dump one = Dumps()[0];
  std::string frame;
  AppendDumpFrame(one, &frame);
  const size_t first_entry = frame.size() - size_t{40} * 68;  // 40 entries of 68 bytes
  const size_t in_stream = s.find(frame);
  ASSERT_NE(in_stream, std::string::npos);
  const int32_t nine = 9;
  std::memcpy(bad.data() + in_stream + first_entry, &nine, sizeof(nine));
  const std::string m = error(bad);
  EXPECT_NE(m.find("http://node0:9400/dumps: dump 1: entries[0] is of group 9"), std::string::npos)
      << m;
  // A frame that claims more than a dump can hold.
  std::string huge = s;
  const uint32_t claim = 0xfffffff0u;
  std::memcpy(huge.data() + in_stream, &claim, sizeof(claim));
  EXPECT_NE(error(huge).find("corrupt stream"), std::string::npos);
}

}  // namespace
}  // namespace megascope::tracer
