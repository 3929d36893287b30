// `megascope report RUN_DIR`: the incidents of a launch read back from control.db and the
// progress stream -- per incident the time of each stage (fault -> trigger -> verdict -> stopped
// -> self-checks -> restart -> state loaded -> first step), the node evicted and why, the steps
// lost -- and the run's effective training time ratio (ETTR: the step time of steps that were
// kept, over the wall time of the run).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "megascope/controller/control_db.h"
#include "megascope/tracer/status.h"

namespace megascope::controller {

struct ReportFigures {
  int incidents = 0;
  int evictions = 0;
  double ettr = 0;
  double wall_s = 0;
  double productive_s = 0;
};

// One stage of an incident, as the report's table lists it.
struct ReportStage {
  std::string stage;  // "fault injected", "trigger (detected)", "verdict", "eviction", ...
  int64_t ts_ns = 0;
  std::string detail;  // one readable line
  bool key = false;    // what an SRE looks for first (the node evicted, the steps lost, a pause)
};

// An incident runs from a trigger to the next trigger (or the end).
struct ReportIncident {
  int number = 0;   // from 1
  int attempt = 0;  // the attempt it struck
  std::string cause;
  int64_t trigger_ns = 0;
  std::vector<ReportStage> stages;  // in time order; the fault (when one fired) first
  int steps_lost = -1;              // -1: no restart followed
  double resumed_after_s = -1;      // trigger to the first step after the restart; -1: none
};

// A launch's run directory read back: control.db's events, the incidents cut from them and the
// progress stream's figures. Both the markdown report and the HTML page are written from it.
struct RunReport {
  std::string run_dir;
  std::string status;  // job_finished's status, or "running (...)"
  ReportFigures figures;
  std::vector<Event> events;  // every event, in time order
  std::vector<ReportIncident> incidents;
  std::vector<std::string> notes;  // agent restarts: the node and why, no eviction
};
Result<RunReport> ReadRunReport(const std::string& run_dir);

// One readable line for an event (its stage table's detail; the page's tooltips).
std::string DescribeEvent(const Event& e);

// The markdown report of `report`.
std::string FormatReport(const RunReport& report);

// Markdown text; `figures` (optional) receives the numbers behind it.
Result<std::string> BuildReport(const std::string& run_dir, ReportFigures* figures = nullptr);

struct HtmlReportOptions {
  int max_steps = 300;  // the heat map shows the newest this many steps
  // Where the page's links to the run's files (dumps, timeline) start from: "" when the page is
  // written in the run directory, else the run directory as seen from the page's folder.
  std::string link_base;
};
// `megascope report RUN_DIR --html OUT`: one self-contained page (inline SVG and CSS, no script, no
// network), readable printed: the summary and every incident's stage table; each verdict's
// evidence by kind (a hang's wait-for graph and the ranks' stacks from the dumps of its incident, a
// straggler's compute per step against its peers over the steps that decided it, a faulty
// machine's metrics against its peers'); the run's events on a time axis; the heat map of per-rank
// compute per step over the DP x PP x TP grid with its colour scale; the loss across restarts.
// Every plot has ticked axes with units, a legend and the restarts marked.
Result<std::string> BuildHtmlReport(const std::string& run_dir,
                                    const HtmlReportOptions& options = {});

}  // namespace megascope::controller
