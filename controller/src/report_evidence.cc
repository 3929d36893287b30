// The HTML report's evidence: a card per verdict with the figure its kind calls for -- a hang's
// wait-for graph and the ranks' stacks (re-derived from the dumps its incident kept, with the
// thresholds it was decided with), a straggler's compute (or its peers' waits) per step against
// its peers over the steps that decided it, a faulty machine's metrics against its peers'.
#include <algorithm>
#include <filesystem>
#include <regex>
#include <set>

#include "megascope/analyzer/hang.h"
#include "megascope/analyzer/stacks.h"
#include "megascope/tracer/metric_names.h"
#include "megascope/tracer/run_layout.h"
#include "report_html.h"
#include "svg.h"

namespace megascope::controller::html {
namespace {

using nlohmann::json;
using svg::Esc;
using svg::Num;

// A fact as an SRE reads it: where it names the agent URL a dump was fetched from, the dump the
// incident kept instead, linked.
std::string Fact(const std::string& fact, const std::string& run_dir, int attempt,
                 const std::string& link_base) {
  static const std::regex kFetched("^rank (\\d+) (.*) from https?://\\S+ dump \\d+$");
  std::smatch m;
  if (!std::regex_match(fact, m, kFetched)) return Esc(fact);
  const std::string rel =
      "dumps/attempt_" + std::to_string(attempt) + "/rank_" + m[1].str() + ".json";
  std::string out = Esc("rank " + m[1].str() + " " + m[2].str());
  if (std::filesystem::exists(run_dir + "/" + rel))
    return out + ": its flight recorder, <a href=\"" + Esc(link_base + rel) + "\">" + Esc(rel) +
           "</a>";
  return out + ": its flight recorder, read from its node's agent (not kept)";
}

// Ranks as boxes in columns by how far each is from the end of the chain (the roots rightmost),
// an arrow from each waiting rank to the rank it waits for.
std::string WaitForGraph(const std::vector<analyzer::WaitEdge>& all, const std::set<int>& roots,
                         const analyzer::HangInput& in) {
  constexpr size_t kMaxRanks = 24;
  std::set<int> kept(roots.begin(), roots.end());
  for (const auto& e : all) {
    if (kept.size() >= kMaxRanks) break;
    if (roots.count(e.to) || kept.count(e.to)) kept.insert(e.from);
  }
  for (const auto& e : all) {
    if (kept.size() >= kMaxRanks) break;
    kept.insert(e.from), kept.insert(e.to);
  }
  std::vector<analyzer::WaitEdge> edges;
  for (const auto& e : all) {
    if (kept.count(e.from) && kept.count(e.to)) edges.push_back(e);
  }
  // Level: the longest chain of waits from the rank to one that waits on nobody (capped: a cycle).
  std::map<int, int> level;
  for (int r : kept) level[r] = 0;
  for (size_t pass = 0; pass < kept.size(); ++pass) {
    for (const auto& e : edges) level[e.from] = std::max(level[e.from], level[e.to] + 1);
  }
  int top = 0;
  for (auto& [r, l] : level) top = std::max(top, l = std::min(l, static_cast<int>(kept.size())));
  std::map<int, std::vector<int>> columns;  // column (0 leftmost) -> ranks
  for (const auto& [r, l] : level) columns[top - l].push_back(r);
  size_t rows = 0;
  for (const auto& [c, rs] : columns) rows = std::max(rows, rs.size());
  const int bw = 190, bh = 36, gx = 90, gy = 12;
  std::map<int, std::pair<int, int>> at;  // rank -> box's top left
  for (const auto& [c, rs] : columns) {
    for (size_t i = 0; i < rs.size(); ++i)
      at[rs[i]] = {10 + c * (bw + gx), 10 + static_cast<int>(i) * (bh + gy)};
  }
  const int W = 20 + static_cast<int>(columns.size()) * (bw + gx) - gx;
  const int H = 20 + static_cast<int>(rows) * (bh + gy);
  std::string h =
      "<svg class=\"waitfor\" width=\"" + std::to_string(W) + "\" height=\"" + std::to_string(H) +
      "\"><defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"10\" refY=\"5\" "
      "markerWidth=\"7\" markerHeight=\"7\" orient=\"auto\"><path d=\"M0,0L10,5L0,10z\" "
      "fill=\"#777\"/></marker></defs>";
  for (const auto& e : edges) {
    const auto [x1, y1] = at[e.from];
    const auto [x2, y2] = at[e.to];
    const bool forward = x2 > x1;
    const double sx = forward ? x1 + bw : x1 + bw / 2.0, sy = forward ? y1 + bh / 2.0 : y1 + bh;
    const double tx = forward ? x2 : x2 + bw / 2.0, ty = forward ? y2 + bh / 2.0 : y2;
    h += "<path class=\"gedge\" marker-end=\"url(#arrow)\" d=\"M" + Num("%.1f", sx) + "," +
         Num("%.1f", sy) + " C" + Num("%.1f", sx + 40) + "," + Num("%.1f", sy) + " " +
         Num("%.1f", tx - 40) + "," + Num("%.1f", ty) + " " + Num("%.1f", tx) + "," +
         Num("%.1f", ty) + "\"><title>rank " + std::to_string(e.from) + " waits in " + Esc(e.what) +
         " for rank " + std::to_string(e.to) + Num(" (%.1f s)", e.seconds) + "</title></path>";
    if (edges.size() <= 12)
      h += "<text class=\"glabel\" x=\"" + Num("%.1f", sx + 4) + "\" y=\"" + Num("%.1f", sy - 4) +
           "\">" + Esc(e.what) + Num(", %.1f s", e.seconds) + "</text>";
  }
  for (const auto& [r, xy] : at) {
    const auto [x, y] = xy;
    std::string where = "no dump";
    if (r >= 0 && r < static_cast<int>(in.ranks.size()) && in.ranks[r].present) {
      const auto& info = in.ranks[r].dump.snapshot.info;
      where = info.node + " dp" + std::to_string(info.coords.dp) + " pp" +
              std::to_string(info.coords.pp) + " tp" + std::to_string(info.coords.tp) +
              (in.ranks[r].dump.alive ? "" : " (gone)");
    }
    h += "<g class=\"gnode" + std::string(roots.count(r) ? " root" : "") + "\"><rect x=\"" +
         std::to_string(x) + "\" y=\"" + std::to_string(y) + "\" width=\"" + std::to_string(bw) +
         "\" height=\"" + std::to_string(bh) + "\"/><text x=\"" + std::to_string(x + 8) +
         "\" y=\"" + std::to_string(y + 15) + "\"><tspan font-weight=\"bold\">rank " +
         std::to_string(r) + "</tspan>" + (roots.count(r) ? " (root)" : "") + "</text><text x=\"" +
         std::to_string(x + 8) + "\" y=\"" + std::to_string(y + 29) + "\">" + Esc(where) +
         "</text></g>";
  }
  h += "</svg>";
  if (edges.size() < all.size())
    h += "<p class=\"note\">" + std::to_string(all.size() - edges.size()) + " of " +
         std::to_string(all.size()) + " waits are not drawn (at most " + std::to_string(kMaxRanks) +
         " ranks are).</p>";
  return h;
}

// The distinct stacks of the ranks' main threads, the roots' first.
std::string StackTable(std::vector<analyzer::StackGroup> groups, const std::set<int>& roots) {
  if (groups.empty()) return "<p class=\"note\">The dumps carry no stacks.</p>";
  auto has_root = [&](const analyzer::StackGroup& g) {
    return std::any_of(g.ranks.begin(), g.ranks.end(), [&](int r) { return roots.count(r) > 0; });
  };
  std::stable_partition(groups.begin(), groups.end(), has_root);
  std::string h = "<h4>Where each rank's main thread was when it dumped</h4>";
  size_t shown = 0;
  for (const analyzer::StackGroup& g : groups) {
    if (++shown > 4) break;
    std::string who;
    for (int r : g.ranks) who += (who.empty() ? "" : ", ") + std::to_string(r);
    h += "<p class=\"note\"><b>" + std::string(has_root(g) ? "the root's: " : "") + "rank" +
         (g.ranks.size() > 1 ? "s " : " ") + who + "</b></p><pre class=\"stack\">";
    for (size_t i = 0; i < g.stack.frames.size() && i < 12; ++i)
      h += "#" + std::to_string(i) + " " + Esc(g.stack.frames[i]) + "\n";
    if (g.stack.frames.size() > 12)
      h += "... " + std::to_string(g.stack.frames.size() - 12) + " more frames\n";
    if (g.stack.frames.empty()) h += "(the thread did not answer)\n";
    h += "</pre>";
  }
  if (groups.size() > 4)
    h += "<p class=\"note\">" + std::to_string(groups.size() - 4) + " more distinct stacks.</p>";
  return h;
}

// A hang: the wait-for graph and stacks re-derived from the dumps its incident kept.
std::string HangFigure(const RunReport& r, const Event& v) {
  const std::string dir = RunLayout(r.run_dir).dumps(v.attempt);
  if (!std::filesystem::exists(dir))
    return "<p class=\"note\">No dumps were kept for attempt " + std::to_string(v.attempt) +
           ".</p>";
  auto in = analyzer::LoadDumpDirectory(dir);
  if (!in.ok()) return "<p class=\"note\">" + Esc(in.status().message()) + "</p>";
  analyzer::HangOptions options;
  auto incident = analyzer::ReadIncidentThresholds(dir);
  if (incident.ok() && incident->has_value()) options = (*incident)->options;
  std::vector<analyzer::WaitEdge> edges;
  const std::vector<Verdict> again = analyzer::AnalyzeHang(*in, options, &edges);
  std::set<int> roots;
  for (const auto& x : v.detail.value("root_ranks", json::array())) roots.insert(x.get<int>());
  std::string h = "<h4>Wait-for graph</h4><p class=\"note\">From the " +
                  std::to_string(in->ranks.size()) + " dumps in " + Esc(dir) +
                  Num(", a wait counted from %.1f s", options.min_wait_s) +
                  ": an arrow from each waiting rank to the rank it waits for.</p>";
  if (edges.empty() && roots.empty()) h += "<p class=\"note\">No rank waits on another.</p>";
  if (!edges.empty() || !roots.empty()) h += WaitForGraph(edges, roots, *in);
  std::set<int> named;
  for (const Verdict& x : again) named.insert(x.root_ranks.begin(), x.root_ranks.end());
  if (!roots.empty() && named != roots)
    h += "<p class=\"note\">Re-analysed from the kept dumps, the roots differ (the live verdict "
         "read the agents' newer state).</p>";
  return h + StackTable(analyzer::GroupByStack(*in), roots);
}

// A straggler: its compute per step (or, for a slow link, its peers' waits in collectives)
// against its peers at the same (pp, tp), over the steps that decided it.
std::string SlowFigure(const Event& v, analyzer::NodeScan* db, const Places& places) {
  const json th = v.detail.value("thresholds", json::object());
  if (db == nullptr || !th.contains("first_step") || v.rank < 0)
    return "<p class=\"note\">No window recorded for this verdict.</p>";
  auto step = [&](const char* key) { return static_cast<int64_t>(th.value(key, 0.0)); };
  const int64_t attempt = step("attempt"), first = step("first_step"), last = step("last_step");
  auto self = places.find({attempt, v.rank});
  if (self == places.end()) return "";
  const bool comm = ParseCause(v.detail.value("cause", "")) == Cause::kCommStraggler;
  std::map<int, std::vector<std::pair<double, double>>> per_rank;
  (void)db->Scan(analyzer::PerRankStepCte() +
                     "\nSELECT rank, step, compute, comm FROM per_rank WHERE attempt = " +
                     std::to_string(attempt) + " AND step BETWEEN " +
                     std::to_string(std::max<int64_t>(0, first - 8)) + " AND " +
                     std::to_string(last) + " ORDER BY step",
                 [&](const analyzer::RunDatabase::Row& row) {
                   const int rank = static_cast<int>(row.Int(0));
                   auto it = places.find({attempt, rank});
                   if (it == places.end() || it->second.pp != self->second.pp ||
                       it->second.tp != self->second.tp)
                     return;
                   per_rank[rank].emplace_back(static_cast<double>(row.Int(1)),
                                               row.Double(comm ? 3 : 2) / 1e9);
                 });
  svg::Plot p;
  p.width = 900;
  p.height = 220;
  p.x_label = "step (attempt " + std::to_string(attempt) + ")";
  p.y_label = comm ? "wait in collectives (s)" : "compute (s)";
  p.y_from_zero = true;
  size_t i = 0;
  for (const auto& [rank, pts] : per_rank) {
    if (rank == v.rank) continue;
    const auto& pal = svg::Palette();
    p.series.push_back(
        {"rank " + std::to_string(rank) + " (" + places.at({attempt, rank}).node + ")", pts,
         pal[i++ % pal.size()], 1.1, true});
  }
  if (per_rank.count(v.rank))
    p.series.push_back(
        {"rank " + std::to_string(v.rank) + " (" + self->second.node + "), the one named",
         per_rank[v.rank], svg::kRed, 2.4, true});
  p.markers = {{static_cast<double>(first), "window"}, {static_cast<double>(last), "verdict"}};
  return "<h4>" +
         std::string(comm ? "Its peers' wait in collectives per step"
                          : "Its compute per step against its peers") +
         " at pp " + std::to_string(self->second.pp) + ", tp " + std::to_string(self->second.tp) +
         "</h4>" + svg::LinePlot(p);
}

// A faulty machine: each metric its evidence names, around the verdict, the named node in red.
std::string MachineFigure(const Event& v, analyzer::NodeScan* db) {
  if (db == nullptr) return "";
  const int64_t det = v.detail.value("detected_at_ns", v.ts_ns);
  std::string h;
  int plotted = 0;
  for (const auto& ev : v.detail.value("evidence", json::array())) {
    if (!ev.is_string() || plotted >= 3) continue;
    const std::string text = ev.get<std::string>();
    const tracer::metrics::Def* def = tracer::metrics::Find(text.substr(0, text.find(' ')));
    if (def == nullptr) continue;
    ++plotted;
    std::map<std::string, std::vector<std::pair<double, double>>> series;
    std::map<std::string, std::pair<double, double>> last;
    (void)db->Scan(
        "SELECT node, ts_ns, value FROM metrics WHERE name = '" + std::string(def->name) +
            "' AND ts_ns BETWEEN " + std::to_string(det - 120'000'000'000) + " AND " +
            std::to_string(det + 30'000'000'000) + " ORDER BY ts_ns",
        [&](const analyzer::RunDatabase::Row& row) {
          const std::string node(row.Text(0));
          const double t = static_cast<double>(row.Int(1) - det) / 1e9, value = row.Double(2);
          if (def->type == tracer::metrics::Type::kCounter) {  // as the detector saw it: a rate
            auto [it, first] = last.try_emplace(node, t, value);
            const auto [pt, pv] = it->second;
            it->second = {t, value};
            if (!first && t > pt && value >= pv)
              series[node].emplace_back(t, (value - pv) / (t - pt));
          } else {
            series[node].emplace_back(t, value);
          }
        });
    svg::Plot p;
    p.width = 760;
    p.height = 190;
    p.x_label = "seconds from the verdict";
    p.y_label = def->type == tracer::metrics::Type::kCounter ? "per second" : "value";
    for (auto& [node, pts] : series) {
      if (node != v.node) p.series.push_back({node, std::move(pts), svg::kGrey, 1.0, false});
    }
    if (series.count(v.node))
      p.series.push_back({v.node + " (named)", series[v.node], svg::kRed, 2.2, true});
    if (!p.series.empty() && p.series.front().colour == svg::kGrey)
      p.series.front().in_legend = true, p.series.front().name = "its peers (one line each)";
    p.markers = {{0, "verdict"}};
    h += "<h4>" + Esc(tracer::metrics::ExportName(def->name)) + " &middot; " +
         Esc(std::string(def->help)) + "</h4>" + svg::LinePlot(p);
  }
  return h;
}

std::string Card(const RunReport& r, const Event& v, analyzer::NodeScan* db, const Places& places,
                 const HtmlReportOptions& o) {
  const json& d = v.detail;
  const std::string kind = d.value("kind", "");
  std::string named = v.node.empty() ? "" : v.node;
  if (v.rank >= 0) named += (named.empty() ? "rank " : " (rank ") + std::to_string(v.rank) + ")";
  const int64_t t0 = r.events.empty() ? 0 : r.events.front().ts_ns;
  std::string h = "<div class=\"verdict " + Esc(kind) + "\"><h3>" + Esc(kind) + ": " +
                  Esc(d.value("cause", "")) + (named.empty() ? "" : " &mdash; " + Esc(named)) +
                  "</h3><p class=\"note\">attempt " + std::to_string(v.attempt) + " &middot; " +
                  Num("+%.2f s into the run", static_cast<double>(v.ts_ns - t0) / 1e9) +
                  " &middot; confidence " + Num("%.2f", d.value("confidence", 0.0)) + "</p><p>" +
                  Esc(d.value("explanation", "")) + "</p><ul class=\"facts\">";
  for (const auto& f : d.value("evidence", json::array())) {
    const std::string fact = f.is_string() ? f.get<std::string>() : f.dump();
    if (fact.rfind("thresholds: ", 0) == 0) continue;  // in the table below
    h += "<li>" + Fact(fact, r.run_dir, v.attempt, o.link_base) + "</li>";
  }
  h += "</ul>";
  const json th = d.value("thresholds", json::object());
  if (!th.empty()) {
    h += "<table class=\"thresholds\"><tr>";
    for (const auto& [k, val] : th.items()) h += "<th class=\"num\">" + Esc(k) + "</th>";
    h += "</tr><tr>";
    for (const auto& [k, val] : th.items())
      h += "<td class=\"num\">" + Num("%g", val.is_number() ? val.get<double>() : 0) + "</td>";
    h += "</tr></table>";
  }
  const VerdictKind k = ParseVerdictKind(kind);
  if (k == VerdictKind::kHang) h += HangFigure(r, v);
  if (k == VerdictKind::kSlow) h += SlowFigure(v, db, places);
  if (k == VerdictKind::kFaultyMachine) h += MachineFigure(v, db);
  return h + "</div>";
}

}  // namespace

std::set<int64_t> ActedOn(const RunReport& r) {
  std::set<int64_t> out = ActedOnVerdicts(r.events);
  bool after_trigger = false;
  for (const Event& e : r.events) {
    const std::optional<EventKind> k = ParseEventKind(e.kind_name);
    if (k == EventKind::kTrigger) after_trigger = true;
    if (k == EventKind::kVerdict && after_trigger) {
      out.insert(VerdictId(e.detail));
      after_trigger = false;
    }
  }
  return out;
}

std::string Evidence(const RunReport& r, analyzer::NodeScan* db, const Places& places,
                     const HtmlReportOptions& o) {
  const std::set<int64_t> shown = ActedOn(r);
  std::string cards, rest;
  const int64_t t0 = r.events.empty() ? 0 : r.events.front().ts_ns;
  int others = 0;
  for (const Event& e : r.events) {
    if (e.kind_name != Name(EventKind::kVerdict)) continue;
    if (shown.count(VerdictId(e.detail))) {
      cards += Card(r, e, db, places, o);
      continue;
    }
    ++others;
    rest += "<tr><td class=\"num\">" + Num("+%.2f s", static_cast<double>(e.ts_ns - t0) / 1e9) +
            "</td><td>" + Esc(e.detail.value("kind", "") + " " + e.detail.value("cause", "")) +
            "</td><td>" + Esc(e.node) + "</td><td>" + Esc(e.detail.value("explanation", "")) +
            "</td></tr>";
  }
  std::string h = "<h2>Evidence of each verdict</h2>";
  if (cards.empty() && others == 0) return h + "<p>No verdict.</p>";
  h += cards;
  if (others > 0)
    h += "<h3>Verdicts nothing acted on (" + std::to_string(others) +
         ")</h3><table id=\"other-verdicts\"><tr><th class=\"num\">at</th><th>verdict</th>"
         "<th>node</th><th>explanation</th></tr>" +
         rest + "</table>";
  return h;
}

}  // namespace megascope::controller::html
