#include "megascope/analyzer/query.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "megascope/tracer/run_layout.h"
#include "megascope/tracer/trace_schema.h"

namespace megascope::analyzer {
namespace {

namespace fs = std::filesystem;
using tracer::kTraceTables;

std::string Quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? "''" : std::string(1, c);
  return out + "'";
}

constexpr size_t kOptional = std::size(tracer::kOptionalTraceTables);

// The union of the nodes' tables: views over the attached files, or, past SQLite's attach limit
// (`copy`), copies in memory shaped after the first readable node's. The nodes' optional tables
// (open_ops, device_spans) are tables older files lack.
struct NodeTables {
  bool copy = false, created = false;
  RunScope scope;
  std::vector<std::string> parts[std::size(kTraceTables)];
  std::vector<std::string> optional_parts[kOptional];

  // The rows of `table` the scope reads: a WHERE clause, or "".
  std::string Where(std::string_view table) const {
    if (scope.whole() || table == "ranks") return "";
    const bool timed = table == "spans" || table == "collectives" || table == "heartbeats";
    if (!timed && (table != "metrics" || !scope.all_steps())) return " WHERE 0";
    std::string w = " WHERE 1";
    if (!scope.all_steps()) {
      // A collective's step is the one it completed in: an asynchronous send issued in the
      // window's last step may complete in the next, so that step's collectives are read too.
      int64_t last = scope.last_step;
      if (table == "collectives" && last < std::numeric_limits<int64_t>::max()) ++last;
      w += " AND step >= " + std::to_string(scope.first_step) +
           " AND step <= " + std::to_string(last);
      if (scope.attempt >= 0) w += " AND attempt = " + std::to_string(scope.attempt);
    }
    if (!scope.all_time()) {
      const std::string_view column = table == "spans"         ? "start_ns"
                                      : table == "collectives" ? "enqueued_ns"
                                                               : "ts_ns";
      w += " AND " + std::string(column) + " >= " + std::to_string(scope.from_ns) + " AND " +
           std::string(column) + " < " + std::to_string(scope.to_ns);
    }
    return w;
  }

  // The rows of an optional table the scope reads: the ops still open (few: those open at the
  // agent's last look) whatever the steps, by issue time in a time window; device spans by time,
  // in a step window within the time the node's spans of those steps cover.
  std::string OptionalWhere(std::string_view table, const std::string& alias) const {
    if (scope.whole()) return "";
    const std::string column = table == "open_ops" ? "enqueued_ns" : "start_ns";
    std::string w = " WHERE 1";
    if (!scope.all_time())
      w += " AND " + column + " >= " + std::to_string(scope.from_ns) + " AND " + column + " < " +
           std::to_string(scope.to_ns);
    if (table == "open_ops" || scope.all_steps()) return w;
    const std::string steps = alias + ".spans" + Where("spans");
    return w + " AND start_ns >= (SELECT MIN(start_ns) FROM " + steps +
           ") AND start_ns <= (SELECT MAX(end_ns) FROM " + steps + ")";
  }

  // The node attached as `alias`.
  Status Add(tracer::sql::Database& db, const std::string& alias) {
    if (copy && !created) {
      for (std::string_view t : kTraceTables) {
        RETURN_IF_ERROR(db.Exec("CREATE TABLE main." + std::string(t) + " AS SELECT * FROM " +
                                alias + "." + std::string(t) + " WHERE 0"));
      }
      created = true;
    }
    for (size_t t = 0; t < std::size(kTraceTables); ++t) {
      const std::string table(kTraceTables[t]);
      const std::string rows = "SELECT * FROM " + alias + "." + table + Where(table);
      if (copy) {
        RETURN_IF_ERROR(db.Exec("INSERT INTO main." + table + " " + rows));
      } else {
        parts[t].push_back(rows);
      }
    }
    for (size_t t = 0; t < kOptional; ++t) {
      const std::string table(tracer::kOptionalTraceTables[t].name);
      auto has = db.QueryInt("SELECT COUNT(*) FROM " + alias +
                             ".sqlite_master WHERE type = 'table' AND name = '" + table + "'");
      if (!has.ok() || *has == 0) continue;
      const std::string rows = "SELECT * FROM " + alias + "." + table + OptionalWhere(table, alias);
      if (!copy) {
        optional_parts[t].push_back(rows);
        continue;
      }
      RETURN_IF_ERROR(db.Exec(tracer::OptionalTableSql(tracer::kOptionalTraceTables[t], "main.")));
      RETURN_IF_ERROR(db.Exec("INSERT INTO main." + table + " " + rows));
    }
    return copy ? db.Exec("DETACH " + alias) : Status::Ok();
  }

  // The views over every node (or the copies' tables), and the open ops' view.
  Status Finish(tracer::sql::Database& db) const {
    if (!copy) {
      for (size_t t = 0; t < std::size(kTraceTables); ++t) {
        std::string view = "CREATE TEMP VIEW " + std::string(kTraceTables[t]) + " AS ";
        for (size_t i = 0; i < parts[t].size(); ++i) view += (i ? " UNION ALL " : "") + parts[t][i];
        RETURN_IF_ERROR(db.Exec(view));
      }
    }
    for (size_t t = 0; t < kOptional; ++t) {
      const tracer::OptionalTraceTable& table = tracer::kOptionalTraceTables[t];
      if (copy || optional_parts[t].empty()) {  // copied, or empty: the files predate it
        RETURN_IF_ERROR(db.Exec(tracer::OptionalTableSql(table, "main.")));
        continue;
      }
      std::string view = "CREATE TEMP VIEW " + std::string(table.name) + " AS ";
      for (size_t i = 0; i < optional_parts[t].size(); ++i)
        view += (i ? " UNION ALL " : "") + optional_parts[t][i];
      RETURN_IF_ERROR(db.Exec(view));
    }
    // The ops still open as far as the run's records go: open_ops without a completed or failed
    // record of the same op (an agent lists an op that completed until its next look).
    return db.Exec(
        "CREATE TEMP VIEW open_collectives AS SELECT o.* FROM open_ops o WHERE NOT EXISTS (SELECT "
        "1 FROM collectives c WHERE c.rank = o.rank AND c.attempt = o.attempt AND c.seq = o.seq "
        "AND c.grp = o.grp AND c.op = o.op AND (o.op NOT IN ('send', 'recv') OR c.peer = o.peer))");
  }
};

}  // namespace

Result<std::unique_ptr<RunDatabase>> RunDatabase::Open(const std::string& run_dir,
                                                       const RunScope& scope) {
  if (!fs::is_directory(run_dir)) return NotFound("run directory " + run_dir + " does not exist");
  std::vector<std::string> files;
  std::error_code ec;
  const RunLayout layout(run_dir);
  for (const auto& e : fs::directory_iterator(layout.nodes(), ec)) {
    const std::string node = e.path().filename().string();
    const std::string f = layout.trace_db(node);
    if ((scope.node.empty() || node == scope.node) && fs::exists(f)) files.push_back(f);
  }
  std::sort(files.begin(), files.end());
  if (files.empty() && !scope.node.empty())
    return NotFound("no trace database " + layout.trace_db(scope.node));
  if (files.empty())
    return NotFound("no trace databases under " + run_dir +
                    "/nodes/*/trace.db (was the run started with agents?)");
  std::unique_ptr<RunDatabase> r(new RunDatabase());
  r->nodes_ = static_cast<int>(files.size());
  ASSIGN_OR_RETURN(r->db_, tracer::sql::Database::Open("", tracer::sql::Database::Mode::kMemory));
  tracer::sql::Database& db = r->db_;
  const int limit = db.attach_limit();
  NodeTables tables;
  tables.copy = static_cast<int>(files.size()) > limit;
  tables.scope = scope;
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string alias = "n" + std::to_string(i % static_cast<size_t>(limit));
    // A node database that cannot be read (corrupt, cut short, not ours) is named and skipped:
    // the other nodes are still answered for. A newer schema is an error.
    auto skip = [&](const std::string& why) {
      r->warnings_.push_back(files[i] + ": " + why + ": skipped, its node's rows are missing");
      (void)db.Exec("DETACH " + alias);
    };
    if (!db.Exec("ATTACH " + Quote("file:" + files[i] + "?mode=ro") + " AS " + alias).ok()) {
      skip("cannot be opened (" + db.LastMessage() + ")");
      continue;
    }
    auto version = db.QueryInt("PRAGMA " + alias + ".user_version");
    auto probe = db.Prepare("SELECT COUNT(*) FROM " + alias + ".spans");
    if (!version.ok() || !probe.ok()) {
      skip("not a readable megascope trace database (" + db.LastMessage() + ")");
      continue;
    }
    RETURN_IF_ERROR(tracer::CheckReadableTraceVersion(*version, files[i]));
    RETURN_IF_ERROR(tables.Add(db, alias));
  }
  if (static_cast<int>(r->warnings_.size()) == r->nodes_) {
    return DataLoss("no trace database under " + run_dir +
                    "/nodes could be read: " + r->warnings_.front());
  }
  r->nodes_ -= static_cast<int>(r->warnings_.size());
  RETURN_IF_ERROR(tables.Finish(db));
  db.DenyWrites();  // after set-up, statements may only read
  return r;
}

RunDatabase::~RunDatabase() = default;

NodeScan::NodeScan(std::string run_dir, RunScope scope)
    : run_dir_(std::move(run_dir)), scope_(std::move(scope)) {
  std::error_code ec;
  const RunLayout layout(run_dir_);
  for (const auto& e : fs::directory_iterator(layout.nodes(), ec)) {
    const std::string node = e.path().filename().string();
    if (fs::exists(layout.trace_db(node))) nodes_.push_back(node);
  }
  std::sort(nodes_.begin(), nodes_.end());
}

Status NodeScan::Scan(const std::string& sql,
                      const std::function<void(const RunDatabase::Row&)>& fn) {
  if (nodes_.empty())
    return NotFound("no trace databases under " + run_dir_ +
                    "/nodes/*/trace.db (was the run started with agents?)");
  warnings_.clear();
  for (const std::string& node : nodes_) {
    RunScope one = scope_;
    one.node = node;
    auto db = RunDatabase::Open(run_dir_, one);
    Status st = db.ok() ? (*db)->Scan(sql, fn) : db.status();
    if (!st.ok()) warnings_.push_back(node + ": " + st.message());
  }
  if (warnings_.size() == nodes_.size()) return DataLoss(warnings_.front());
  return Status::Ok();
}

Result<Table> RunDatabase::Query(const std::string& sql, size_t max_rows, bool* truncated) {
  std::string_view tail;
  auto prepared = db_.Prepare(sql, false, &tail);
  if (!prepared.ok()) {
    const std::string msg = db_.LastMessage();
    if (msg.find("not authorized") != std::string::npos ||
        msg.find("cannot modify") != std::string::npos) {
      return Status(StatusCode::kPermissionDenied,
                    "writes are refused: trace databases are opened read-only (" + msg + ")");
    }
    if (prepared.status().message().find("empty SQL") != std::string::npos)
      return InvalidArgument("empty SQL");
    return InvalidArgument("bad SQL: " + msg);
  }
  tracer::sql::Statement& st = *prepared;
  if (!st.read_only()) {
    return Status(StatusCode::kPermissionDenied,
                  "writes are refused: only read-only statements run over trace databases");
  }
  if (tail.find_first_not_of(" \t\r\n;") != std::string_view::npos)
    return InvalidArgument("one statement at a time, please");
  auto t = ReadTable(st, max_rows, truncated);
  if (!t.ok() && db_.stopped())
    return Status(StatusCode::kDeadlineExceeded, "the query ran out of time");
  if (!t.ok()) return InvalidArgument("query failed: " + db_.LastMessage());
  return t;
}

Result<Table> ReadTable(tracer::sql::Statement& st, size_t max_rows, bool* truncated) {
  Table t;
  for (int c = 0; c < st.columns(); ++c) t.columns.push_back(st.ColumnName(c));
  if (truncated != nullptr) *truncated = false;
  for (;;) {
    ASSIGN_OR_RETURN(const bool row, st.Step());
    if (!row) break;
    if (t.rows.size() == max_rows) {
      if (truncated != nullptr) *truncated = true;
      break;
    }
    std::vector<std::string> cells;
    std::vector<bool> nulls;
    for (int c = 0; c < st.columns(); ++c) {
      nulls.push_back(st.IsNull(c));
      cells.emplace_back(st.Text(c));
    }
    t.rows.push_back(std::move(cells));
    t.is_null.push_back(std::move(nulls));
  }
  return t;
}

Status RunDatabase::Scan(const std::string& sql, const std::function<void(const Row&)>& fn) {
  auto prepared = db_.Prepare(sql);
  if (!prepared.ok()) return InvalidArgument("bad SQL: " + db_.LastMessage());
  for (;;) {
    auto row = prepared->Step();
    if (!row.ok()) return InvalidArgument("query failed: " + db_.LastMessage());
    if (!*row) return Status::Ok();
    fn(*prepared);
  }
}

std::string PerRankStepCte() { return tracer::PerRankStepSql(); }

std::string StepsSql() {
  return tracer::PerRankStepSql() + R"sql(
SELECT attempt, step, COUNT(*) AS ranks, ROUND(MAX(wall) / 1e6, 3) AS step_ms, ROUND(AVG(compute) / 1e6, 3) AS compute_ms,
       ROUND(AVG(comm) / 1e6, 3) AS comm_wait_ms, ROUND(AVG(data) / 1e6, 3) AS data_ms,
       ROUND(AVG(MAX(0, wall - compute - comm - data)) / 1e6, 3) AS bubble_ms
FROM per_rank GROUP BY attempt, step ORDER BY attempt, step)sql";
}

// A rank's node is the one it ran on in that attempt (a restart may move it to a spare).
std::string StragglersSql() {
  return tracer::PerRankStepSql() + R"sql(,
mean AS (SELECT p.attempt, p.rank, r.node, r.dp, r.pp, r.tp, AVG(p.compute) AS compute_per_step
         FROM per_rank p JOIN (SELECT attempt, rank, node, dp, pp, tp FROM ranks GROUP BY attempt, rank) r
           ON r.attempt = p.attempt AND r.rank = p.rank GROUP BY p.attempt, p.rank),
peers AS (SELECT attempt, pp, tp, AVG(compute_per_step) AS peer_avg, COUNT(*) AS n FROM mean GROUP BY attempt, pp, tp)
SELECT m.attempt, m.rank, m.node, m.dp, m.pp, m.tp, ROUND(m.compute_per_step / 1e6, 3) AS compute_ms_per_step,
       ROUND(q.peer_avg / 1e6, 3) AS peers_ms_per_step, ROUND(m.compute_per_step / q.peer_avg, 3) AS ratio, q.n AS peers
FROM mean m JOIN peers q ON q.attempt = m.attempt AND q.pp = m.pp AND q.tp = m.tp
ORDER BY ratio DESC, m.attempt, m.rank)sql";
}

// A collective is one (attempt, group, seq): sequence numbers start again with every attempt. Its
// members are the ranks that issued it, completed or still open (open_collectives): a hang's
// collective is listed while it lasts, its wait running to when it was last seen open.
std::string WaitsSql(int limit) {
  return R"sql(
WITH c AS (SELECT attempt, grp, seq, op, rank, enqueued_ns, 0 AS is_open, enqueued_ns AS until_ns
           FROM collectives WHERE op NOT IN ('send','recv')
           UNION ALL
           SELECT attempt, grp, seq, op, rank, enqueued_ns, 1, seen_ns
           FROM open_collectives WHERE op NOT IN ('send','recv')),
w AS (SELECT attempt, grp, seq, op, COUNT(*) AS members, SUM(is_open) AS still_open,
             CASE WHEN SUM(is_open) > 0 THEN MAX(until_ns) ELSE MAX(enqueued_ns) END - MIN(enqueued_ns) AS wait_ns,
             MAX(enqueued_ns) AS last_ns
      FROM c GROUP BY attempt, grp, seq, op HAVING members > 1 OR still_open > 0)
SELECT w.attempt, w.grp, w.seq, w.op, w.members, w.still_open, ROUND(w.wait_ns / 1e6, 3) AS wait_ms,
       (SELECT rank FROM c WHERE c.attempt = w.attempt AND c.grp = w.grp AND c.seq = w.seq AND c.enqueued_ns = w.last_ns LIMIT 1) AS last_rank
FROM w ORDER BY w.wait_ns DESC LIMIT )sql" +
         std::to_string(limit);
}

// Each rank as it was at `t`: the newest attempt it had begun by then (its first heartbeat), the
// node it ran on in that attempt, and what it was doing in it: the shortest span around `t`, or
// else the oldest op it held open from before `t` (where a hung rank is stuck).
std::string AtSql(int64_t t) {
  const std::string ts = std::to_string(t);
  return "WITH cur AS (SELECT rank, COALESCE((SELECT MAX(h.attempt) FROM heartbeats h WHERE h.rank "
         "= "
         "x.rank AND h.ts_ns <= " +
         ts +
         "), MIN(x.attempt)) AS attempt FROM ranks x GROUP BY x.rank)"
         " SELECT r.rank, r.attempt, r.node, r.dp, r.pp, r.tp,"
         " COALESCE((SELECT kind || ' ' || name || ' (step ' || step || COALESCE(', mb ' || "
         "microbatch, '') || ')' FROM spans s"
         "  WHERE s.rank = r.rank AND s.attempt = r.attempt AND s.start_ns <= " +
         ts + " AND s.end_ns >= " + ts +
         "  ORDER BY s.end_ns - s.start_ns LIMIT 1),"
         " (SELECT 'in ' || o.op || ' ' || o.grp || ' #' || o.seq || CASE WHEN o.peer >= 0 THEN "
         "' with rank ' || o.peer ELSE '' END || ' (' || o.state || ', open)' FROM "
         "open_collectives o WHERE o.rank = r.rank AND o.attempt = r.attempt AND o.enqueued_ns "
         "<= " +
         ts +
         " ORDER BY o.enqueued_ns LIMIT 1)) AS doing,"
         " (SELECT phase || ' of step ' || step FROM heartbeats h WHERE h.rank = r.rank AND "
         "h.attempt = r.attempt AND h.ts_ns <= " +
         ts +
         "  ORDER BY h.ts_ns DESC LIMIT 1) AS last_heartbeat"
         " FROM cur JOIN ranks r ON r.rank = cur.rank AND r.attempt = cur.attempt"
         " GROUP BY r.rank ORDER BY r.rank";
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
