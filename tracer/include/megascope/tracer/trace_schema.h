// The one owner of trace.db's schema (docs/formats.md section 4), for its writer (TraceStore) and
// its readers (RunDatabase, the tests).
//
// Since version 2 the rows are stored compactly and the FORMATS tables are views over them, so
// every query written against the documented columns keeps working:
//  - collectives: op, dtype and state as their enum codes, the group as an id into group_names,
//    started/completed as offsets from enqueued_ns, plus the step the op completed in;
//  - spans: kind as its code and end as a duration; a completed collective is also its own `comm`
//    span (name = op, from started to completed), so the worker records no comm span of its own
//    for it (only for time that is not a collective, such as a link's hold);
//  - heartbeats: phase as its code.
// Codes and spellings come from records.h, so the two cannot drift apart.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "megascope/tracer/records.h"
#include "megascope/tracer/status.h"

namespace megascope::tracer {

inline constexpr int kTraceSchemaVersion = 2;

// "CASE <column> WHEN 0 THEN 'allreduce' ... ELSE 'unknown' END": an enum code of records.h as
// its spelling, in SQL that SQLite and ClickHouse both run.
template <typename E>
std::string SpellingSql(const std::string& column) {
  std::string out = "CASE " + column;
  for (int code = 0; code < 255; ++code) {
    const std::string_view name = Name(static_cast<E>(code));
    if (name == "unknown") break;
    out += " WHEN " + std::to_string(code) + " THEN '" + std::string(name) + "'";
  }
  return out + " ELSE 'unknown' END";
}

// The tables users query, as docs/formats.md names them (tables or views, per version).
inline constexpr std::array<std::string_view, 6> kTraceTables = {
    "ranks", "spans", "collectives", "heartbeats", "metrics", "drops"};

// Tables a file of this version may lack (added to version 2 since; readers see them empty):
//   open_ops(rank, attempt, grp, seq, op, peer, bytes, dtype, state, enqueued_ns, started_ns,
//            seen_ns): the ops each rank's flight recorder held open (state enqueued or started)
//            when its agent last looked (seen_ns), per (rank, attempt); a rank's rows are
//            replaced at each look while its process lives, and its last ones are kept when it
//            dies (the ops it died in, or the hang it was stuck in). An op that completed since
//            the last look is still listed until the next (about a second): compare with
//            `collectives`. Spellings as in `collectives`.
//   device_spans(rank, attempt, kind, start_ns, device, stream, correlation, bytes): where each
//            span of device activity (kind kernel, memcpy, memset, sync) ran and the CUPTI
//            correlation id of the runtime call that launched it; joins `spans` on
//            (rank, attempt, kind, start_ns).
struct OptionalTraceTable {
  std::string_view name, columns;
};
inline constexpr std::array<OptionalTraceTable, 2> kOptionalTraceTables = {{
    {"open_ops",
     "rank INTEGER, attempt INTEGER, grp TEXT, seq INTEGER, op TEXT, peer INTEGER, bytes INTEGER, "
     "dtype TEXT, state TEXT, enqueued_ns INTEGER, started_ns INTEGER, seen_ns INTEGER"},
    {"device_spans",
     "rank INTEGER, attempt INTEGER, kind TEXT, start_ns INTEGER, device INTEGER, stream INTEGER, "
     "correlation INTEGER, bytes INTEGER"},
}};
// The CREATE TABLE IF NOT EXISTS of an optional table, in `schema` ("" or "main.").
std::string OptionalTableSql(const OptionalTraceTable& table, std::string_view schema = "");

// A WITH clause ending in per_rank(attempt, rank, step, wall, compute, comm, data), nanoseconds,
// over the `spans` view: the one definition of a rank's step (the analyzer's SRE views, the
// straggler analysis and the store sink's per-step rows all use it). Compute excludes the
// collectives nested in compute spans; comm leaves out asynchronous sends.
std::string PerRankStepSql();

// The `spans` view's SELECT (version 2): the stored spans, and each completed collective as its
// `comm` span. `span_rows_where` (" WHERE ...") and `collective_rows_and` (" AND ...") narrow
// what it reads (a reader of a few steps need not read every row).
std::string SpansSelectSql(std::string_view span_rows_where = "",
                           std::string_view collective_rows_and = "");

// CREATE statements of the stored tables and the views (idempotent: IF NOT EXISTS).
std::string TraceSchemaSql();

// Retention keeps a time window of rows; what it drops of spans and collectives is first summed
// per (rank, attempt, step) into step_rollups(rank, attempt, step, what, count, total_ns, bytes,
// first_ns, last_ns), `what` being a span kind or 'comm:<op>' (a step pruned in two passes has two
// rows: sum them). The INSERTs for the rows before the given rowids.
std::string TraceRollupSql(int64_t spans_before, int64_t collectives_before);

// Whether a trace.db of `version` (PRAGMA user_version) can be read by this build: versions 1
// (tables stored as documented) and 2 can; a newer one is refused with a clear error.
Status CheckReadableTraceVersion(int64_t version, const std::string& path);

}  // namespace megascope::tracer
