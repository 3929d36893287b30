#include "megascope/tracer/tracer.h"

#include <gtest/gtest.h>

#include <thread>

#include "megascope/tracer/span_timer.h"
#include "test_util.h"

namespace megascope::tracer {
namespace {

using megascope::testing::TempDir;

class TracerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RingOptions o;
    o.dir = dir_.path();
    o.job = "tracertest";
    o.rank = 0;
    o.world_size = 4;
    o.lane_capacity = 4096;
    o.flight_entries = 256;
    auto t = Tracer::Create(o, clock_);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    tracer_ = std::move(t).value();
  }
  GroupId Group(const std::string& name, std::vector<int32_t> ranks,
                const std::string& kind = "tp") {
    auto g = tracer_->RegisterGroup(name, kind, ranks);
    EXPECT_TRUE(g.ok()) << g.status().ToString();
    return *g;
  }
  const FlightEntry& Entry(const RankSnapshot& s, OpHandle h) {
    for (const FlightEntry& e : s.entries) {
      if (e.id == h) return e;
    }
    ADD_FAILURE() << "no entry " << h;
    return s.entries.front();
  }

  TempDir dir_;
  std::shared_ptr<FakeClock> clock_ = std::make_shared<FakeClock>(1'000'000);
  std::unique_ptr<Tracer> tracer_;
};

TEST_F(TracerTest, CollectiveSeqCountsPerGroup) {
  GroupId a = Group("tp.0.0", {0, 1}), b = Group("dp.0.0", {0, 2}, "dp");
  std::vector<OpHandle> ha, hb;
  for (int i = 0; i < 3; ++i) {
    ha.push_back(tracer_->Enqueue(a, OpType::kAllreduce, 64, DType::kF32));
    if (i < 2) hb.push_back(tracer_->Enqueue(b, OpType::kAllgather, 32, DType::kBf16));
  }
  RankSnapshot s = tracer_->Snapshot();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(Entry(s, ha[i]).seq, static_cast<uint64_t>(i));
  for (int i = 0; i < 2; ++i) EXPECT_EQ(Entry(s, hb[i]).seq, static_cast<uint64_t>(i));
  EXPECT_EQ(Entry(s, ha[0]).peer, -1);
  EXPECT_EQ(s.groups[a].name, "tp.0.0");
  EXPECT_EQ(s.groups[b].ranks.ToVector(), (std::vector<int32_t>{0, 2}));
}

TEST_F(TracerTest, P2PSeqCountsPerPeerAndDirection) {
  GroupId pp = Group("pp.0.0", {0, 1, 2}, "pp");
  OpHandle s0 = tracer_->Enqueue(pp, OpType::kSend, 8, DType::kF32, 1);
  OpHandle s1 = tracer_->Enqueue(pp, OpType::kSend, 8, DType::kF32, 1);
  OpHandle r0 = tracer_->Enqueue(pp, OpType::kRecv, 8, DType::kF32, 1);
  OpHandle t0 = tracer_->Enqueue(pp, OpType::kSend, 8, DType::kF32, 2);
  OpHandle r1 = tracer_->Enqueue(pp, OpType::kRecv, 8, DType::kF32, 1);
  OpHandle c0 = tracer_->Enqueue(pp, OpType::kBarrier, 0, DType::kU8);
  RankSnapshot s = tracer_->Snapshot();
  EXPECT_EQ(Entry(s, s0).seq, 0u);
  EXPECT_EQ(Entry(s, s1).seq, 1u);
  EXPECT_EQ(Entry(s, r0).seq, 0u);
  EXPECT_EQ(Entry(s, r1).seq, 1u);
  EXPECT_EQ(Entry(s, t0).seq, 0u);
  EXPECT_EQ(Entry(s, t0).peer, 2);
  EXPECT_EQ(Entry(s, c0).seq, 0u);  // p2p ops do not advance the collective count
}

TEST_F(TracerTest, TheGroupsOfAHundredThousandRanksFitTheRingAsRuns) {
  // Rank 0 of dp=625 tp=8 pp=20: its world, its data-parallel group (strided by tp), its
  // model-parallel group (one run a stage) and its pipeline group. Listed rank by rank they would
  // be 100,000 + 625 + 160 + 20 members, past the ring's room; as runs they are 23.
  const int dp = 625, tp = 8, pp = 20, world = dp * tp * pp;
  RankList all, data, model, pipe;
  all.AppendRun(0, world, 1);
  data.AppendRun(0, dp, tp);
  for (int p = 0; p < pp; ++p) model.AppendRun(p * tp * dp, tp, 1);
  for (int p = 0; p < pp; ++p) pipe.push_back(p * tp * dp);
  std::vector<GroupId> ids;
  for (auto [name, kind, ranks] : {std::tuple{"world", "world", &all},
                                   {"dp.0.0", "dp", &data},
                                   {"mp.0", "mp", &model},
                                   {"pp.0.0", "pp", &pipe}}) {
    auto g = tracer_->RegisterGroup(name, kind, *ranks);
    ASSERT_TRUE(g.ok()) << name << ": " << g.status().ToString();
    ids.push_back(*g);
  }
  EXPECT_EQ(*tracer_->RegisterGroup("world", "world", all), ids[0]);  // the same group again
  RankList other = all;
  other.push_back(world);
  EXPECT_FALSE(tracer_->RegisterGroup("world", "world", other).ok());
  // Point-to-point along the pipeline and across the world: per-peer numbers, found by runs.
  const OpHandle to_last = tracer_->Enqueue(ids[0], OpType::kSend, 8, DType::kF32, world - 1);
  const OpHandle again = tracer_->Enqueue(ids[0], OpType::kSend, 8, DType::kF32, world - 1);
  const OpHandle from = tracer_->Enqueue(ids[3], OpType::kRecv, 8, DType::kF32, 19 * tp * dp);
  EXPECT_EQ(tracer_->Enqueue(ids[3], OpType::kRecv, 8, DType::kF32, 1), 0u);  // not a member

  RankSnapshot s = tracer_->Snapshot();
  ASSERT_EQ(s.groups.size(), 4u);
  EXPECT_EQ(s.groups[0].ranks, all);
  EXPECT_EQ(s.groups[0].ranks.size(), 100'000u);
  EXPECT_EQ(s.groups[1].ranks, data);
  EXPECT_EQ(s.groups[1].ranks[624], 624 * tp);
  EXPECT_EQ(s.groups[2].ranks, model);
  EXPECT_EQ(s.groups[3].ranks, pipe);
  EXPECT_EQ(Entry(s, to_last).seq, 0u);
  EXPECT_EQ(Entry(s, again).seq, 1u);
  EXPECT_EQ(Entry(s, from).peer, 19 * tp * dp);
}

TEST_F(TracerTest, UnknownGroupOrPeerGivesNoHandle) {
  GroupId g = Group("pp.0.0", {0, 1}, "pp");
  EXPECT_EQ(tracer_->Enqueue(g + 1, OpType::kAllreduce, 8, DType::kF32), 0u);
  EXPECT_EQ(tracer_->Enqueue(g, OpType::kSend, 8, DType::kF32, 3), 0u);
  tracer_->Start(0);  // harmless
  tracer_->Complete(0);
  EXPECT_TRUE(tracer_->Snapshot().entries.empty());
}

TEST_F(TracerTest, StateTransitionsCarryTimesAndProgress) {
  GroupId g = Group("tp.0.0", {0, 1});
  auto reader = RingReader::Attach(tracer_->ring().path(), RingReader::Mode::kConsume);
  ASSERT_TRUE(reader.ok());
  clock_->Set(1000);
  OpHandle h = tracer_->Enqueue(g, OpType::kAllreduce, 4096, DType::kF32);
  EXPECT_EQ(Entry(tracer_->Snapshot(), h).state, OpState::kEnqueued);
  EXPECT_EQ(Entry(tracer_->Snapshot(), h).bytes_sent, -1);
  clock_->Set(2000);
  tracer_->Start(h);
  tracer_->Progress(h, 2048, 1024);
  RankSnapshot mid = tracer_->Snapshot();
  EXPECT_EQ(Entry(mid, h).state, OpState::kStarted);
  EXPECT_EQ(Entry(mid, h).started_at_ns, 2000);
  EXPECT_EQ(Entry(mid, h).completed_at_ns, 0);
  EXPECT_EQ(Entry(mid, h).bytes_sent, 2048);
  EXPECT_EQ(mid.heartbeat.op_entry_id, h);
  clock_->Set(3000);
  tracer_->Complete(h);
  OpHandle f = tracer_->Enqueue(g, OpType::kBroadcast, 16, DType::kI64);
  tracer_->Start(f);
  tracer_->Fail(f);
  RankSnapshot end = tracer_->Snapshot();
  EXPECT_EQ(Entry(end, h).state, OpState::kCompleted);
  EXPECT_EQ(Entry(end, h).enqueued_at_ns, 1000);
  EXPECT_EQ(Entry(end, h).completed_at_ns, 3000);
  EXPECT_EQ(Entry(end, f).state, OpState::kFailed);
  EXPECT_EQ(end.heartbeat.op_entry_id, 0u);

  // A terminal state also sends one collective record through the ring.
  std::vector<Record> out(16);
  size_t n = (*reader)->Drain(out);
  std::vector<CollectiveRecord> colls;
  for (size_t i = 0; i < n; ++i) {
    if (out[i].type == RecordType::kCollective) colls.push_back(out[i].collective);
  }
  ASSERT_EQ(colls.size(), 2u);
  EXPECT_EQ(colls[0].state, OpState::kCompleted);
  EXPECT_EQ(colls[0].enqueued_ticks, 1000);
  EXPECT_EQ(colls[0].started_ticks, 2000);
  EXPECT_EQ(colls[0].completed_ticks, 3000);
  EXPECT_EQ(colls[0].bytes, 4096u);
  EXPECT_EQ(colls[1].state, OpState::kFailed);
  EXPECT_EQ(colls[1].op, OpType::kBroadcast);
}

TEST_F(TracerTest, KeepsTheLastNEntriesInOrder) {
  GroupId g = Group("tp.0.0", {0, 1});
  for (int i = 0; i < 1000; ++i) {
    OpHandle h = tracer_->Enqueue(g, OpType::kAllreduce, 8, DType::kF32);
    tracer_->Start(h);
    tracer_->Complete(h);
  }
  RankSnapshot s = tracer_->Snapshot();
  ASSERT_EQ(s.entries.size(), 256u);
  for (size_t i = 0; i < s.entries.size(); ++i) {
    EXPECT_EQ(s.entries[i].id, 745 + i);
    EXPECT_EQ(s.entries[i].seq, 744 + i);
  }
}

// The host span timer is the CPU backend's SpanTimer: a span exactly as Tracer::Scope records it;
// without CUDA, asking for event timing says why instead of timing nothing.
TEST_F(TracerTest, TheHostSpanTimerRecordsAsAScopeDoes) {
  auto reader = RingReader::Attach(tracer_->ring().path(), RingReader::Mode::kConsume);
  ASSERT_TRUE(reader.ok());
  NameId fwd = *tracer_->InternName("forward");
  auto timer = CreateHostSpanTimer(tracer_.get());
  clock_->Set(9000);
  {
    SpanTimer::Scope span(timer.get(), SpanKind::kBackward, fwd, 4, 1);
    clock_->Advance(300);
  }
  timer->Flush();
  std::vector<Record> out(4);
  ASSERT_EQ((*reader)->Drain(out), 1u);
  EXPECT_EQ(out[0].span.kind, SpanKind::kBackward);
  EXPECT_EQ(out[0].span.step, 4);
  EXPECT_EQ(out[0].span.microbatch, 1);
  EXPECT_EQ(out[0].span.end_ticks - out[0].span.start_ticks, 300);
  std::string why;
  int stream_stand_in = 0;
  auto cuda = CreateCudaSpanTimer(tracer_.get(), &stream_stand_in, 16, &why);
  if (cuda == nullptr) {
    EXPECT_FALSE(why.empty());
  }
}

TEST_F(TracerTest, SpansAndHeartbeatsReachTheReader) {
  auto reader = RingReader::Attach(tracer_->ring().path(), RingReader::Mode::kConsume);
  ASSERT_TRUE(reader.ok());
  NameId fwd = *tracer_->InternName("forward");
  EXPECT_EQ(*tracer_->InternName("forward"), fwd);  // interned once
  clock_->Set(5000);
  tracer_->SetPhase(7, Phase::kForward);
  {
    Tracer::Scope span(tracer_.get(), SpanKind::kForward, fwd, 7, 3);
    clock_->Advance(250);
  }
  Tracer::Span s = tracer_->BeginSpan(SpanKind::kComm, fwd, 7);
  clock_->Advance(10);
  tracer_->EndSpan(s);
  std::vector<Record> out(8);
  ASSERT_EQ((*reader)->Drain(out), 3u);
  EXPECT_EQ(out[0].type, RecordType::kHeartbeat);
  EXPECT_EQ(out[0].heartbeat.step, 7);
  EXPECT_EQ(out[0].heartbeat.phase, Phase::kForward);
  ASSERT_EQ(out[1].type, RecordType::kSpan);
  EXPECT_EQ(out[1].span.kind, SpanKind::kForward);
  EXPECT_EQ(out[1].span.microbatch, 3);
  EXPECT_EQ((*reader)->Calibration().ToNs(out[1].span.end_ticks) -
                (*reader)->Calibration().ToNs(out[1].span.start_ticks),
            250);
  EXPECT_EQ((*reader)->NameOf(out[1].span.name), "forward");
  EXPECT_EQ(out[2].span.end_ticks - out[2].span.start_ticks, 10);
  RankSnapshot snap = (*reader)->Snapshot();
  EXPECT_EQ(snap.heartbeat.step, 7);
  EXPECT_EQ(snap.heartbeat.phase, Phase::kForward);
  EXPECT_EQ(snap.heartbeat.updated_at_ns, 5000);
}

// A device span (CUPTI's) carries where it ran and what launched it, at the step of the last
// SetPhase; tracing off drops it like any span.
TEST_F(TracerTest, DeviceSpansCarryDeviceStreamBytesAndLaunchCorrelation) {
  auto reader = RingReader::Attach(tracer_->ring().path(), RingReader::Mode::kConsume);
  ASSERT_TRUE(reader.ok());
  const NameId gemm = *tracer_->InternName("sm90_gemm");
  tracer_->SetPhase(4, Phase::kBackward);
  tracer_->RecordDeviceSpan(SpanKind::kKernel, gemm, tracer_->step(), 100, 180,
                            {/*correlation=*/91, /*device=*/1, /*stream=*/7, /*bytes=*/0});
  tracer_->set_enabled(false);
  tracer_->RecordDeviceSpan(SpanKind::kMemcpy, gemm, 4, 200, 210, {92, 1, 7, 4096});
  std::vector<Record> out(8);
  ASSERT_EQ((*reader)->Drain(out), 2u);  // the heartbeat and the kernel
  ASSERT_EQ(out[1].type, RecordType::kSpan);
  EXPECT_EQ(out[1].span.kind, SpanKind::kKernel);
  EXPECT_EQ(out[1].span.step, 4);
  EXPECT_EQ(out[1].span.microbatch, -1);
  EXPECT_EQ(out[1].span.end_ticks - out[1].span.start_ticks, 80);
  EXPECT_EQ(out[1].span.correlation, 91u);
  EXPECT_EQ(out[1].span.device, 1u);
  EXPECT_EQ(out[1].span.stream, 7u);
  EXPECT_EQ((*reader)->NameOf(out[1].span.name), "sm90_gemm");
}

// A reader in another thread takes snapshots while the rank writes flat out; every entry and
// heartbeat it sees must be internally consistent (no torn reads). Run under the tsan preset too.
TEST_F(TracerTest, SnapshotsAreConsistentUnderConcurrentWrites) {
  GroupId g = Group("tp.0.0", {0, 1});
  auto reader = RingReader::Attach(tracer_->ring().path(), RingReader::Mode::kSnapshotOnly);
  ASSERT_TRUE(reader.ok());
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (int64_t k = 1; !stop.load(std::memory_order_relaxed); ++k) {
      tracer_->SetPhase(k, (k % 2) ? Phase::kForward : Phase::kBackward);
      clock_->Advance(1);
      OpHandle h =
          tracer_->Enqueue(g, OpType::kAllreduce, static_cast<uint64_t>(k) * 8, DType::kF32);
      clock_->Advance(1);
      tracer_->Start(h);
      tracer_->Progress(h, k * 4, k * 2);
      clock_->Advance(1);
      tracer_->Complete(h);
    }
  });
  int snapshots = 0, entries_seen = 0;
  bool consistent = true;
  while (snapshots < 2000) {
    RankSnapshot s = (*reader)->Snapshot();
    ++snapshots;
    const HeartbeatState& hb = s.heartbeat;
    if (hb.step > 0) consistent &= (hb.step % 2 == 1) == (hb.phase == Phase::kForward);
    for (const FlightEntry& e : s.entries) {
      ++entries_seen;
      const int64_t k = static_cast<int64_t>(e.bytes / 8);
      consistent &= e.seq + 1 == e.id && static_cast<int64_t>(e.seq) + 1 == k;
      if (e.state == OpState::kStarted || e.state == OpState::kCompleted) {
        consistent &= e.started_at_ns > e.enqueued_at_ns;
        consistent &= e.bytes_sent == -1 || (e.bytes_sent == k * 4 && e.bytes_received == k * 2);
      }
      if (e.state == OpState::kCompleted) {
        consistent &= e.bytes_sent == k * 4 && e.completed_at_ns > e.started_at_ns;
      }
    }
  }
  stop.store(true);
  writer.join();
  EXPECT_TRUE(consistent);
  EXPECT_GT(entries_seen, 0);
}

}  // namespace
}  // namespace megascope::tracer
