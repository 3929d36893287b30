// The node's trace database (docs/formats.md section 4): SQLite in WAL mode, schema version in
// PRAGMA user_version, prepared statements, one transaction per batch. Each batch also records how
// far it consumed each ring lane (table ring_cursors), in the same transaction, so a restarted
// agent resumes exactly where the database is: no row lost, none written twice.
#pragma once

#include <deque>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "megascope/tracer/records.h"
#include "megascope/tracer/ring.h"
#include "megascope/tracer/snapshot.h"
#include "megascope/tracer/sqlite.h"
#include "megascope/tracer/status.h"
#include "megascope/tracer/trace_schema.h"

namespace megascope::tracer {

// Records drained from one ring, with what is needed to turn them into rows.
struct RingRows {
  const RankInfo* info = nullptr;
  ClockCalibration calibration;
  const std::vector<std::string>* names = nullptr;  // interned span/metric names by id
  const std::vector<GroupInfo>* groups = nullptr;
  std::span<const Record> records;
  std::string ring;                  // cursor key (the ring's file name)
  std::vector<uint64_t> lane_tails;  // consumed-through position per lane after this batch
};

struct MetricRow {
  std::string node;
  int64_t ts_ns;
  std::string name;
  double value;
};

struct DropRow {
  int32_t rank;
  int64_t ts_ns;
  int64_t dropped_records;
};

// Where a write can be interrupted: the fault seam of the crash tests (as leveldb's fault-injection
// tests interrupt theirs at chosen points, not after a sleep and a hope). kBeforeCommit: every row
// of the transaction is inserted and COMMIT is next; kAfterCommit: committed, and the caller has
// not yet advanced its rings.
enum class WritePoint { kBeforeCommit, kAfterCommit };
using WriteHook = std::function<void(WritePoint)>;

// The ops one rank (in one attempt) holds open, for open_ops (trace_schema.h).
struct OpenOps {
  int32_t rank = 0;
  int32_t attempt = 0;
  int64_t seen_ns = 0;
  const std::vector<GroupInfo>* groups = nullptr;  // FlightEntry::group indexes these
  std::vector<FlightEntry> entries;                // only those enqueued or started
};

class TraceStore {
 public:
  // Opens or creates `path` (and its directory) with the schema of trace_schema.h. A database of
  // another schema version is refused.
  // `max_bytes` > 0 caps the file's size: past it writes fail as on a full disk.
  static Result<std::unique_ptr<TraceStore>> Open(const std::string& path, int64_t max_bytes = 0);
  ~TraceStore();

  // Writes everything in one transaction; on error nothing is written (and the caller must not
  // advance the rings).
  Status Write(std::span<const RingRows> rings, std::span<const MetricRow> metrics,
               std::span<const DropRow> drops);
  Status UpsertRank(const RankInfo& info);
  // Replaces each listed rank-attempt's rows of open_ops with its entries, in one transaction.
  Status ReplaceOpenOps(std::span<const OpenOps> ranks);
  // Retention: drops the rows older than `before_ns` (wall clock) from spans, collectives,
  // heartbeats, metrics and drops, summing the spans and collectives into step_rollups first, in
  // one transaction. Rows arrive about in time order, so a table's old rows are those before its
  // first row at or after the cutoff: the newest are never dropped, and the cost is that of the
  // rows dropped, not of the table. The per-step rollups are kept longer: those whose last row
  // is older than `rollups_before_ns` go in the same pass (rollups are appended in time order
  // too). Returns the rows dropped.
  Result<int64_t> Prune(int64_t before_ns,
                        int64_t rollups_before_ns = std::numeric_limits<int64_t>::min());
  // The consumed-through position per lane of `ring` (empty if never seen).
  Result<std::vector<uint64_t>> Cursors(const std::string& ring);
  const std::string& path() const { return path_; }
  // Called at each WritePoint of every Write (tests only; none by default).
  void set_write_hook(WriteHook hook) { hook_ = std::move(hook); }

 private:
  TraceStore() = default;
  // The id of group `name` in group_names, added in the current transaction when new.
  Result<int64_t> GroupId(const std::string& name);
  // One ring's records and lane cursors added to the batches: nullptr, or what could not be
  // inserted. `group_of_index`: the ring's group index -> group_names id (-1: not yet).
  const char* AddRing(const RingRows& rr, std::vector<int64_t>& group_of_index);
  const char* AddSpan(const RingRows& rr, const SpanRecord& sp);
  const char* AddCollective(const RingRows& rr, const CollectiveRecord& c,
                            std::vector<int64_t>& group_of_index);

  // The rows of one table, inserted many to a statement (INSERT ... VALUES (..),(..),...): a
  // statement's step (starting SQLite's VM, halting it, resetting it) costs more than the small row
  // it inserts, so a writer that steps once per row spends most of its time there. Rows wait here
  // until Flush() (or until kMaxRows are pending) and go out in statements of 64, 32, ..., 1 rows.
  class BatchInsert {
   public:
    // One value of a row: NULL (the default), an integer, a real or text (which must outlive the
    // next Flush()).
    struct Cell {
      enum class Type : uint8_t { kNull, kInt, kReal, kText };
      Cell() = default;
      Cell(int64_t v) : type(Type::kInt), i(v) {}            // NOLINT(google-explicit-constructor)
      Cell(int v) : type(Type::kInt), i(v) {}                // NOLINT(google-explicit-constructor)
      Cell(double v) : type(Type::kReal), d(v) {}            // NOLINT(google-explicit-constructor)
      Cell(std::string_view v) : type(Type::kText), s(v) {}  // NOLINT(google-explicit-constructor)
      Cell(const std::string& v)
          : type(Type::kText), s(v) {}  // NOLINT(google-explicit-constructor)
      Type type = Type::kNull;
      int64_t i = 0;
      double d = 0;
      std::string_view s;
    };
    static constexpr int kMaxRows = 64;
    // `verb`: "INSERT" or "INSERT OR REPLACE".
    Status Prepare(const sql::Database& db, std::string_view verb, std::string_view table,
                   int cols);
    // Adds a row of exactly the table's columns; flushes when kMaxRows are pending.
    Status Add(std::initializer_list<Cell> row);
    Status Flush();
    void Clear() { cells_.clear(); }
    size_t pending_rows() const { return cols_ == 0 ? 0 : cells_.size() / cols_; }
    const std::string& table() const { return table_; }

   private:
    std::string table_;
    size_t cols_ = 0;
    std::vector<sql::Statement> by_log2_rows_;  // [k] inserts 2^k rows
    std::vector<Cell> cells_;
  };

  std::string path_;
  WriteHook hook_;
  sql::Database db_;
  BatchInsert spans_, device_spans_, collectives_, heartbeats_, metrics_, drops_, cursors_;
  std::deque<std::string> texts_;  // text made up for the rows of the current Write
  sql::Statement rank_, get_cursor_, group_get_, group_add_, open_clear_, open_add_;
  std::unordered_map<std::string, int64_t> group_ids_;  // a cache of group_names
};

}  // namespace megascope::tracer
