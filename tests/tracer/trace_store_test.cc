#include "megascope/tracer/trace_store.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "megascope/tracer/sqlite.h"
#include "test_util.h"

namespace megascope::tracer {
namespace {

using megascope::testing::TempDir;

// Record i of a batch: a span, a collective, a heartbeat or a metric in turn, each carrying i
// (and, every other one, the NULLs its table allows: no microbatch, no peer, never started).
Record Numbered(int i) {
  Record r{};
  switch (i % 4) {
    case 0:
      r.span = {RecordType::kSpan,
                SpanKind::kForward,
                0,
                i % 8 ? 1 : -1,
                i,
                1000 + i,
                2000 + 3 * i,
                0,
                0,
                0,
                0,
                0,
                {}};
      break;
    case 1:
      r.collective.type = RecordType::kCollective;
      r.collective.op = OpType::kAllreduce;
      r.collective.state = OpState::kCompleted;
      r.collective.group = static_cast<uint16_t>(i % 2);
      r.collective.peer = i % 8 == 1 ? -1 : i;
      r.collective.seq = static_cast<uint64_t>(i);
      r.collective.bytes = 64u * static_cast<uint64_t>(i);
      r.collective.step = i;
      r.collective.enqueued_ticks = 5000 + i;
      r.collective.started_ticks = i % 8 == 1 ? 0 : 5001 + i;
      r.collective.completed_ticks = 5010 + 2 * i;
      break;
    case 2:
      r.heartbeat.type = RecordType::kHeartbeat;
      r.heartbeat.phase = Phase::kBackward;
      r.heartbeat.step = i;
      r.heartbeat.ticks = 7000 + i;
      break;
    default:
      r.metric.type = RecordType::kMetric;
      r.metric.name = 1;
      r.metric.ticks = 9000 + i;
      r.metric.value = 0.5 * i;
      break;
  }
  return r;
}

class TraceStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    info_.node = "n0";
    info_.rank = 3;
    info_.attempt = 1;
  }
  RingRows Rows(const std::vector<Record>& records) const {
    RingRows rows;
    rows.info = &info_;
    rows.names = &names_;
    rows.groups = &groups_;
    rows.records = records;
    rows.ring = "ring3";
    rows.lane_tails = {records.size()};
    return rows;
  }
  // One column of every row of `sql`, NULL read as "null", in rowid order.
  std::vector<std::string> Column(const std::string& sql) const {
    auto db = sql::Database::Open(path_, sql::Database::Mode::kReadOnly);
    EXPECT_TRUE(db.ok()) << db.status().ToString();
    std::vector<std::string> out;
    if (!db.ok()) return out;
    auto st = db->Prepare(sql);
    EXPECT_TRUE(st.ok()) << st.status().ToString();
    if (!st.ok()) return out;
    while (true) {
      auto row = st->Step();
      if (!row.ok() || !*row) break;
      std::string line;
      for (int c = 0; c < st->columns(); ++c)
        line += (c ? "|" : "") + (st->IsNull(c) ? std::string("null") : std::string(st->Text(c)));
      out.push_back(line);
    }
    return out;
  }

  TempDir dir_;
  std::string path_ = dir_.path() + "/trace.db";
  RankInfo info_;
  std::vector<std::string> names_ = {"fwd", "loss"};
  std::vector<GroupInfo> groups_ = {{"dp.0", "dp", {}}, {"tp.0", "tp", {}}};
};

// Rows go out many to a statement (64, 32, ..., 1): whatever a batch's size, every row arrives
// once, in order, with its NULLs, and each batch's cursor is the last.
TEST_F(TraceStoreTest, EveryRowOfABatchArrivesOnceInOrderWhateverItsSize) {
  auto store = TraceStore::Open(path_);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  std::vector<std::string> spans, colls, hbs, metrics;
  int next = 0;
  for (int size : {0, 1, 3, 63, 64, 65, 127, 128, 129, 255, 300, 1000}) {
    std::vector<Record> batch;
    batch.reserve(static_cast<size_t>(size));
    for (int k = 0; k < size; ++k, ++next) {
      batch.push_back(Numbered(next));
      const std::string i = std::to_string(next);
      switch (next % 4) {
        case 0:
          spans.push_back("3|1|" + i + "|" + (next % 8 ? "1" : "null") + "|forward|fwd|" +
                          std::to_string(1000 + next) + "|" + std::to_string(2000 + 3 * next));
          break;
        case 1:
          colls.push_back(std::string(next % 2 ? "tp.0" : "dp.0") + "|" + i + "|" +
                          (next % 8 == 1 ? "null" : i) + "|" + std::to_string(64 * next) + "|" +
                          std::to_string(5000 + next) + "|" +
                          (next % 8 == 1 ? "null" : std::to_string(5001 + next)) + "|" +
                          std::to_string(5010 + 2 * next));
          break;
        case 2:
          hbs.push_back("3|1|" + std::to_string(7000 + next) + "|" + i + "|backward");
          break;
        default:
          metrics.push_back("n0|" + std::to_string(9000 + next) + "|rank3.loss|" + i);
          break;
      }
    }
    const RingRows rows = Rows(batch);
    ASSERT_TRUE((*store)->Write({&rows, 1}, {}, {}).ok()) << "a batch of " << size;
    auto cursors = (*store)->Cursors("ring3");
    ASSERT_TRUE(cursors.ok());
    EXPECT_EQ(*cursors, std::vector<uint64_t>{static_cast<uint64_t>(size)}) << size;
  }
  EXPECT_EQ(Column("SELECT rank, attempt, step, microbatch, kind, name, start_ns, end_ns FROM spans"
                   " WHERE kind != 'comm' ORDER BY rowid"),
            spans);
  EXPECT_EQ(Column("SELECT grp, seq, peer, bytes, enqueued_ns, started_ns, completed_ns "
                   "FROM collectives"),
            colls);
  EXPECT_EQ(Column("SELECT * FROM heartbeats"), hbs);
  EXPECT_EQ(Column("SELECT node, ts_ns, name, CAST(2 * value AS INTEGER) FROM metrics"), metrics);
}

// A span of device activity is a span like any other, and where it ran and what launched it go to
// device_spans (joined on rank, attempt, kind, start); a host span has no such row, and retention
// drops device rows with their spans.
TEST_F(TraceStoreTest, DeviceSpansKeepTheirDeviceStreamAndLaunchCorrelation) {
  auto store = TraceStore::Open(path_);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  std::vector<Record> batch(3);
  batch[0].span = {RecordType::kSpan, SpanKind::kForward, 0, -1, 4, 100, 200, 0, 0, 0, 0, 0, {}};
  batch[1].span = {RecordType::kSpan, SpanKind::kKernel, 1, -1, 4, 120, 180, 77, 0, 13, 0, 0, {}};
  batch[2].span = {RecordType::kSpan, SpanKind::kMemcpy, 0, -1, 5, 300, 340, 78, 1, 7, 0, 4096, {}};
  const RingRows rows = Rows(batch);
  ASSERT_TRUE((*store)->Write({&rows, 1}, {}, {}).ok());
  EXPECT_EQ(Column("SELECT s.kind, s.name, s.start_ns, s.end_ns, d.device, d.stream, "
                   "d.correlation, d.bytes FROM spans s LEFT JOIN device_spans d USING (rank, "
                   "attempt, kind, start_ns) ORDER BY s.start_ns"),
            (std::vector<std::string>{"forward|fwd|100|200|null|null|null|null",
                                      "kernel|loss|120|180|0|13|77|0",
                                      "memcpy|fwd|300|340|1|7|78|4096"}));
  ASSERT_TRUE((*store)->Prune(/*before_ns=*/250).ok());
  EXPECT_EQ(Column("SELECT kind, correlation FROM device_spans"),
            std::vector<std::string>{"memcpy|78"});
}

// Retention keeps a time window: rows older than the cutoff go, summed per step into step_rollups
// first (spans by kind, collectives by op with their bytes); newer rows and other tables stay.
TEST_F(TraceStoreTest, RetentionDropsTheOldestRowsAndKeepsTheirPerStepRollups) {
  auto store = TraceStore::Open(path_);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  std::vector<Record> all;
  all.reserve(1000);
  for (int i = 0; i < 1000; ++i) all.push_back(Numbered(i));
  for (size_t from = 0; from < all.size(); from += 100) {  // in arrival order, as the agent writes
    const std::vector<Record> batch(all.begin() + static_cast<long>(from),
                                    all.begin() + static_cast<long>(from + 100));
    const RingRows rows = Rows(batch);
    ASSERT_TRUE((*store)->Write({&rows, 1}, {}, {}).ok());
  }
  // Spans start at 1000 + i (i = 0, 4, ...): those before 1500 are the 125 of i < 500.
  auto dropped = (*store)->Prune(1500);
  ASSERT_TRUE(dropped.ok()) << dropped.status().ToString();
  EXPECT_EQ(*dropped, 125);
  EXPECT_EQ(Column("SELECT MIN(start_ns), COUNT(*) FROM spans WHERE kind = 'forward'"),
            std::vector<std::string>{"1500|125"});
  // Their durations (1000 + 2i) summed: 125 * 1000 + 2 * (0 + 4 + ... + 496).
  EXPECT_EQ(Column("SELECT SUM(count), SUM(total_ns), MIN(first_ns) FROM step_rollups "
                   "WHERE what = 'forward'"),
            std::vector<std::string>{"125|187000|1000"});
  EXPECT_EQ(Column("SELECT COUNT(*) FROM collectives"), std::vector<std::string>{"250"});
  // Collectives are enqueued at 5000 + i: before 5500, the 125 of i < 500; and every span left
  // but the newest (a table's newest row stays: rowids only grow).
  dropped = (*store)->Prune(5500);
  ASSERT_TRUE(dropped.ok()) << dropped.status().ToString();
  EXPECT_EQ(*dropped, 249);
  EXPECT_EQ(Column("SELECT COUNT(*), MIN(start_ns) FROM span_rows"),
            (std::vector<std::string>{"1|1996"}));
  EXPECT_EQ(Column("SELECT SUM(count), SUM(bytes) FROM step_rollups WHERE what = 'comm:allreduce'"),
            std::vector<std::string>{"125|1992000"});
  EXPECT_EQ(Column("SELECT COUNT(*), MIN(enqueued_ns) FROM collectives"),
            (std::vector<std::string>{"125|5501"}));
  EXPECT_EQ(Column("SELECT COUNT(*) FROM heartbeats"), std::vector<std::string>{"250"});
  EXPECT_EQ(Column("SELECT COUNT(*) FROM metrics"), std::vector<std::string>{"250"});
  EXPECT_EQ(Column("SELECT SUM(count) FROM step_rollups WHERE what = 'forward'"),
            std::vector<std::string>{"249"});
  // The rollups are kept longer, not for ever: those whose last row is older than their own cutoff
  // go, the newer stay.
  const std::vector<std::string> kept =
      Column("SELECT COUNT(*) FROM step_rollups WHERE last_ns >= 3000");
  dropped = (*store)->Prune(5500, /*rollups_before_ns=*/3000);
  ASSERT_TRUE(dropped.ok()) << dropped.status().ToString();
  EXPECT_GT(*dropped, 0);
  EXPECT_EQ(Column("SELECT COUNT(*) FROM step_rollups"), kept);
  EXPECT_NE(kept, std::vector<std::string>{"0"});
  EXPECT_EQ(Column("SELECT COUNT(*) FROM step_rollups WHERE last_ns < 3000"),
            std::vector<std::string>{"0"});
  EXPECT_EQ(Column("SELECT COUNT(*), MIN(enqueued_ns) FROM collectives"),
            (std::vector<std::string>{"125|5501"}));  // the window's rows stay
}

// Retention past every row of a table keeps its newest: SQLite numbers a row after the largest
// rowid there (from 1 in an empty table), and the store's sink ships each table above a rowid
// cursor -- rows numbered again from 1 would never be shipped.
TEST_F(TraceStoreTest, RetentionPastEveryRowKeepsRowidsGrowing) {
  auto store = TraceStore::Open(path_);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  std::vector<Record> batch(20);
  for (int i = 0; i < 20; ++i) batch[static_cast<size_t>(i)] = Numbered(i);
  const RingRows rows = Rows(batch);
  ASSERT_TRUE((*store)->Write({&rows, 1}, {}, {}).ok());
  const std::vector<std::string> before =
      Column("SELECT MAX(rowid) FROM span_rows UNION ALL SELECT MAX(rowid) FROM heartbeat_rows");
  ASSERT_TRUE((*store)->Prune(int64_t{1} << 60).ok());
  EXPECT_EQ(Column("SELECT COUNT(*) FROM span_rows UNION ALL SELECT COUNT(*) FROM heartbeat_rows"),
            (std::vector<std::string>{"1", "1"}));
  const RingRows more = Rows(batch);
  ASSERT_TRUE((*store)->Write({&more, 1}, {}, {}).ok());
  const std::vector<std::string> after =
      Column("SELECT MIN(rowid) FROM span_rows UNION ALL SELECT MIN(rowid) FROM heartbeat_rows");
  EXPECT_EQ(after, before) << "the kept newest row is the smallest: new rows numbered after it";
}

// A write that fails part-way leaves nothing of its rows behind: neither in the database nor
// waiting in the store for the next write.
TEST_F(TraceStoreTest, AFailedWriteLeavesNoRowsBehindForTheNext) {
  auto store = TraceStore::Open(path_, /*max_bytes=*/int64_t{64} * 4096);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  std::vector<Record> big;
  big.reserve(20000);
  for (int i = 0; i < 20000; ++i) big.push_back(Numbered(i));
  const RingRows too_many = Rows(big);
  EXPECT_FALSE((*store)->Write({&too_many, 1}, {}, {}).ok()) << "the cap should have been hit";
  const std::vector<Record> one = {Numbered(1)};
  const RingRows small = Rows(one);
  ASSERT_TRUE((*store)->Write({&small, 1}, {}, {}).ok());
  EXPECT_EQ(Column("SELECT count(*) FROM collective_rows"), std::vector<std::string>{"1"});
  EXPECT_EQ(Column("SELECT count(*) FROM span_rows"), std::vector<std::string>{"0"});
  EXPECT_EQ(Column("SELECT count(*) FROM heartbeat_rows"), std::vector<std::string>{"0"});
  EXPECT_EQ(Column("SELECT count(*) FROM metrics"), std::vector<std::string>{"0"});
}

}  // namespace
}  // namespace megascope::tracer
