// The fleet's trace store in ClickHouse (docs/formats.md section 4b): the one owner of its schema,
// for the agent's sink (which fills it from trace.db and control.db) and the analyzer's views
// (which read it).
//
// Every table starts with the same four columns:
//   day     Date    the partition (UTC day of the row's time): retention drops whole days;
//   job     String  the run's job;
//   src     String  the database the row came from (a random id kept in that database);
//   row_id  UInt64  the row's rowid in that database.
// (src, row_id) names a row once and for ever: the sink ships a database's rows in rowid order,
// one partition per INSERT (atomic in a MergeTree table), so after any failure the largest row_id
// ClickHouse holds for src says exactly what arrived (docs/formats.md section 4b).
//
// Written for ClickHouse 18.16 (Debian's) and current releases alike: no TTL clause, no
// LowCardinality, no WITH subqueries, equality-only JOIN ON.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "megascope/tracer/clickhouse.h"
#include "megascope/tracer/status.h"

namespace megascope::tracer {

// Version 2: the tables below (version 1 had heartbeats ordered by attempt, step, rank, ts_ns).
// A store of a newer version is refused (naming both); an older one is migrated forward by
// StoreMigrations, by `megascope store init` (not by the agents' sinks: many at once would race).
inline constexpr int kStoreSchemaVersion = 2;

// How long a table's rows are kept: raw spans for days, collectives for weeks, what the
// controller decided for ever.
enum class StoreRetention : uint8_t { kRaw = 0, kCollectives, kForever };

// Which database a table's rows come from.
enum class StoreSource : uint8_t { kTrace = 0, kControl };

struct StoreTable {
  std::string_view name;
  std::string_view source_table;  // the table of the source database its rows are read from
  StoreSource source;
  StoreRetention retention;
  std::string_view columns;   // after the four common ones, as CREATE TABLE lists them
  std::string_view order_by;  // after (job, ...)
  // The SQLite SELECT over the source database that yields (rowid, time_ns, <columns>) for rowids
  // above ?1, in rowid order, at most ?2 rows; ?3 is the agent's node. Empty: shipped otherwise
  // (open_ops: every change of the whole table, see below).
  std::string source_sql;
};

// spans, collectives, rank_steps, heartbeats, ranks, metrics, drops, device_spans, open_ops,
// events. rank_steps holds each rank's step summed as trace_schema.h's per_rank sums it
// (attempt, rank, step, start_ns, wall, compute, comm, data), made by the sink from trace.db once
// the rank's next step (or next attempt) is there, or the database's last sink pass.
// open_ops ships the node's open_ops table whole each time it changes, as one "look": row_id is
// the look's number, and a row of rank -1 marks each look (so a look with no open op is one too);
// the ops open at a node are those of its latest look.
const std::array<StoreTable, 10>& StoreTables();
const StoreTable* FindStoreTable(std::string_view name);

// The columns of a table, for INSERT: "day, job, src, row_id, <columns' names>".
std::string StoreColumnNames(const StoreTable& t);

// The days of each retention class kept by default (kForever: 0, never dropped).
int DefaultRetentionDays(StoreRetention r);

// A long step's progress, a line at a time (may be empty).
using StoreProgress = std::function<void(const std::string&)>;

// One step of the schema: takes a store from version - 1 to version: its statements (each
// "{db}" the store's database), then `apply`. A step cut short is finished by running it again.
struct StoreMigration {
  int version;
  std::vector<std::string> statements;
  std::string what;  // said before it runs
  std::function<Status(ClickHouse&, const StoreProgress&)> apply;
};
// This build's steps past version 1: 2 sorts heartbeats by time (their rows copied a day at a
// time into a table of the new key, which takes the old one's name first).
const std::vector<StoreMigration>& StoreMigrations();
// Runs the steps past `have` in order, recording each version as it completes; a step that fails
// is an error naming the versions it was between (the store stays at the last completed one).
Status MigrateStore(ClickHouse& ch, int have, const std::vector<StoreMigration>& steps,
                    const StoreProgress& say = {});

// What EnsureStoreSchema does with a store of an older schema version.
enum class OlderStore : uint8_t { kRefuse = 0, kMigrate };

// Creates the database, the tables (MergeTree partitioned by day; with a cluster, `<name>_local`
// on the server asked and a Distributed table `<name>` over the cluster's shards) and the schema
// version, or checks an existing store: a newer one is refused; an older one is migrated
// (kMigrate, saying each step through `say`) or refused with the command that migrates it. Errors
// name the URL and both versions.
Status EnsureStoreSchema(ClickHouse& ch, OlderStore older = OlderStore::kRefuse,
                         const StoreProgress& say = {});
// The store's schema version (0: no megascope schema there yet).
Result<int> StoreSchemaVersion(ClickHouse& ch);

// Drops the day partitions older than each table's retention (`days_of` overrides per class; a
// value <= 0 keeps for ever). On a cluster, the server asked drops its own shard's. Returns the
// partitions dropped.
Result<int> PruneStore(ClickHouse& ch, const std::array<int, 3>& days, int64_t now_ns);

// "YYYY-MM-DD", the UTC day of an epoch time in nanoseconds.
std::string UtcDay(int64_t epoch_ns);

}  // namespace megascope::tracer
