#include "megascope/analyzer/store_views.h"

#include <array>

#include "megascope/tracer/enum_names.h"

namespace megascope::analyzer {
namespace {

// By StoreView's value.
constexpr std::array<std::string_view, 8> kViewNames = {
    "steps", "stragglers", "waits", "open", "verdicts", "machines", "incidents", "at"};

std::string Quote(const std::string& s) {
  std::string out = "'";
  for (const char c : s) {
    if (c == '\'' || c == '\\') out += '\\';
    out += c;
  }
  return out + "'";
}

// The rows of `time_column` in scope: the job's, since the time asked (whole days skipped by the
// partition key).
std::string Where(const StoreScope& s, const std::string& time_column) {
  std::string w = " WHERE 1";
  if (!s.job.empty()) w += " AND job = " + Quote(s.job);
  if (s.since_ns != std::numeric_limits<int64_t>::min()) {
    w += " AND day >= toDate(toDateTime(intDiv(" + std::to_string(s.since_ns) +
         ", 1000000000), 'UTC')) AND " + time_column + " >= " + std::to_string(s.since_ns);
  }
  return w;
}

// Per attempt and rank: its mean compute per step, with its node and coordinates.
std::string Mean(const StoreScope& s) {
  return "(SELECT attempt, rank, c, node, dp, pp, tp FROM (SELECT attempt, rank, avg(compute) AS c "
         "FROM rank_steps" +
         Where(s, "start_ns") +
         " GROUP BY attempt, rank) ALL INNER JOIN (SELECT attempt, rank, any(node) AS node, "
         "any(dp) AS dp, any(pp) AS pp, any(tp) AS tp FROM ranks" +
         Where({s.job, std::numeric_limits<int64_t>::min(), 0}, "0") +
         " GROUP BY attempt, rank) USING (attempt, rank))";
}

// open_collectives: each node's latest look of open ops, less those with a record since.
std::string OpenCollectives(const StoreScope& s) {
  const std::string p2p_peer = "if(op IN ('send', 'recv'), ifNull(peer, -1), -2)";
  return "(SELECT attempt, rank, grp, seq, op, peer, bytes, dtype, state, enqueued_ns, "
         "started_ns, seen_ns FROM open_ops" +
         Where({s.job, std::numeric_limits<int64_t>::min(), 0}, "0") +
         " AND rank >= 0 AND (src, row_id) IN (SELECT src, max(row_id) FROM open_ops" +
         Where({s.job, std::numeric_limits<int64_t>::min(), 0}, "0") +
         " GROUP BY src) AND (attempt, grp, seq, op, rank, " + p2p_peer +
         ") NOT IN (SELECT attempt, grp, seq, op, rank, " + p2p_peer + " FROM collectives" +
         Where({s.job, std::numeric_limits<int64_t>::min(), 0}, "0") + "))";
}

// AtSql() without its correlated subqueries (18.16 has none): each rank's attempt at the moment,
// then its row, then what it was doing and its last heartbeat, one join a level. A join that finds
// nothing gives '' (18.16 has no NULL-filled joins): read back as NULL.
std::string At(const StoreScope& s) {
  const std::string t = std::to_string(s.at_ns);
  const StoreScope all{s.job, std::numeric_limits<int64_t>::min(), 0, 0};
  const std::string cur =
      "(SELECT rank, toInt32(if(h1 > 0, h1 - 1, a0)) AS attempt FROM (SELECT rank, min(attempt) AS "
      "a0 FROM "
      "ranks" +
      Where(all, "0") +
      " GROUP BY rank) ALL LEFT JOIN (SELECT rank, max(attempt) + 1 AS h1 FROM heartbeats" +
      Where(all, "ts_ns") + " AND ts_ns <= " + t + " GROUP BY rank) USING (rank))";
  const std::string rows =
      "(SELECT rank, attempt, any(node) AS node, any(dp) AS dp, any(pp) AS "
      "pp, any(tp) AS tp FROM ranks" +
      Where(all, "0") + " GROUP BY rank, attempt)";
  const std::string span =
      "(SELECT rank, attempt, argMin(concat(kind, ' ', name, ' (step ', toString(step), "
      "if(isNull(microbatch), '', concat(', mb ', toString(assumeNotNull(microbatch)))), ')'), "
      "end_ns - start_ns) AS in_span FROM (SELECT attempt, rank, step, microbatch, kind, name, "
      "start_ns, end_ns FROM spans" +
      Where(all, "start_ns") + " AND start_ns <= " + t + " AND end_ns >= " + t +
      " UNION ALL SELECT attempt, rank, step, CAST(NULL AS Nullable(Int32)), 'comm', op, "
      "assumeNotNull(started_ns), assumeNotNull(completed_ns) FROM collectives" +
      Where(all, "enqueued_ns") + " AND state = 'completed' AND started_ns IS NOT NULL AND " +
      "started_ns <= " + t + " AND completed_ns >= " + t + ") GROUP BY rank, attempt)";
  const std::string open =
      "(SELECT rank, attempt, argMin(concat('in ', op, ' ', grp, ' #', toString(seq), "
      "if(ifNull(peer, -1) >= 0, concat(' with rank ', toString(assumeNotNull(peer))), ''), ' (', "
      "state, ', open)'), enqueued_ns) AS in_open FROM " +
      OpenCollectives(s) + " WHERE enqueued_ns <= " + t + " GROUP BY rank, attempt)";
  const std::string beat =
      "(SELECT rank, attempt, argMax(concat(phase, ' of step ', "
      "toString(step)), ts_ns) AS beat FROM heartbeats" +
      Where(all, "ts_ns") + " AND ts_ns <= " + t + " GROUP BY rank, attempt)";
  return "SELECT rank, attempt, node, dp, pp, tp, nullIf(if(in_span != '', in_span, in_open), '') "
         "AS doing, nullIf(beat, '') AS last_heartbeat FROM (SELECT * FROM (SELECT * FROM (SELECT "
         "* FROM " +
         cur + " ALL INNER JOIN " + rows + " USING (rank, attempt)) ALL LEFT JOIN " + span +
         " USING (rank, attempt)) ALL LEFT JOIN " + open +
         " USING (rank, attempt)) ALL LEFT JOIN " + beat + " USING (rank, attempt) ORDER BY rank";
}

std::string VerdictRows(const StoreScope& s) {
  return "(SELECT ts_ns, job, attempt, verdict, cause, level, arrayJoin(if(root_nodes = '', "
         "[ifNull(node, '')], splitByChar(',', root_nodes))) AS named, rank FROM events" +
         Where(s, "ts_ns") + " AND kind = 'verdict')";
}

}  // namespace

std::string_view Name(StoreView v) { return tracer::NameFrom(kViewNames, v); }

std::optional<StoreView> ParseStoreView(std::string_view name) {
  return tracer::ParseFrom<StoreView>(kViewNames, name);
}

bool IsRunView(StoreView v) {
  return v == StoreView::kSteps || v == StoreView::kStragglers || v == StoreView::kWaits ||
         v == StoreView::kOpen || v == StoreView::kAt;
}

std::string StoreViewSql(StoreView v, const StoreScope& s) {
  switch (v) {
    case StoreView::kSteps:
      return "SELECT attempt, step, count() AS ranks, round(max(wall) / 1e6, 3) AS step_ms, "
             "round(avg(compute) / 1e6, 3) AS compute_ms, round(avg(comm) / 1e6, 3) AS "
             "comm_wait_ms, round(avg(data) / 1e6, 3) AS data_ms, round(avg(greatest(0, wall - "
             "compute - comm - data)) / 1e6, 3) AS bubble_ms FROM rank_steps" +
             Where(s, "start_ns") + " GROUP BY attempt, step ORDER BY attempt, step";
    case StoreView::kStragglers:
      // Each (attempt, pp, tp) group's mean once, its members unrolled after.
      return "SELECT attempt, r.1 AS rank, r.3 AS node, r.4 AS dp, pp, tp, round(r.2 / 1e6, 3) AS "
             "compute_ms_per_step, round(peer_avg / 1e6, 3) AS peers_ms_per_step, round(r.2 / "
             "peer_avg, 3) AS ratio, n AS peers FROM (SELECT attempt, pp, tp, avg(c) AS peer_avg, "
             "count() AS n, groupArray((rank, c, node, dp)) AS members FROM " +
             Mean(s) +
             " GROUP BY attempt, pp, tp) ARRAY JOIN members AS r ORDER BY ratio DESC, attempt, "
             "rank";
    case StoreView::kWaits:
      return "SELECT attempt, grp, seq, op, count() AS members, sum(is_open) AS still_open, "
             "round((if(sum(is_open) > 0, max(until_ns), max(enqueued_ns)) - min(enqueued_ns)) / "
             "1e6, 3) AS wait_ms, argMax(rank, enqueued_ns) AS last_rank FROM (SELECT attempt, "
             "grp, seq, op, rank, enqueued_ns, 0 AS is_open, enqueued_ns AS until_ns FROM "
             "collectives" +
             Where(s, "enqueued_ns") +
             " AND op NOT IN ('send','recv') UNION ALL SELECT attempt, grp, seq, op, rank, "
             "enqueued_ns, 1, seen_ns FROM " +
             OpenCollectives(s) +
             " WHERE op NOT IN ('send','recv')) GROUP BY attempt, grp, seq, op HAVING members > 1 "
             "OR still_open > 0 ORDER BY if(sum(is_open) > 0, max(until_ns), max(enqueued_ns)) - "
             "min(enqueued_ns) DESC LIMIT " +
             std::to_string(s.limit);
    case StoreView::kOpen:
      return "SELECT * FROM " + OpenCollectives(s) + " ORDER BY attempt, rank, grp, seq";
    case StoreView::kVerdicts:
      // (`kind` is the verdict's in the answer: the event's is filtered a level below)
      return "SELECT ts_ns, job, attempt, verdict AS kind, cause, level, node, rank FROM (SELECT * "
             "FROM events" +
             Where(s, "ts_ns") + " AND kind = 'verdict') ORDER BY ts_ns";
    case StoreView::kMachines:
      return "SELECT named AS node, count() AS named_times, countIf(verdict = 'faulty_machine' AND "
             "level = 'faulty') AS faulty, countIf(verdict = 'faulty_machine' AND level != "
             "'faulty') AS suspect, countIf(verdict = 'slow') AS straggler, countIf(verdict = "
             "'hang') AS hang, uniqExact(job) AS jobs, round((max(ts_ns) - min(ts_ns)) / 3.6e12, "
             "3) AS named_over_hours, min(ts_ns) AS first_ns, max(ts_ns) AS last_ns FROM " +
             VerdictRows(s) + " WHERE named != '' GROUP BY named ORDER BY named_times DESC, node";
    case StoreView::kAt:
      return At(s);
    case StoreView::kIncidents:
      return "SELECT verdict AS kind, cause, named AS node, rank, count() AS verdicts, "
             "uniqExact(job) AS jobs, min(ts_ns) AS first_ns, max(ts_ns) AS last_ns FROM " +
             VerdictRows(s) +
             " GROUP BY kind, cause, node, rank ORDER BY verdicts DESC, kind, "
             "cause, node, rank";
  }
  return "";
}

Result<Table> QueryStore(tracer::ClickHouse& ch, StoreView v, const StoreScope& scope) {
  if (IsRunView(v) && scope.job.empty())
    return InvalidArgument("the view '" + std::string(Name(v)) +
                           "' is of one job's run: name it with --job");
  // A view over weeks groups more (attempt, rank, step) keys than memory holds: past 2 GB the
  // grouping spills to disk instead of failing.
  ASSIGN_OR_RETURN(
      tracer::StoreRows rows,
      ch.Select(StoreViewSql(v, scope), "max_bytes_before_external_group_by=2000000000"));
  Table t;
  t.columns = std::move(rows.names);
  for (size_t r = 0; r < rows.rows.size(); ++r) {
    for (size_t c = 0; c < rows.rows[r].size(); ++c) {
      std::string& cell = rows.rows[r][c];
      const std::string& type = rows.types[c];
      // SQLite spells a whole REAL "12.0"; ClickHouse "12".
      if (!rows.null[r][c] && type.find("Float") != std::string::npos &&
          cell.find_first_of(".eEn") == std::string::npos)
        cell += ".0";
    }
    t.rows.push_back(std::move(rows.rows[r]));
    t.is_null.push_back(std::move(rows.null[r]));
  }
  return t;
}

Result<std::optional<SlowInput>> LoadSlowInputFromStore(tracer::ClickHouse& ch,
                                                        const std::string& job,
                                                        const SlowOptions& o, int world,
                                                        bool anyway) {
  StoreScope s;
  s.job = job;
  const std::string of_attempt =
      o.attempt >= 0 ? " AND attempt = " + std::to_string(o.attempt) : std::string();
  const std::string range = " AND step >= " + std::to_string(o.first_step) +
                            " AND step <= " + std::to_string(o.last_step) + of_attempt;
  if (!anyway) {  // every rank's steps through the window's last, or wait
    ASSIGN_OR_RETURN(
        const std::string through,
        ch.Scalar("SELECT count() FROM (SELECT rank, max(step) AS top FROM rank_steps" +
                  Where(s, "start_ns") + of_attempt +
                  " AND step >= " + std::to_string(o.first_step) +
                  " GROUP BY rank) WHERE top >= " + std::to_string(o.last_step)));
    if (std::stoll(through.empty() ? "0" : through) < world) return std::optional<SlowInput>();
  }
  SlowInput in;
  // A rank's row of the newest clock offset (as LoadSlowInput's MAX() picks it).
  ASSIGN_OR_RETURN(tracer::StoreRows ranks,
                   ch.Select("SELECT rank, argMax(node, clock_offset_ns), argMax(dp, "
                             "clock_offset_ns), argMax(pp, clock_offset_ns), argMax(tp, "
                             "clock_offset_ns), max(clock_offset_ns) FROM ranks" +
                             Where(s, "0") + of_attempt + " GROUP BY rank"));
  for (const auto& r : ranks.rows)
    in.ranks[std::stoi(r[0])] = {r[1], std::stoi(r[2]), std::stoi(r[3]), std::stoi(r[4]),
                                 std::stoll(r[5])};
  ASSIGN_OR_RETURN(
      tracer::StoreRows steps,
      ch.Select("SELECT rank, attempt, step, wall, compute, comm, data FROM rank_steps" +
                Where(s, "start_ns") + range));
  for (const auto& r : steps.rows)
    in.steps.push_back({std::stoi(r[0]), std::stoll(r[1]), std::stoll(r[2]), std::stod(r[3]),
                        std::stod(r[4]), std::stod(r[5]), std::stod(r[6])});
  // Each rank's ops enqueued while its steps of the window ran, on its own clock (an op completes
  // in its step or, a send issued last, in the next: the collectives read are those of the
  // window's steps and the one after).
  ASSIGN_OR_RETURN(
      tracer::StoreRows ops,
      ch.Select("SELECT grp, seq, rank, enqueued_ns, ifNull(completed_ns, 0), op IN ('send', "
                "'recv'), ifNull(bytes, 0) FROM (SELECT * FROM collectives" +
                Where(s, "enqueued_ns") + of_attempt + " AND step >= " +
                std::to_string(o.first_step) + " AND step <= " + std::to_string(o.last_step + 1) +
                ") ALL INNER JOIN (SELECT attempt, rank, min(start_ns) AS lo, max(start_ns + wall) "
                "AS hi FROM rank_steps" +
                Where(s, "start_ns") + range +
                " GROUP BY attempt, rank) USING (attempt, rank) WHERE enqueued_ns >= lo AND "
                "enqueued_ns <= hi"));
  for (const auto& r : ops.rows)
    in.ops.push_back({r[0], std::stoll(r[1]), std::stoi(r[2]), std::stoll(r[3]), std::stoll(r[4]),
                      std::stoll(r[6]), r[5] == "1"});
  return std::optional<SlowInput>(std::move(in));
}

}  // namespace megascope::analyzer
