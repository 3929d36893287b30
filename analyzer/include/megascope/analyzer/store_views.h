// The SRE views over the fleet's ClickHouse store (docs/formats.md section 4b), with the columns
// the same views have over a run's trace databases (query.h): the run views of one job (steps,
// stragglers, waits, open), and the fleet views that need a store (verdicts, machines,
// incidents), across jobs and weeks. Each view is one ClickHouse statement: the work runs where
// the rows are, and what comes back is the answer.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "megascope/analyzer/query.h"
#include "megascope/analyzer/slow.h"
#include "megascope/tracer/clickhouse.h"
#include "megascope/tracer/status.h"

namespace megascope::analyzer {

enum class StoreView : uint8_t {
  kSteps = 0,   // as StepsSql()
  kStragglers,  // as StragglersSql()
  kWaits,       // as WaitsSql()
  kOpen,        // the ops still open: open_collectives' rows
  kVerdicts,    // every verdict the controllers recorded: when, job, attempt, kind, cause, node
  kMachines,    // per node: how often and over how long it was named, by what
  kIncidents,   // per cause, rank and node: how many incidents, in how many jobs, first and last
  kAt,          // as AtSql(): what each rank was doing at StoreScope::at_ns
};
std::string_view Name(StoreView v);
std::optional<StoreView> ParseStoreView(std::string_view name);
// Whether a view is of one job's run (and needs StoreScope::job).
bool IsRunView(StoreView v);

struct StoreScope {
  std::string job;  // "": every job (the fleet views only)
  int64_t since_ns = std::numeric_limits<int64_t>::min();
  int limit = 20;     // rows for waits
  int64_t at_ns = 0;  // the moment for `at`
};

// The view's ClickHouse statement.
std::string StoreViewSql(StoreView v, const StoreScope& scope);
// Runs it; numbers come back spelled as SQLite spells them (a whole Float64 as "12.0").
Result<Table> QueryStore(tracer::ClickHouse& ch, StoreView v, const StoreScope& scope);

// A straggler window (`options`' steps and attempt) of `job` read from the store, as LoadSlowInput
// reads it from a run's databases: nullopt while fewer than `world` ranks have spans through its
// last step there (their agents have not shipped them yet), unless `anyway`. One statement per
// part (ranks, steps, ops), where the controller would otherwise ask every node's agent.
Result<std::optional<SlowInput>> LoadSlowInputFromStore(tracer::ClickHouse& ch,
                                                        const std::string& job,
                                                        const SlowOptions& options, int world,
                                                        bool anyway);

}  // namespace megascope::analyzer
