#include "megascope/tracer/agent/store_sink.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <limits>
#include <random>

#include "megascope/tracer/format.h"
#include "megascope/tracer/metric_names.h"
#include "megascope/tracer/trace_schema.h"

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
  std::string id = Format("%016llx", static_cast<unsigned long long>(v));
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

Result<StoreSinkOptions> StoreSinkOptions::Of(std::string_view url, std::string job,
                                              std::string node, std::string db_path,
                                              StoreSource source) {
  StoreSinkOptions o;
  ASSIGN_OR_RETURN(o.url, StoreUrl::Parse(url));
  o.job = std::move(job);
  o.node = std::move(node);
  o.db_path = std::move(db_path);
  o.source = source;
  return o;
}

Result<std::unique_ptr<StoreSink>> StoreSink::Open(const StoreSinkOptions& options) {
  ASSIGN_OR_RETURN(
      sql::Database db,
      sql::Database::Open(options.db_path, sql::Database::Mode::kReadWrite, "[store sink]"));
  std::unique_ptr<StoreSink> sink(new StoreSink(options, std::move(db)));
  ASSIGN_OR_RETURN(sink->src_, SourceId(sink->db_));
  const auto& tables = StoreTables();
  for (size_t i = 0; i < tables.size(); ++i) {
    ASSIGN_OR_RETURN(sql::Statement st, sink->db_.Prepare("SELECT row_id FROM store_cursors WHERE "
                                                          "store = ? AND tbl = ?"));
    st.Bind(1, sink->store_key_).Bind(2, tables[i].name);
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
  int64_t& cursor = cursors_[index];
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
      // Rowids only grow and only retention removes rows (trace_store.cc keeps each table's
      // newest), so a gap above the cursor is rows removed before they were shipped: counted, not
      // waited for. (Rows of the tables kept for ever are only replaced -- a rank written again.)
      if (rows == 0 && st.Int(0) > cursor + 1 && t.retention != StoreRetention::kForever)
        dropped_rows_ += static_cast<uint64_t>(st.Int(0) - cursor - 1);
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

Status StoreSink::FindTables() {
  const auto& tables = StoreTables();
  for (size_t i = 0; i < tables.size(); ++i) {
    if (present_[i] || tables[i].source != opt_.source) continue;
    ASSIGN_OR_RETURN(const int64_t n,
                     db_.QueryInt("SELECT count(*) FROM sqlite_master WHERE name = '" +
                                  std::string(tables[i].source_table) + "'"));
    if (n > 0) {  // a table that appeared (control.db's, once the controller made it)
      present_[i] = true;
      in_sync_ = false;
    }
  }
  return Status::Ok();
}

Status StoreSink::StartSums() {
  ASSIGN_OR_RETURN(const int64_t have,
                   db_.QueryInt("SELECT count(*) FROM sqlite_master WHERE name = 'span_rows'"));
  if (have == 0) return Status::Ok();  // not a trace.db of version 2
  RETURN_IF_ERROR(db_.Exec(
      "CREATE TABLE IF NOT EXISTS store_rank_steps(id INTEGER PRIMARY KEY AUTOINCREMENT, "
      "attempt INTEGER, rank INTEGER, step INTEGER, start_ns INTEGER, wall INTEGER, "
      "compute INTEGER, comm INTEGER, data INTEGER);"
      "CREATE TEMP TABLE IF NOT EXISTS summing(attempt INTEGER, rank INTEGER, step INTEGER);"));
  ASSIGN_OR_RETURN(sql::Statement done,
                   db_.Prepare("SELECT attempt, rank, MAX(step) FROM store_rank_steps GROUP BY "
                               "attempt, rank"));
  for (;;) {
    ASSIGN_OR_RETURN(const bool row, done.Step());
    if (!row) break;
    summed_[{done.Int(0), done.Int(1)}] = done.Int(2);
  }
  steps_ready_ = true;
  return Status::Ok();
}

Status StoreSink::NoteNewSteps() {
  for (const bool spans : {true, false}) {
    int64_t& seen = spans ? spans_seen_ : collectives_seen_;
    ASSIGN_OR_RETURN(sql::Statement st,
                     db_.Prepare(std::string("SELECT attempt, rank, step, MIN(rowid), MAX(rowid) "
                                             "FROM ") +
                                 (spans ? "span_rows" : "collective_rows") +
                                 " WHERE rowid > ? AND step IS NOT NULL GROUP BY attempt, rank, "
                                 "step"));
    st.Bind(1, seen);
    for (;;) {
      ASSIGN_OR_RETURN(const bool row, st.Step());
      if (!row) break;
      const int64_t attempt = st.Int(0), rank = st.Int(1), step = st.Int(2);
      seen = std::max(seen, st.Int(4));
      const auto done = summed_.find({attempt, rank});
      if (done != summed_.end() && step <= done->second) continue;  // late: its sum is shipped
      auto it = pending_steps_
                    .try_emplace({attempt, rank, step}, std::numeric_limits<int64_t>::max(),
                                 std::numeric_limits<int64_t>::max())
                    .first;
      (spans ? it->second.first : it->second.second) =
          std::min(spans ? it->second.first : it->second.second, st.Int(3));
      auto [newest, first_seen] = newest_.try_emplace({attempt, rank}, step);
      if (!first_seen) newest->second = std::max(newest->second, step);
      auto [latest, first_attempt] = newest_attempt_.try_emplace(rank, attempt);
      if (!first_attempt) latest->second = std::max(latest->second, attempt);
    }
  }
  return Status::Ok();
}

Status StoreSink::SumSteps(bool all) {
  if (!steps_ready_) RETURN_IF_ERROR(StartSums());
  if (!steps_ready_) return Status::Ok();  // not a trace.db of version 2
  // The rows stored since the last look: which steps they belong to, and where those begin.
  RETURN_IF_ERROR(NoteNewSteps());
  // The steps that are over: before the rank's newest, or of an attempt it has left.
  std::vector<std::tuple<int64_t, int64_t, int64_t>> over;
  int64_t from_span = std::numeric_limits<int64_t>::max(), from_coll = from_span;
  for (const auto& [key, first] : pending_steps_) {
    const auto& [attempt, rank, step] = key;
    if (all || step < newest_[{attempt, rank}] || attempt < newest_attempt_[rank]) {
      over.push_back(key);
      from_span = std::min(from_span, first.first);
      from_coll = std::min(from_coll, first.second);
    }
  }
  if (over.empty()) return Status::Ok();
  RETURN_IF_ERROR(db_.Exec("DELETE FROM temp.summing"));
  ASSIGN_OR_RETURN(sql::Statement add, db_.Prepare("INSERT INTO temp.summing VALUES (?, ?, ?)"));
  for (const auto& [attempt, rank, step] : over) {
    add.Bind(1, attempt).Bind(2, rank).Bind(3, step);
    RETURN_IF_ERROR(add.Run());
  }
  // trace_schema.h's per_rank over those steps' rows only, from where they begin.
  const std::string of_them =
      " AND (attempt, rank, step) IN (SELECT attempt, rank, step FROM "
      "temp.summing)";
  const std::string rows = "(" +
                           SpansSelectSql(" WHERE rowid >= " + std::to_string(from_span) + of_them,
                                          " AND rowid >= " + std::to_string(from_coll) + of_them) +
                           ")";
  std::string cte = PerRankStepSql();
  for (size_t at = 0; (at = cte.find("FROM spans", at)) != std::string::npos;) {
    cte.replace(at, 10, "FROM " + rows);
    at += 5 + rows.size();
  }
  RETURN_IF_ERROR(db_.Exec(cte +
                           ", first AS (SELECT attempt, rank, step, MIN(start_ns) AS "
                           "start_ns FROM " +
                           rows +
                           " GROUP BY attempt, rank, step) INSERT INTO store_rank_steps(attempt, "
                           "rank, step, start_ns, wall, compute, comm, data) SELECT p.attempt, "
                           "p.rank, p.step, f.start_ns, p.wall, p.compute, p.comm, p.data FROM "
                           "per_rank p JOIN first f ON f.attempt = p.attempt AND f.rank = p.rank "
                           "AND f.step = p.step ORDER BY p.attempt, p.step, p.rank"));
  for (const auto& key : over) {
    const auto& [attempt, rank, step] = key;
    int64_t& done = summed_.try_emplace({attempt, rank}, step).first->second;
    done = std::max(done, step);
    pending_steps_.erase(key);
  }
  // What the store has, less each rank's last sum (where the next pass starts after a restart).
  const StoreTable* t = FindStoreTable("rank_steps");
  const int64_t shipped = cursors_[static_cast<size_t>(t - StoreTables().data())];
  return db_.Exec("DELETE FROM store_rank_steps WHERE id <= " + std::to_string(shipped) +
                  " AND id NOT IN (SELECT MAX(id) FROM store_rank_steps GROUP BY attempt, rank)");
}

Result<size_t> StoreSink::Pass(bool last) {
  Result<size_t> got = PassOnce(last);
  // What waits in the database, whether or not the store took anything.
  int64_t lag = 0;
  const auto& tables = StoreTables();
  for (size_t i = 0; i < tables.size(); ++i) {
    if (!present_[i] || tables[i].source_sql.empty()) continue;
    auto top = db_.QueryInt("SELECT max(rowid) FROM " + std::string(tables[i].source_table));
    if (top.ok()) lag += std::max<int64_t>(0, *top - cursors_[i]);
  }
  lag_rows_ = lag;
  return got;
}

Result<size_t> StoreSink::PassOnce(bool last) {
  if (opt_.source == StoreSource::kTrace) {
    if (Status s = SumSteps(last); !s.ok()) {
      ++errors_;
      return s;
    }
  }
  RETURN_IF_ERROR(FindTables());
  if (!in_sync_) {
    if (Status s = Resync(); !s.ok()) {
      ++errors_;
      return s;
    }
  }
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

Result<std::unique_ptr<StoreLoop>> StoreLoop::Start(const std::vector<StoreSinkOptions>& sinks,
                                                    double interval_s,
                                                    std::function<void(const std::string&)> log) {
  std::unique_ptr<StoreLoop> loop(new StoreLoop());
  for (const StoreSinkOptions& o : sinks) {
    ASSIGN_OR_RETURN(auto sink, StoreSink::Open(o));
    loop->sinks_.push_back(std::move(sink));
  }
  loop->log_ = std::move(log);
  loop->interval_s_ = interval_s;
  StoreLoop* l = loop.get();
  loop->thread_ = std::thread([l] {
    std::unique_lock<std::mutex> lock(l->mu_);
    while (!l->stop_) {
      lock.unlock();
      l->PassAll();
      lock.lock();
      l->wake_.wait_for(lock, std::chrono::duration<double>(l->interval_s_),
                        [l] { return l->stop_; });
    }
  });
  return loop;
}

void StoreLoop::Finish() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;
    finished_ = stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (!failing_) PassAll(/*last=*/true);
}

void StoreLoop::PassAll(bool last) {
  int64_t lag = 0;
  uint64_t rows = 0, dropped = 0, errors = 0;
  Status first_error = Status::Ok();
  for (auto& sink : sinks_) {
    auto got = sink->Pass(last);
    if (!got.ok() && first_error.ok()) first_error = got.status();
    lag += sink->lag_rows();
    rows += sink->shipped_rows();
    dropped += sink->dropped_rows();
    errors += sink->errors();
  }
  lag_ = lag;
  rows_ = rows;
  dropped_ = dropped;
  errors_ = errors;
  if (!first_error.ok() && !failing_ && log_)
    log_("store: " + first_error.message() + " (rows wait in the database; tried again every " +
         std::to_string(interval_s_).substr(0, 4) + " s)");
  if (first_error.ok() && failing_ && log_)
    log_("store: reachable again; " + std::to_string(lag) + " rows still to ship");
  failing_ = !first_error.ok();
}

std::string StoreLoop::MetricsText(const std::string& labels) const {
  std::string out;
  auto series = [&](const metrics::Def& d, double v) {
    const std::string name = metrics::PrometheusName(d);
    out += "# HELP " + name + " " + std::string(d.help) + "\n# TYPE " + name +
           (d.type == metrics::Type::kCounter ? " counter\n" : " gauge\n") + name + "{" + labels +
           "} " + std::to_string(v) + "\n";
  };
  series(metrics::kStoreRows, static_cast<double>(rows_.load()));
  series(metrics::kStoreLag, static_cast<double>(lag_.load()));
  series(metrics::kStoreDropped, static_cast<double>(dropped_.load()));
  series(metrics::kStoreErrors, static_cast<double>(errors_.load()));
  return out;
}

}  // namespace megascope::tracer::agent
