// `megascope report RUN_DIR --html OUT`: one self-contained page (inline SVG and CSS, no script, no
// network) -- the run's events on a time axis, the incidents' stage table, MegaScale's heat map of
// per-rank compute time per step over the DP x PP x TP grid, the loss curve across restarts, the
// detector's evidence for each verdict as small plots, and a link to the timeline viewer.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include "megascope/analyzer/query.h"
#include "megascope/controller/control_db.h"
#include "megascope/controller/report.h"
#include "megascope/launch/progress.h"
#include "megascope/launch/run_layout.h"
#include "megascope/tracer/metric_names.h"

namespace megascope::controller {
namespace {

using nlohmann::json;

std::string Esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '<':
        o += "&lt;";
        break;
      case '>':
        o += "&gt;";
        break;
      case '&':
        o += "&amp;";
        break;
      case '"':
        o += "&quot;";
        break;
      default:
        o += c;
    }
  }
  return o;
}

std::string F(const char* fmt, double v) {
  char b[64];
  std::snprintf(b, sizeof(b), fmt, v);
  return b;
}

// A small line plot: one series per name, `highlight` drawn red and on top.
std::string LinePlot(const std::map<std::string, std::vector<std::pair<double, double>>>& series,
                     const std::string& highlight, int w, int h, const std::string& ylabel) {
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  for (const auto& [n, pts] : series) {
    for (auto [x, y] : pts) {
      x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
    }
  }
  if (x1 <= x0) x1 = x0 + 1;
  if (y1 <= y0) y1 = y0 + 1;
  const int L = 56, B = 18;
  std::string svg = "<svg class=\"plot\" width=\"" + std::to_string(w) + "\" height=\"" +
                    std::to_string(h) + "\">";
  svg += "<text x=\"2\" y=\"12\" class=\"axis\">" + Esc(ylabel) + " " + F("%.3g", y1) +
         "</text><text x=\"2\" y=\"" + std::to_string(h - B) + "\" class=\"axis\">" +
         F("%.3g", y0) + "</text>";
  auto line = [&](const std::string& name, const std::vector<std::pair<double, double>>& pts) {
    std::string p;
    for (auto [x, y] : pts) {
      p += F("%.1f", L + (x - x0) / (x1 - x0) * (w - L - 4)) + "," +
           F("%.1f", 4 + (1 - (y - y0) / (y1 - y0)) * (h - B - 8)) + " ";
    }
    return "<polyline class=\"" + std::string(name == highlight ? "hi" : "peer") + "\" points=\"" +
           p + "\"><title>" + Esc(name) + "</title></polyline>";
  };
  for (const auto& [n, pts] : series) {
    if (n != highlight) svg += line(n, pts);
  }
  if (series.count(highlight)) svg += line(highlight, series.at(highlight));
  return svg + "</svg>";
}

}  // namespace

Result<std::string> BuildHtmlReport(const std::string& run_dir, const HtmlReportOptions& o) {
  launch::RunLayout layout(run_dir);
  ASSIGN_OR_RETURN(std::unique_ptr<ControlDb> cdb, ControlDb::Open(layout.control_db(), true));
  ASSIGN_OR_RETURN(std::vector<Event> events, cdb->Events());
  ReportFigures fig;
  ASSIGN_OR_RETURN(std::string markdown, BuildReport(run_dir, &fig));
  std::string h =
      "<!doctype html><html><head><meta charset=\"utf-8\"><title>megascope incident report</title>"
      "<style>body{font:14px sans-serif;margin:20px;color:#222}h2{margin-top:28px}"
      "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 6px;font-size:12px}"
      ".axis{font-size:10px;fill:#555}.peer{fill:none;stroke:#999;stroke-width:1}"
      ".hi{fill:none;stroke:#d62728;stroke-width:2}.ev{font-size:10px}"
      "rect.cell{stroke:none}rect.slow{stroke:#000;stroke-width:1.5}"
      ".row-suspect{font-weight:bold;fill:#d62728}pre{background:#f6f6f6;padding:8px;"
      "white-space:pre-wrap}</style></head><body>";
  h += "<h1>megascope launch report</h1><p>" + Esc(run_dir) + "</p>";
  h += "<p id=\"summary\">" + std::to_string(fig.incidents) + " incident(s), " +
       std::to_string(fig.evictions) + " eviction(s), wall " + F("%.1f s", fig.wall_s) + ", ETTR " +
       F("%.3f", fig.ettr) +
       ". <a href=\"timeline.html\">Timeline viewer</a> (the "
       "steps around the last incident, its root ranks highlighted).</p>";

  // 1. Events on a time axis.
  const int64_t t0 = events.empty() ? 0 : events.front().ts_ns;
  const int64_t t1 = events.empty() ? 1 : std::max(events.back().ts_ns, t0 + 1);
  static const std::map<std::string, std::string> kColour = {
      {"fault_injected", "#ff7f0e"}, {"trigger", "#d62728"}, {"verdict", "#9467bd"},
      {"decision", "#8c564b"},       {"eviction", "#000"},   {"self_check", "#17becf"},
      {"restart", "#2ca02c"},        {"resumed", "#2ca02c"}, {"paused", "#e377c2"}};
  const int W = 1100;
  h += "<h2>Faults, verdicts, actions and restarts</h2><svg id=\"events\" width=\"" +
       std::to_string(W) + "\" height=\"" + std::to_string(40 + 14 * kColour.size()) + "\">";
  int lane = 0;
  for (const auto& [kind, colour] : kColour) {
    const int y = 20 + 14 * lane++;
    h += "<text x=\"0\" y=\"" + std::to_string(y + 4) + "\" class=\"ev\">" + kind + "</text>";
    for (const Event& e : events) {
      if (e.kind_name != kind) continue;
      const double x =
          110 + static_cast<double>(e.ts_ns - t0) / static_cast<double>(t1 - t0) * (W - 120);
      h += "<circle cx=\"" + F("%.1f", x) + "\" cy=\"" + std::to_string(y) + "\" r=\"4\" fill=\"" +
           colour + "\"><title>" + F("+%.2f s ", static_cast<double>(e.ts_ns - t0) / 1e9) +
           Esc(kind + " " + e.node + " " + e.detail.dump().substr(0, 300)) + "</title></circle>";
    }
  }
  h += "<text x=\"110\" y=\"" + std::to_string(34 + 14 * kColour.size()) +
       "\" class=\"axis\">0 s</text><text x=\"" + std::to_string(W - 60) + "\" y=\"" +
       std::to_string(34 + 14 * kColour.size()) + "\" class=\"axis\">" +
       F("%.1f s", static_cast<double>(t1 - t0) / 1e9) + "</text></svg>";
  h += "<h2>Incidents, stage by stage</h2><pre>" + Esc(markdown) + "</pre>";

  // Ranks named by slow verdicts, with the node each ran on then ("" when not said), and nodes
  // named by faulty-machine verdicts. A rank that a restart moved to a spare is not the suspect
  // there.
  std::set<std::pair<int, std::string>> suspect_ranks;
  std::set<std::string> suspect_nodes;
  for (const Event& e : events) {
    if (e.kind_name != "verdict") continue;
    const std::string kind = e.detail.value("kind", "");
    if (kind == "slow" && e.detail.value("cause", "") != "stage_imbalance" && e.rank >= 0)
      suspect_ranks.insert({e.rank, e.node});
    if (kind == "faulty_machine" && !e.node.empty()) suspect_nodes.insert(e.node);
  }
  auto suspect = [&](int rank, const std::string& node) {
    return suspect_nodes.count(node) > 0 || suspect_ranks.count({rank, node}) > 0 ||
           suspect_ranks.count({rank, ""}) > 0;
  };

  // 2. Heat map: compute per rank and step over its peers' median at the same (pp, tp).
  auto rdb = analyzer::RunDatabase::Open(run_dir);
  if (rdb.ok()) {
    struct Meta {
      int dp = 0, pp = 0, tp = 0;
      std::string node;
    };
    std::map<int, Meta> meta;                                // the rank's coordinates
    std::map<std::pair<int, int64_t>, std::string> node_at;  // (rank, attempt) -> node
    std::map<int, std::vector<std::string>> nodes_of;        // where each rank ran, in order
    (void)(*rdb)->Scan("SELECT rank, dp, pp, tp, node, attempt FROM ranks ORDER BY attempt",
                       [&](const analyzer::RunDatabase::Row& r) {
                         const int rank = static_cast<int>(r.Int(0));
                         const std::string node(r.Text(4));
                         meta[rank] = {static_cast<int>(r.Int(1)), static_cast<int>(r.Int(2)),
                                       static_cast<int>(r.Int(3)), node};
                         node_at[{rank, r.Int(5)}] = node;
                         auto& seen = nodes_of[rank];
                         if (std::find(seen.begin(), seen.end(), node) == seen.end())
                           seen.push_back(node);
                       });
    struct Cell {
      double s = 0;
      std::string node;  // where this run of the step ran
    };
    std::map<int64_t, std::map<int, Cell>> compute;  // step -> rank -> its last run
    (void)(*rdb)->Scan(analyzer::PerRankStepCte() +
                           "\nSELECT p.rank, p.step, p.compute, p.attempt FROM per_rank p"
                           " ORDER BY p.step, p.attempt",
                       [&](const analyzer::RunDatabase::Row& r) {
                         const int rank = static_cast<int>(r.Int(0));
                         compute[r.Int(1)][rank] = {r.Double(2) / 1e9, node_at[{rank, r.Int(3)}]};
                       });
    std::vector<int64_t> steps;
    steps.reserve(compute.size());
    for (const auto& [s, per] : compute) steps.push_back(s);
    if (steps.size() > static_cast<size_t>(o.max_steps))
      steps.erase(steps.begin(), steps.end() - o.max_steps);
    std::vector<int> ranks;
    ranks.reserve(meta.size());
    for (const auto& [r, m] : meta) ranks.push_back(r);
    std::sort(ranks.begin(), ranks.end(), [&](int a, int b) {
      const Meta &x = meta[a], &y = meta[b];
      return std::tie(x.pp, x.tp, x.dp) < std::tie(y.pp, y.tp, y.dp);
    });
    // A row per rank and node it ran on: a rank a restart moved to a spare has a row there too,
    // and only the row of the node a verdict named is marked.
    std::vector<std::pair<int, std::string>> rows;
    for (int r : ranks) {
      for (const std::string& node : nodes_of[r]) rows.emplace_back(r, node);
    }
    const int cw =
        std::max(3, std::min(14, 900 / std::max<int>(1, static_cast<int>(steps.size()))));
    const int ch = 16, L = 190;
    h += "<h2>Compute time per rank and step, against its peers at the same (pp, tp)</h2>"
         "<p>White: at its peers' median; red: slower (darkest at 2x and more); outlined: 20 % or "
         "more slower. A rank moved by a restart has a row per node it ran on; the rows a "
         "straggler or faulty-machine verdict named are red.</p><svg id=\"heatmap\" width=\"" +
         std::to_string(L + cw * steps.size() + 10) + "\" height=\"" +
         std::to_string(ch * rows.size() + 24) + "\">";
    for (size_t i = 0; i < rows.size(); ++i) {
      const auto& [r, node] = rows[i];
      const Meta& m = meta[r];
      h += "<text x=\"0\" y=\"" + std::to_string(ch * i + 12) + "\" class=\"axis" +
           (suspect(r, node) ? " row-suspect" : "") + "\">rank " + std::to_string(r) + " dp" +
           std::to_string(m.dp) + " pp" + std::to_string(m.pp) + " tp" + std::to_string(m.tp) +
           " " + Esc(node) + "</text>";
      for (size_t k = 0; k < steps.size(); ++k) {
        const auto& per = compute[steps[k]];
        auto it = per.find(r);
        if (it == per.end() || it->second.node != node) continue;
        std::vector<double> peers;
        for (const auto& [r2, c2] : per) {
          if (r2 != r && meta[r2].pp == m.pp && meta[r2].tp == m.tp) peers.push_back(c2.s);
        }
        double ratio = 1;
        if (!peers.empty()) {
          const auto mid = peers.begin() + static_cast<std::ptrdiff_t>(peers.size() / 2);
          std::nth_element(peers.begin(), mid, peers.end());
          const double med = *mid;
          if (med > 0) ratio = it->second.s / med;
        }
        const double heat = std::clamp(ratio - 1, 0.0, 1.0);
        const int g = static_cast<int>(255 * (1 - heat));
        h += "<rect class=\"cell" + std::string(ratio >= 1.2 ? " slow" : "") + "\" data-rank=\"" +
             std::to_string(r) + "\" data-step=\"" + std::to_string(steps[k]) + "\" x=\"" +
             std::to_string(L + cw * k) + "\" y=\"" + std::to_string(ch * i) + "\" width=\"" +
             std::to_string(cw) + "\" height=\"" + std::to_string(ch - 1) + "\" fill=\"rgb(255," +
             std::to_string(g) + "," + std::to_string(g) + ")\"><title>rank " + std::to_string(r) +
             " step " + std::to_string(steps[k]) + " on " + Esc(node) + ": " +
             F("%.4f s", it->second.s) + ", " + F("%.2fx", ratio) + " its peers</title></rect>";
      }
    }
    if (!steps.empty()) {
      h += "<text x=\"" + std::to_string(L) + "\" y=\"" + std::to_string(ch * rows.size() + 14) +
           "\" class=\"axis\">step " + std::to_string(steps.front()) + "</text><text x=\"" +
           std::to_string(L + cw * steps.size() - 50) + "\" y=\"" +
           std::to_string(ch * rows.size() + 14) + "\" class=\"axis\">step " +
           std::to_string(steps.back()) + "</text>";
    }
    h += "</svg>";
  } else {
    h += "<p>No trace database: " + Esc(rdb.status().message()) + "</p>";
  }

  // 3. The loss curve, one line per attempt.
  std::map<std::string, std::vector<std::pair<double, double>>> loss;
  launch::ProgressReader progress(layout.progress());
  for (const auto& line : progress.Poll()) {
    if (line.contains("event") || !line.contains("loss")) continue;
    loss["attempt " + std::to_string(line.value("attempt", 0))].emplace_back(
        line.value("step", 0.0), line.value("loss", 0.0));
  }
  h += "<h2>Loss across restarts</h2>";
  h += loss.empty() ? "<p>No step finished.</p>"
                    : LinePlot(loss, loss.rbegin()->first, 700, 180, "loss") +
                          "<p>One line per attempt; the newest in red.</p>";

  // 4. The evidence behind each online verdict.
  h += "<h2>Evidence of each verdict</h2>";
  int n = 0;
  for (const Event& e : events) {
    if (e.kind_name != "verdict") continue;
    ++n;
    h += "<h3>" + Esc(e.detail.value("kind", "") + " " + e.detail.value("cause", "")) + " on " +
         Esc(e.node.empty() ? "-" : e.node) +
         F(" (confidence %.2f)", e.detail.value("confidence", 0.0)) + "</h3><p>" +
         Esc(e.detail.value("explanation", "")) + "</p><ul>";
    for (const auto& ev : e.detail.value("evidence", json::array()))
      h += "<li>" + Esc(ev.is_string() ? ev.get<std::string>() : ev.dump()) + "</li>";
    h += "</ul>";
    if (e.detail.value("kind", "") != "faulty_machine" || !rdb.ok()) continue;
    // Each evidence metric around the verdict: the named node in red, its peers in grey.
    const int64_t det = e.detail.value("detected_at_ns", e.ts_ns);
    int plotted = 0;
    for (const auto& ev : e.detail.value("evidence", json::array())) {
      if (!ev.is_string() || plotted >= 3) continue;
      const std::string text = ev.get<std::string>();
      const std::string metric = text.substr(0, text.find(' '));
      const tracer::metrics::Def* def = tracer::metrics::Find(metric);
      if (def == nullptr) continue;
      ++plotted;
      std::map<std::string, std::vector<std::pair<double, double>>> series;
      std::map<std::string, std::pair<double, double>> last;
      (void)(*rdb)->Scan(
          "SELECT node, ts_ns, value FROM metrics WHERE name = '" + std::string(def->name) +
              "' AND ts_ns BETWEEN " + std::to_string(det - 120'000'000'000) + " AND " +
              std::to_string(det + 30'000'000'000) + " ORDER BY ts_ns",
          [&](const analyzer::RunDatabase::Row& r) {
            const std::string node(r.Text(0));
            const double t = static_cast<double>(r.Int(1) - det) / 1e9, v = r.Double(2);
            if (def->type == tracer::metrics::Type::kCounter) {  // as the detector saw it: a rate
              auto [it, first] = last.try_emplace(node, t, v);
              const auto [pt, pv] = it->second;
              it->second = {t, v};
              if (!first && t > pt && v >= pv) series[node].emplace_back(t, (v - pv) / (t - pt));
            } else {
              series[node].emplace_back(t, v);
            }
          });
      if (!series.empty())
        h += "<div class=\"evidence\"><b>" + Esc(tracer::metrics::ExportName(def->name)) +
             "</b> (seconds from the verdict)<br>" + LinePlot(series, e.node, 520, 120, "") +
             "</div>";
    }
  }
  if (n == 0) h += "<p>No verdict.</p>";
  return h + "</body></html>\n";
}

}  // namespace megascope::controller
