#include "megascope/analyzer/node_query.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "agent_answer.h"
#include "megascope/tracer/format.h"
#include "megascope/tracer/http_client.h"

namespace megascope::analyzer {
namespace {

using nlohmann::json;
constexpr std::string_view kQuestions[] = {"steps", "stragglers", "waits",
                                           "at",    "sql",        "quantiles"};

// Each question's part (per node) and merge (over the union of the parts, table `part`).
// steps: per (attempt, step) the ranks, the slowest wall and sums that average after the merge.
constexpr const char* kStepsPart = R"sql(
SELECT attempt, step, COUNT(*) AS ranks, MAX(wall) AS wall_max, SUM(compute) AS compute_sum,
       SUM(comm) AS comm_sum, SUM(data) AS data_sum, SUM(MAX(0, wall - compute - comm - data)) AS bubble_sum
FROM per_rank GROUP BY attempt, step)sql";
constexpr const char* kStepsMerge = R"sql(
SELECT attempt, step, SUM(ranks) AS ranks, ROUND(MAX(wall_max) / 1e6, 3) AS step_ms,
       ROUND(SUM(compute_sum) * 1.0 / SUM(ranks) / 1e6, 3) AS compute_ms,
       ROUND(SUM(comm_sum) * 1.0 / SUM(ranks) / 1e6, 3) AS comm_wait_ms,
       ROUND(SUM(data_sum) * 1.0 / SUM(ranks) / 1e6, 3) AS data_ms,
       ROUND(SUM(bubble_sum) * 1.0 / SUM(ranks) / 1e6, 3) AS bubble_ms
FROM part GROUP BY attempt, step ORDER BY attempt, step)sql";
// stragglers: per rank its compute summed over its steps (a rank's rows of one attempt are on its
// node); its peers, ranks of the same (pp, tp) on any node, only meet in the merge.
constexpr const char* kStragglersPart = R"sql(
SELECT p.attempt, p.rank, r.node, r.dp, r.pp, r.tp, SUM(p.compute) AS compute_sum, COUNT(*) AS steps
FROM per_rank p JOIN (SELECT attempt, rank, node, dp, pp, tp FROM ranks GROUP BY attempt, rank) r
  ON r.attempt = p.attempt AND r.rank = p.rank GROUP BY p.attempt, p.rank)sql";
constexpr const char* kStragglersMerge = R"sql(
WITH mean AS (SELECT attempt, rank, node, dp, pp, tp, SUM(compute_sum) * 1.0 / SUM(steps) AS compute_per_step
              FROM part GROUP BY attempt, rank),
peers AS (SELECT attempt, pp, tp, AVG(compute_per_step) AS peer_avg, COUNT(*) AS n FROM mean GROUP BY attempt, pp, tp)
SELECT m.attempt, m.rank, m.node, m.dp, m.pp, m.tp, ROUND(m.compute_per_step / 1e6, 3) AS compute_ms_per_step,
       ROUND(q.peer_avg / 1e6, 3) AS peers_ms_per_step, ROUND(m.compute_per_step / q.peer_avg, 3) AS ratio, q.n AS peers
FROM mean m JOIN peers q ON q.attempt = m.attempt AND q.pp = m.pp AND q.tp = m.tp
ORDER BY ratio DESC, m.attempt, m.rank)sql";
// waits: per collective the node's members, open members, first and last issue and how long the
// open ones have been seen, and who issued last; the wait is measured over every node's members.
constexpr const char* kWaitsPart = R"sql(
WITH c AS (SELECT attempt, grp, seq, op, rank, enqueued_ns, 0 AS is_open, enqueued_ns AS until_ns
           FROM collectives WHERE op NOT IN ('send','recv')
           UNION ALL
           SELECT attempt, grp, seq, op, rank, enqueued_ns, 1, seen_ns
           FROM open_collectives WHERE op NOT IN ('send','recv')),
w AS (SELECT attempt, grp, seq, op, COUNT(*) AS n, SUM(is_open) AS n_open, MIN(enqueued_ns) AS first_ns,
             MAX(enqueued_ns) AS last_ns, MAX(until_ns) AS until_ns FROM c GROUP BY attempt, grp, seq, op)
SELECT w.*, (SELECT rank FROM c WHERE c.attempt = w.attempt AND c.grp = w.grp AND c.seq = w.seq
                                  AND c.enqueued_ns = w.last_ns LIMIT 1) AS last_rank FROM w)sql";
constexpr const char* kWaitsMerge = R"sql(
WITH w AS (SELECT attempt, grp, seq, op, SUM(n) AS members, SUM(n_open) AS still_open,
                  CASE WHEN SUM(n_open) > 0 THEN MAX(until_ns) ELSE MAX(last_ns) END - MIN(first_ns) AS wait_ns,
                  MAX(last_ns) AS newest_ns
           FROM part GROUP BY attempt, grp, seq, op HAVING SUM(n) > 1 OR SUM(n_open) > 0)
SELECT w.attempt, w.grp, w.seq, w.op, w.members, w.still_open, ROUND(w.wait_ns / 1e6, 3) AS wait_ms,
       (SELECT last_rank FROM part p WHERE p.attempt = w.attempt AND p.grp = w.grp AND p.seq = w.seq
                                       AND p.op = w.op AND p.last_ns = w.newest_ns LIMIT 1) AS last_rank
FROM w ORDER BY w.wait_ns DESC LIMIT )sql";
// at: each node says, for its ranks, the newest attempt begun by then (a heartbeat at or before the
// moment: `begun`) or else the first it has; the merge keeps per rank the newest begun attempt of
// any node (a rank restarted on a spare has older attempts elsewhere), else the oldest.
constexpr const char* kAtMerge = R"sql(
WITH pick AS (SELECT rank, CASE WHEN MAX(begun) > 0 THEN MAX(CASE WHEN begun > 0 THEN attempt END)
                                ELSE MIN(attempt) END AS attempt FROM part GROUP BY rank)
SELECT p.rank, p.attempt, p.node, p.dp, p.pp, p.tp, p.doing, p.last_heartbeat
FROM part p JOIN pick ON pick.rank = p.rank AND pick.attempt = p.attempt GROUP BY p.rank ORDER BY p.rank)sql";

// quantiles: DDSketch's buckets (Masson et al., VLDB 2019) with relative accuracy a = 1 %: a
// duration x > 0 falls in bucket i = ceil(log_g x), g = (1 + a) / (1 - a), whose every value is
// within a of 2 g^i / (g + 1); zero (and below) is a bucket of its own. A node sends per attempt
// its buckets' counts and its least and greatest value; the merge adds the counts and reads each
// quantile (the least value with at least q of the samples at or below it) from the cumulative
// counts, kept within the least and greatest value seen.
constexpr const char* kGamma = "1.0202020202020202";
std::string QuantilesPart(const std::string& column) {
  return std::string(",\nv AS (SELECT attempt, ") + column + R"sql( AS x FROM per_rank)
SELECT attempt, CASE WHEN x > 0 THEN CAST(CEIL(LN(x) / LN()sql" +
         kGamma + R"sql()) AS INTEGER) END AS bin,
       COUNT(*) AS n, MIN(x) AS lo, MAX(x) AS hi
FROM v GROUP BY attempt, bin)sql";
}
std::string QuantilesMerge(std::string of) {
  const auto& ofs = QuantileOfs();
  if (std::find(ofs.begin(), ofs.end(), of) == ofs.end()) of = "?";  // never text into the SQL
  auto at = [](const char* q) {
    return std::string(
               "ROUND(MAX(a.lo, MIN(a.hi, (SELECT CASE WHEN c.bin IS NULL THEN 0 ELSE "
               "2 * POW(") +
           kGamma + ", c.bin) / (" + kGamma +
           " + 1) END FROM c WHERE c.attempt = a.attempt AND c.cum >= " + q +
           " * a.samples ORDER BY c.cum LIMIT 1))) / 1e6, 3)";
  };
  return std::string(R"sql(
WITH b AS (SELECT attempt, bin, SUM(n) AS n, MIN(lo) AS lo, MAX(hi) AS hi FROM part GROUP BY attempt, bin),
c AS (SELECT attempt, bin, SUM(n) OVER (PARTITION BY attempt ORDER BY bin NULLS FIRST
                                        ROWS UNBOUNDED PRECEDING) AS cum FROM b),
a AS (SELECT attempt, SUM(n) AS samples, MIN(lo) AS lo, MAX(hi) AS hi FROM b GROUP BY attempt)
SELECT a.attempt, ')sql") +
         of + "' AS of, a.samples, " + at("0.5") + " AS p50_ms, " + at("0.9") + " AS p90_ms, " +
         at("0.99") + " AS p99_ms, ROUND(a.hi / 1e6, 3) AS max_ms FROM a ORDER BY a.attempt";
}
// The per_rank column of each duration `quantiles` can be asked of.
constexpr std::pair<const char*, const char*> kQuantileColumns[] = {
    {"step", "wall"}, {"compute", "compute"}, {"comm_wait", "comm"}, {"data", "data"}};

std::string Quoted(const std::string& name) {
  std::string q = "\"";
  for (char c : name) q += c == '"' ? "\"\"" : std::string(1, c);
  return q + "\"";
}

}  // namespace

std::string_view QuestionName(Question q) { return kQuestions[static_cast<int>(q)]; }

const std::vector<std::string>& QuantileOfs() {
  static const std::vector<std::string> ofs = [] {
    std::vector<std::string> v;
    for (const auto& [of, column] : kQuantileColumns) v.emplace_back(of);
    return v;
  }();
  return ofs;
}

Result<NodeQuery> ParseNodeQuery(std::string_view query) {
  NodeQuery q;
  bool asked = false;
  for (const auto& [key, raw] : answer::Fields(query)) {
    const std::string value = tracer::PercentDecode(raw, /*plus_is_space=*/true);
    if (key == "q") {
      const auto* it = std::find(std::begin(kQuestions), std::end(kQuestions), value);
      if (it == std::end(kQuestions))
        return InvalidArgument("query: unknown question '" + value +
                               "' (steps, stragglers, waits, at, sql, quantiles)");
      q.question = static_cast<Question>(it - std::begin(kQuestions));
      asked = true;
    } else if (key == "sql") {
      q.sql = value;
    } else if (key == "of") {
      const auto& ofs = QuantileOfs();
      if (std::find(ofs.begin(), ofs.end(), value) == ofs.end())
        return InvalidArgument("query: unknown of '" + value +
                               "' (step, compute, comm_wait, data)");
      q.of = value;
    } else if (key == "at" || key == "from_ns" || key == "to_ns" || key == "limit") {
      ASSIGN_OR_RETURN(const int64_t v, answer::Integer("query", key, value));
      if (key == "at") q.at_ns = v;
      if (key == "from_ns") q.from_ns = v;
      if (key == "to_ns") q.to_ns = v;
      if (key == "limit") {
        if (v < 1 || v > 1000000) return InvalidArgument("query: limit must be 1 to 1000000");
        q.limit = static_cast<int>(v);
      }
    } else {
      return InvalidArgument("query: unknown field '" + std::string(key) +
                             "' (q, sql, at, of, from_ns, to_ns, limit)");
    }
  }
  if (!asked) return InvalidArgument("query: q (the question) is needed");
  if ((q.question == Question::kSql) == q.sql.empty())
    return InvalidArgument("query: sql goes with q=sql, and only with it");
  if (q.to_ns <= q.from_ns) return InvalidArgument("query: to_ns must be after from_ns");
  return q;
}

std::string NodeQueryPath(const NodeQuery& q) {
  std::string p = "/query?q=" + std::string(QuestionName(q.question));
  if (q.question == Question::kSql) p += "&sql=" + tracer::PercentEncode(q.sql);
  if (q.question == Question::kAt) p += "&at=" + std::to_string(q.at_ns);
  if (q.question == Question::kWaits) p += "&limit=" + std::to_string(q.limit);
  if (q.question == Question::kQuantiles) p += "&of=" + tracer::PercentEncode(q.of);
  if (q.from_ns != std::numeric_limits<int64_t>::min())
    p += "&from_ns=" + std::to_string(q.from_ns);
  if (q.to_ns != std::numeric_limits<int64_t>::max()) p += "&to_ns=" + std::to_string(q.to_ns);
  return p;
}

RunScope QueryScope(const NodeQuery& q) {
  RunScope s;
  s.from_ns = q.from_ns;
  s.to_ns = q.to_ns;
  return s;
}

std::string PartSql(const NodeQuery& q) {
  switch (q.question) {
    case Question::kSteps:
      return PerRankStepCte() + kStepsPart;
    case Question::kStragglers:
      return PerRankStepCte() + kStragglersPart;
    case Question::kWaits:
      return kWaitsPart;
    case Question::kAt:
      return "SELECT a.*, (SELECT COUNT(*) FROM heartbeats h WHERE h.rank = a.rank AND h.attempt = "
             "a.attempt AND h.ts_ns <= " +
             std::to_string(q.at_ns) + ") AS begun FROM (" + AtSql(q.at_ns) + ") a";
    case Question::kSql:
      return q.sql;
    case Question::kQuantiles:
      for (const auto& [of, column] : kQuantileColumns) {
        if (q.of == of) return PerRankStepCte() + QuantilesPart(column);
      }
      break;
  }
  return q.sql;
}

std::string MergeSql(const NodeQuery& q, const std::string& merge_sql) {
  switch (q.question) {
    case Question::kSteps:
      return kStepsMerge;
    case Question::kStragglers:
      return kStragglersMerge;
    case Question::kWaits:
      return kWaitsMerge + std::to_string(q.limit);
    case Question::kAt:
      return kAtMerge;
    case Question::kQuantiles:
      return QuantilesMerge(q.of);
    case Question::kSql:
      break;
  }
  return merge_sql.empty() ? "SELECT * FROM part" : merge_sql;
}

std::string QueryPartJson(const QueryPart& part) {
  json rows = json::array();
  for (size_t r = 0; r < part.table.rows.size(); ++r) {
    json row = json::array();
    for (size_t c = 0; c < part.table.columns.size(); ++c) {
      if (part.table.is_null[r][c])
        row.push_back(nullptr);
      else
        row.push_back(part.table.rows[r][c]);
    }
    rows.push_back(std::move(row));
  }
  return json{{"version", QueryPart::kVersion},
              {"node", part.node},
              {"truncated", part.truncated},
              {"columns", part.table.columns},
              {"rows", std::move(rows)}}
             .dump() +
         "\n";
}

Result<QueryPart> ParseQueryPart(std::string_view text) {
  ASSIGN_OR_RETURN(const json j, answer::ReadVersioned(text, "/query", QueryPart::kVersion));
  QueryPart part;
  try {
    part.node = j.at("node").get<std::string>();
    part.truncated = j.at("truncated").get<bool>();
    part.table.columns = j.at("columns").get<std::vector<std::string>>();
    for (const json& row : j.at("rows")) {
      if (row.size() != part.table.columns.size())
        return DataLoss("a /query answer from " + part.node + " has a row of " +
                        std::to_string(row.size()) + " cells for " +
                        std::to_string(part.table.columns.size()) + " columns");
      std::vector<std::string> cells;
      std::vector<bool> nulls;
      for (const json& cell : row) {
        nulls.push_back(cell.is_null());
        cells.push_back(cell.is_null() ? "" : cell.get<std::string>());
      }
      part.table.rows.push_back(std::move(cells));
      part.table.is_null.push_back(std::move(nulls));
    }
  } catch (const json::exception& e) {
    return DataLoss("a malformed /query answer" +
                    (part.node.empty() ? std::string() : " from " + part.node) + ": " + e.what());
  }
  return part;
}

Result<Table> MergeParts(const NodeQuery& q, const std::vector<QueryPart>& parts,
                         const std::string& merge_sql) {
  if (parts.empty()) return NotFound("no node answered");
  const std::vector<std::string>& columns = parts.front().table.columns;
  ASSIGN_OR_RETURN(auto db, tracer::sql::Database::Open("", tracer::sql::Database::Mode::kMemory));
  // NUMERIC columns: the parts' cells come as text, and numbers must compare and add as numbers.
  std::string create = "CREATE TABLE part(", insert = "INSERT INTO part VALUES(";
  for (size_t c = 0; c < columns.size(); ++c) {
    create += (c ? ", " : "") + Quoted(columns[c]) + " NUMERIC";
    insert += c ? ", ?" : "?";
  }
  RETURN_IF_ERROR(db.Exec(create + ")"));
  RETURN_IF_ERROR(db.Exec("BEGIN"));
  ASSIGN_OR_RETURN(auto ins, db.Prepare(insert + ")"));
  for (const QueryPart& p : parts) {
    if (p.table.columns != columns)
      return InvalidArgument(p.node + " answered other columns than " + parts.front().node +
                             " (an agent of another megascope version?)");
    for (size_t r = 0; r < p.table.rows.size(); ++r) {
      for (size_t c = 0; c < columns.size(); ++c) {
        if (p.table.is_null[r][c])
          ins.BindNull(static_cast<int>(c) + 1);
        else
          ins.Bind(static_cast<int>(c) + 1, std::string_view(p.table.rows[r][c]));
      }
      RETURN_IF_ERROR(ins.Run());
    }
  }
  RETURN_IF_ERROR(db.Exec("COMMIT"));
  db.DenyWrites();
  auto merge = db.Prepare(MergeSql(q, merge_sql));
  if (!merge.ok()) return InvalidArgument("bad merge SQL over table part: " + db.LastMessage());
  auto t = ReadTable(*merge);
  if (!t.ok()) return InvalidArgument("merge failed: " + db.LastMessage());
  return t;
}

QueryServer::QueryServer(std::string run_dir, std::string node, size_t max_rows, double max_seconds)
    : run_dir_(std::move(run_dir)),
      node_(std::move(node)),
      max_rows_(max_rows),
      max_seconds_(max_seconds) {}

Result<QueryPart> QueryServer::Part(const NodeQuery& q) const {
  RunScope scope = QueryScope(q);
  scope.node = node_;
  ASSIGN_OR_RETURN(auto db, RunDatabase::Open(run_dir_, scope));
  db->StopAt(std::chrono::steady_clock::now() +
             std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                 std::chrono::duration<double>(max_seconds_)));
  QueryPart part;
  part.node = node_;
  auto t = db->Query(PartSql(q), max_rows_, &part.truncated);
  if (!t.ok() && t.status().code() == StatusCode::kDeadlineExceeded) {
    std::string limit = tracer::Format("%g", max_seconds_);
    return Status(StatusCode::kDeadlineExceeded,
                  "the query ran past this agent's limit of " + std::string(limit) +
                      " s: ask for a shorter window (from_ns, to_ns)");
  }
  if (!t.ok()) return t.status();
  part.table = std::move(*t);
  return part;
}

std::pair<int, std::string> QueryServer::Serve(std::string_view query) const {
  auto q = ParseNodeQuery(query);
  if (!q.ok()) return {400, answer::ErrorJson(q.status().message())};
  auto part = Part(*q);
  if (!part.ok()) {
    const StatusCode code = part.status().code();
    const bool theirs =
        code == StatusCode::kInvalidArgument || code == StatusCode::kPermissionDenied;
    return {theirs ? 400 : 503, answer::ErrorJson(node_ + ": " + part.status().message())};
  }
  return {200, QueryPartJson(*part)};
}

}  // namespace megascope::analyzer
