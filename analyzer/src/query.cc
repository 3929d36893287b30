#include "megascope/analyzer/query.h"

#include <sqlite3.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

namespace megascope::analyzer {
namespace {

namespace fs = std::filesystem;
const char* const kTables[] = {"ranks", "spans", "collectives", "heartbeats", "metrics", "drops"};

Status Exec(sqlite3* db, const std::string& sql) {
  char* err = nullptr;
  if (sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : "unknown error";
    sqlite3_free(err);
    return InvalidArgument(msg);
  }
  return Status::Ok();
}

// After set-up, statements may only read: anything else fails to prepare ("not authorized").
int ReadOnlyAuthorizer(void*, int action, const char*, const char*, const char*, const char*) {
  switch (action) {
    case SQLITE_SELECT:
    case SQLITE_READ:
    case SQLITE_FUNCTION:
    case SQLITE_RECURSIVE:
      return SQLITE_OK;
    default:
      return SQLITE_DENY;
  }
}

std::string Quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? "''" : std::string(1, c);
  return out + "'";
}

}  // namespace

Result<std::unique_ptr<RunDatabase>> RunDatabase::Open(const std::string& run_dir) {
  if (!fs::is_directory(run_dir)) return NotFound("run directory " + run_dir + " does not exist");
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(run_dir + "/nodes", ec)) {
    const std::string f = e.path().string() + "/trace.db";
    if (fs::exists(f)) files.push_back(f);
  }
  std::sort(files.begin(), files.end());
  if (files.empty())
    return NotFound("no trace databases under " + run_dir +
                    "/nodes/*/trace.db (was the run started with agents?)");
  std::unique_ptr<RunDatabase> r(new RunDatabase());
  r->nodes_ = static_cast<int>(files.size());
  if (sqlite3_open_v2(":memory:", &r->db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_URI, nullptr) !=
      SQLITE_OK) {
    return Internal("cannot open an in-memory database");
  }
  const int limit = sqlite3_limit(r->db_, SQLITE_LIMIT_ATTACHED, -1);
  const bool copy = static_cast<int>(files.size()) > limit;
  if (copy) {  // more nodes than SQLite attaches at once: gather into memory batch by batch
    for (const char* t : kTables) {
      RETURN_IF_ERROR(Exec(
          r->db_, std::string("ATTACH ") + Quote("file:" + files[0] + "?mode=ro") + " AS probe"));
      RETURN_IF_ERROR(Exec(r->db_, std::string("CREATE TABLE main.") + t +
                                       " AS SELECT * FROM probe." + t + " WHERE 0"));
      RETURN_IF_ERROR(Exec(r->db_, "DETACH probe"));
    }
  }
  std::vector<std::string> parts[std::size(kTables)];
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string alias = "n" + std::to_string(i % static_cast<size_t>(limit));
    Status st = Exec(r->db_, "ATTACH " + Quote("file:" + files[i] + "?mode=ro") + " AS " + alias);
    if (!st.ok()) return InvalidArgument("cannot open " + files[i] + ": " + st.message());
    sqlite3_stmt* probe = nullptr;
    if (sqlite3_prepare_v2(r->db_, ("SELECT COUNT(*) FROM " + alias + ".spans").c_str(), -1, &probe,
                           nullptr) != SQLITE_OK) {
      const std::string msg = sqlite3_errmsg(r->db_);
      sqlite3_finalize(probe);
      return InvalidArgument(files[i] + " is not a megascope trace database: " + msg);
    }
    sqlite3_finalize(probe);
    for (size_t t = 0; t < std::size(kTables); ++t) {
      if (copy) {
        RETURN_IF_ERROR(Exec(r->db_, std::string("INSERT INTO main.") + kTables[t] +
                                         " SELECT * FROM " + alias + "." + kTables[t]));
      } else {
        parts[t].push_back("SELECT * FROM " + alias + "." + kTables[t]);
      }
    }
    if (copy) RETURN_IF_ERROR(Exec(r->db_, "DETACH " + alias));
  }
  if (!copy) {
    for (size_t t = 0; t < std::size(kTables); ++t) {
      std::string view = std::string("CREATE TEMP VIEW ") + kTables[t] + " AS ";
      for (size_t i = 0; i < parts[t].size(); ++i) view += (i ? " UNION ALL " : "") + parts[t][i];
      RETURN_IF_ERROR(Exec(r->db_, view));
    }
  }
  sqlite3_set_authorizer(r->db_, &ReadOnlyAuthorizer, nullptr);
  return r;
}

RunDatabase::~RunDatabase() {
  if (db_ != nullptr) sqlite3_close(db_);
}

Result<Table> RunDatabase::Query(const std::string& sql) {
  sqlite3_stmt* st = nullptr;
  const char* tail = nullptr;
  if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &st, &tail) != SQLITE_OK) {
    const std::string msg = sqlite3_errmsg(db_);
    if (msg.find("not authorized") != std::string::npos ||
        msg.find("cannot modify") != std::string::npos) {
      return Status(StatusCode::kPermissionDenied,
                    "writes are refused: trace databases are opened read-only (" + msg + ")");
    }
    return InvalidArgument("bad SQL: " + msg);
  }
  if (st == nullptr) return InvalidArgument("empty SQL");
  if (!sqlite3_stmt_readonly(st)) {
    sqlite3_finalize(st);
    return Status(StatusCode::kPermissionDenied,
                  "writes are refused: only read-only statements run over trace databases");
  }
  if (tail != nullptr && std::string(tail).find_first_not_of(" \t\r\n;") != std::string::npos) {
    sqlite3_finalize(st);
    return InvalidArgument("one statement at a time, please");
  }
  Table t;
  for (int c = 0; c < sqlite3_column_count(st); ++c)
    t.columns.push_back(sqlite3_column_name(st, c));
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    std::vector<std::string> row;
    std::vector<bool> nulls;
    for (int c = 0; c < sqlite3_column_count(st); ++c) {
      const unsigned char* v = sqlite3_column_text(st, c);
      nulls.push_back(v == nullptr);
      row.emplace_back(v ? reinterpret_cast<const char*>(v) : "");
    }
    t.rows.push_back(std::move(row));
    t.is_null.push_back(std::move(nulls));
  }
  const std::string err = rc == SQLITE_DONE ? "" : sqlite3_errmsg(db_);
  sqlite3_finalize(st);
  if (!err.empty()) return InvalidArgument("query failed: " + err);
  return t;
}

namespace {

// Per rank and step: wall time, compute (forward/backward/optimizer spans minus the collectives
// that ran inside them, e.g. tensor-parallel all-reduces), communication wait (synchronous comm
// spans; asynchronous sends overlap other work and are left out) and data time.
const char* kPerRankStep = R"sql(
WITH comp AS (SELECT rank, step, start_ns, end_ns FROM spans WHERE kind IN ('forward','backward','optimizer','compute')),
comm AS (SELECT rank, step, start_ns, end_ns FROM spans WHERE kind = 'comm' AND name != 'send'),
comm_total AS (SELECT rank, step, SUM(end_ns - start_ns) AS comm FROM comm GROUP BY rank, step),
nested AS (SELECT m.rank, m.step, SUM(m.end_ns - m.start_ns) AS nested FROM comm m JOIN comp c
             ON c.rank = m.rank AND c.step = m.step AND c.start_ns <= m.start_ns AND c.end_ns >= m.end_ns
           GROUP BY m.rank, m.step),
comm_rank AS (SELECT t.rank, t.step, t.comm, COALESCE(n.nested, 0) AS nested FROM comm_total t
              LEFT JOIN nested n ON n.rank = t.rank AND n.step = t.step),
busy AS (SELECT rank, step, MAX(end_ns) - MIN(start_ns) AS wall,
                SUM(CASE WHEN kind IN ('forward','backward','optimizer','compute') THEN end_ns - start_ns ELSE 0 END) AS busy,
                SUM(CASE WHEN kind = 'data' THEN end_ns - start_ns ELSE 0 END) AS data
         FROM spans GROUP BY rank, step),
per_rank AS (SELECT b.rank, b.step, b.wall, b.busy - COALESCE(c.nested, 0) AS compute, COALESCE(c.comm, 0) AS comm, b.data
             FROM busy b LEFT JOIN comm_rank c ON c.rank = b.rank AND c.step = b.step))sql";

}  // namespace

int64_t RunDatabase::Row::Int(int c) const { return sqlite3_column_int64(st_, c); }
double RunDatabase::Row::Double(int c) const { return sqlite3_column_double(st_, c); }
std::string_view RunDatabase::Row::Text(int c) const {
  const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(st_, c));
  return p == nullptr ? std::string_view()
                      : std::string_view(p, static_cast<size_t>(sqlite3_column_bytes(st_, c)));
}
bool RunDatabase::Row::IsNull(int c) const { return sqlite3_column_type(st_, c) == SQLITE_NULL; }

Status RunDatabase::Scan(const std::string& sql, const std::function<void(const Row&)>& fn) {
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &st, nullptr) != SQLITE_OK) {
    return InvalidArgument(std::string("bad SQL: ") + sqlite3_errmsg(db_));
  }
  int rc;
  const Row row(st);
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) fn(row);
  const std::string err = rc == SQLITE_DONE ? "" : sqlite3_errmsg(db_);
  sqlite3_finalize(st);
  return err.empty() ? Status::Ok() : InvalidArgument("query failed: " + err);
}

std::string PerRankStepCte() { return kPerRankStep; }

std::string StepsSql() {
  return std::string(kPerRankStep) + R"sql(
SELECT step, COUNT(*) AS ranks, ROUND(MAX(wall) / 1e6, 3) AS step_ms, ROUND(AVG(compute) / 1e6, 3) AS compute_ms,
       ROUND(AVG(comm) / 1e6, 3) AS comm_wait_ms, ROUND(AVG(data) / 1e6, 3) AS data_ms,
       ROUND(AVG(MAX(0, wall - compute - comm - data)) / 1e6, 3) AS bubble_ms
FROM per_rank GROUP BY step ORDER BY step)sql";
}

std::string StragglersSql() {
  return std::string(kPerRankStep) + R"sql(,
mean AS (SELECT p.rank, r.node, r.dp, r.pp, r.tp, AVG(p.compute) AS compute_per_step
         FROM per_rank p JOIN (SELECT rank, node, dp, pp, tp FROM ranks GROUP BY rank) r ON r.rank = p.rank GROUP BY p.rank),
peers AS (SELECT pp, tp, AVG(compute_per_step) AS peer_avg, COUNT(*) AS n FROM mean GROUP BY pp, tp)
SELECT m.rank, m.node, m.dp, m.pp, m.tp, ROUND(m.compute_per_step / 1e6, 3) AS compute_ms_per_step,
       ROUND(q.peer_avg / 1e6, 3) AS peers_ms_per_step, ROUND(m.compute_per_step / q.peer_avg, 3) AS ratio, q.n AS peers
FROM mean m JOIN peers q ON q.pp = m.pp AND q.tp = m.tp
ORDER BY ratio DESC, m.rank)sql";
}

std::string WaitsSql(int limit) {
  return R"sql(
WITH c AS (SELECT * FROM collectives WHERE op NOT IN ('send','recv')),
w AS (SELECT grp, seq, op, COUNT(*) AS members, MAX(enqueued_ns) - MIN(enqueued_ns) AS wait_ns, MAX(enqueued_ns) AS last_ns
      FROM c GROUP BY grp, seq, op HAVING members > 1)
SELECT w.grp, w.seq, w.op, w.members, ROUND(w.wait_ns / 1e6, 3) AS wait_ms,
       (SELECT rank FROM c WHERE c.grp = w.grp AND c.seq = w.seq AND c.enqueued_ns = w.last_ns LIMIT 1) AS last_rank
FROM w ORDER BY w.wait_ns DESC LIMIT )sql" +
         std::to_string(limit);
}

std::string AtSql(int64_t t) {
  const std::string ts = std::to_string(t);
  return "SELECT r.rank, r.node, r.dp, r.pp, r.tp,"
         " (SELECT kind || ' ' || name || ' (step ' || step || COALESCE(', mb ' || microbatch, '') "
         "|| ')' FROM spans s"
         "  WHERE s.rank = r.rank AND s.start_ns <= " +
         ts + " AND s.end_ns >= " + ts +
         "  ORDER BY s.end_ns - s.start_ns LIMIT 1) AS doing,"
         " (SELECT phase || ' of step ' || step FROM heartbeats h WHERE h.rank = r.rank AND "
         "h.ts_ns <= " +
         ts +
         "  ORDER BY h.ts_ns DESC LIMIT 1) AS last_heartbeat"
         " FROM ranks r GROUP BY r.rank ORDER BY r.rank";
}

std::string FormatTable(const Table& t) {
  std::vector<size_t> w(t.columns.size());
  for (size_t c = 0; c < w.size(); ++c) w[c] = t.columns[c].size();
  for (const auto& row : t.rows) {
    for (size_t c = 0; c < w.size(); ++c) w[c] = std::max(w[c], row[c].size());
  }
  auto line = [&](const std::vector<std::string>& cells) {
    std::string out;
    for (size_t c = 0; c < cells.size(); ++c) {
      out += cells[c] + std::string(w[c] - cells[c].size() + (c + 1 < cells.size() ? 2 : 0), ' ');
    }
    while (!out.empty() && out.back() == ' ') out.pop_back();
    return out + "\n";
  };
  std::string out = line(t.columns);
  std::vector<std::string> rule;
  for (size_t c = 0; c < w.size(); ++c) rule.push_back(std::string(w[c], '-'));
  out += line(rule);
  for (const auto& row : t.rows) out += line(row);
  out += "(" + std::to_string(t.rows.size()) + " rows)\n";
  return out;
}

std::string FormatCsv(const Table& t) {
  auto cell = [](const std::string& s) {
    if (s.find_first_of(",\"\n") == std::string::npos) return s;
    std::string q = "\"";
    for (char c : s) q += c == '"' ? "\"\"" : std::string(1, c);
    return q + "\"";
  };
  std::string out;
  for (size_t c = 0; c < t.columns.size(); ++c) out += (c ? "," : "") + cell(t.columns[c]);
  out += "\n";
  for (const auto& row : t.rows) {
    for (size_t c = 0; c < row.size(); ++c) out += (c ? "," : "") + cell(row[c]);
    out += "\n";
  }
  return out;
}

std::string FormatJson(const Table& t) {
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (size_t r = 0; r < t.rows.size(); ++r) {
    nlohmann::ordered_json o;
    for (size_t c = 0; c < t.columns.size(); ++c) {
      if (t.is_null[r][c]) {
        o[t.columns[c]] = nullptr;
        continue;
      }
      const std::string& v = t.rows[r][c];
      char* end = nullptr;
      const double d = std::strtod(v.c_str(), &end);
      if (!v.empty() && end != nullptr && *end == '\0') {
        if (v.find_first_of(".eE") == std::string::npos)
          o[t.columns[c]] = std::stoll(v);
        else
          o[t.columns[c]] = d;
      } else {
        o[t.columns[c]] = v;
      }
    }
    rows.push_back(o);
  }
  return rows.dump(1) + "\n";
}

}  // namespace megascope::analyzer
