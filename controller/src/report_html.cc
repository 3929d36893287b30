// `megascope report RUN_DIR --html OUT`: the page (report.h). Sections in the order an SRE reads
// an incident: what happened and what it cost, why (each verdict's evidence), then the run around
// it (events, the compute heat map, the loss).
#include "report_html.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>

#include "megascope/launch/progress.h"
#include "megascope/tracer/run_layout.h"
#include "megascope/tracer/verdict.h"
#include "svg.h"

namespace megascope::controller {
namespace html {

using svg::Esc;
using svg::Num;

std::vector<Restart> Restarts(const RunReport& r) {
  std::vector<Restart> out;
  for (const Event& e : r.events) {
    if (e.kind_name == Name(EventKind::kRestart) && e.attempt > 0)
      out.push_back({e.attempt, e.ts_ns, e.detail.value("resume_step", int64_t{0})});
  }
  return out;
}

Places ReadPlaces(analyzer::NodeScan* db, Status* status) {
  Places out;
  if (db == nullptr) return out;
  *status = db->Scan("SELECT attempt, rank, dp, pp, tp, node FROM ranks",
                     [&](const analyzer::RunDatabase::Row& row) {
                       out[{row.Int(0), static_cast<int>(row.Int(1))}] = {
                           static_cast<int>(row.Int(2)), static_cast<int>(row.Int(3)),
                           static_cast<int>(row.Int(4)), std::string(row.Text(5))};
                     });
  return out;
}

namespace {

constexpr const char* kStyle = R"css(
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px auto;max-width:1180px;color:#1d1d1f;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:30px 0 8px;padding-bottom:4px;border-bottom:1px solid #ddd}
h3{font-size:15px;margin:18px 0 6px}.sub{color:#666;margin:0 0 14px}.note{color:#666;font-size:12px;margin:4px 0}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin:12px 0}.card{border:1px solid #ddd;border-radius:6px;padding:8px 14px;min-width:110px}
.card b{display:block;font-size:20px}.card span{color:#666;font-size:12px}.card.bad b{color:#d62728}.card.good b{color:#2ca02c}
table{border-collapse:collapse;margin:6px 0 10px;width:100%}th,td{border-bottom:1px solid #e4e4e4;padding:4px 8px;text-align:left;vertical-align:top;font-size:13px}
th{background:#f4f5f7;font-weight:600}td.num,th.num{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}
table.stages td:first-child{white-space:nowrap}table.thresholds{width:auto}tr.key td{font-weight:600}tr.key td:first-child{border-left:3px solid #d62728}
.verdict{border:1px solid #ddd;border-left:4px solid #9467bd;border-radius:4px;padding:6px 14px 10px;margin:14px 0;break-inside:avoid}
.verdict.hang{border-left-color:#d62728}.verdict.slow{border-left-color:#ff7f0e}.verdict.faulty_machine{border-left-color:#8c564b}
.facts{margin:4px 0;padding-left:20px;font-size:13px}pre.stack{background:#f6f7f9;padding:6px 10px;font-size:11.5px;overflow-x:auto;white-space:pre-wrap;word-break:break-all;margin:4px 0}
svg{font-family:inherit;display:block}svg text{fill:#333}.tick{font-size:10px;fill:#555}.label{font-size:11px;fill:#333}
.grid{stroke:#eee}.axisline{stroke:#888}.marker{stroke:#2ca02c;stroke-dasharray:4 3;stroke-width:1.2}.markerlabel{font-size:10px;fill:#2ca02c}
.band{fill:#d62728;fill-opacity:.07}.pt{fill:transparent}.pt:hover{fill:#333}
figure{margin:6px 0 12px}.legend{font-size:12px;color:#333;margin:2px 0 0 62px}.key{margin-right:14px;white-space:nowrap}
.key i{display:inline-block;width:14px;height:3px;margin:0 5px 3px 0;vertical-align:middle}
rect.cell{stroke:none}rect.slow{stroke:#000;stroke-width:1.2}.row-suspect{font-weight:bold;fill:#d62728}
.gnode rect{fill:#fff;stroke:#888;rx:4}.gnode.root rect{fill:#fde8e8;stroke:#d62728;stroke-width:2}.gnode text{font-size:11px}
.gedge{stroke:#777;stroke-width:1.2;fill:none}.glabel{font-size:10px;fill:#555}
a{color:#1a5fb4}
@media print{body{margin:0;max-width:none;font-size:12px}h2{break-after:avoid}figure,table,.verdict{break-inside:avoid}
a{color:#000;text-decoration:none}.pt{display:none}@page{size:A4 landscape;margin:12mm}}
)css";

std::string Secs(double s) { return Num(std::abs(s) < 10 ? "%.2f s" : "%.1f s", s); }

// The header: what the run is and what its incidents cost, as cards.
std::string Summary(const RunReport& r, const std::vector<Restart>& restarts,
                    const std::string& link_base) {
  const ReportFigures& f = r.figures;
  int lost = 0;
  for (const ReportIncident& inc : r.incidents) lost += std::max(0, inc.steps_lost);
  auto card = [](const std::string& value, const std::string& what, const char* cls) {
    return "<div class=\"card " + std::string(cls) + "\"><b>" + value + "</b><span>" + what +
           "</span></div>";
  };
  std::string h = "<h1>megascope incident report</h1><p class=\"sub\">" + Esc(r.run_dir) +
                  " &middot; <a href=\"" + Esc(link_base) +
                  "timeline.html\">3D-parallel timeline</a> (the steps around the last incident, "
                  "its root ranks highlighted)</p><div class=\"cards\" id=\"summary\">";
  const bool finished = r.status == "finished";
  h += card(Esc(r.status), "status", finished ? "good" : "bad");
  h += card(std::to_string(f.incidents), "incidents", f.incidents > 0 ? "bad" : "");
  h += card(std::to_string(f.evictions), "nodes evicted", "");
  h += card(std::to_string(restarts.size()), "restarts", "");
  h += card(std::to_string(lost), "steps lost", lost > 0 ? "bad" : "");
  h += card(Secs(f.wall_s), "wall time", "");
  h += card(Num("%.3f", f.ettr), "ETTR (kept step time / wall)", f.ettr < 0.5 ? "bad" : "");
  return h + "</div>";
}

// Every incident: a line each in an overview, then its stages as a table.
std::string Incidents(const RunReport& r) {
  std::string h = "<h2>Incidents, stage by stage</h2>";
  if (r.incidents.empty()) return h + "<p>No incident: nothing triggered the controller.</p>";
  h += "<table id=\"incidents\"><tr><th class=\"num\">#</th><th class=\"num\">attempt</th>"
       "<th>cause</th><th>root</th><th class=\"num\">detected after the fault</th>"
       "<th class=\"num\">training again after</th><th class=\"num\">steps lost</th></tr>";
  for (const ReportIncident& inc : r.incidents) {
    std::string root = "-", fault = "-";
    for (const ReportStage& s : inc.stages) {
      if (s.stage == "eviction" && root == "-") root = s.detail;
      if (s.stage == "fault injected")
        fault = Secs(static_cast<double>(inc.trigger_ns - s.ts_ns) / 1e9);
    }
    h += "<tr><td class=\"num\">" + std::to_string(inc.number) + "</td><td class=\"num\">" +
         std::to_string(inc.attempt) + "</td><td>" + Esc(inc.cause) + "</td><td>" + Esc(root) +
         "</td><td class=\"num\">" + fault + "</td><td class=\"num\">" +
         (inc.resumed_after_s >= 0 ? Secs(inc.resumed_after_s) : "-") + "</td><td class=\"num\">" +
         (inc.steps_lost >= 0 ? std::to_string(inc.steps_lost) : "-") + "</td></tr>";
  }
  h += "</table>";
  for (const ReportIncident& inc : r.incidents) {
    h += "<h3>Incident " + std::to_string(inc.number) + " (attempt " + std::to_string(inc.attempt) +
         "): " + Esc(inc.cause) +
         "</h3><table class=\"stages\"><tr><th>stage</th><th class=\"num\">from the trigger</th>"
         "<th>detail</th></tr>";
    for (const ReportStage& s : inc.stages) {
      const double d = static_cast<double>(s.ts_ns - inc.trigger_ns) / 1e9;
      h += std::string(s.key ? "<tr class=\"key\">" : "<tr>") + "<td>" + Esc(s.stage) +
           "</td><td class=\"num\">" + (d >= 0 ? "+" : "") + Secs(d) + "</td><td>" + Esc(s.detail) +
           "</td></tr>";
    }
    h += "</table>";
  }
  for (const std::string& n : r.notes) h += "<p class=\"note\">" + Esc(n) + "</p>";
  return h;
}

// The chart's lanes: a lane per kind that occurred, ours in the order an incident goes through
// them, then a newer writer's; each with its colour.
std::vector<std::pair<std::string, const char*>> EventLanes(const RunReport& r) {
  static const std::vector<std::pair<EventKind, const char*>> kLanes = {
      {EventKind::kFaultInjected, "#ff7f0e"},    {EventKind::kTrigger, "#d62728"},
      {EventKind::kVerdict, "#9467bd"},          {EventKind::kDecision, "#8c564b"},
      {EventKind::kStopped, "#7f7f7f"},          {EventKind::kEviction, "#000000"},
      {EventKind::kSelfCheck, "#17becf"},        {EventKind::kRestart, "#2ca02c"},
      {EventKind::kCheckpointLoaded, "#98df8a"}, {EventKind::kResumed, "#2ca02c"},
      {EventKind::kPaused, "#e377c2"},           {EventKind::kAgentRestarted, "#bcbd22"},
      {EventKind::kCheckpointSaved, "#c7c7c7"},  {EventKind::kJobFinished, "#1f77b4"}};
  std::vector<std::pair<std::string, const char*>> lanes;  // kind name, colour
  std::set<std::string> known;
  for (const auto& [kind, colour] : kLanes) {
    const std::string name(Name(kind));
    known.insert(name);
    for (const Event& e : r.events) {
      if (e.kind_name == name) {
        lanes.emplace_back(name, colour);
        break;
      }
    }
  }
  for (const Event& e : r.events) {  // a newer writer's kinds, after ours
    if (!known.count(e.kind_name)) {
      known.insert(e.kind_name);
      lanes.emplace_back(e.kind_name, "#555555");
    }
  }
  return lanes;
}

// The run's events on a time axis: a lane per kind that occurred, in the order an incident goes
// through them; incidents shaded from trigger to training again; restarts marked.
std::string EventsChart(const RunReport& r, const std::vector<Restart>& restarts) {
  if (r.events.empty()) return "";
  const int64_t t0 = r.events.front().ts_ns;
  const double span = std::max(1e-3, static_cast<double>(r.events.back().ts_ns - t0) / 1e9);
  const std::vector<std::pair<std::string, const char*>> lanes = EventLanes(r);
  const int W = 1120, L = 130, T = 22, lane_h = 18;
  const double pw = W - L - 20;
  const int H = T + lane_h * static_cast<int>(lanes.size()) + 34;
  auto X = [&](int64_t ts) { return L + static_cast<double>(ts - t0) / 1e9 / span * pw; };
  std::string h = "<h2>Faults, verdicts, actions and restarts</h2><svg id=\"events\" width=\"" +
                  std::to_string(W) + "\" height=\"" + std::to_string(H) + "\" viewBox=\"0 0 " +
                  std::to_string(W) + " " + std::to_string(H) + "\">";
  const int bottom = T + lane_h * static_cast<int>(lanes.size());
  for (const ReportIncident& inc : r.incidents) {  // trigger to training again
    const int64_t end = inc.resumed_after_s >= 0
                            ? inc.trigger_ns + static_cast<int64_t>(inc.resumed_after_s * 1e9)
                            : r.events.back().ts_ns;
    h += "<rect class=\"band\" x=\"" + Num("%.1f", X(inc.trigger_ns)) + "\" y=\"" +
         std::to_string(T - 6) + "\" width=\"" +
         Num("%.1f", std::max(2.0, X(end) - X(inc.trigger_ns))) + "\" height=\"" +
         std::to_string(bottom - T + 6) + "\"><title>incident " + std::to_string(inc.number) +
         ": " + Esc(inc.cause) + "</title></rect>";
  }
  const std::vector<double> ticks = svg::Ticks(0, span, 10);
  const double step = ticks.size() > 1 ? ticks[1] - ticks[0] : 1;
  for (double t : ticks) {
    const double x = L + t / span * pw;
    h += "<line class=\"grid\" x1=\"" + Num("%.1f", x) + "\" x2=\"" + Num("%.1f", x) + "\" y1=\"" +
         std::to_string(T - 6) + "\" y2=\"" + std::to_string(bottom) +
         "\"/><text class=\"tick\" text-anchor=\"middle\" x=\"" + Num("%.1f", x) + "\" y=\"" +
         std::to_string(bottom + 14) + "\">" + svg::TickLabel(t, step) + " s</text>";
  }
  h += "<text class=\"label\" x=\"" + Num("%.1f", L + pw / 2) + "\" y=\"" + std::to_string(H - 4) +
       "\" text-anchor=\"middle\">seconds since the launch</text>";
  for (const Restart& rs : restarts) {
    h += "<line class=\"marker\" x1=\"" + Num("%.1f", X(rs.ts_ns)) + "\" x2=\"" +
         Num("%.1f", X(rs.ts_ns)) + "\" y1=\"" + std::to_string(T - 6) + "\" y2=\"" +
         std::to_string(bottom) + "\"/><text class=\"markerlabel\" x=\"" +
         Num("%.1f", X(rs.ts_ns) + 3) + "\" y=\"" + std::to_string(T - 9) + "\">attempt " +
         std::to_string(rs.attempt) + "</text>";
  }
  for (size_t i = 0; i < lanes.size(); ++i) {
    const int y = T + lane_h * static_cast<int>(i) + lane_h / 2;
    h += "<text class=\"label\" x=\"0\" y=\"" + std::to_string(y + 4) + "\">" +
         Esc(lanes[i].first) + "</text>";
    for (const Event& e : r.events) {
      if (e.kind_name != lanes[i].first) continue;
      h += "<circle cx=\"" + Num("%.1f", X(e.ts_ns)) + "\" cy=\"" + std::to_string(y) +
           "\" r=\"4.5\" fill=\"" + lanes[i].second + "\"><title>" +
           Num("+%.2f s", static_cast<double>(e.ts_ns - t0) / 1e9) + " (attempt " +
           std::to_string(e.attempt) + ") " + Esc(e.kind_name) + "\n" + Esc(DescribeEvent(e)) +
           "</title></circle>";
    }
  }
  return h +
         "</svg><p class=\"note\">Shaded: an incident, from its trigger to the first step after "
         "its restart. Dashed: a restart. Hover a point for the event.</p>";
}

// The heat map's cells: compute per rank and step over its peers' median at the same (pp, tp).
struct HeatData {
  struct Cell {
    double s = 0;
    std::string node;  // where the kept run of the step ran
    int64_t attempt = -1;
  };
  std::map<int64_t, std::map<int, Cell>> compute;    // step -> rank -> its kept run
  std::map<int, RankPlace> meta;                     // rank -> its coordinates
  std::map<int, std::vector<std::string>> nodes_of;  // where each rank ran, in order
};

HeatData ReadHeat(analyzer::NodeScan* db, const Places& places) {
  HeatData d;
  for (const auto& [key, place] : places) {  // by attempt, so nodes_of is in order
    d.meta[key.second] = place;
    auto& seen = d.nodes_of[key.second];
    if (std::find(seen.begin(), seen.end(), place.node) == seen.end()) seen.push_back(place.node);
  }
  (void)db->Scan(
      analyzer::PerRankStepCte() +
          "\nSELECT p.rank, p.step, p.compute, p.attempt FROM per_rank p"
          " ORDER BY p.step, p.attempt",
      [&](const analyzer::RunDatabase::Row& row) {
        const int rank = static_cast<int>(row.Int(0));
        auto it = places.find({row.Int(3), rank});
        // The newest attempt's run of a step is kept (the nodes are read one after another: a
        // rank's attempts may come in any order).
        HeatData::Cell& cell = d.compute[row.Int(1)][rank];
        if (row.Int(3) >= cell.attempt)
          cell = {row.Double(2) / 1e9, it == places.end() ? "" : it->second.node, row.Int(3)};
      });
  return d;
}

double PeerRatio(const HeatData& d, int64_t step, int rank) {
  const auto& per = d.compute.at(step);
  const RankPlace& m = d.meta.at(rank);
  std::vector<double> peers;
  for (const auto& [r2, c2] : per) {
    auto it = d.meta.find(r2);
    if (r2 != rank && it != d.meta.end() && it->second.pp == m.pp && it->second.tp == m.tp)
      peers.push_back(c2.s);
  }
  if (peers.empty()) return 1;
  const auto mid = peers.begin() + static_cast<std::ptrdiff_t>(peers.size() / 2);
  std::nth_element(peers.begin(), mid, peers.end());
  return *mid > 0 ? per.at(rank).s / *mid : 1;
}

// Ranks named by the slow verdicts acted on, with the node each ran on then ("" when not said),
// and nodes named by faulty-machine verdicts acted on: their heat-map rows are marked. A rank that
// a restart moved to a spare is not the suspect there.
std::function<bool(int, const std::string&)> Suspects(const RunReport& r) {
  std::set<std::pair<int, std::string>> ranks;
  std::set<std::string> nodes;
  const std::set<int64_t> acted = ActedOn(r);
  for (const Event& e : r.events) {
    if (e.kind_name != Name(EventKind::kVerdict) || !acted.count(VerdictId(e.detail))) continue;
    const std::string kind = e.detail.value("kind", "");
    if (ParseVerdictKind(kind) == VerdictKind::kSlow &&
        ParseCause(e.detail.value("cause", "")) != Cause::kStageImbalance && e.rank >= 0)
      ranks.insert({e.rank, e.node});
    if (ParseVerdictKind(kind) == VerdictKind::kFaultyMachine && !e.node.empty())
      nodes.insert(e.node);
  }
  return [ranks, nodes](int rank, const std::string& node) {
    return nodes.count(node) > 0 || ranks.count({rank, node}) > 0 || ranks.count({rank, ""}) > 0;
  };
}

// Under the heat map: the step axis, and where each restart resumed. `bottom`: the rows' end.
std::string HeatAxis(const std::vector<int64_t>& steps, const std::vector<Restart>& restarts, int L,
                     int bottom, int T, int cw) {
  std::string h;
  auto col = [&](int64_t step) {
    const auto it = std::lower_bound(steps.begin(), steps.end(), step);
    return L + cw * static_cast<double>(it - steps.begin());
  };
  const std::vector<double> ticks =
      svg::Ticks(static_cast<double>(steps.front()), static_cast<double>(steps.back()), 10);
  for (double t : ticks) {
    const double x = col(static_cast<int64_t>(t)) + cw / 2.0;
    h += "<line class=\"axisline\" x1=\"" + Num("%.1f", x) + "\" x2=\"" + Num("%.1f", x) +
         "\" y1=\"" + std::to_string(bottom) + "\" y2=\"" + std::to_string(bottom + 4) +
         "\"/><text class=\"tick\" text-anchor=\"middle\" x=\"" + Num("%.1f", x) + "\" y=\"" +
         std::to_string(bottom + 15) + "\">" + Num("%.0f", t) + "</text>";
  }
  h += "<text class=\"label\" x=\"" + std::to_string(L) + "\" y=\"" + std::to_string(bottom + 30) +
       "\">step</text>";
  for (const Restart& rs : restarts) {
    if (rs.resume_step + 1 < steps.front() || rs.resume_step + 1 > steps.back()) continue;
    const double x = col(rs.resume_step + 1);
    h += "<line class=\"marker\" x1=\"" + Num("%.1f", x) + "\" x2=\"" + Num("%.1f", x) +
         "\" y1=\"" + std::to_string(T - 4) + "\" y2=\"" + std::to_string(bottom) +
         "\"/><text class=\"markerlabel\" x=\"" + Num("%.1f", x + 3) + "\" y=\"" +
         std::to_string(T - 5) + "\">attempt " + std::to_string(rs.attempt) + " resumes</text>";
  }
  return h;
}

// The heat map's colour scale.
constexpr const char* kHeatScale =
    "</svg><svg id=\"heatscale\" width=\"420\" height=\"34\"><defs><linearGradient "
    "id=\"heat\"><stop offset=\"0\" stop-color=\"#fff\"/><stop offset=\"1\" "
    "stop-color=\"#f00\"/></linearGradient></defs><rect x=\"60\" y=\"4\" width=\"200\" "
    "height=\"12\" fill=\"url(#heat)\" stroke=\"#999\"/><text class=\"tick\" x=\"0\" "
    "y=\"14\">vs peers</text><text class=\"tick\" x=\"60\" y=\"30\">1.0x</text><text "
    "class=\"tick\" x=\"150\" y=\"30\">1.5x</text><text class=\"tick\" x=\"240\" "
    "y=\"30\">2.0x+</text><rect class=\"slow\" x=\"290\" y=\"4\" width=\"12\" height=\"12\" "
    "fill=\"#fcc\"/><text class=\"tick\" x=\"308\" y=\"14\">1.2x or slower</text></svg>";

std::string HeatMap(const RunReport& r, analyzer::NodeScan* db, const Places& places,
                    const std::vector<Restart>& restarts, const HtmlReportOptions& o) {
  std::string h = "<h2>Compute time per rank and step, against its peers at the same (pp, tp)</h2>";
  if (db == nullptr) return h + "<p>No trace database.</p>";
  HeatData d = ReadHeat(db, places);
  std::vector<int64_t> steps;
  for (const auto& [s, per] : d.compute) steps.push_back(s);
  if (steps.size() > static_cast<size_t>(o.max_steps))
    steps.erase(steps.begin(), steps.end() - o.max_steps);
  if (steps.empty()) return h + "<p>No step was traced.</p>";
  std::vector<int> ranks;
  for (const auto& [rank, m] : d.meta) ranks.push_back(rank);
  std::sort(ranks.begin(), ranks.end(), [&](int a, int b) {
    const RankPlace &x = d.meta[a], &y = d.meta[b];
    return std::tie(x.pp, x.tp, x.dp) < std::tie(y.pp, y.tp, y.dp);
  });
  // A row per rank and node it ran on: a rank a restart moved to a spare has a row there too.
  std::vector<std::pair<int, std::string>> rows;
  for (int rank : ranks) {
    for (const std::string& node : d.nodes_of[rank]) rows.emplace_back(rank, node);
  }
  const auto suspect = Suspects(r);
  const int cw = std::max(3, std::min(16, 880 / static_cast<int>(steps.size())));
  const int ch = 16, L = 200, T = 16;
  const int W = L + cw * static_cast<int>(steps.size()) + 20;
  const int H = T + ch * static_cast<int>(rows.size()) + 40;
  h += "<p class=\"note\">Each cell: the rank's compute in the step (its kept run) over the median "
       "of its peers at the same (pp, tp). A rank moved by a restart has a row per node it ran "
       "on. Rows in red: the rank or machine named by a verdict the controller acted on.</p><svg "
       "id=\"heatmap\" "
       "width=\"" +
       std::to_string(W) + "\" height=\"" + std::to_string(H) + "\">";
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& [rank, node] = rows[i];
    const RankPlace& m = d.meta[rank];
    const int y = T + ch * static_cast<int>(i);
    h += "<text x=\"0\" y=\"" + std::to_string(y + 12) + "\" class=\"tick" +
         (suspect(rank, node) ? " row-suspect" : "") + "\">rank " + std::to_string(rank) + " dp" +
         std::to_string(m.dp) + " pp" + std::to_string(m.pp) + " tp" + std::to_string(m.tp) + " " +
         Esc(node) + "</text>";
    for (size_t k = 0; k < steps.size(); ++k) {
      const auto& per = d.compute[steps[k]];
      auto it = per.find(rank);
      if (it == per.end() || it->second.node != node) continue;
      const double ratio = PeerRatio(d, steps[k], rank);
      const int g = static_cast<int>(255 * (1 - std::clamp(ratio - 1, 0.0, 1.0)));
      h += "<rect class=\"cell" + std::string(ratio >= 1.2 ? " slow" : "") + "\" data-rank=\"" +
           std::to_string(rank) + "\" data-step=\"" + std::to_string(steps[k]) + "\" x=\"" +
           std::to_string(L + cw * static_cast<int>(k)) + "\" y=\"" + std::to_string(y) +
           "\" width=\"" + std::to_string(cw) + "\" height=\"" + std::to_string(ch - 1) +
           "\" fill=\"rgb(255," + std::to_string(g) + "," + std::to_string(g) + ")\"><title>rank " +
           std::to_string(rank) + " on " + Esc(node) + "\nstep " + std::to_string(steps[k]) +
           ": compute " + Num("%.4f s", it->second.s) + ", " + Num("%.2fx", ratio) +
           " its peers</title></rect>";
    }
  }
  h += HeatAxis(steps, restarts, L, T + ch * static_cast<int>(rows.size()), T, cw);
  return h + kHeatScale;
}

// The loss of every step, a line per attempt, the restarts marked.
std::string LossPlot(const RunReport& r, const std::vector<Restart>& restarts) {
  std::map<int, std::vector<std::pair<double, double>>> by_attempt;
  launch::ProgressReader progress(RunLayout(r.run_dir).progress());
  for (const auto& line : progress.Poll()) {
    if (line.contains("event") || !line.contains("loss")) continue;
    by_attempt[line.value("attempt", 0)].emplace_back(line.value("step", 0.0),
                                                      line.value("loss", 0.0));
  }
  std::string h = "<h2>Loss across restarts</h2>";
  if (by_attempt.empty()) return h + "<p>No step finished.</p>";
  svg::Plot p;
  p.id = "loss";
  p.width = 760;
  p.height = 230;
  p.x_label = "step";
  p.y_label = "loss (cross-entropy)";
  for (const auto& [attempt, pts] : by_attempt) {
    const auto& pal = svg::Palette();
    p.series.push_back({"attempt " + std::to_string(attempt), pts,
                        pal[static_cast<size_t>(attempt) % pal.size()], 1.6, true});
  }
  for (const Restart& rs : restarts)
    p.markers.push_back(
        {static_cast<double>(rs.resume_step) + 0.5, "attempt " + std::to_string(rs.attempt)});
  return h + svg::LinePlot(p) +
         "<p class=\"note\">A line per attempt; a dashed line where an attempt resumed (the steps "
         "after it were run again or for the first time by the new attempt).</p>";
}

}  // namespace
}  // namespace html

Result<std::string> BuildHtmlReport(const std::string& run_dir, const HtmlReportOptions& o) {
  ASSIGN_OR_RETURN(RunReport r, ReadRunReport(run_dir));
  // The nodes' databases one at a time, never a copy of the run (1,536 nodes' worth).
  analyzer::NodeScan scan(run_dir);
  Status traces = Status::Ok();
  const html::Places places = html::ReadPlaces(&scan, &traces);
  analyzer::NodeScan* db = traces.ok() ? &scan : nullptr;
  const std::vector<html::Restart> restarts = html::Restarts(r);
  std::string page =
      "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" "
      "content=\"width=device-width\"><title>megascope incident report: " +
      svg::Esc(run_dir) + "</title><style>" + html::kStyle + "</style></head><body>";
  page += html::Summary(r, restarts, o.link_base);
  page += html::Incidents(r);
  page += html::Evidence(r, db, places, o);
  page += html::EventsChart(r, restarts);
  page += html::HeatMap(r, db, places, restarts, o);
  if (!traces.ok())
    page += "<p class=\"note\">Trace database: " + svg::Esc(traces.message()) + "</p>";
  page += html::LossPlot(r, restarts);
  return page + "</body></html>\n";
}

}  // namespace megascope::controller
