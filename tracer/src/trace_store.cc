#include "megascope/tracer/trace_store.h"

#include <algorithm>
#include <filesystem>

namespace megascope::tracer {
namespace {

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
  const std::string span_multi_sql = MultiRowInsert("span_rows", 8, kSpanRowsPerInsert);
  struct {
    sql::Statement* stmt;
    std::string_view sql;
  } stmts[] = {
      {&s->span_, "INSERT INTO span_rows VALUES(?,?,?,?,?,?,?,?)"},
      {&s->span_multi_, span_multi_sql},
      {&s->coll_, "INSERT INTO collective_rows VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?)"},
      {&s->hb_, "INSERT INTO heartbeat_rows VALUES(?,?,?,?,?)"},
      {&s->metric_, "INSERT INTO metrics VALUES(?,?,?,?)"},
      {&s->drop_, "INSERT INTO drops VALUES(?,?,?)"},
      {&s->cursor_, "INSERT OR REPLACE INTO ring_cursors VALUES(?,?,?)"},
      {&s->rank_, "INSERT OR REPLACE INTO ranks VALUES(?,?,?,?,?,?,?,?,?)"},
      {&s->get_cursor_, "SELECT lane, tail FROM ring_cursors WHERE ring = ? ORDER BY lane"},
      {&s->group_get_, "SELECT id FROM group_names WHERE name = ?"},
      {&s->group_add_, "INSERT INTO group_names(name) VALUES(?)"},
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

Status TraceStore::Write(std::span<const RingRows> rings, std::span<const MetricRow> metrics,
                         std::span<const DropRow> drops) {
  RETURN_IF_ERROR(db_.Exec("BEGIN"));
  auto fail = [&](const char* what) {
    Status st = db_.Error(what);
    (void)db_.Exec("ROLLBACK");
    group_ids_.clear();  // ids added in the rolled-back transaction are gone
    return st;
  };
  static const std::string kUnknown = "?";
  struct SpanRow {
    int64_t step;
    int32_t microbatch;
    SpanKind kind;
    const std::string* name;
    int64_t start_ns, dur_ns;
  };
  SpanRow spans[kSpanRowsPerInsert];
  int pending_spans = 0;
  // Binds the pending spans into `st` (the multi-row statement when full, else row by row).
  auto flush_spans = [&](sql::Statement& st, int rank, int attempt) {
    const int per_step = &st == &span_multi_ ? kSpanRowsPerInsert : 1;
    for (int first = 0; first < pending_spans; first += per_step) {
      for (int k = 0; k < per_step; ++k) {
        const SpanRow& row = spans[first + k];
        const int b = k * 8;
        st.Bind(b + 1, rank).Bind(b + 2, attempt).Bind(b + 3, row.step);
        if (row.microbatch < 0)
          st.BindNull(b + 4);
        else
          st.Bind(b + 4, row.microbatch);
        st.Bind(b + 5, static_cast<int>(row.kind))
            .Bind(b + 6, *row.name)
            .Bind(b + 7, row.start_ns)
            .Bind(b + 8, row.dur_ns);
      }
      if (!st.Run().ok()) return false;
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
          const int64_t start = Ns(rr.calibration, sp.start_ticks);
          spans[pending_spans++] = {sp.step, sp.microbatch,
                                    sp.kind, &name,
                                    start,   Ns(rr.calibration, sp.end_ticks) - start};
          if (pending_spans == kSpanRowsPerInsert) {
            if (!flush_spans(span_multi_, rank, attempt)) return fail("cannot insert spans");
          }
          break;
        }
        case RecordType::kCollective: {
          const CollectiveRecord& c = r.collective;
          const std::string& grp =
              c.group < rr.groups->size() ? (*rr.groups)[c.group].name : kUnknown;
          auto group = GroupId(grp);
          if (!group.ok()) return fail("cannot record a group name");
          const int64_t enqueued = Ns(rr.calibration, c.enqueued_ticks);
          coll_.Bind(1, rank)
              .Bind(2, attempt)
              .Bind(3, static_cast<int64_t>(c.step))
              .Bind(4, *group);
          coll_.Bind(5, static_cast<int64_t>(c.seq)).Bind(6, static_cast<int>(c.op));
          if (c.peer < 0)
            coll_.BindNull(7);
          else
            coll_.Bind(7, c.peer);
          coll_.Bind(8, static_cast<int64_t>(c.bytes))
              .Bind(9, static_cast<int>(c.dtype))
              .Bind(10, static_cast<int>(c.state))
              .Bind(11, enqueued);
          if (c.started_ticks == 0)
            coll_.BindNull(12);
          else
            coll_.Bind(12, Ns(rr.calibration, c.started_ticks) - enqueued);
          coll_.Bind(13, Ns(rr.calibration, c.completed_ticks) - enqueued);
          if (!coll_.Run().ok()) return fail("cannot insert a collective");
          break;
        }
        case RecordType::kHeartbeat: {
          const HeartbeatRecord& h = r.heartbeat;
          hb_.Bind(1, rank)
              .Bind(2, attempt)
              .Bind(3, Ns(rr.calibration, h.ticks))
              .Bind(4, h.step)
              .Bind(5, static_cast<int>(h.phase));
          if (!hb_.Run().ok()) return fail("cannot insert a heartbeat");
          break;
        }
        case RecordType::kMetric: {
          const MetricRecord& m = r.metric;
          const std::string name = "rank" + std::to_string(rank) + "." +
                                   (m.name < rr.names->size() ? (*rr.names)[m.name] : kUnknown);
          metric_.Bind(1, rr.info->node)
              .Bind(2, Ns(rr.calibration, m.ticks))
              .Bind(3, name)
              .Bind(4, m.value);
          if (!metric_.Run().ok()) return fail("cannot insert a metric");
          break;
        }
        default:
          break;
      }
    }
    if (!flush_spans(span_, rank, attempt))
      return fail("cannot insert spans");  // the tail, row by row
    for (size_t lane = 0; lane < rr.lane_tails.size(); ++lane) {
      cursor_.Bind(1, rr.ring)
          .Bind(2, static_cast<int>(lane))
          .Bind(3, static_cast<int64_t>(rr.lane_tails[lane]));
      if (!cursor_.Run().ok()) return fail("cannot record a ring cursor");
    }
  }
  for (const MetricRow& m : metrics) {
    metric_.Bind(1, m.node).Bind(2, m.ts_ns).Bind(3, m.name).Bind(4, m.value);
    if (!metric_.Run().ok()) return fail("cannot insert a metric");
  }
  for (const DropRow& d : drops) {
    drop_.Bind(1, d.rank).Bind(2, d.ts_ns).Bind(3, d.dropped_records);
    if (!drop_.Run().ok()) return fail("cannot insert a drop count");
  }
  if (hook_) hook_(WritePoint::kBeforeCommit);
  if (!db_.Exec("COMMIT").ok()) return fail("cannot commit");
  if (hook_) hook_(WritePoint::kAfterCommit);
  return Status::Ok();
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
