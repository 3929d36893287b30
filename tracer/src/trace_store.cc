#include "megascope/tracer/trace_store.h"

#include <algorithm>
#include <filesystem>

namespace megascope::tracer {
namespace {

int64_t Ns(const ClockCalibration& c, int64_t ticks) { return ticks == 0 ? 0 : c.ToNs(ticks); }

// "<verb> INTO t VALUES(?,..),(?,..),..." with `rows` rows of `cols` columns.
std::string MultiRowInsert(std::string_view verb, std::string_view table, size_t cols,
                           size_t rows) {
  std::string row = "(";
  for (size_t c = 0; c < cols; ++c) row += c ? ",?" : "?";
  row += ")";
  std::string sql = std::string(verb) + " INTO " + std::string(table) + " VALUES";
  for (size_t r = 0; r < rows; ++r) sql += (r ? "," : "") + row;
  return sql;
}

}  // namespace

Result<std::unique_ptr<TraceStore>> TraceStore::Open(const std::string& path, int64_t max_bytes) {
  std::error_code ec;
  std::filesystem::path p(path);
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path(), ec);
  if (ec)
    return IoError("cannot create directory " + p.parent_path().string() + ": " + ec.message());
  std::unique_ptr<TraceStore> s(new TraceStore());
  s->path_ = path;
  ASSIGN_OR_RETURN(s->db_, sql::Database::Open(path, sql::Database::Mode::kReadWrite, "[store]"));
  auto version = s->db_.QueryInt("PRAGMA user_version");
  if (!version.ok()) return s->db_.Error("cannot read the schema version (not a database?)");
  if (*version != 0 && *version != kTraceSchemaVersion) {
    return FailedPrecondition(path + " has trace schema version " + std::to_string(*version) +
                              "; this build writes version " + std::to_string(kTraceSchemaVersion));
  }
  RETURN_IF_ERROR(
      s->db_.Exec("PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA cache_size=-65536;"));
  RETURN_IF_ERROR(s->db_.Exec(TraceSchemaSql()));
  RETURN_IF_ERROR(s->db_.Exec("PRAGMA user_version=" + std::to_string(kTraceSchemaVersion)));
  if (max_bytes > 0) {
    RETURN_IF_ERROR(s->db_.Exec("PRAGMA max_page_count=" +
                                std::to_string(std::max<int64_t>(1, max_bytes / 4096))));
  }
  struct {
    TraceStore::BatchInsert* batch;
    std::string_view verb, table;
    int cols;
  } batches[] = {
      {&s->spans_, "INSERT", "span_rows", 8},
      {&s->collectives_, "INSERT", "collective_rows", 13},
      {&s->heartbeats_, "INSERT", "heartbeat_rows", 5},
      {&s->metrics_, "INSERT", "metrics", 4},
      {&s->drops_, "INSERT", "drops", 3},
      {&s->device_spans_, "INSERT", "device_spans", 8},
      {&s->cursors_, "INSERT OR REPLACE", "ring_cursors", 3},
  };
  for (auto& b : batches) RETURN_IF_ERROR(b.batch->Prepare(s->db_, b.verb, b.table, b.cols));
  struct {
    sql::Statement* stmt;
    std::string_view sql;
  } stmts[] = {
      {&s->rank_, "INSERT OR REPLACE INTO ranks VALUES(?,?,?,?,?,?,?,?,?)"},
      {&s->get_cursor_, "SELECT lane, tail FROM ring_cursors WHERE ring = ? ORDER BY lane"},
      {&s->group_get_, "SELECT id FROM group_names WHERE name = ?"},
      {&s->group_add_, "INSERT INTO group_names(name) VALUES(?)"},
      {&s->open_clear_, "DELETE FROM open_ops WHERE rank = ? AND attempt = ?"},
      {&s->open_add_, "INSERT INTO open_ops VALUES(?,?,?,?,?,?,?,?,?,?,?,?)"},
  };
  for (auto& st : stmts) {
    auto prepared = s->db_.Prepare(st.sql, /*persistent=*/true);
    if (!prepared.ok()) return s->db_.Error("cannot prepare a statement");
    *st.stmt = std::move(*prepared);
  }
  return s;
}

TraceStore::~TraceStore() = default;

Result<int64_t> TraceStore::GroupId(const std::string& name) {
  if (auto it = group_ids_.find(name); it != group_ids_.end()) return it->second;
  group_get_.Bind(1, name);
  ASSIGN_OR_RETURN(bool found, group_get_.Step());
  int64_t id = found ? group_get_.Int(0) : 0;
  group_get_.Reset();
  if (!found) {
    RETURN_IF_ERROR(group_add_.Bind(1, name).Run());
    ASSIGN_OR_RETURN(id, db_.QueryInt("SELECT last_insert_rowid()"));
  }
  group_ids_.emplace(name, id);
  return id;
}

Status TraceStore::BatchInsert::Prepare(const sql::Database& db, std::string_view verb,
                                        std::string_view table, int cols) {
  table_ = table;
  cols_ = static_cast<size_t>(cols);
  by_log2_rows_.clear();
  for (size_t rows = 1; rows <= kMaxRows; rows *= 2) {
    auto st = db.Prepare(MultiRowInsert(verb, table, cols_, rows), /*persistent=*/true);
    if (!st.ok()) return db.Error("cannot prepare the insert into " + std::string(table));
    by_log2_rows_.push_back(std::move(*st));
  }
  cells_.reserve(kMaxRows * cols_);
  return Status::Ok();
}

Status TraceStore::BatchInsert::Add(std::initializer_list<Cell> row) {
  if (row.size() != cols_)
    return InvalidArgument("a row of " + std::to_string(row.size()) + " values for a table of " +
                           std::to_string(cols_) + " columns");
  cells_.insert(cells_.end(), row.begin(), row.end());
  return pending_rows() == kMaxRows ? Flush() : Status::Ok();
}

Status TraceStore::BatchInsert::Flush() {
  const size_t rows = pending_rows();
  size_t done = 0;
  while (done < rows) {
    size_t k = by_log2_rows_.size() - 1;
    while ((size_t{1} << k) > rows - done) --k;
    sql::Statement& st = by_log2_rows_[k];
    const size_t first = done * cols_, n = (size_t{1} << k) * cols_;
    for (size_t i = 0; i < n; ++i) {
      const Cell& c = cells_[first + i];
      const int param = static_cast<int>(i) + 1;
      switch (c.type) {
        case Cell::Type::kNull:
          st.BindNull(param);
          break;
        case Cell::Type::kInt:
          st.Bind(param, c.i);
          break;
        case Cell::Type::kReal:
          st.Bind(param, c.d);
          break;
        case Cell::Type::kText:
          st.Bind(param, c.s);
          break;
      }
    }
    if (Status s = st.Run(); !s.ok()) {
      cells_.clear();
      return s;
    }
    done += size_t{1} << k;
  }
  cells_.clear();
  return Status::Ok();
}

namespace {
const std::string kUnknownName = "?";
}  // namespace

const char* TraceStore::AddSpan(const RingRows& rr, const SpanRecord& sp) {
  using Cell = BatchInsert::Cell;
  const int rank = rr.info->rank, attempt = rr.info->attempt;
  const std::string& name = sp.name < rr.names->size() ? (*rr.names)[sp.name] : kUnknownName;
  const int64_t start = Ns(rr.calibration, sp.start_ticks);
  if (!spans_
           .Add({rank, attempt, sp.step, sp.microbatch < 0 ? Cell() : Cell(sp.microbatch),
                 static_cast<int>(sp.kind), name, start, Ns(rr.calibration, sp.end_ticks) - start})
           .ok())
    return "cannot insert spans";
  if (IsDeviceSpan(sp.kind) &&
      !device_spans_
           .Add({rank, attempt, Name(sp.kind), start, static_cast<int64_t>(sp.device),
                 static_cast<int64_t>(sp.stream), static_cast<int64_t>(sp.correlation),
                 static_cast<int64_t>(sp.bytes)})
           .ok())
    return "cannot insert device spans";
  return nullptr;
}

const char* TraceStore::AddCollective(const RingRows& rr, const CollectiveRecord& c,
                                      std::vector<int64_t>& group_of_index) {
  using Cell = BatchInsert::Cell;
  const bool known = c.group < rr.groups->size();
  int64_t group = known ? group_of_index[c.group] : -1;
  if (group < 0) {
    auto id = GroupId(known ? (*rr.groups)[c.group].name : kUnknownName);
    if (!id.ok()) return "cannot record a group name";
    group = *id;
    if (known) group_of_index[c.group] = group;
  }
  const int64_t enqueued = Ns(rr.calibration, c.enqueued_ticks);
  if (!collectives_
           .Add({rr.info->rank, rr.info->attempt, static_cast<int64_t>(c.step), group,
                 static_cast<int64_t>(c.seq), static_cast<int>(c.op),
                 c.peer < 0 ? Cell() : Cell(c.peer), static_cast<int64_t>(c.bytes),
                 static_cast<int>(c.dtype), static_cast<int>(c.state), enqueued,
                 c.started_ticks == 0 ? Cell()
                                      : Cell(Ns(rr.calibration, c.started_ticks) - enqueued),
                 Ns(rr.calibration, c.completed_ticks) - enqueued})
           .ok())
    return "cannot insert a collective";
  return nullptr;
}

const char* TraceStore::AddRing(const RingRows& rr, std::vector<int64_t>& group_of_index) {
  const int rank = rr.info->rank, attempt = rr.info->attempt;
  group_of_index.assign(rr.groups->size(), -1);
  for (const Record& r : rr.records) {
    const char* failed = nullptr;
    switch (r.type) {
      case RecordType::kSpan:
        failed = AddSpan(rr, r.span);
        break;
      case RecordType::kCollective:
        failed = AddCollective(rr, r.collective, group_of_index);
        break;
      case RecordType::kHeartbeat: {
        const HeartbeatRecord& h = r.heartbeat;
        if (!heartbeats_
                 .Add({rank, attempt, Ns(rr.calibration, h.ticks), h.step,
                       static_cast<int>(h.phase)})
                 .ok())
          failed = "cannot insert a heartbeat";
        break;
      }
      case RecordType::kMetric: {
        const MetricRecord& m = r.metric;
        const std::string& name =
            texts_.emplace_back("rank" + std::to_string(rank) + "." +
                                (m.name < rr.names->size() ? (*rr.names)[m.name] : kUnknownName));
        if (!metrics_.Add({rr.info->node, Ns(rr.calibration, m.ticks), name, m.value}).ok())
          failed = "cannot insert a metric";
        break;
      }
      default:
        break;
    }
    if (failed != nullptr) return failed;
  }
  for (size_t lane = 0; lane < rr.lane_tails.size(); ++lane) {
    if (!cursors_.Add({rr.ring, static_cast<int>(lane), static_cast<int64_t>(rr.lane_tails[lane])})
             .ok())
      return "cannot record a ring cursor";
  }
  return nullptr;
}

Status TraceStore::Write(std::span<const RingRows> rings, std::span<const MetricRow> metrics,
                         std::span<const DropRow> drops) {
  BatchInsert* const batches[] = {&spans_,   &device_spans_, &collectives_, &heartbeats_,
                                  &metrics_, &drops_,        &cursors_};
  texts_.clear();
  RETURN_IF_ERROR(db_.Exec("BEGIN"));
  auto fail = [&](std::string_view what) {
    Status st = db_.Error(what);
    (void)db_.Exec("ROLLBACK");
    for (BatchInsert* b : batches) b->Clear();
    group_ids_.clear();  // ids added in the rolled-back transaction are gone
    return st;
  };
  std::vector<int64_t> group_of_index;
  for (const RingRows& rr : rings) {
    if (const char* failed = AddRing(rr, group_of_index)) return fail(failed);
  }
  for (const MetricRow& m : metrics) {
    if (!metrics_.Add({m.node, m.ts_ns, m.name, m.value}).ok())
      return fail("cannot insert a metric");
  }
  for (const DropRow& d : drops) {
    if (!drops_.Add({d.rank, d.ts_ns, d.dropped_records}).ok())
      return fail("cannot insert a drop count");
  }
  for (BatchInsert* b : batches) {
    if (!b->Flush().ok()) return fail("cannot insert into " + b->table());
  }
  if (hook_) hook_(WritePoint::kBeforeCommit);
  if (!db_.Exec("COMMIT").ok()) return fail("cannot commit");
  if (hook_) hook_(WritePoint::kAfterCommit);
  return Status::Ok();
}

Result<int64_t> TraceStore::Prune(int64_t before_ns, int64_t rollups_before_ns) {
  // The rowid of a table's first row at or after the cutoff, at most its last row's: a table's
  // newest row stays past its retention, so that rowids only ever grow (SQLite numbers a new row
  // after the largest rowid there, from 1 in an empty table) -- the store's sink names each row
  // by its rowid and ships above a cursor.
  auto boundary = [&](const char* table, const char* time, int64_t cutoff) {
    return db_.QueryInt(
        std::string("SELECT MIN(COALESCE((SELECT rowid FROM ") + table + " WHERE " + time +
        " >= " + std::to_string(cutoff) +
        " ORDER BY rowid LIMIT 1), 1 << 62), (SELECT COALESCE(MAX(rowid), 0) FROM " + table + "))");
  };
  ASSIGN_OR_RETURN(const int64_t rollups, boundary("step_rollups", "last_ns", rollups_before_ns));
  ASSIGN_OR_RETURN(const int64_t spans, boundary("span_rows", "start_ns", before_ns));
  ASSIGN_OR_RETURN(const int64_t colls, boundary("collective_rows", "enqueued_ns", before_ns));
  ASSIGN_OR_RETURN(const int64_t beats, boundary("heartbeat_rows", "ts_ns", before_ns));
  ASSIGN_OR_RETURN(const int64_t metrics, boundary("metrics", "ts_ns", before_ns));
  ASSIGN_OR_RETURN(const int64_t drops, boundary("drops", "ts_ns", before_ns));
  RETURN_IF_ERROR(db_.Exec("BEGIN"));
  Status st = db_.Exec(TraceRollupSql(spans, colls));
  Result<int64_t> before = db_.QueryInt("SELECT total_changes()");
  if (st.ok() && !before.ok()) st = before.status();
  if (st.ok())
    st = db_.Exec("DELETE FROM span_rows WHERE rowid < " + std::to_string(spans) +
                  "; DELETE FROM collective_rows WHERE rowid < " + std::to_string(colls) +
                  "; DELETE FROM heartbeat_rows WHERE rowid < " + std::to_string(beats) +
                  "; DELETE FROM metrics WHERE rowid < " + std::to_string(metrics) +
                  "; DELETE FROM drops WHERE rowid < " + std::to_string(drops) +
                  "; DELETE FROM step_rollups WHERE rowid < " + std::to_string(rollups) +
                  "; DELETE FROM open_ops WHERE seen_ns < " + std::to_string(before_ns) +
                  "; DELETE FROM device_spans WHERE start_ns < " + std::to_string(before_ns) +
                  " AND rowid < (SELECT MAX(rowid) FROM device_spans);");
  if (st.ok()) st = db_.Exec("COMMIT");
  if (!st.ok()) {
    (void)db_.Exec("ROLLBACK");
    return st.WithContext("retention on " + path_);
  }
  ASSIGN_OR_RETURN(const int64_t after, db_.QueryInt("SELECT total_changes()"));
  return after - *before;
}

Status TraceStore::UpsertRank(const RankInfo& i) {
  rank_.Bind(1, i.rank)
      .Bind(2, i.node)
      .Bind(3, i.local_rank)
      .Bind(4, i.coords.dp)
      .Bind(5, i.coords.pp)
      .Bind(6, i.coords.tp)
      .Bind(7, static_cast<int64_t>(i.pid))
      .Bind(8, i.attempt)
      .Bind(9, i.clock_offset_ns);
  return rank_.Run().ok() ? Status::Ok() : db_.Error("cannot record a rank");
}

Status TraceStore::ReplaceOpenOps(std::span<const OpenOps> ranks) {
  if (ranks.empty()) return Status::Ok();
  RETURN_IF_ERROR(db_.Exec("BEGIN"));
  auto fail = [&](const std::string& what) {
    Status e = db_.Error(what);
    (void)db_.Exec("ROLLBACK");
    return e;
  };
  for (const OpenOps& r : ranks) {
    open_clear_.Bind(1, r.rank).Bind(2, r.attempt);
    if (!open_clear_.Run().ok()) return fail("cannot replace a rank's open ops");
    for (const FlightEntry& e : r.entries) {
      const std::string group =
          r.groups != nullptr && e.group >= 0 && static_cast<size_t>(e.group) < r.groups->size()
              ? (*r.groups)[static_cast<size_t>(e.group)].name
              : "group" + std::to_string(e.group);
      open_add_.Bind(1, r.rank)
          .Bind(2, r.attempt)
          .Bind(3, group)
          .Bind(4, static_cast<int64_t>(e.seq))
          .Bind(5, Name(e.op))
          .Bind(6, e.peer)
          .Bind(7, static_cast<int64_t>(e.bytes))
          .Bind(8, Name(e.dtype))
          .Bind(9, Name(e.state))
          .Bind(10, e.enqueued_at_ns);
      if (e.state == OpState::kStarted && e.started_at_ns > 0)
        open_add_.Bind(11, e.started_at_ns);
      else
        open_add_.BindNull(11);
      open_add_.Bind(12, r.seen_ns);
      if (!open_add_.Run().ok()) return fail("cannot record an open op");
    }
  }
  if (!db_.Exec("COMMIT").ok()) return fail("cannot commit open ops");
  return Status::Ok();
}

Result<std::vector<uint64_t>> TraceStore::Cursors(const std::string& ring) {
  std::vector<uint64_t> tails;
  get_cursor_.Bind(1, ring);
  for (;;) {
    auto row = get_cursor_.Step();
    if (!row.ok()) {
      get_cursor_.Reset();
      return db_.Error("cannot read ring cursors");
    }
    if (!*row) break;
    const int64_t lane = get_cursor_.Int(0);
    if (lane >= 0 && lane < 4096) {
      if (tails.size() <= static_cast<size_t>(lane)) tails.resize(lane + 1, 0);
      tails[lane] = static_cast<uint64_t>(get_cursor_.Int(1));
    }
  }
  get_cursor_.Reset();
  return tails;
}

}  // namespace megascope::tracer
