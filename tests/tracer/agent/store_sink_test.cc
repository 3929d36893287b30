// The agent's ClickHouse sink against a real ClickHouse server on loopback: every row of trace.db
// arrives once, through a lost acknowledgement, a killed server, a store down from the start, a
// lost cursor; bad credentials and a newer schema are one clear line; retention drops whole days;
// two shards behind a Distributed table.
#include "megascope/tracer/agent/store_sink.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <thread>
#include <vector>

#include "clickhouse_server.h"
#include "gate_proxy.h"
#include "megascope/tracer/trace_schema.h"
#include "megascope/tracer/trace_store.h"
#include "test_util.h"

namespace megascope::tracer::agent {
namespace {

using megascope::testing::ClickHouseServer;
using megascope::testing::TempDir;

constexpr int64_t kDayNs = 86'400'000'000'000;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A node's trace.db, written through the real store: each Add() is one drain pass of `steps`
// steps of rank `rank`, from `start_ns` on (a forward span, a completed all-reduce, a heartbeat
// and a metric per step).
class TraceDb {
 public:
  explicit TraceDb(std::string path) : path_(std::move(path)) {
    auto s = TraceStore::Open(path_);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(*s);
  }
  void Add(int rank, int steps, int64_t start_ns) {
    RankInfo info;
    info.node = "n0";
    info.rank = rank;
    info.attempt = 0;
    ASSERT_TRUE(store_->UpsertRank(info).ok());
    std::vector<Record> records;
    for (int i = 0; i < steps; ++i, ++next_step_) {
      const int64_t t = int64_t{1000000} * (next_step_ + 1);  // tick 0 reads as unknown
      Record span{};
      span.span = {
          RecordType::kSpan, SpanKind::kForward, 0, -1, next_step_, t, t + 500, 0, 0, 0, 0, 0, {}};
      records.push_back(span);
      Record c{};
      c.collective.type = RecordType::kCollective;
      c.collective.op = OpType::kAllreduce;
      c.collective.state = OpState::kCompleted;
      c.collective.group = 0;
      c.collective.peer = -1;
      c.collective.seq = static_cast<uint64_t>(next_step_);
      c.collective.bytes = 4096;
      c.collective.step = next_step_;
      c.collective.enqueued_ticks = t + 100;  // inside the forward span: compute excludes it
      c.collective.started_ticks = t + 110;
      c.collective.completed_ticks = t + 400;
      records.push_back(c);
      Record h{};
      h.heartbeat.type = RecordType::kHeartbeat;
      h.heartbeat.phase = Phase::kForward;
      h.heartbeat.step = next_step_;
      h.heartbeat.ticks = t;
      records.push_back(h);
      Record m{};
      m.metric.type = RecordType::kMetric;
      m.metric.name = 0;
      m.metric.ticks = t + 950;
      m.metric.value = 0.25 * next_step_;
      records.push_back(m);
    }
    RingRows rows;
    rows.info = &info;
    rows.calibration.base_ns = start_ns;
    rows.names = &names_;
    rows.groups = &groups_;
    rows.records = records;
    rows.ring = "ring" + std::to_string(rank);
    rows.lane_tails = {++tail_};
    ASSERT_TRUE(store_->Write({&rows, 1}, {}, {}).ok());
  }
  int64_t Count(const std::string& table) const {
    auto db = sql::Database::Open(path_, sql::Database::Mode::kReadOnly);
    EXPECT_TRUE(db.ok());
    auto n = db->QueryInt("SELECT count(*) FROM " + table);
    EXPECT_TRUE(n.ok());
    return n.ok() ? *n : -1;
  }
  TraceStore& Store() { return *store_; }
  const std::string& Path() const { return path_; }

 private:
  std::string path_;
  std::unique_ptr<TraceStore> store_;
  std::vector<std::string> names_ = {"loss"};
  std::vector<GroupInfo> groups_ = {{"dp.0", "dp", {}}};
  int next_step_ = 0;
  uint64_t tail_ = 0;
};

class StoreSinkTest : public megascope::testing::ClickHouseTest {
 protected:
  std::unique_ptr<StoreSink> Sink(const std::string& db_path, const std::string& url,
                                  std::function<Status(std::string_view)> after = nullptr) {
    auto u = StoreUrl::Parse(url);
    EXPECT_TRUE(u.ok()) << u.status().ToString();
    StoreSinkOptions o;
    o.url = *u;
    o.job = "j1";
    o.node = "n0";
    o.db_path = db_path;
    o.batch_rows = 7;  // many batches: every boundary is crossed
    o.batches_per_table = 1000;
    o.timeout_ms = 5000;
    o.after_insert = std::move(after);
    auto s = StoreSink::Open(o);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(*s) : nullptr;
  }
  std::string Scalar(const std::string& sql, const std::string& db = "m") {
    ClickHouse ch(*StoreUrl::Parse(server_->Url(db)));
    auto v = ch.Scalar(sql);
    EXPECT_TRUE(v.ok()) << v.status().ToString();
    return v.ok() ? *v : "";
  }
  // Every shipped table holds exactly trace.db's rows: as many, none twice.
  void ExpectExactlyOnce(const TraceDb& db) {
    const std::map<std::string, std::string> pairs = {{"spans", "span_rows"},
                                                      {"collectives", "collective_rows"},
                                                      {"heartbeats", "heartbeat_rows"},
                                                      {"metrics", "metrics"},
                                                      {"ranks", "ranks"}};
    for (const auto& [store_table, source] : pairs) {
      // A rank's row is replaced when it is written again (a new rowid): the store keeps both.
      const std::string rows = store_table == "ranks" ? "uniqExact(rank, attempt)" : "count()";
      EXPECT_EQ(Scalar("SELECT " + rows + " FROM " + store_table), std::to_string(db.Count(source)))
          << store_table;
      EXPECT_EQ(Scalar("SELECT count() - uniqExact(src, row_id) FROM " + store_table), "0")
          << store_table << " holds a row twice";
    }
    EXPECT_EQ(Scalar("SELECT count() - uniqExact(src, attempt, rank, step) FROM rank_steps"), "0")
        << "a step summed twice";
  }
};

TEST_F(StoreSinkTest, EveryRowArrivesOnceWithTheColumnsTraceDbShows) {
  TraceDb db(dir_.path() + "/trace.db");
  const int64_t t0 = NowNs();
  db.Add(0, 20, t0);
  db.Add(1, 15, t0);
  auto sink = Sink(db.Path(), server_->Url("m"));
  auto shipped = sink->Pass();
  ASSERT_TRUE(shipped.ok()) << shipped.status().ToString();
  EXPECT_EQ(sink->lag_rows(), 0);
  ExpectExactlyOnce(db);
  // The rows read back as trace.db's documented views show them.
  EXPECT_EQ(Scalar("SELECT sum(end_ns - start_ns) FROM spans WHERE kind = 'forward'"),
            std::to_string(35 * 500));
  EXPECT_EQ(Scalar("SELECT any(grp) || ' ' || any(op) || ' ' || any(state) || ' ' || "
                   "toString(sum(completed_ns - started_ns)) FROM collectives"),
            "dp.0 allreduce completed " + std::to_string(35 * 290));
  EXPECT_EQ(Scalar("SELECT sum(value) FROM metrics"), "148.75");  // 0.25 * (0 + ... + 34)
  // Nothing new: nothing sent; more rows: only they are.
  EXPECT_EQ(*sink->Pass(), 0u);
  db.Add(0, 3, t0);
  EXPECT_EQ(*sink->Pass(), 3u * 4 + 1 + 3)
      << "3 steps' 4 rows, rank 0's row again, and the sums of its 3 steps now over";
  ExpectExactlyOnce(db);
}

// Each rank's steps are summed as they end (the rank's next step is in trace.db), over several
// passes, and the last pass sums the rest: the sums are those trace_schema.h's per_rank gives over
// the whole database.
TEST_F(StoreSinkTest, StepsSummedAsTheyEndAreThoseOfTheWholeDatabase) {
  TraceDb db(dir_.path() + "/trace.db");
  const int64_t t0 = NowNs();
  auto sink = Sink(db.Path(), server_->Url("m"));
  for (int pass = 0; pass < 4; ++pass) {
    db.Add(pass % 2, 3 + pass, t0);
    ASSERT_TRUE(sink->Pass().ok());
  }
  EXPECT_LT(std::stoi(Scalar("SELECT count() FROM rank_steps")), 3 + 4 + 5 + 6)
      << "each rank's newest step is not over yet";
  ASSERT_TRUE(sink->Pass(/*last=*/true).ok());
  ExpectExactlyOnce(db);
  auto raw = sql::Database::Open(db.Path(), sql::Database::Mode::kReadOnly);
  ASSERT_TRUE(raw.ok());
  auto st = raw->Prepare(PerRankStepSql() +
                         " SELECT attempt, rank, step, wall, compute, comm, data FROM per_rank "
                         "ORDER BY attempt, rank, step");
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  std::string want;
  int steps = 0;
  while (*st->Step()) {
    for (int c = 0; c < 7; ++c) want += std::string(c ? "," : "") + std::string(st->Text(c));
    want += ";";
    ++steps;
  }
  EXPECT_EQ(steps, 3 + 4 + 5 + 6);
  EXPECT_EQ(Scalar("SELECT arrayStringConcat(groupArray(r), ';') || ';' FROM (SELECT "
                   "concat(toString(attempt), ',', toString(rank), ',', toString(step), ',', "
                   "toString(wall), ',', toString(compute), ',', toString(comm), ',', "
                   "toString(data)) AS r FROM rank_steps ORDER BY attempt, rank, step)"),
            want);
  EXPECT_NE(want.find(",210,290,0;"), std::string::npos)
      << "compute is the forward span less the all-reduce inside it: " << want;
}

// The acknowledgement of an INSERT lost on the way (the rows landed, the sink does not know), then
// the server killed mid-run and started again: the next passes ask the store where it is, and
// every row is there once.
TEST_F(StoreSinkTest, ALostAcknowledgementOrAKilledServerNeitherLosesNorDoublesARow) {
  TraceDb db(dir_.path() + "/trace.db");
  const int64_t t0 = NowNs();
  db.Add(0, 10, t0);
  int inserts = 0;
  auto sink = Sink(db.Path(), server_->Url("m"), [&](std::string_view table) {
    // The second INSERT into collectives lands, but its answer never arrives.
    return table == "collectives" && ++inserts == 2 ? Status(StatusCode::kDeadlineExceeded, "lost")
                                                    : Status::Ok();
  });
  EXPECT_FALSE(sink->Pass().ok());
  EXPECT_EQ(sink->errors(), 1u);
  ASSERT_TRUE(sink->Pass().ok());
  ExpectExactlyOnce(db);

  server_->Kill();
  db.Add(1, 10, t0);  // training goes on: trace.db grows while the store is gone
  auto down = sink->Pass();
  ASSERT_FALSE(down.ok());
  EXPECT_EQ(down.status().code(), StatusCode::kUnavailable) << down.status().ToString();
  EXPECT_NE(down.status().message().find("cannot connect"), std::string::npos)
      << down.status().message();
  EXPECT_GE(sink->lag_rows(), 10 * 4) << "the new rows wait in trace.db, counted";
  ASSERT_TRUE(server_->Start());
  ASSERT_TRUE(sink->Pass().ok());
  EXPECT_EQ(sink->lag_rows(), 0);
  ExpectExactlyOnce(db);
}

// The agent killed after the store acknowledged and before its cursor was saved: a new sink on the
// same trace.db goes on from the store's largest row_id, not from the cursor it finds.
TEST_F(StoreSinkTest, ACursorNeverSavedIsFoundAgainInTheStore) {
  TraceDb db(dir_.path() + "/trace.db");
  db.Add(0, 12, NowNs());
  ASSERT_TRUE(Sink(db.Path(), server_->Url("m"))->Pass().ok());
  {
    auto raw = sql::Database::Open(db.Path(), sql::Database::Mode::kReadWrite);
    ASSERT_TRUE(raw.ok());
    ASSERT_TRUE(raw->Exec("DELETE FROM store_cursors").ok());
  }
  db.Add(0, 5, NowNs());
  auto again = Sink(db.Path(), server_->Url("m"));
  auto shipped = again->Pass();
  ASSERT_TRUE(shipped.ok()) << shipped.status().ToString();
  EXPECT_EQ(*shipped, 5u * 4 + 1 + 1 + 5)
      << "the new rows, rank 0 again, a first look of open ops and the 5 steps now over";
  ExpectExactlyOnce(db);
}

// A store down from the start: training and trace.db are unaffected, the error says where and
// why, the lag is counted, and everything arrives once the store is up.
TEST_F(StoreSinkTest, AStoreDownFromTheStartIsOneClearErrorAndTheRowsCatchUpLater) {
  TraceDb db(dir_.path() + "/trace.db");
  db.Add(0, 9, NowNs());
  ClickHouseServer later(dir_.path() + "/later");
  auto sink = Sink(db.Path(), later.Url("m"));
  auto first = sink->Pass();
  ASSERT_FALSE(first.ok());
  EXPECT_EQ(first.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(first.status().message().find(later.Url("m")), std::string::npos)
      << first.status().message();
  ASSERT_TRUE(later.Start());
  ASSERT_TRUE(sink->Pass().ok());
  ClickHouse ch(*StoreUrl::Parse(later.Url("m")));
  EXPECT_EQ(*ch.Scalar("SELECT count() FROM spans"), std::to_string(db.Count("span_rows")));
}

// A wrong password is one line that names the store (not the password); a store written by a
// newer megascope is refused naming both versions; neither loses a row.
TEST_F(StoreSinkTest, AWrongPasswordAndANewerSchemaAreOneClearLineEach) {
  TraceDb db(dir_.path() + "/trace.db");
  db.Add(0, 3, NowNs());
  auto wrong = Sink(db.Path(), server_->Url("m", "writer:nope"))->Pass();
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), StatusCode::kPermissionDenied) << wrong.status().ToString();
  EXPECT_NE(wrong.status().message().find("Wrong password"), std::string::npos);
  EXPECT_EQ(wrong.status().message().find("nope"), std::string::npos) << "the password is shown";
  EXPECT_EQ(wrong.status().message().find('\n'), std::string::npos);

  auto right = Sink(db.Path(), server_->Url("m", "writer:s3cret"));
  ASSERT_TRUE(right->Pass().ok());
  ClickHouse ch(*StoreUrl::Parse(server_->Url("m")));
  ASSERT_TRUE(ch.Exec("INSERT INTO schema_version VALUES (" +
                      std::to_string(kStoreSchemaVersion + 1) + ", now())")
                  .ok());
  db.Add(0, 3, NowNs());
  auto newer = Sink(db.Path(), server_->Url("m"))->Pass();
  ASSERT_FALSE(newer.ok());
  EXPECT_EQ(newer.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(
      newer.status().message().find("schema version " + std::to_string(kStoreSchemaVersion + 1)),
      std::string::npos)
      << newer.status().message();
  EXPECT_NE(newer.status().message().find("version " + std::to_string(kStoreSchemaVersion)),
            std::string::npos);
  EXPECT_EQ(*ch.Scalar("SELECT count() FROM spans"), "3") << "what was stored stays";
}

// A store of an older schema version is brought forward one step at a time, each recorded; a step
// that fails says between which versions, and the store stays at the last one completed.
TEST_F(StoreSinkTest, AnOlderStoreIsMigratedStepByStepAndAFailedStepNamesBothVersions) {
  ClickHouse ch(*StoreUrl::Parse(server_->Url("m")));
  ASSERT_TRUE(EnsureStoreSchema(ch).ok());
  ASSERT_EQ(*StoreSchemaVersion(ch), kStoreSchemaVersion);
  const int v = kStoreSchemaVersion;
  const std::vector<StoreMigration> steps = {
      {v + 1, {"ALTER TABLE {db}.spans ADD COLUMN migrated UInt8 DEFAULT 1"}, "", nullptr},
      {v + 2, {"ALTER TABLE {db}.heartbeats ADD COLUMN beat2 UInt8 DEFAULT 2"}, "", nullptr}};
  ASSERT_TRUE(MigrateStore(ch, v, steps).ok());
  EXPECT_EQ(*StoreSchemaVersion(ch), v + 2);
  EXPECT_EQ(*ch.Scalar("SELECT count() FROM system.columns WHERE database = 'm' AND name IN "
                       "('migrated', 'beat2')"),
            "2");
  auto failed =
      MigrateStore(ch, v + 2, {{v + 3, {"ALTER TABLE {db}.nope ADD COLUMN x UInt8"}, "", nullptr}});
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.message().find("from schema version " + std::to_string(v + 2) + " to " +
                                  std::to_string(v + 3)),
            std::string::npos)
      << failed.message();
  EXPECT_EQ(*StoreSchemaVersion(ch), v + 2);
  // This build, older than the store now, refuses it, naming both.
  auto newer = EnsureStoreSchema(ch);
  EXPECT_EQ(newer.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(newer.message().find("schema version " + std::to_string(v + 2)), std::string::npos);
}

// A store of version 1 (heartbeats ordered by attempt, step, rank, ts_ns), as the first builds
// made it, holding two days of heartbeats.
void MakeVersionOneStore(ClickHouse& ch, const std::string& db) {
  for (const std::string& sql :
       {"CREATE DATABASE " + db,
        "CREATE TABLE " + db +
            ".schema_version (version UInt32, applied DateTime) ENGINE = "
            "MergeTree() ORDER BY version",
        "INSERT INTO " + db + ".schema_version VALUES (1, now())",
        "CREATE TABLE " + db +
            ".heartbeats (day Date, job String, src String, row_id UInt64, "
            "node String, rank Int32, attempt Int32, ts_ns Int64, step Int64, phase String) ENGINE "
            "= "
            "MergeTree() PARTITION BY day ORDER BY (job, attempt, step, rank, ts_ns)",
        "INSERT INTO " + db +
            ".heartbeats SELECT toDate('2026-12-06') + (number % 2), 'j1', "
            "'old', number + 1, 'n0', toInt32(number % 8), 0, toInt64(number * 1000), "
            "toInt64(intDiv(number, 8)), 'forward' FROM system.numbers LIMIT 1000"}) {
    auto st = ch.Exec(sql, /*in_database=*/false);
    ASSERT_TRUE(st.ok()) << sql << ": " << st.ToString();
  }
}

// A store of version 1: the sink refuses it with the command that migrates it (its rows wait in
// trace.db); `megascope store init` migrates it, every heartbeat kept once, sorted by time; a
// migration cut short after its rename is finished by running it again.
TEST_F(StoreSinkTest, AVersionOneStoreIsRefusedBySinksAndMigratedByStoreInitRowForRow) {
  ClickHouse root(*StoreUrl::Parse(server_->Url("default")));
  MakeVersionOneStore(root, "m");
  TraceDb db(dir_.path() + "/trace.db");
  db.Add(0, 5, NowNs());
  auto sink = Sink(db.Path(), server_->Url("m"));
  auto refused = sink->Pass();
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  for (const char* says : {"schema version 1", "writes version 2", "megascope store init"})
    EXPECT_NE(refused.status().message().find(says), std::string::npos)
        << refused.status().message();
  EXPECT_EQ(Scalar("SELECT count() FROM system.tables WHERE database = 'm'"), "2")
      << "nothing created or changed";

  const std::string init = std::string(MEGASCOPE_BIN) + " store init --store " + server_->Url("m");
  const auto out = megascope::testing::RunCommand(init);
  ASSERT_EQ(out.code, 0) << out.out;
  EXPECT_NE(out.out.find("schema version 1, migrating to 2"), std::string::npos) << out.out;
  EXPECT_NE(out.out.find("heartbeats: 2026-12-07 sorted anew (2 of 2 days)"), std::string::npos)
      << out.out;
  const auto expect_migrated = [&](const std::string& d) {
    EXPECT_EQ(Scalar("SELECT max(version) FROM schema_version", d), "2");
    EXPECT_EQ(Scalar("SELECT sorting_key FROM system.tables WHERE database = '" + d +
                         "' AND name = 'heartbeats'",
                     d),
              "job, ts_ns, rank");
    EXPECT_EQ(Scalar("SELECT concat(toString(count()), ' ', toString(uniqExact(src, row_id)), ' ', "
                     "toString(sum(row_id)), ' ', toString(sum(ts_ns))) FROM heartbeats WHERE src "
                     "= 'old'",
                     d),
              "1000 1000 500500 499500000");
    EXPECT_EQ(Scalar("SELECT count() FROM system.tables WHERE database = '" + d +
                         "' AND name LIKE '%resort%'",
                     d),
              "0");
  };
  expect_migrated("m");
  ASSERT_TRUE(sink->Pass().ok());  // the rows that waited
  EXPECT_EQ(Scalar("SELECT count() FROM heartbeats WHERE src = '" + sink->src() + "'"),
            std::to_string(db.Count("heartbeat_rows")));

  // Cut short after its rename, with part of the first day copied: run again, it finishes.
  MakeVersionOneStore(root, "m2");
  for (const std::string& sql :
       {std::string("RENAME TABLE m2.heartbeats TO m2.heartbeats_resorting"),
        std::string("CREATE TABLE m2.heartbeats AS m2.heartbeats_resorting ENGINE = MergeTree() "
                    "PARTITION BY day ORDER BY (job, ts_ns, rank)"),
        std::string("INSERT INTO m2.heartbeats SELECT * FROM m2.heartbeats_resorting WHERE day = "
                    "'2026-12-06' AND row_id < 300")})
    ASSERT_TRUE(root.Exec(sql, false).ok()) << sql;
  ClickHouse m2(*StoreUrl::Parse(server_->Url("m2")));
  std::vector<std::string> said;
  ASSERT_TRUE(EnsureStoreSchema(m2, OlderStore::kMigrate, [&](const std::string& line) {
                said.push_back(line);
              }).ok());
  EXPECT_EQ(said.size(), 3u) << "the step, then each of its two days";
  expect_migrated("m2");
}

// Retention drops whole days, per table: raw spans after a week, collectives after four, events
// never. Rows trace.db's own retention removed before they were shipped are counted as dropped.
TEST_F(StoreSinkTest, RetentionDropsWholeOldDaysPerTableAndCountsRowsPrunedBeforeShipping) {
  TraceDb db(dir_.path() + "/trace.db");
  const int64_t now = NowNs();
  db.Add(0, 4, now - 10 * kDayNs);  // older than spans' week, younger than collectives' month
  db.Add(0, 4, now);
  auto sink = Sink(db.Path(), server_->Url("m"));
  ASSERT_TRUE(sink->Pass().ok());
  ClickHouse ch(*StoreUrl::Parse(server_->Url("m")));
  EXPECT_EQ(*ch.Scalar("SELECT uniqExact(day) FROM spans"), "2");
  const std::array<int, 3> days = {DefaultRetentionDays(StoreRetention::kRaw),
                                   DefaultRetentionDays(StoreRetention::kCollectives),
                                   DefaultRetentionDays(StoreRetention::kForever)};
  auto dropped = PruneStore(ch, days, now);
  ASSERT_TRUE(dropped.ok()) << dropped.status().ToString();
  EXPECT_GE(*dropped, 3) << "spans', heartbeats' and metrics' old day";
  EXPECT_EQ(*ch.Scalar("SELECT count() FROM spans"), "4");
  EXPECT_EQ(*ch.Scalar("SELECT count() FROM collectives"), "8");

  // Another node's trace.db keeps a day and its agent's sink starts late: what its retention
  // pruned unshipped is counted, the rest shipped.
  TraceDb late(dir_.path() + "/late.db");
  late.Add(0, 6, now - 2 * kDayNs);
  late.Add(0, 2, now);
  ASSERT_TRUE(late.Store().Prune(now - kDayNs).ok());
  auto late_sink = Sink(late.Path(), server_->Url("m"));
  ASSERT_TRUE(late_sink->Pass().ok());
  EXPECT_EQ(late_sink->dropped_rows(), 4u * 6) << "six steps' span, collective, heartbeat, metric";
  EXPECT_EQ(*ch.Scalar("SELECT count() FROM spans WHERE src = '" + late_sink->src() + "'"), "2");
}

// A store slower than its writers (each INSERT held in a proxy until the test lets it through,
// the server behind it real): trace.db's writes go on beside the held INSERT, the lag grows, the
// sink never sends more than one batch, rows that trace.db's retention removed meanwhile are
// counted as dropped, and once the store keeps up every other row is there once.
TEST_F(StoreSinkTest, AStoreSlowerThanItsWritersLagsHoldsOneBatchAndCountsWhatRetentionPruned) {
  TraceDb db(dir_.path() + "/trace.db");
  const int64_t now = NowNs();
  db.Add(0, 100, now - 2 * kDayNs);  // 100 rows a table on a day trace.db will prune
  megascope::testing::GateProxy proxy(server_->http_port());
  StoreSinkOptions o;
  o.url = *StoreUrl::Parse("clickhouse://127.0.0.1:" + std::to_string(proxy.port()) + "/m");
  o.job = "j1";
  o.node = "n0";
  o.db_path = db.Path();
  o.batch_rows = 20;
  o.batches_per_table = 3;  // a pass ships 60 rows a table at most: the store's pace
  o.timeout_ms = 60000;
  auto sink = StoreSink::Open(o);
  ASSERT_TRUE(sink.ok()) << sink.status().ToString();
  StoreSink& s = **sink;
  ASSERT_TRUE(s.Pass().ok());
  const int64_t lag_before = s.lag_rows();
  EXPECT_GT(lag_before, 0);

  proxy.Shut();
  Result<size_t> held = 0;
  std::thread pass([&] { held = s.Pass(); });
  ASSERT_TRUE(proxy.WaitHeld(std::chrono::seconds(30)));
  db.Add(0, 400, now);  // the writers go on while the store holds an INSERT
  ASSERT_TRUE(db.Store().Prune(now - kDayNs).ok());  // and retention removes the old day
  EXPECT_TRUE(proxy.Holding()) << "trace.db was written beside the held INSERT";
  proxy.Open();
  pass.join();
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  EXPECT_GT(s.lag_rows(), lag_before) << "the ingest outran the store";

  ASSERT_TRUE(s.Pass().ok());  // sums the steps written meanwhile (rank_steps rows: more lag)
  size_t passes = 0;
  while (s.lag_rows() > 0 && passes++ < 100) {
    const int64_t lag = s.lag_rows();
    ASSERT_TRUE(s.Pass().ok());
    EXPECT_LT(s.lag_rows(), lag) << "catching up";
  }
  EXPECT_EQ(s.lag_rows(), 0);
  const std::string today = UtcDay(now);
  // What trace.db still holds arrived once; of the old day, what was shipped before the prune is
  // there and the rest counted as dropped.
  for (const auto& [table, source] : std::map<std::string, std::string>{
           {"spans", "span_rows"}, {"heartbeats", "heartbeat_rows"}, {"metrics", "metrics"}}) {
    EXPECT_EQ(Scalar("SELECT count() FROM " + table + " WHERE day = '" + today + "'"),
              std::to_string(db.Count(source)))
        << table;
    EXPECT_EQ(Scalar("SELECT count() - uniqExact(src, row_id) FROM " + table), "0") << table;
  }
  const int64_t old_shipped =
      std::stoll(Scalar("SELECT (SELECT count() FROM spans WHERE day < '" + today +
                        "') + (SELECT count() FROM collectives WHERE day < '" + today +
                        "') + (SELECT count() FROM heartbeats WHERE day < '" + today +
                        "') + (SELECT count() FROM metrics WHERE day < '" + today + "')"));
  EXPECT_EQ(static_cast<int64_t>(s.dropped_rows()), int64_t{400} - old_shipped);
  EXPECT_GT(s.dropped_rows(), 0u);
  // The sink's memory is a batch: no request carried more than 20 rows, though 1,600 waited.
  const std::string one_batch = Scalar(
      "SELECT sum(length(concat(toString(day), job, src, toString(row_id), node, kind, "
      "name))) + 200 * 20 FROM (SELECT * FROM spans LIMIT 20)");
  EXPECT_LT(proxy.LargestRequest(), std::stoull(one_batch) + 4096) << one_batch;
  EXPECT_GT(proxy.LargestRequest(), 0u);
}

// Two shards behind a Distributed table: each source database's rows live on one shard (by its
// id), the Distributed table reads them all, and a sink's acknowledgement means every shard has
// its rows.
TEST_F(StoreSinkTest, TwoShardsBehindADistributedTableHoldEveryRowOnce) {
  const int tcp_a = megascope::testing::ListenPort(), tcp_b = megascope::testing::ListenPort();
  ClickHouseServer a(dir_.path() + "/a", {tcp_a, tcp_b}, tcp_a);
  ClickHouseServer b(dir_.path() + "/b", {tcp_a, tcp_b}, tcp_b);
  ASSERT_TRUE(a.Start());
  ASSERT_TRUE(b.Start());
  ClickHouse on_b(*StoreUrl::Parse(b.Url("m", "", true)));
  ASSERT_TRUE(EnsureStoreSchema(on_b).ok());  // each shard's tables, before any row goes
  std::vector<std::unique_ptr<TraceDb>> dbs;
  int64_t spans = 0;
  std::map<std::string, int64_t> by_src;
  for (int n = 0; n < 4; ++n) {
    dbs.push_back(std::make_unique<TraceDb>(dir_.path() + "/t" + std::to_string(n) + ".db"));
    dbs.back()->Add(n, 5 + n, NowNs());
    auto sink = Sink(dbs.back()->Path(), a.Url("m", "", true));
    auto got = sink->Pass();
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    spans += 5 + n;
    by_src[sink->src()] = 5 + n;
  }
  ClickHouse on_a(*StoreUrl::Parse(a.Url("m", "", true)));
  EXPECT_EQ(*on_a.Scalar("SELECT count() FROM spans"), std::to_string(spans));
  // Each shard holds the sources its hash gives it.
  int64_t on_shard[2] = {0, 0};
  for (const auto& [src, n] : by_src)
    on_shard[std::stoi(*on_a.Scalar("SELECT cityHash64('" + src + "') % 2"))] += n;
  EXPECT_EQ(*on_a.Scalar("SELECT count() FROM spans_local"), std::to_string(on_shard[0]));
  EXPECT_EQ(*on_b.Scalar("SELECT count() FROM spans_local"), std::to_string(on_shard[1]));
}

}  // namespace
}  // namespace megascope::tracer::agent
