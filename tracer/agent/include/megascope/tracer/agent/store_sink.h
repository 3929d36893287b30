// The agent's ClickHouse sink (docs/formats.md section 4b): ships what the agent committed to
// trace.db (or the controller to control.db) into the fleet's store, in rowid order, one INSERT per
// batch of rows of one day (one partition: atomic in a MergeTree table).
//
// Exactly once: a table's cursor (the last rowid ClickHouse acknowledged) is committed in the
// source database only after the acknowledgement. A kill between the two, a timeout whose INSERT
// did land, or a restarted ClickHouse leaves the cursor behind what the store holds; so before its
// first batch, and after every failed one, the sink asks the store for the largest row_id it holds
// of this database and goes on from there. Nothing is lost (the rows wait in the database) and
// nothing is written twice (the store's largest row_id is exact, because batches go one at a
// time, in order, each all or nothing).
//
// Back-pressure stops here: the sink runs beside the drain (its own thread and SQLite connection);
// when ClickHouse is slow or down the rows wait in the database (lag_rows() grows; memory is one
// batch), and rows that the database's retention removes before they were shipped are counted
// (dropped_rows()), never waited for.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "megascope/tracer/clickhouse.h"
#include "megascope/tracer/sqlite.h"
#include "megascope/tracer/status.h"
#include "megascope/tracer/store_schema.h"

namespace megascope::tracer::agent {

struct StoreSinkOptions {
  StoreUrl url;
  std::string job = "train";
  std::string node = "node0";
  std::string db_path;  // trace.db, or control.db for kControl
  StoreSource source = StoreSource::kTrace;
  size_t batch_rows = 20000;   // rows per INSERT at most (the sink's memory)
  int batches_per_table = 16;  // per table and Pass(), so one busy table cannot starve the others
  int timeout_ms = 10000;
  // The fault seam of the exactly-once tests: called after the store acknowledged an INSERT into
  // `table` and before the cursor moves; an error here is an acknowledgement lost on the way (the
  // rows are in the store, the sink does not know it).
  std::function<Status(std::string_view table)> after_insert;

  // The options of a sink of `db_path` (a trace.db, or control.db for kControl) to the store at
  // `url` (clickhouse://...; an error names what is wrong with it), the rest at their defaults.
  static Result<StoreSinkOptions> Of(std::string_view url, std::string job, std::string node,
                                     std::string db_path, StoreSource source = StoreSource::kTrace);
};

class StoreSink {
 public:
  // Opens the source database (the store is not asked yet: an unreachable store is not an error
  // until the first Pass()).
  static Result<std::unique_ptr<StoreSink>> Open(const StoreSinkOptions& options);

  // Ships what is pending, table by table; returns the rows the store acknowledged. An error
  // (the store unreachable, refusing, or of another schema version) leaves the rest for the next
  // pass; what was acknowledged before it stays shipped. First, each rank's steps that are over
  // (its next step, or its next attempt, is in trace.db) are summed into rank_steps; `last`: every
  // step is (the database's last pass: its agent is stopping, or is gone).
  Result<size_t> Pass(bool last = false);

  int64_t lag_rows() const { return lag_rows_; }  // after the last Pass()
  uint64_t shipped_rows() const { return shipped_rows_; }
  uint64_t dropped_rows() const { return dropped_rows_; }
  uint64_t errors() const { return errors_; }
  const std::string& src() const { return src_; }  // this database's id in the store

 private:
  StoreSink(StoreSinkOptions options, sql::Database db);
  Result<size_t> PassOnce(bool last);  // Pass() but for the lag
  Status FindTables();                 // notes the source tables that exist now
  Status Resync();  // the schema ensured and every cursor at least the store's largest row_id
  Status SaveCursor(const StoreTable& t, int64_t row_id);
  Result<size_t> ShipTable(const StoreTable& t, size_t index);
  Result<size_t> ShipOpenOps(const StoreTable& t, size_t index);
  // Sums the steps that are over into store_rank_steps (in trace.db, shipped as rank_steps).
  Status SumSteps(bool all);
  Status StartSums();     // the table, and each rank's last step summed (after a restart)
  Status NoteNewSteps();  // the steps of the rows stored since the last look
  // One row's four common cells ("day\tjob\tsrc\trow_id").
  void AppendCommon(std::string& out, int64_t time_ns, int64_t row_id) const;

  StoreSinkOptions opt_;
  ClickHouse ch_;
  sql::Database db_;
  std::string src_;
  std::string store_key_;         // the store, as the cursor table names it
  std::vector<int64_t> cursors_;  // by StoreTables() index
  std::vector<bool> present_;     // the source database has the table
  bool in_sync_ = false;
  size_t open_ops_hash_ = 0;  // the content of the last look shipped (0: none this process)
  // SumSteps' progress: per (attempt, rank) the last step summed and the newest seen, the newest
  // attempt per rank, and per (attempt, rank, step) not yet summed the first rowid of its rows in
  // span_rows and collective_rows (what a sum reads starts there, not at the table's start).
  using RankKey = std::pair<int64_t, int64_t>;
  std::map<RankKey, int64_t> summed_, newest_;
  std::map<int64_t, int64_t> newest_attempt_;
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::pair<int64_t, int64_t>> pending_steps_;
  int64_t spans_seen_ = 0, collectives_seen_ = 0;  // rowids looked at
  bool steps_ready_ = false;
  int64_t lag_rows_ = 0;
  uint64_t shipped_rows_ = 0, dropped_rows_ = 0, errors_ = 0;
};

// Runs sinks beside the agent: a pass over each every `interval_s` on a thread of its own. Says
// (through `log`) when the store fails -- once, until it works again -- and when it has caught up.
class StoreLoop {
 public:
  static Result<std::unique_ptr<StoreLoop>> Start(const std::vector<StoreSinkOptions>& sinks,
                                                  double interval_s,
                                                  std::function<void(const std::string&)> log);
  // Ends the thread, then a last pass (when the store answered the one before: a store that is
  // down does not hold up an agent's exit; its rows wait in the database for the next agent).
  // Idempotent; the destructor calls it.
  void Finish();
  ~StoreLoop() { Finish(); }
  // megascope_store_rows_total, _lag_rows, _dropped_rows_total, _errors_total (docs/formats.md
  // section 5) in Prometheus' text format, with `labels` ("job=\"j\",node=\"n\"").
  std::string MetricsText(const std::string& labels) const;

 private:
  StoreLoop() = default;
  void PassAll(bool last = false);
  std::vector<std::unique_ptr<StoreSink>> sinks_;
  std::function<void(const std::string&)> log_;
  double interval_s_ = 1;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;
  bool finished_ = false;
  bool failing_ = false;
  std::atomic<int64_t> lag_{0};
  std::atomic<uint64_t> rows_{0}, dropped_{0}, errors_{0};
};

}  // namespace megascope::tracer::agent
