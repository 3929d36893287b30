// SRE queries over a run's trace databases (docs/architecture.md section 5): every
// RUN_DIR/nodes/*/trace.db opened read-only and unified into views of the docs/formats.md section 4
// tables; arbitrary read-only SQL, plus canned questions (step breakdown, stragglers, collective
// waits, what each rank was doing at a moment). Writes are refused.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "megascope/tracer/sqlite.h"
#include "megascope/tracer/status.h"

namespace megascope::analyzer {

struct Table {
  std::vector<std::string> columns;
  std::vector<std::vector<std::string>> rows;  // NULL as ""
  std::vector<std::vector<bool>> is_null;
};

// What of a run to read: all of it, or a window of steps (of one attempt). A window holds the
// spans and heartbeats of its steps, the collectives completed in them or in the step after (an
// asynchronous send issued in the last step completes in the next), every rank's row, the ops
// still open, and the device spans within the time the node's spans of those steps cover; metrics
// and drops read empty. The straggler watch and the launch's timeline read their windows so: past
// SQLite's attach limit only the window is copied, not the run.
struct RunScope {
  int attempt = -1;  // -1: every attempt
  int64_t first_step = std::numeric_limits<int64_t>::min();
  int64_t last_step = std::numeric_limits<int64_t>::max();
  std::string node;  // only this node's database ("": every node's)
  // A time window (epoch ns): spans by their start, collectives and open ops by their issue,
  // heartbeats, metrics and device spans by their time; drops read empty.
  int64_t from_ns = std::numeric_limits<int64_t>::min();
  int64_t to_ns = std::numeric_limits<int64_t>::max();
  bool all_steps() const {
    return attempt < 0 && first_step == std::numeric_limits<int64_t>::min() &&
           last_step == std::numeric_limits<int64_t>::max();
  }
  bool all_time() const {
    return from_ns == std::numeric_limits<int64_t>::min() &&
           to_ns == std::numeric_limits<int64_t>::max();
  }
  // Every row (of the databases read).
  bool whole() const { return all_steps() && all_time(); }
};

// The rows of a prepared statement: at most `max_rows` (`truncated` says whether more were left).
Result<Table> ReadTable(tracer::sql::Statement& st, size_t max_rows = SIZE_MAX,
                        bool* truncated = nullptr);

class RunDatabase {
 public:
  // Attaches every node database of `run_dir` read-only (in batches beyond SQLite's attach
  // limit, copying into memory), or of them what `scope` asks for. One that cannot be read is
  // skipped (warnings()); none readable, or a newer schema, is an error.
  static Result<std::unique_ptr<RunDatabase>> Open(const std::string& run_dir,
                                                   const RunScope& scope = {});
  ~RunDatabase();
  // One read-only statement; errors name what SQLite said. At most `max_rows` rows are kept
  // (`truncated` says whether there were more).
  Result<Table> Query(const std::string& sql, size_t max_rows = SIZE_MAX,
                      bool* truncated = nullptr);
  // Statements still running at `deadline` stop with an error saying the time ran out.
  void StopAt(std::chrono::steady_clock::time_point deadline) { db_.StopAt(deadline); }
  // A row of Scan(): typed access (Int, Double, Text, IsNull) without copying every cell.
  using Row = tracer::sql::Statement;
  // Streams the rows of a read-only statement through `fn` (for large results).
  Status Scan(const std::string& sql, const std::function<void(const Row&)>& fn);
  int nodes() const { return nodes_; }  // the node databases read
  // One line per node database that could not be read and was skipped (callers print them).
  const std::vector<std::string>& warnings() const { return warnings_; }

 private:
  RunDatabase() = default;
  tracer::sql::Database db_;
  int nodes_ = 0;
  std::vector<std::string> warnings_;
};

// A run's node databases read one after another: each statement runs over every node's database
// in turn (in node order), one attached at a time, never a copy of the run. For answers that are
// unions of per-node rows (per rank, per node: a rank's rows of one attempt are all on its node);
// ORDER BY orders each node's rows. What a report of a run of 1,536 nodes can afford.
class NodeScan {
 public:
  explicit NodeScan(std::string run_dir, RunScope scope = {});
  // Runs `sql` over each node's database; a node that cannot be read is skipped (warnings()),
  // none readable is an error.
  Status Scan(const std::string& sql, const std::function<void(const RunDatabase::Row&)>& fn);
  const std::vector<std::string>& warnings() const { return warnings_; }

 private:
  std::string run_dir_;
  RunScope scope_;
  std::vector<std::string> nodes_;
  std::vector<std::string> warnings_;
};

// The canned questions, as SQL over the unified views.
// A WITH clause ending in per_rank(attempt, rank, step, wall, compute, comm, data), nanoseconds
// (a step run again after a restart is a row per attempt): compute
// excludes the collectives nested in compute spans; comm leaves out asynchronous sends.
std::string PerRankStepCte();
std::string StepsSql();
std::string StragglersSql();
std::string WaitsSql(int limit);
std::string AtSql(int64_t t_ns);

// Output formats.
std::string FormatTable(const Table& t);
std::string FormatCsv(const Table& t);
std::string FormatJson(const Table& t);

}  // namespace megascope::analyzer
