// SRE queries where the data is: each node's agent answers
//   GET /query?q=steps|stragglers|waits|at|sql|quantiles[&sql=...][&at=NS][&of=step][&from_ns=..]
//              [&to_ns=..][&limit=N]
// over its own trace.db (read-only, a bounded number of rows and seconds) with its part of the
// answer, and `megascope query --from-agents` merges the parts: each question is a part asked of
// every node and a merge over the union of the parts (counts and sums add, minima and maxima
// combine, averages are sums over counts, quantiles by sketch, a rank's newest attempt wins), so
// the merged answer is the one the whole run's databases give, without any machine reading them
// all. docs/formats.md section 4 describes the answer.
#pragma once

#include <chrono>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "megascope/analyzer/query.h"

namespace megascope::analyzer {

enum class Question { kSteps, kStragglers, kWaits, kAt, kSql, kQuantiles };
// "steps", "stragglers", "waits", "at", "sql", "quantiles".
std::string_view QuestionName(Question q);

struct NodeQuery {
  Question question = Question::kSteps;
  std::string sql;    // kSql: the statement each node runs over its own views
  int64_t at_ns = 0;  // kAt: the moment
  int limit = 20;     // kWaits: the rows kept after the merge
  // kQuantiles: the per-rank, per-step duration whose quantiles are asked (QuantileOfs()). Each
  // node sends a log-bucket sketch (DDSketch's buckets: relative accuracy 1 %), which merges by
  // adding counts; the answer's p50, p90 and p99 are within 1 % of the exact ones over every rank.
  std::string of = "step";
  // Rows of this time window only (spans by start, collectives by issue, heartbeats and metrics by
  // time): what is read, not only what is shown.
  int64_t from_ns = std::numeric_limits<int64_t>::min();
  int64_t to_ns = std::numeric_limits<int64_t>::max();
};
// The durations `quantiles` can be asked of: step (a rank's wall per step), compute, comm_wait,
// data.
const std::vector<std::string>& QuantileOfs();
// A URL's query string ("q=stragglers&from_ns=...", percent-encoded); an error names the field.
Result<NodeQuery> ParseNodeQuery(std::string_view query);
std::string NodeQueryPath(const NodeQuery& q);  // "/query?q=..."

// The scope of a node's read for `q` (its time window).
RunScope QueryScope(const NodeQuery& q);
// The statement a node runs for its part, and the one run over the union of every node's part
// (as table `part`) for the answer. For kSql the merge is `merge_sql` when given, else every row.
std::string PartSql(const NodeQuery& q);
std::string MergeSql(const NodeQuery& q, const std::string& merge_sql = "");

// One node's part as sent: its rows, and whether the row bound cut it short.
struct QueryPart {
  static constexpr int kVersion = 1;
  std::string node;
  Table table;
  bool truncated = false;
};
std::string QueryPartJson(const QueryPart& part);
// An unknown version is an error; so is a malformed part (naming what is wrong).
Result<QueryPart> ParseQueryPart(std::string_view json);

// The answer from every node's part (`parts` in any order; columns must agree).
Result<Table> MergeParts(const NodeQuery& q, const std::vector<QueryPart>& parts,
                         const std::string& merge_sql = "");

// Answers one node's /query over RUN_DIR/nodes/NODE/trace.db, read-only: at most `max_rows` rows
// (more: the part says it was cut) and `max_seconds` of work (more: an error saying so).
class QueryServer {
 public:
  QueryServer(std::string run_dir, std::string node, size_t max_rows = 200000,
              double max_seconds = 20);
  Result<QueryPart> Part(const NodeQuery& q) const;
  // (HTTP status, body): 200 and the part's JSON; 400 and the reason for a bad query or SQL; 503
  // when the database cannot be read or the query ran too long (JSON {"error": ...}).
  std::pair<int, std::string> Serve(std::string_view query) const;

 private:
  std::string run_dir_, node_;
  size_t max_rows_;
  double max_seconds_;
};

}  // namespace megascope::analyzer
