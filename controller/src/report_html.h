// The HTML report's sections, each a pure function of the run read back (RunReport) and, where it
// draws traces, the run's trace databases. report_html.cc assembles the page; report_evidence.cc
// draws each verdict's evidence by kind.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "megascope/analyzer/query.h"
#include "megascope/controller/report.h"

namespace megascope::controller::html {

// Where a restart resumed: attempt `attempt` began at `ts_ns` after step `resume_step`.
struct Restart {
  int attempt = 0;
  int64_t ts_ns = 0;
  int64_t resume_step = 0;
};
std::vector<Restart> Restarts(const RunReport& r);

// What the page knows of each rank in each attempt (from the trace databases' ranks table).
struct RankPlace {
  int dp = 0, pp = 0, tp = 0;
  std::string node;
};
using Places = std::map<std::pair<int64_t, int>, RankPlace>;  // (attempt, rank) -> place
// Every rank's place in each attempt; `status` says why none could be read.
Places ReadPlaces(analyzer::NodeScan* db, Status* status);

// The verdicts the controller acted on (ActedOnVerdicts) and those that opened an incident, by
// VerdictId: the page draws these in full.
std::set<int64_t> ActedOn(const RunReport& r);

// Each verdict: a card with its explanation, facts and thresholds, and the figure its kind calls
// for; verdicts nothing acted on are listed in one table after the cards.
std::string Evidence(const RunReport& r, analyzer::NodeScan* db, const Places& places,
                     const HtmlReportOptions& o);

}  // namespace megascope::controller::html
