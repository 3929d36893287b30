#include "megascope/tracer/store_schema.h"

#include <chrono>
#include <cstdio>
#include <vector>

#include "megascope/tracer/format.h"
#include "megascope/tracer/records.h"
#include "megascope/tracer/trace_schema.h"

namespace megascope::tracer {
namespace {

constexpr std::string_view kCommon = "day Date, job String, src String, row_id UInt64";

std::array<StoreTable, 10> BuildTables() {
  const std::string above = " WHERE rowid > ?1 ORDER BY rowid LIMIT ?2";
  return {{
      {"spans", "span_rows", StoreSource::kTrace, StoreRetention::kRaw,
       "node String, rank Int32, attempt Int32, step Int64, microbatch Nullable(Int32), "
       "kind String, name String, start_ns Int64, end_ns Int64",
       "attempt, step, rank, start_ns",
       "SELECT rowid, start_ns, ?3, rank, attempt, step, microbatch, " +
           SpellingSql<SpanKind>("kind") + ", name, start_ns, start_ns + dur_ns FROM span_rows" +
           above},
      {"collectives", "collective_rows", StoreSource::kTrace, StoreRetention::kCollectives,
       "node String, rank Int32, attempt Int32, grp String, seq Int64, op String, "
       "peer Nullable(Int32), bytes Nullable(Int64), dtype String, state String, enqueued_ns "
       "Int64, "
       "started_ns Nullable(Int64), completed_ns Nullable(Int64), step Int64",
       "attempt, step, grp, seq",
       "SELECT c.rowid, c.enqueued_ns, ?3, c.rank, c.attempt, COALESCE(g.name, ''), c.seq, " +
           SpellingSql<OpType>("c.op") + ", c.peer, c.bytes, " + SpellingSql<DType>("c.dtype") +
           ", " + SpellingSql<OpState>("c.state") +
           ", c.enqueued_ns, c.enqueued_ns + c.start_after_ns, c.enqueued_ns + c.end_after_ns, "
           "COALESCE(c.step, -1) FROM collective_rows c LEFT JOIN group_names g ON g.id = c.grp "
           "WHERE c.rowid > ?1 ORDER BY c.rowid LIMIT ?2"},
      // Each rank's step as the `steps` and `stragglers` views and the straggler window account it
      // (trace_schema.h's per_rank), made by the sink from trace.db once the step is over.
      {"rank_steps", "store_rank_steps", StoreSource::kTrace, StoreRetention::kCollectives,
       "node String, rank Int32, attempt Int32, step Int64, start_ns Int64, wall Int64, "
       "compute Int64, comm Int64, data Int64",
       "attempt, step, rank",
       "SELECT id, start_ns, ?3, rank, attempt, step, start_ns, wall, compute, comm, data FROM "
       "store_rank_steps WHERE id > ?1 ORDER BY id LIMIT ?2"},
      {"heartbeats", "heartbeat_rows", StoreSource::kTrace, StoreRetention::kRaw,
       "node String, rank Int32, attempt Int32, ts_ns Int64, step Int64, phase String",
       "ts_ns, rank",  // version 2: by time (version 1: attempt, step, rank, ts_ns)
       "SELECT rowid, ts_ns, ?3, rank, attempt, ts_ns, step, " + SpellingSql<Phase>("phase") +
           " FROM heartbeat_rows" + above},
      {"ranks", "ranks", StoreSource::kTrace, StoreRetention::kForever,
       "node String, rank Int32, local_rank Int32, dp Int32, pp Int32, tp Int32, pid Int64, "
       "attempt Int32, clock_offset_ns Int64",
       "attempt, rank",
       "SELECT rowid, NULL, node, rank, local_rank, dp, pp, tp, pid, attempt, clock_offset_ns "
       "FROM ranks" +
           above},
      {"metrics", "metrics", StoreSource::kTrace, StoreRetention::kRaw,
       "node String, ts_ns Int64, name String, value Float64", "node, name, ts_ns",
       "SELECT rowid, ts_ns, node, ts_ns, name, printf('%.17g', value) FROM metrics" + above},
      {"drops", "drops", StoreSource::kTrace, StoreRetention::kRaw,
       "node String, rank Int32, ts_ns Int64, dropped_records Int64", "rank, ts_ns",
       "SELECT rowid, ts_ns, ?3, rank, ts_ns, dropped_records FROM drops" + above},
      {"device_spans", "device_spans", StoreSource::kTrace, StoreRetention::kRaw,
       "node String, rank Int32, attempt Int32, kind String, start_ns Int64, "
       "device Nullable(Int32), stream Nullable(Int64), correlation Nullable(Int64), "
       "bytes Nullable(Int64)",
       "attempt, rank, start_ns",
       "SELECT rowid, start_ns, ?3, rank, attempt, kind, start_ns, device, stream, correlation, "
       "bytes FROM device_spans" +
           above},
      {"open_ops", "open_ops", StoreSource::kTrace, StoreRetention::kRaw,
       "node String, rank Int32, attempt Int32, grp String, seq Int64, op String, "
       "peer Nullable(Int32), bytes Nullable(Int64), dtype String, state String, enqueued_ns "
       "Int64, "
       "started_ns Nullable(Int64), seen_ns Int64",
       "src, row_id, attempt, rank", ""},
      {"events", "events", StoreSource::kControl, StoreRetention::kForever,
       "ts_ns Int64, attempt Int32, kind String, node Nullable(String), rank Nullable(Int32), "
       "detail_json String, verdict Nullable(String), cause Nullable(String), "
       "level Nullable(String), root_nodes String",
       "ts_ns",
       // A verdict's kind, cause, level and root nodes (comma-separated) read out of its detail
       // here, where SQLite's JSON functions run: ClickHouse 18.16 has none for nested fields.
       "SELECT rowid, ts_ns, ts_ns, attempt, kind, node, rank, detail_json, "
       "CASE WHEN json_valid(detail_json) THEN json_extract(detail_json, '$.kind') END, "
       "CASE WHEN json_valid(detail_json) THEN json_extract(detail_json, '$.cause') END, "
       "CASE WHEN json_valid(detail_json) THEN json_extract(detail_json, '$.level') END, "
       "CASE WHEN json_valid(detail_json) AND json_type(detail_json, '$.root_nodes') = 'array' "
       "THEN COALESCE((SELECT group_concat(value, ',') FROM json_each(detail_json, "
       "'$.root_nodes')), '') ELSE '' END FROM events" +
           above},
  }};
}

std::string ColumnNames(std::string_view columns) {
  std::string out;
  size_t start = 0;
  while (start < columns.size()) {
    size_t end = start;
    int depth = 0;
    while (end < columns.size() && (columns[end] != ',' || depth > 0)) {
      depth += columns[end] == '(' ? 1 : columns[end] == ')' ? -1 : 0;
      ++end;
    }
    std::string_view col = columns.substr(start, end - start);
    while (!col.empty() && col.front() == ' ') col.remove_prefix(1);
    out += (out.empty() ? "" : ", ") + std::string(col.substr(0, col.find(' ')));
    start = end + 1;
  }
  return out;
}

// The table that holds a store table's rows on the server asked: `<name>_local` under a cluster.
std::string LocalName(const ClickHouse& ch, std::string_view name) {
  return std::string(name) + (ch.url().cluster.empty() ? "" : "_local");
}

std::string MergeTreeOf(const StoreTable& t) {
  return "MergeTree() PARTITION BY day ORDER BY (job, " + std::string(t.order_by) + ")";
}

// The active day partitions of `local`, as 'YYYY-MM-DD', in order (`and` narrows them).
Result<std::vector<std::string>> DaysOf(ClickHouse& ch, const std::string& local,
                                        const std::string& and_where = "") {
  ASSIGN_OR_RETURN(StoreRows parts,
                   ch.Select("SELECT DISTINCT partition FROM system.parts WHERE database = '" +
                             ch.url().database + "' AND table = '" + local + "' AND active" +
                             and_where + " ORDER BY partition"));
  std::vector<std::string> days;
  for (const auto& row : parts.rows) {
    // Partitions of a Date key read as 'YYYY-MM-DD' (quoted in newer releases).
    std::string p = row[0];
    if (p.size() >= 2 && p.front() == '\'' && p.back() == '\'') p = p.substr(1, p.size() - 2);
    days.push_back(p);
  }
  return days;
}

// A table sorted anew (its ORDER BY changed): ClickHouse cannot change a MergeTree's sorting key
// in place, so a table of the new key takes the old one's name, and the old rows are copied into
// it a day at a time, each day's INSERT leaving out the rows already there -- so a step cut short
// anywhere is finished by running it again, and rows that writers of the old build send meanwhile
// land in the new table (after the rename) or are copied (before it).
Status Resort(ClickHouse& ch, const StoreTable& t, const StoreProgress& say) {
  const std::string local = LocalName(ch, t.name);
  const std::string old = local + "_resorting";
  ASSIGN_OR_RETURN(const std::string begun,
                   ch.Scalar("SELECT count() FROM system.tables WHERE database = '" +
                             ch.url().database + "' AND name = '" + old + "'"));
  if (begun == "0") {
    RETURN_IF_ERROR(ch.Exec("DROP TABLE IF EXISTS " + ch.Table(local + "_sorted")));
    RETURN_IF_ERROR(ch.Exec("CREATE TABLE " + ch.Table(local + "_sorted") + " AS " +
                            ch.Table(local) + " ENGINE = " + MergeTreeOf(t)));
    RETURN_IF_ERROR(ch.Exec("RENAME TABLE " + ch.Table(local) + " TO " + ch.Table(old) + ", " +
                            ch.Table(local + "_sorted") + " TO " + ch.Table(local)));
  }
  ASSIGN_OR_RETURN(const std::vector<std::string> days, DaysOf(ch, old));
  for (size_t i = 0; i < days.size(); ++i) {
    const std::string day = "day = '" + days[i] + "'";
    RETURN_IF_ERROR(ch.Exec("INSERT INTO " + ch.Table(local) + " SELECT * FROM " + ch.Table(old) +
                            " WHERE " + day +
                            " AND (src, row_id) NOT IN (SELECT src, row_id FROM " +
                            ch.Table(local) + " WHERE " + day + ")"));
    if (say)
      say(std::string(t.name) + ": " + days[i] + " sorted anew (" + std::to_string(i + 1) + " of " +
          std::to_string(days.size()) + " days)");
  }
  return ch.Exec("DROP TABLE " + ch.Table(old));
}

Status CreateTables(ClickHouse& ch) {
  const StoreUrl& u = ch.url();
  for (const StoreTable& t : StoreTables()) {
    const std::string local = LocalName(ch, t.name);
    RETURN_IF_ERROR(ch.Exec("CREATE TABLE IF NOT EXISTS " + ch.Table(local) + " (" +
                            std::string(kCommon) + ", " + std::string(t.columns) +
                            ") ENGINE = " + MergeTreeOf(t)));
    if (!u.cluster.empty()) {
      // Rows of one source database stay on one shard: its largest row_id is on that shard.
      RETURN_IF_ERROR(ch.Exec("CREATE TABLE IF NOT EXISTS " + ch.Table(t.name) + " AS " +
                              ch.Table(local) + " ENGINE = Distributed(" + u.cluster + ", " +
                              u.database + ", " + local + ", cityHash64(src))"));
    }
  }
  return Status::Ok();
}

}  // namespace

const std::vector<StoreMigration>& StoreMigrations() {
  static const std::vector<StoreMigration> steps = {
      {2,
       {},
       "heartbeats sorted by time (job, ts_ns, rank): the newest heartbeats and `at` read the "
       "granules of their time range, not the day's",
       [](ClickHouse& ch, const StoreProgress& say) {
         return Resort(ch, *FindStoreTable("heartbeats"), say);
       }},
  };
  return steps;
}

Status MigrateStore(ClickHouse& ch, int have, const std::vector<StoreMigration>& steps,
                    const StoreProgress& say) {
  for (const StoreMigration& m : steps) {
    if (m.version <= have) continue;
    const auto failed = [&](const Status& st) {
      return Status(st.code(), "migrating the store at " + ch.url().Redacted() +
                                   " from schema version " + std::to_string(m.version - 1) +
                                   " to " + std::to_string(m.version) + ": " + st.message());
    };
    if (say)
      say("schema version " + std::to_string(m.version - 1) + " -> " + std::to_string(m.version) +
          (m.what.empty() ? "" : ": " + m.what));
    for (std::string sql : m.statements) {
      for (size_t at; (at = sql.find("{db}")) != std::string::npos;)
        sql.replace(at, 4, ch.url().database);
      if (Status st = ch.Exec(sql); !st.ok()) return failed(st);
    }
    if (m.apply) {
      if (Status st = m.apply(ch, say); !st.ok()) return failed(st);
    }
    RETURN_IF_ERROR(ch.Exec("INSERT INTO " + ch.Table("schema_version") + " VALUES (" +
                            std::to_string(m.version) + ", now())"));
    have = m.version;
  }
  return Status::Ok();
}

const std::array<StoreTable, 10>& StoreTables() {
  static const std::array<StoreTable, 10> tables = BuildTables();
  return tables;
}

const StoreTable* FindStoreTable(std::string_view name) {
  for (const StoreTable& t : StoreTables())
    if (t.name == name) return &t;
  return nullptr;
}

std::string StoreColumnNames(const StoreTable& t) {
  return "day, job, src, row_id, " + ColumnNames(t.columns);
}

int DefaultRetentionDays(StoreRetention r) {
  switch (r) {
    case StoreRetention::kRaw:
      return 7;
    case StoreRetention::kCollectives:
      return 28;
    case StoreRetention::kForever:
      return 0;
  }
  return 0;
}

Result<int> StoreSchemaVersion(ClickHouse& ch) {
  ASSIGN_OR_RETURN(const std::string exists,
                   ch.Scalar("SELECT count() FROM system.tables WHERE database = '" +
                             ch.url().database + "' AND name = 'schema_version'"));
  if (exists == "0") return 0;
  ASSIGN_OR_RETURN(const std::string v, ch.Scalar("SELECT max(version) FROM schema_version"));
  return v.empty() ? 0 : std::stoi(v);
}

Status EnsureStoreSchema(ClickHouse& ch, OlderStore older, const StoreProgress& say) {
  const std::string db = ch.url().database;
  // Outside any database: the store's may not exist yet.
  RETURN_IF_ERROR(ch.Exec("CREATE DATABASE IF NOT EXISTS " + db, /*in_database=*/false));
  RETURN_IF_ERROR(ch.Exec("CREATE TABLE IF NOT EXISTS " + ch.Table("schema_version") +
                          " (version UInt32, applied DateTime) ENGINE = MergeTree() "
                          "ORDER BY version"));
  ASSIGN_OR_RETURN(const int have, StoreSchemaVersion(ch));
  if (have > kStoreSchemaVersion)
    return FailedPrecondition("the store at " + ch.url().Redacted() + " has schema version " +
                              std::to_string(have) + ", written by a newer megascope; this build " +
                              "writes and reads version " + std::to_string(kStoreSchemaVersion));
  if (have > 0 && have < kStoreSchemaVersion) {
    if (older == OlderStore::kRefuse)
      return FailedPrecondition(
          "the store at " + ch.url().Redacted() + " has schema version " + std::to_string(have) +
          " and this build writes version " + std::to_string(kStoreSchemaVersion) +
          ": migrate it with `megascope store init --store " + ch.url().Redacted() +
          "` (on each shard); until then the rows wait in trace.db");
    RETURN_IF_ERROR(MigrateStore(ch, have, StoreMigrations(), say));
  }
  RETURN_IF_ERROR(CreateTables(ch));  // (a new store is created at this version)
  if (have == 0)
    return ch.Exec("INSERT INTO " + ch.Table("schema_version") + " VALUES (" +
                   std::to_string(kStoreSchemaVersion) + ", now())");
  return Status::Ok();
}

Result<int> PruneStore(ClickHouse& ch, const std::array<int, 3>& days, int64_t now_ns) {
  int dropped = 0;
  for (const StoreTable& t : StoreTables()) {
    const int keep = days[static_cast<size_t>(t.retention)];
    if (keep <= 0) continue;
    const std::string cutoff = UtcDay(now_ns - int64_t{keep} * 86'400'000'000'000);
    const std::string local = LocalName(ch, t.name);
    ASSIGN_OR_RETURN(const std::vector<std::string> old,
                     DaysOf(ch, local, " AND partition < '" + cutoff + "'"));
    for (const std::string& p : old) {
      RETURN_IF_ERROR(ch.Exec("ALTER TABLE " + ch.Table(local) + " DROP PARTITION '" + p + "'"));
      ++dropped;
    }
  }
  return dropped;
}

std::string UtcDay(int64_t epoch_ns) {
  using namespace std::chrono;
  const auto d = floor<days>(sys_time<nanoseconds>(nanoseconds(epoch_ns)));
  const year_month_day ymd(d);
  return Format("%04d-%02u-%02u", static_cast<int>(ymd.year()), static_cast<unsigned>(ymd.month()),
                static_cast<unsigned>(ymd.day()));
}

}  // namespace megascope::tracer
