#include "megascope/tracer/ring.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <latch>
#include <map>
#include <thread>
#include <vector>

#include "megascope/launch/process.h"
#include "test_util.h"

namespace megascope::tracer {
namespace {
using megascope::launch::Process;

using megascope::testing::TempDir;

class RingTest : public ::testing::Test {
 protected:
  RingOptions Options(uint32_t capacity, uint32_t lanes = 1) {
    RingOptions o;
    o.dir = dir_.path();
    o.job = "ringtest";
    o.lane_capacity = capacity;
    o.lanes = lanes;
    o.flight_entries = 256;
    return o;
  }
  std::unique_ptr<RingWriter> Writer(const RingOptions& o) {
    auto w = RingWriter::Create(o, clock_);
    EXPECT_TRUE(w.ok()) << w.status().ToString();
    return std::move(w).value();
  }
  std::unique_ptr<RingReader> Reader(const std::string& path,
                                     RingReader::Mode mode = RingReader::Mode::kConsume) {
    auto r = RingReader::Attach(path, mode);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return std::move(r).value();
  }
  static Record Numbered(int64_t n, int32_t tag = 0) {
    Record r{};
    r.span.type = RecordType::kSpan;
    r.span.step = n;
    r.span.microbatch = tag;
    return r;
  }

  TempDir dir_;
  FakeClock clock_;
};

TEST_F(RingTest, WrapAroundKeepsOrder) {
  auto w = Writer(Options(8));
  auto r = Reader(w->path());
  std::vector<Record> out(16);
  int64_t next_push = 0, next_read = 0;
  for (int round = 0; round < 100; ++round) {
    for (int i = 0; i < 5; ++i) ASSERT_TRUE(w->Push(Numbered(next_push++)));
    size_t n = r->Drain(out);
    ASSERT_EQ(n, 5u);
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(out[i].span.step, next_read++);
  }
  EXPECT_EQ(r->Dropped(), 0u);
}

TEST_F(RingTest, FullRingDropsAndCounts) {
  auto w = Writer(Options(8));
  int accepted = 0;
  for (int i = 0; i < 20; ++i) accepted += w->Push(Numbered(i)) ? 1 : 0;
  EXPECT_EQ(accepted, 8);
  auto r = Reader(w->path());
  EXPECT_EQ(r->Dropped(), 12u);
  std::vector<Record> out(32);
  ASSERT_EQ(r->Drain(out), 8u);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(out[i].span.step, i);  // the oldest are kept
  RankSnapshot s = r->Snapshot();
  EXPECT_EQ(s.records_total, 20u);
  EXPECT_EQ(s.dropped_total, 12u);
  EXPECT_TRUE(w->Push(Numbered(99)));  // space again after the drain
}

TEST_F(RingTest, ReadWithoutCommitLosesNothing) {
  auto w = Writer(Options(16));
  for (int i = 0; i < 10; ++i) w->Push(Numbered(i));
  std::vector<Record> out(16);
  {
    auto r = Reader(w->path());
    ReadBatch b;
    EXPECT_EQ(r->Read(out, &b), 10u);
    // No Commit: as if the agent died before its database transaction committed.
  }
  auto r = Reader(w->path());
  ReadBatch b;
  ASSERT_EQ(r->Read(std::span(out).first(4), &b), 4u);
  r->Commit(b);
  ASSERT_EQ(r->Drain(out), 6u);
  EXPECT_EQ(out[0].span.step, 4);
}

TEST_F(RingTest, ACommitBeyondTheHeadIsIgnored) {
  auto w = Writer(Options(16));
  for (int i = 0; i < 5; ++i) w->Push(Numbered(i));
  auto r = Reader(w->path());
  ReadBatch bogus;
  bogus.lane_tails = {1000};  // e.g. a cursor of another ring that had the same name
  r->Commit(bogus);
  std::vector<Record> out(16);
  EXPECT_EQ(r->Drain(out), 0u);  // clamped to the head: nothing re-read, no loop
  w->Push(Numbered(5));
  ASSERT_EQ(r->Drain(out), 1u);
  EXPECT_EQ(out[0].span.step, 5);
}

TEST_F(RingTest, OneConsumerAtATime) {
  auto w = Writer(Options(16));
  auto first = Reader(w->path());
  auto second = RingReader::Attach(w->path(), RingReader::Mode::kConsume);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kAlreadyExists);
  EXPECT_NE(second.status().message().find("already being drained"), std::string::npos);
  EXPECT_TRUE(RingReader::Attach(w->path(), RingReader::Mode::kSnapshotOnly).ok());
  first.reset();  // the lock goes with the consumer
  EXPECT_TRUE(RingReader::Attach(w->path(), RingReader::Mode::kConsume).ok());
}

TEST_F(RingTest, TwoThreadsEveryRecordAccounted) {
  auto w = Writer(Options(1024));
  auto r = Reader(w->path());
  constexpr int64_t kTotal = 2'000'000;
  std::atomic<bool> done{false};
  int64_t accepted = 0;
  std::thread producer([&] {
    for (int64_t i = 0; i < kTotal; ++i) accepted += w->Push(Numbered(i)) ? 1 : 0;
    done.store(true);
  });
  std::vector<Record> out(256);
  int64_t received = 0, last = -1;
  bool ordered = true;
  for (;;) {
    bool finished = done.load();
    size_t n = r->Drain(out);
    for (size_t i = 0; i < n; ++i) {
      ordered = ordered && out[i].span.step > last;
      last = out[i].span.step;
    }
    received += static_cast<int64_t>(n);
    if (finished && n == 0) break;
  }
  producer.join();
  EXPECT_TRUE(ordered);
  EXPECT_EQ(received, accepted);
  EXPECT_EQ(received + static_cast<int64_t>(r->Dropped()), kTotal);
  EXPECT_GT(received, 0);
}

TEST_F(RingTest, TwoProcessesEveryRecordAccounted) {
  RingOptions o = Options(4096);
  constexpr int64_t kTotal = 500'000;
  int go[2];
  ASSERT_EQ(::pipe(go), 0);
  auto writer = Process::Fork([&] {
    auto w = RingWriter::Create(o, clock_);
    if (!w.ok()) return 3;
    char c = 'x';
    if (::write(go[1], &c, 1) != 1) return 4;  // ring exists now
    for (int64_t i = 0; i < kTotal; ++i) (*w)->Push(Numbered(i));
    (*w)->MarkClosed();
    return 0;
  });
  ASSERT_TRUE(writer.ok());
  char c;
  ASSERT_EQ(::read(go[0], &c, 1), 1);
  auto r = Reader(o.dir + "/" + RingFileName(o.job, 0, 0));
  std::vector<Record> out(512);
  int64_t received = 0, last = -1;
  bool ordered = true;
  for (;;) {
    bool closed = r->Closed();
    size_t n = r->Drain(out);
    for (size_t i = 0; i < n; ++i) {
      ordered = ordered && out[i].span.step > last;
      last = out[i].span.step;
    }
    received += static_cast<int64_t>(n);
    if (closed && n == 0) break;
  }
  ASSERT_TRUE((*writer)->Wait().success());
  EXPECT_TRUE(ordered);
  EXPECT_EQ(received + static_cast<int64_t>(r->Dropped()), kTotal);
  EXPECT_EQ(r->Snapshot().records_total, static_cast<uint64_t>(kTotal));
  EXPECT_FALSE(r->WriterAlive());
}

TEST_F(RingTest, EachThreadGetsItsOwnLaneAndExtraThreadsAreCounted) {
  auto w = Writer(Options(1024, /*lanes=*/2));
  std::latch all_started(3);  // alive at once, so thread ids differ
  auto push_100 = [&](int32_t tag) {
    all_started.arrive_and_wait();
    for (int i = 0; i < 100; ++i) w->Push(Numbered(i, tag));
  };
  std::thread a(push_100, 1), b(push_100, 2), c(push_100, 3);  // one finds no lane left
  a.join();
  b.join();
  c.join();
  auto r = Reader(w->path());
  std::vector<Record> out(1024);
  size_t n = r->Drain(out);
  ASSERT_EQ(n, 200u);
  std::map<int32_t, int64_t> next;
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(out[i].span.step, next[out[i].span.microbatch]++);
  }
  EXPECT_EQ(next.size(), 2u);
  EXPECT_EQ(r->Dropped(), 100u);
}

TEST_F(RingTest, AttachToMissingRingSaysSo) {
  auto r = RingReader::Attach(dir_.path() + "/megascope.nojob.a0.r0", RingReader::Mode::kConsume);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("megascope.nojob.a0.r0"), std::string::npos);
}

TEST_F(RingTest, AttachToForeignFileSaysSo) {
  std::string path = dir_.path() + "/not-a-ring";
  std::ofstream(path) << std::string(8192, 'z');
  auto r = RingReader::Attach(path, RingReader::Mode::kSnapshotOnly);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("not a megascope ring"), std::string::npos)
      << r.status().ToString();

  std::ofstream(dir_.path() + "/tiny") << "abc";
  auto t = RingReader::Attach(dir_.path() + "/tiny", RingReader::Mode::kSnapshotOnly);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("only 3 bytes"), std::string::npos);
}

TEST_F(RingTest, AttachToRingOfAnotherVersionSaysSo) {
  auto w = Writer(Options(8));
  int fd = ::open(w->path().c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  uint32_t future = kRingVersion + 1;
  ASSERT_EQ(::pwrite(fd, &future, sizeof(future), 8), 4);  // version follows the 8-byte magic
  ::close(fd);
  auto r = RingReader::Attach(w->path(), RingReader::Mode::kSnapshotOnly);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("layout version " + std::to_string(future)),
            std::string::npos)
      << r.status().ToString();
}

TEST_F(RingTest, AttachToRingOfAnotherUserSaysSo) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to chown";
  auto w = Writer(Options(8));
  ASSERT_EQ(::chown(w->path().c_str(), 4242, 4242), 0);
  auto r = RingReader::Attach(w->path(), RingReader::Mode::kSnapshotOnly);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(r.status().message().find("owned by uid 4242"), std::string::npos);
}

TEST_F(RingTest, NameHeldByLiveProcessIsRefused) {
  auto w = Writer(Options(8));
  auto again = RingWriter::Create(Options(8), clock_);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::kAlreadyExists);
  EXPECT_NE(again.status().message().find("in use by live process " + std::to_string(::getpid())),
            std::string::npos);
}

TEST_F(RingTest, StaleRingOfDeadProcessIsReplaced) {
  RingOptions o = Options(8);
  auto writer = Process::Fork([&] {
    auto w = RingWriter::Create(o, clock_);
    if (w.ok()) (*w)->Push(Numbered(1));
    ::_exit(w.ok() ? 0 : 1);  // leaves its ring behind
    return 1;
  });
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE((*writer)->Wait().success());
  auto w = Writer(o);
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->Snapshot().records_total, 0u);
}

// A writer that exited but was not reaped (a zombie: the rank of a launch killed with SIGKILL,
// whose parent is gone or busy) still has a /proc entry with its start time; it holds nothing.
TEST_F(RingTest, StaleRingOfAZombieIsReplaced) {
  RingOptions o = Options(8);
  auto writer = Process::Fork([&] {
    auto w = RingWriter::Create(o, clock_);
    ::_exit(w.ok() ? 0 : 1);  // leaves its ring behind
    return 1;
  });
  ASSERT_TRUE(writer.ok());
  siginfo_t info{};  // until it has exited, without reaping it
  ASSERT_EQ(::waitid(P_PID, static_cast<id_t>((*writer)->pid()), &info, WEXITED | WNOWAIT), 0);
  auto w = RingWriter::Create(o, clock_);
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_TRUE((*writer)->Wait().success());
}

TEST_F(RingTest, BadOptionsAreRefusedClearly) {
  RingOptions o = Options(12);
  auto a = RingWriter::Create(o, clock_);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("power of two"), std::string::npos);
  o = Options(8);
  o.job = "bad job/name";
  auto b = RingWriter::Create(o, clock_);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("job name"), std::string::npos);
  o = Options(8);
  o.flight_entries = 100;
  EXPECT_FALSE(RingWriter::Create(o, clock_).ok());
  o = Options(8);
  o.dir = dir_.path() + "/missing";
  auto d = RingWriter::Create(o, clock_);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("does not exist"), std::string::npos);
}

}  // namespace
}  // namespace megascope::tracer
