// `megascope report RUN_DIR`: the incidents of a launch read back from control.db and the
// progress stream -- per incident the time of each stage (fault -> trigger -> verdict -> stopped
// -> self-checks -> restart -> state loaded -> first step), the node evicted and why, the steps
// lost -- and the run's effective training time ratio (ETTR: the step time of steps that were
// kept, over the wall time of the run).
#pragma once

#include <string>

#include "megascope/tracer/status.h"

namespace megascope::controller {

struct ReportFigures {
  int incidents = 0;
  int evictions = 0;
  double ettr = 0;
  double wall_s = 0;
  double productive_s = 0;
};

// Markdown text; `figures` (optional) receives the numbers behind it.
Result<std::string> BuildReport(const std::string& run_dir, ReportFigures* figures = nullptr);

struct HtmlReportOptions {
  int max_steps = 300;  // the heat map shows the newest this many steps
};
// `megascope report RUN_DIR --html OUT`: one self-contained page (inline SVG, no script, no
// network): events on a time axis, the incidents' stages, the heat map of per-rank compute time per
// step over the DP x PP x TP grid (a straggler's cells outlined, its row in red), the loss curve
// across restarts, each verdict's evidence (the detector's metrics around it, the node in red
// against its peers) and a link to the timeline viewer.
Result<std::string> BuildHtmlReport(const std::string& run_dir,
                                    const HtmlReportOptions& options = {});

}  // namespace megascope::controller
