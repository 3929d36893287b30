#include "megascope/tracer/agent/store_sink.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <random>

namespace megascope::tracer::agent {
namespace {

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A source database's id in the store: 16 random hex digits, made once and kept in the database
// (a database deleted and made again is another source, whose rowids start again).
Result<std::string> SourceId(sql::Database& db) {
  RETURN_IF_ERROR(
      db.Exec("CREATE TABLE IF NOT EXISTS store_source(id TEXT);"
              "CREATE TABLE IF NOT EXISTS store_cursors(store TEXT, tbl TEXT, row_id INTEGER, "
              "PRIMARY KEY(store, tbl));"));
  ASSIGN_OR_RETURN(sql::Statement get, db.Prepare("SELECT id FROM store_source LIMIT 1"));
  ASSIGN_OR_RETURN(const bool have, get.Step());
  if (have) return std::string(get.Text(0));
  std::random_device rd;
  const uint64_t v = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(NowNs());
  char id[17];
  std::snprintf(id, sizeof id, "%016llx", static_cast<unsigned long long>(v));
  ASSIGN_OR_RETURN(sql::Statement put, db.Prepare("INSERT INTO store_source VALUES (?)"));
  RETURN_IF_ERROR(put.Bind(1, std::string_view(id)).Run());
  return std::string(id);
}

// One SQLite cell as a TabSeparated cell.
void AppendCell(std::string& out, const sql::Statement& st, int c) {
  if (st.IsNull(c))
    AppendTsvNull(out);
  else
    AppendTsv(out, st.Text(c));
}

}  // namespace

Result<std::unique_ptr<StoreSink>> StoreSink::Open(const StoreSinkOptions& options) {
  ASSIGN_OR_RETURN(
      sql::Database db,
      sql::Database::Open(options.db_path, sql::Database::Mode::kReadWrite, "[store sink]"));
  std::unique_ptr<StoreSink> sink(new StoreSink(options, std::move(db)));
  ASSIGN_OR_RETURN(sink->src_, SourceId(sink->db_));
  const auto& tables = StoreTables();
  for (size_t i = 0; i < tables.size(); ++i) {
    const StoreTable& t = tables[i];
    ASSIGN_OR_RETURN(const int64_t n,
                     sink->db_.QueryInt("SELECT count(*) FROM sqlite_master WHERE name = '" +
                                        std::string(t.source_table) + "'"));
    sink->present_[i] = t.source == options.source && n > 0;
    ASSIGN_OR_RETURN(sql::Statement st, sink->db_.Prepare("SELECT row_id FROM store_cursors WHERE "
                                                          "store = ? AND tbl = ?"));
    st.Bind(1, sink->store_key_).Bind(2, t.name);
    ASSIGN_OR_RETURN(const bool row, st.Step());
    sink->cursors_[i] = row ? st.Int(0) : 0;
  }
  return sink;
}

StoreSink::StoreSink(StoreSinkOptions options, sql::Database db)
    : opt_(std::move(options)),
      ch_(opt_.url, opt_.timeout_ms),
      db_(std::move(db)),
      store_key_(opt_.url.host + ":" + std::to_string(opt_.url.port) + "/" + opt_.url.database),
      cursors_(StoreTables().size(), 0),
      present_(StoreTables().size(), false) {}

void StoreSink::AppendCommon(std::string& out, int64_t time_ns, int64_t row_id) const {
  out += UtcDay(time_ns);
  out += '\t';
  AppendTsv(out, opt_.job);
  out += '\t';
  out += src_;
  out += '\t';
  out += std::to_string(row_id);
}

Status StoreSink::SaveCursor(const StoreTable& t, int64_t row_id) {
  ASSIGN_OR_RETURN(sql::Statement st,
                   db_.Prepare("INSERT OR REPLACE INTO store_cursors VALUES (?, ?, ?)"));
  return st.Bind(1, store_key_).Bind(2, t.name).Bind(3, row_id).Run();
}

Status StoreSink::Resync() {
  RETURN_IF_ERROR(EnsureStoreSchema(ch_));
  const auto& tables = StoreTables();
  for (size_t i = 0; i < tables.size(); ++i) {
    if (!present_[i]) continue;
    ASSIGN_OR_RETURN(const std::string held,
                     ch_.Scalar("SELECT max(row_id) FROM " + ch_.Table(tables[i].name) +
                                " WHERE job = '" + opt_.job + "' AND src = '" + src_ + "'"));
    const int64_t in_store = held.empty() ? 0 : std::stoll(held);
    if (in_store > cursors_[i]) {
      cursors_[i] = in_store;
      // Best effort: a cursor not saved is found again in the store next time.
      (void)SaveCursor(tables[i], in_store);
    }
  }
  in_sync_ = true;
  return Status::Ok();
}

Result<size_t> StoreSink::ShipTable(const StoreTable& t, size_t index) {
  const std::string from = std::string(t.source_table);
  ASSIGN_OR_RETURN(const int64_t last, db_.QueryInt("SELECT max(rowid) FROM " + from));
  ASSIGN_OR_RETURN(const int64_t first, db_.QueryInt("SELECT min(rowid) FROM " + from));
  int64_t& cursor = cursors_[index];
  // Retention removed rows the store never had: counted, not waited for. (Rows of the tables kept
  // for ever are only ever replaced -- a rank written again -- never lost.)
  if (first > cursor + 1 && last > 0 && t.retention != StoreRetention::kForever) {
    dropped_rows_ += static_cast<uint64_t>(first - cursor - 1);
  }
  cursor = std::max(cursor, first - 1);
  ASSIGN_OR_RETURN(sql::Statement st, db_.Prepare(t.source_sql));
  const std::string columns = StoreColumnNames(t);
  size_t shipped = 0;
  std::string body;
  for (int b = 0; b < opt_.batches_per_table && cursor < last; ++b) {
    st.Reset();
    st.Bind(1, cursor).Bind(2, static_cast<int64_t>(opt_.batch_rows)).Bind(3, opt_.node);
    body.clear();
    std::string day;
    int64_t batch_last = cursor;
    size_t rows = 0;
    for (;;) {
      ASSIGN_OR_RETURN(const bool row, st.Step());
      if (!row) break;
      const int64_t time_ns = st.IsNull(1) ? NowNs() : st.Int(1);
      // One day per INSERT: one partition, all or nothing.
      const std::string row_day = UtcDay(time_ns);
      if (day.empty()) day = row_day;
      if (row_day != day) break;
      AppendCommon(body, time_ns, st.Int(0));
      for (int c = 2; c < st.columns(); ++c) {
        body += '\t';
        AppendCell(body, st, c);
      }
      body += '\n';
      batch_last = st.Int(0);
      ++rows;
    }
    if (rows == 0) break;
    Status s = ch_.Insert(t.name, columns, body);
    if (s.ok() && opt_.after_insert) s = opt_.after_insert(t.name);
    if (!s.ok()) {
      in_sync_ = false;  // it may have landed: ask the store before the next batch
      return s;
    }
    cursor = batch_last;
    shipped += rows;
    shipped_rows_ += rows;
    (void)SaveCursor(t, cursor);
  }
  lag_rows_ += std::max<int64_t>(0, last - cursor);
  return shipped;
}

Result<size_t> StoreSink::ShipOpenOps(const StoreTable& t, size_t index) {
  ASSIGN_OR_RETURN(
      sql::Statement st,
      db_.Prepare("SELECT rank, attempt, COALESCE(grp, ''), seq, op, peer, bytes, dtype, state, "
                  "enqueued_ns, started_ns, seen_ns FROM open_ops "
                  "ORDER BY rank, attempt, grp, seq"));
  std::string rows;
  size_t n = 0;
  for (;;) {
    ASSIGN_OR_RETURN(const bool row, st.Step());
    if (!row) break;
    rows += '\t';
    AppendTsv(rows, opt_.node);
    for (int c = 0; c < st.columns(); ++c) {
      rows += '\t';
      AppendCell(rows, st, c);
    }
    rows += '\n';
    ++n;
  }
  const size_t hash = std::hash<std::string>()(rows) | 1;
  if (hash == open_ops_hash_) return 0;  // the same look as last shipped
  // A look: a marker row (rank -1) and the ops, under one row_id, in one INSERT.
  const int64_t look = cursors_[index] + 1;
  const int64_t now = NowNs();
  std::string body;
  AppendCommon(body, now, look);
  body += '\t';
  AppendTsv(body, opt_.node);
  body += "\t-1\t0\t\\N\t0\t\t0\t0\t\t\t0\t\\N\t" + std::to_string(now) + "\n";
  std::string common;
  AppendCommon(common, now, look);
  size_t start = 0;
  while (start < rows.size()) {
    const size_t nl = rows.find('\n', start);
    body += common;
    body.append(rows, start, nl + 1 - start);
    start = nl + 1;
  }
  Status s = ch_.Insert(t.name, StoreColumnNames(t), body);
  if (s.ok() && opt_.after_insert) s = opt_.after_insert(t.name);
  if (!s.ok()) {
    in_sync_ = false;
    return s;
  }
  cursors_[index] = look;
  open_ops_hash_ = hash;
  shipped_rows_ += n + 1;
  (void)SaveCursor(t, look);
  return n + 1;
}

Result<size_t> StoreSink::Pass() {
  if (!in_sync_) {
    if (Status s = Resync(); !s.ok()) {
      ++errors_;
      return s;
    }
  }
  lag_rows_ = 0;
  size_t shipped = 0;
  const auto& tables = StoreTables();
  for (size_t i = 0; i < tables.size(); ++i) {
    if (!present_[i]) continue;
    auto got = tables[i].source_sql.empty() ? ShipOpenOps(tables[i], i) : ShipTable(tables[i], i);
    if (!got.ok()) {
      ++errors_;
      return got.status();
    }
    shipped += *got;
  }
  return shipped;
}

}  // namespace megascope::tracer::agent
