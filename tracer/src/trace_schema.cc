#include "megascope/tracer/trace_schema.h"

#include "megascope/tracer/records.h"

namespace megascope::tracer {

std::string OptionalTableSql(const OptionalTraceTable& table, std::string_view schema) {
  return "CREATE TABLE IF NOT EXISTS " + std::string(schema) + std::string(table.name) + "(" +
         std::string(table.columns) + ")";
}

// Per attempt, rank and step: wall time, compute (forward/backward/optimizer spans minus the
// collectives that ran inside them, e.g. tensor-parallel all-reduces), communication wait
// (synchronous comm spans; asynchronous sends overlap other work and are left out) and data time.
// A step run again after a restart is another row: its two runs are never one step.
std::string PerRankStepSql() {
  return R"sql(
WITH comp AS (SELECT attempt, rank, step, start_ns, end_ns FROM spans WHERE kind IN ('forward','backward','optimizer','compute')),
comm AS (SELECT attempt, rank, step, start_ns, end_ns FROM spans WHERE kind = 'comm' AND name != 'send'),
comm_total AS (SELECT attempt, rank, step, SUM(end_ns - start_ns) AS comm FROM comm GROUP BY attempt, rank, step),
nested AS (SELECT m.attempt, m.rank, m.step, SUM(m.end_ns - m.start_ns) AS nested FROM comm m JOIN comp c
             ON c.attempt = m.attempt AND c.rank = m.rank AND c.step = m.step AND c.start_ns <= m.start_ns AND c.end_ns >= m.end_ns
           GROUP BY m.attempt, m.rank, m.step),
comm_rank AS (SELECT t.attempt, t.rank, t.step, t.comm, COALESCE(n.nested, 0) AS nested FROM comm_total t
              LEFT JOIN nested n ON n.attempt = t.attempt AND n.rank = t.rank AND n.step = t.step),
busy AS (SELECT attempt, rank, step, MAX(end_ns) - MIN(start_ns) AS wall,
                SUM(CASE WHEN kind IN ('forward','backward','optimizer','compute') THEN end_ns - start_ns ELSE 0 END) AS busy,
                SUM(CASE WHEN kind = 'data' THEN end_ns - start_ns ELSE 0 END) AS data
         FROM spans GROUP BY attempt, rank, step),
per_rank AS (SELECT b.attempt, b.rank, b.step, b.wall, b.busy - COALESCE(c.nested, 0) AS compute, COALESCE(c.comm, 0) AS comm, b.data
             FROM busy b LEFT JOIN comm_rank c ON c.attempt = b.attempt AND c.rank = b.rank AND c.step = b.step))sql";
}

std::string SpansSelectSql(std::string_view span_rows_where, std::string_view collective_rows_and) {
  return "SELECT rank, attempt, step, microbatch, " + SpellingSql<SpanKind>("kind") +
         " AS kind, name, start_ns, start_ns + dur_ns AS end_ns FROM span_rows" +
         std::string(span_rows_where) + " UNION ALL SELECT rank, attempt, step, NULL, 'comm', " +
         SpellingSql<OpType>("op") +
         ", enqueued_ns + start_after_ns, enqueued_ns + end_after_ns FROM collective_rows WHERE "
         "state = " +
         std::to_string(static_cast<int>(OpState::kCompleted)) + " AND start_after_ns IS NOT NULL" +
         std::string(collective_rows_and);
}

std::string TraceSchemaSql() {
  const std::string completed = std::to_string(static_cast<int>(OpState::kCompleted));
  std::string optional;
  for (const OptionalTraceTable& t : kOptionalTraceTables) optional += OptionalTableSql(t) + ";\n";
  return optional + R"sql(
CREATE TABLE IF NOT EXISTS ranks(rank INTEGER, node TEXT, local_rank INTEGER, dp INTEGER, pp INTEGER, tp INTEGER,
                                 pid INTEGER, attempt INTEGER, clock_offset_ns INTEGER, PRIMARY KEY(rank, attempt));
CREATE TABLE IF NOT EXISTS span_rows(rank INTEGER, attempt INTEGER, step INTEGER, microbatch INTEGER, kind INTEGER,
                                     name TEXT, start_ns INTEGER, dur_ns INTEGER);
CREATE TABLE IF NOT EXISTS group_names(id INTEGER PRIMARY KEY, name TEXT UNIQUE);
CREATE TABLE IF NOT EXISTS collective_rows(rank INTEGER, attempt INTEGER, step INTEGER, grp INTEGER, seq INTEGER,
                                           op INTEGER, peer INTEGER, bytes INTEGER, dtype INTEGER, state INTEGER,
                                           enqueued_ns INTEGER, start_after_ns INTEGER, end_after_ns INTEGER);
CREATE TABLE IF NOT EXISTS heartbeat_rows(rank INTEGER, attempt INTEGER, ts_ns INTEGER, step INTEGER, phase INTEGER);
CREATE TABLE IF NOT EXISTS metrics(node TEXT, ts_ns INTEGER, name TEXT, value REAL);
CREATE TABLE IF NOT EXISTS drops(rank INTEGER, ts_ns INTEGER, dropped_records INTEGER);
CREATE TABLE IF NOT EXISTS ring_cursors(ring TEXT, lane INTEGER, tail INTEGER, PRIMARY KEY(ring, lane));
CREATE TABLE IF NOT EXISTS step_rollups(rank INTEGER, attempt INTEGER, step INTEGER, what TEXT, count INTEGER,
                                        total_ns INTEGER, bytes INTEGER, first_ns INTEGER, last_ns INTEGER);
-- No indexes: ingest speed comes first; queries over a node's file scan.
CREATE VIEW IF NOT EXISTS collectives AS
  SELECT c.rank, c.attempt, g.name AS grp, c.seq, )sql" +
         SpellingSql<OpType>("c.op") + R"sql( AS op, c.peer, c.bytes, )sql" +
         SpellingSql<DType>("c.dtype") + R"sql( AS dtype, )sql" + SpellingSql<OpState>("c.state") +
         R"sql( AS state,
         c.enqueued_ns, c.enqueued_ns + c.start_after_ns AS started_ns, c.enqueued_ns + c.end_after_ns AS completed_ns,
         c.step
  FROM collective_rows c LEFT JOIN group_names g ON g.id = c.grp;
CREATE VIEW IF NOT EXISTS spans AS
  )sql" + SpansSelectSql() +
         R"sql(;
CREATE VIEW IF NOT EXISTS heartbeats AS
  SELECT rank, attempt, ts_ns, step, )sql" +
         SpellingSql<Phase>("phase") + R"sql( AS phase FROM heartbeat_rows;
)sql";
}

std::string TraceRollupSql(int64_t spans_before, int64_t collectives_before) {
  return "INSERT INTO step_rollups SELECT rank, attempt, step, " + SpellingSql<SpanKind>("kind") +
         ", COUNT(*), SUM(dur_ns), NULL, MIN(start_ns), MAX(start_ns + dur_ns) FROM span_rows "
         "WHERE rowid < " +
         std::to_string(spans_before) +
         " GROUP BY rank, attempt, step, kind;"
         "INSERT INTO step_rollups SELECT rank, attempt, step, 'comm:' || " +
         SpellingSql<OpType>("op") +
         ", COUNT(*), SUM(end_after_ns), SUM(bytes), MIN(enqueued_ns), "
         "MAX(enqueued_ns + end_after_ns) FROM collective_rows WHERE rowid < " +
         std::to_string(collectives_before) + " GROUP BY rank, attempt, step, op;";
}

Status CheckReadableTraceVersion(int64_t version, const std::string& path) {
  if (version >= 0 && version <= kTraceSchemaVersion) return Status::Ok();
  return FailedPrecondition(path + " has trace schema version " + std::to_string(version) +
                            ", written by a newer megascope; this build reads versions up to " +
                            std::to_string(kTraceSchemaVersion));
}

}  // namespace megascope::tracer
