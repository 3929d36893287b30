#include "megascope/tracer/trace_store.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

namespace megascope::tracer {
namespace {

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS ranks(rank INTEGER, node TEXT, local_rank INTEGER, dp INTEGER, pp INTEGER, tp INTEGER,
                                 pid INTEGER, attempt INTEGER, clock_offset_ns INTEGER, PRIMARY KEY(rank, attempt));
CREATE TABLE IF NOT EXISTS spans(rank INTEGER, attempt INTEGER, step INTEGER, microbatch INTEGER, kind TEXT,
                                 name TEXT, start_ns INTEGER, end_ns INTEGER);
CREATE TABLE IF NOT EXISTS collectives(rank INTEGER, attempt INTEGER, grp TEXT, seq INTEGER, op TEXT, peer INTEGER,
                                       bytes INTEGER, dtype TEXT, state TEXT, enqueued_ns INTEGER, started_ns INTEGER,
                                       completed_ns INTEGER);
CREATE TABLE IF NOT EXISTS heartbeats(rank INTEGER, attempt INTEGER, ts_ns INTEGER, step INTEGER, phase TEXT);
CREATE TABLE IF NOT EXISTS metrics(node TEXT, ts_ns INTEGER, name TEXT, value REAL);
CREATE TABLE IF NOT EXISTS drops(rank INTEGER, ts_ns INTEGER, dropped_records INTEGER);
CREATE TABLE IF NOT EXISTS ring_cursors(ring TEXT, lane INTEGER, tail INTEGER, PRIMARY KEY(ring, lane));
-- No indexes: ingest speed comes first; queries over a node's file scan.
)sql";

int64_t Ns(const ClockCalibration& c, int64_t ticks) { return ticks == 0 ? 0 : c.ToNs(ticks); }

// "INSERT INTO t VALUES(?,..),(?,..),..." with `rows` rows of `cols` columns: one statement step
// per many rows is most of what makes ingest fast.
std::string MultiRowInsert(const char* table, int cols, int rows) {
  std::string row = "(";
  for (int c = 0; c < cols; ++c) row += c ? ",?" : "?";
  row += ")";
  std::string sql = std::string("INSERT INTO ") + table + " VALUES";
  for (int r = 0; r < rows; ++r) sql += (r ? "," : "") + row;
  return sql;
}

}  // namespace

Status TraceStore::Error(const char* what) const {
  return IoError(std::string("[store] ") + what + " on " + path_ + ": " + sqlite3_errmsg(db_));
}

Status TraceStore::Exec(const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : "unknown error";
    sqlite3_free(err);
    return IoError("[store] " + path_ + ": " + msg);
  }
  return Status::Ok();
}

Result<std::unique_ptr<TraceStore>> TraceStore::Open(const std::string& path, int64_t max_bytes) {
  std::error_code ec;
  std::filesystem::path p(path);
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path(), ec);
  if (ec)
    return IoError("cannot create directory " + p.parent_path().string() + ": " + ec.message());
  // Created 0600: traces name hosts, ranks and timings of someone's job.
  if (const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600); fd >= 0)
    ::close(fd);
  std::unique_ptr<TraceStore> s(new TraceStore());
  s->path_ = path;
  if (sqlite3_open_v2(path.c_str(), &s->db_,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                      nullptr) != SQLITE_OK) {
    return s->Error("cannot open");
  }
  sqlite3_busy_timeout(s->db_, 5000);
  sqlite3_stmt* v = nullptr;
  int version = 0;
  if (sqlite3_prepare_v2(s->db_, "PRAGMA user_version", -1, &v, nullptr) != SQLITE_OK) {
    return s->Error("cannot read the schema version (not a database?)");
  }
  if (sqlite3_step(v) == SQLITE_ROW) version = sqlite3_column_int(v, 0);
  sqlite3_finalize(v);
  if (version != 0 && version != kTraceSchemaVersion) {
    return FailedPrecondition(path + " has trace schema version " + std::to_string(version) +
                              "; this build writes version " + std::to_string(kTraceSchemaVersion));
  }
  RETURN_IF_ERROR(
      s->Exec("PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA cache_size=-65536;"));
  RETURN_IF_ERROR(s->Exec(kSchema));
  RETURN_IF_ERROR(s->Exec(("PRAGMA user_version=" + std::to_string(kTraceSchemaVersion)).c_str()));
  if (max_bytes > 0) {
    RETURN_IF_ERROR(
        s->Exec(("PRAGMA max_page_count=" + std::to_string(std::max<int64_t>(1, max_bytes / 4096)))
                    .c_str()));
  }
  const std::string span_multi_sql = MultiRowInsert("spans", 8, kSpanRowsPerInsert);
  struct {
    sqlite3_stmt** stmt;
    const char* sql;
  } stmts[] = {
      {&s->span_, "INSERT INTO spans VALUES(?,?,?,?,?,?,?,?)"},
      {&s->span_multi_, span_multi_sql.c_str()},
      {&s->coll_, "INSERT INTO collectives VALUES(?,?,?,?,?,?,?,?,?,?,?,?)"},
      {&s->hb_, "INSERT INTO heartbeats VALUES(?,?,?,?,?)"},
      {&s->metric_, "INSERT INTO metrics VALUES(?,?,?,?)"},
      {&s->drop_, "INSERT INTO drops VALUES(?,?,?)"},
      {&s->cursor_, "INSERT OR REPLACE INTO ring_cursors VALUES(?,?,?)"},
      {&s->rank_, "INSERT OR REPLACE INTO ranks VALUES(?,?,?,?,?,?,?,?,?)"},
      {&s->get_cursor_, "SELECT lane, tail FROM ring_cursors WHERE ring = ? ORDER BY lane"},
  };
  for (auto& st : stmts) {
    if (sqlite3_prepare_v3(s->db_, st.sql, -1, SQLITE_PREPARE_PERSISTENT, st.stmt, nullptr) !=
        SQLITE_OK) {
      return s->Error("cannot prepare a statement");
    }
  }
  return s;
}

TraceStore::~TraceStore() {
  for (sqlite3_stmt* st :
       {span_, span_multi_, coll_, hb_, metric_, drop_, cursor_, rank_, get_cursor_})
    sqlite3_finalize(st);
  if (db_ != nullptr) sqlite3_close(db_);
}

Status TraceStore::Write(std::span<const RingRows> rings, std::span<const MetricRow> metrics,
                         std::span<const DropRow> drops) {
  RETURN_IF_ERROR(Exec("BEGIN"));
  auto fail = [&](const char* what) {
    Status st = Error(what);
    sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
    return st;
  };
  auto run = [](sqlite3_stmt* st) {
    const int rc = sqlite3_step(st);
    sqlite3_reset(st);
    return rc == SQLITE_DONE;
  };
  static const std::string kUnknown = "?";
  struct SpanRow {
    int64_t step;
    int32_t microbatch;
    std::string_view kind;
    const std::string* name;
    int64_t start_ns, end_ns;
  };
  SpanRow spans[kSpanRowsPerInsert];
  int pending_spans = 0;
  // Binds the pending spans into `st` (the multi-row statement when full, else row by row).
  auto flush_spans = [&](sqlite3_stmt* st, int rank, int attempt) {
    const int per_step = st == span_multi_ ? kSpanRowsPerInsert : 1;
    for (int first = 0; first < pending_spans; first += per_step) {
      for (int k = 0; k < per_step; ++k) {
        const SpanRow& row = spans[first + k];
        const int b = k * 8;
        sqlite3_bind_int(st, b + 1, rank);
        sqlite3_bind_int(st, b + 2, attempt);
        sqlite3_bind_int64(st, b + 3, row.step);
        if (row.microbatch < 0)
          sqlite3_bind_null(st, b + 4);
        else
          sqlite3_bind_int(st, b + 4, row.microbatch);
        sqlite3_bind_text(st, b + 5, row.kind.data(), static_cast<int>(row.kind.size()),
                          SQLITE_STATIC);
        sqlite3_bind_text(st, b + 6, row.name->data(), static_cast<int>(row.name->size()),
                          SQLITE_STATIC);
        sqlite3_bind_int64(st, b + 7, row.start_ns);
        sqlite3_bind_int64(st, b + 8, row.end_ns);
      }
      if (!run(st)) return false;
    }
    pending_spans = 0;
    return true;
  };
  for (const RingRows& rr : rings) {
    const int rank = rr.info->rank, attempt = rr.info->attempt;
    for (const Record& r : rr.records) {
      switch (r.type) {
        case RecordType::kSpan: {
          const SpanRecord& sp = r.span;
          const std::string& name = sp.name < rr.names->size() ? (*rr.names)[sp.name] : kUnknown;
          spans[pending_spans++] = {sp.step,
                                    sp.microbatch,
                                    Name(sp.kind),
                                    &name,
                                    Ns(rr.calibration, sp.start_ticks),
                                    Ns(rr.calibration, sp.end_ticks)};
          if (pending_spans == kSpanRowsPerInsert) {
            if (!flush_spans(span_multi_, rank, attempt)) return fail("cannot insert spans");
          }
          break;
        }
        case RecordType::kCollective: {
          const CollectiveRecord& c = r.collective;
          sqlite3_bind_int(coll_, 1, rank);
          sqlite3_bind_int(coll_, 2, attempt);
          const std::string& grp =
              c.group < rr.groups->size() ? (*rr.groups)[c.group].name : kUnknown;
          sqlite3_bind_text(coll_, 3, grp.data(), static_cast<int>(grp.size()), SQLITE_STATIC);
          sqlite3_bind_int64(coll_, 4, static_cast<int64_t>(c.seq));
          const std::string_view op = Name(c.op), dtype = Name(c.dtype), state = Name(c.state);
          sqlite3_bind_text(coll_, 5, op.data(), static_cast<int>(op.size()), SQLITE_STATIC);
          if (c.peer < 0)
            sqlite3_bind_null(coll_, 6);
          else
            sqlite3_bind_int(coll_, 6, c.peer);
          sqlite3_bind_int64(coll_, 7, static_cast<int64_t>(c.bytes));
          sqlite3_bind_text(coll_, 8, dtype.data(), static_cast<int>(dtype.size()), SQLITE_STATIC);
          sqlite3_bind_text(coll_, 9, state.data(), static_cast<int>(state.size()), SQLITE_STATIC);
          sqlite3_bind_int64(coll_, 10, Ns(rr.calibration, c.enqueued_ticks));
          if (c.started_ticks == 0)
            sqlite3_bind_null(coll_, 11);
          else
            sqlite3_bind_int64(coll_, 11, Ns(rr.calibration, c.started_ticks));
          sqlite3_bind_int64(coll_, 12, Ns(rr.calibration, c.completed_ticks));
          if (!run(coll_)) return fail("cannot insert a collective");
          break;
        }
        case RecordType::kHeartbeat: {
          const HeartbeatRecord& h = r.heartbeat;
          sqlite3_bind_int(hb_, 1, rank);
          sqlite3_bind_int(hb_, 2, attempt);
          sqlite3_bind_int64(hb_, 3, Ns(rr.calibration, h.ticks));
          sqlite3_bind_int64(hb_, 4, h.step);
          const std::string_view phase = Name(h.phase);
          sqlite3_bind_text(hb_, 5, phase.data(), static_cast<int>(phase.size()), SQLITE_STATIC);
          if (!run(hb_)) return fail("cannot insert a heartbeat");
          break;
        }
        case RecordType::kMetric: {
          const MetricRecord& m = r.metric;
          sqlite3_bind_text(metric_, 1, rr.info->node.data(),
                            static_cast<int>(rr.info->node.size()), SQLITE_STATIC);
          sqlite3_bind_int64(metric_, 2, Ns(rr.calibration, m.ticks));
          const std::string name = "rank" + std::to_string(rank) + "." +
                                   (m.name < rr.names->size() ? (*rr.names)[m.name] : kUnknown);
          sqlite3_bind_text(metric_, 3, name.data(), static_cast<int>(name.size()),
                            SQLITE_TRANSIENT);
          sqlite3_bind_double(metric_, 4, m.value);
          if (!run(metric_)) return fail("cannot insert a metric");
          break;
        }
        default:
          break;
      }
    }
    if (!flush_spans(span_, rank, attempt))
      return fail("cannot insert spans");  // the tail, row by row
    for (size_t lane = 0; lane < rr.lane_tails.size(); ++lane) {
      sqlite3_bind_text(cursor_, 1, rr.ring.data(), static_cast<int>(rr.ring.size()),
                        SQLITE_STATIC);
      sqlite3_bind_int(cursor_, 2, static_cast<int>(lane));
      sqlite3_bind_int64(cursor_, 3, static_cast<int64_t>(rr.lane_tails[lane]));
      if (!run(cursor_)) return fail("cannot record a ring cursor");
    }
  }
  for (const MetricRow& m : metrics) {
    sqlite3_bind_text(metric_, 1, m.node.data(), static_cast<int>(m.node.size()), SQLITE_STATIC);
    sqlite3_bind_int64(metric_, 2, m.ts_ns);
    sqlite3_bind_text(metric_, 3, m.name.data(), static_cast<int>(m.name.size()), SQLITE_STATIC);
    sqlite3_bind_double(metric_, 4, m.value);
    if (!run(metric_)) return fail("cannot insert a metric");
  }
  for (const DropRow& d : drops) {
    sqlite3_bind_int(drop_, 1, d.rank);
    sqlite3_bind_int64(drop_, 2, d.ts_ns);
    sqlite3_bind_int64(drop_, 3, d.dropped_records);
    if (!run(drop_)) return fail("cannot insert a drop count");
  }
  if (hook_) hook_(WritePoint::kBeforeCommit);
  if (sqlite3_exec(db_, "COMMIT", nullptr, nullptr, nullptr) != SQLITE_OK)
    return fail("cannot commit");
  if (hook_) hook_(WritePoint::kAfterCommit);
  return Status::Ok();
}

Status TraceStore::UpsertRank(const RankInfo& i) {
  sqlite3_bind_int(rank_, 1, i.rank);
  sqlite3_bind_text(rank_, 2, i.node.data(), static_cast<int>(i.node.size()), SQLITE_STATIC);
  sqlite3_bind_int(rank_, 3, i.local_rank);
  sqlite3_bind_int(rank_, 4, i.coords.dp);
  sqlite3_bind_int(rank_, 5, i.coords.pp);
  sqlite3_bind_int(rank_, 6, i.coords.tp);
  sqlite3_bind_int(rank_, 7, i.pid);
  sqlite3_bind_int(rank_, 8, i.attempt);
  sqlite3_bind_int64(rank_, 9, i.clock_offset_ns);
  const int rc = sqlite3_step(rank_);
  sqlite3_reset(rank_);
  return rc == SQLITE_DONE ? Status::Ok() : Error("cannot record a rank");
}

Result<std::vector<uint64_t>> TraceStore::Cursors(const std::string& ring) {
  std::vector<uint64_t> tails;
  sqlite3_bind_text(get_cursor_, 1, ring.data(), static_cast<int>(ring.size()), SQLITE_STATIC);
  int rc;
  while ((rc = sqlite3_step(get_cursor_)) == SQLITE_ROW) {
    const int lane = sqlite3_column_int(get_cursor_, 0);
    if (lane >= 0 && lane < 4096) {
      if (tails.size() <= static_cast<size_t>(lane)) tails.resize(lane + 1, 0);
      tails[lane] = static_cast<uint64_t>(sqlite3_column_int64(get_cursor_, 1));
    }
  }
  sqlite3_reset(get_cursor_);
  if (rc != SQLITE_DONE) return Error("cannot read ring cursors");
  return tails;
}

}  // namespace megascope::tracer
