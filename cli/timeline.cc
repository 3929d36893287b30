// `megascope timeline`: a run's 3D-parallel timeline as Chrome/Perfetto JSON and HTML.
#include "megascope/analyzer/timeline.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#include "command.h"

namespace megascope::cli {

int RunTimeline(const Args& args) {
  std::string run_dir, steps, out, html, highlight;
  po::options_description opts("Options");
  opts.add_options()("help,h", "show this help")("run-dir", po::value(&run_dir)->required(),
                                                 "run directory")(
      "steps", po::value(&steps), "A:B, the steps to show (default: all)")(
      "out,o", po::value(&out),
      "Chrome trace-event JSON to write (open in Perfetto or chrome://tracing)")(
      "html", po::value(&html), "self-contained HTML viewer to write")(
      "highlight", po::value(&highlight),
      "comma-separated ranks to highlight (e.g. a verdict's roots)");
  po::positional_options_description pos;
  pos.add("run-dir", 1);
  po::variables_map vm;
  if (auto rc = ParseArgs("timeline",
                          "megascope timeline RUN_DIR --steps A:B -o out.json [--html out.html]",
                          args, opts, pos, &vm)) {
    return *rc;
  }
  if (out.empty() && html.empty())
    return Fail("timeline", "give -o out.json and/or --html out.html", kExitUsage);
  analyzer::TimelineOptions o;
  if (!steps.empty()) {
    std::string why;
    const std::optional<StepRange> range = ParseStepRange(steps, &why);
    if (!range) return Fail("timeline", why, kExitUsage);
    o.first_step = range->first;
    o.last_step = range->last;
  }
  std::stringstream ss(highlight);
  for (std::string r; std::getline(ss, r, ',');) {
    try {
      o.highlight_ranks.push_back(std::stoi(r));
    } catch (const std::exception&) {
      return Fail("timeline", "--highlight takes rank numbers", kExitUsage);
    }
  }
  o.title = "megascope timeline of " + run_dir;
  analyzer::RunScope scope;  // with --steps, only those steps are read
  if (!steps.empty()) scope = {-1, o.first_step, o.last_step, ""};
  auto db = analyzer::RunDatabase::Open(run_dir, scope);
  if (!db.ok()) return Fail("timeline", db.status().message());
  Warn("timeline", (*db)->warnings());
  analyzer::TimelineStats stats;
  auto json = analyzer::TimelineJson(**db, o, &stats);
  if (!json.ok()) return Fail("timeline", json.status().message());
  if (stats.spans == 0 && stats.open == 0)
    std::fprintf(stderr, "megascope timeline: warning: no spans in steps %s\n", steps.c_str());
  for (const auto& [path, text] : {std::pair<std::string, std::string>{out, *json},
                                   {html, html.empty() ? "" : analyzer::TimelineHtml(*json, o)}}) {
    if (path.empty()) continue;
    std::ofstream f(path);
    if (!(f << text) || !f.flush()) return Fail("timeline", "cannot write " + path);
    std::printf("wrote %s (%lld spans of %lld ranks, %lld pipeline arrows, %lld ops open)\n",
                path.c_str(), static_cast<long long>(stats.spans),
                static_cast<long long>(stats.ranks), static_cast<long long>(stats.flows),
                static_cast<long long>(stats.open));
  }
  return 0;
}

}  // namespace megascope::cli
