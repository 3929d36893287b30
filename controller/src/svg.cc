#include "svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "megascope/tracer/format.h"

namespace megascope::controller::svg {

std::string Esc(const std::string& s) {
  std::string o;
  o.reserve(s.size());
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

std::string Num(const char* fmt, double v) { return tracer::Format(fmt, v); }

std::vector<double> Ticks(double lo, double hi, int n) {
  if (!(hi > lo) || n < 1) return {lo};
  const double raw = (hi - lo) / n;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * mag;
    if (step >= raw) break;
  }
  std::vector<double> out;
  for (double t = std::ceil(lo / step - 1e-9) * step; t <= hi + step * 1e-9; t += step)
    out.push_back(std::abs(t) < step * 1e-9 ? 0.0 : t);
  return out;
}

std::string TickLabel(double v, double step) {
  const int digits = step >= 1 ? 0 : static_cast<int>(std::ceil(-std::log10(step) - 1e-9));
  std::string b;
  if (std::abs(v) >= 1e5 || (v != 0 && std::abs(v) < 1e-3)) {
    b = tracer::Format("%.3g", v);
  } else {
    b = tracer::Format("%.*f", std::min(digits, 6), v);
  }
  return b;
}

const std::vector<std::string>& Palette() {
  static const std::vector<std::string> k = {"#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd",
                                             "#8c564b", "#17becf", "#e377c2", "#7f7f7f"};
  return k;
}

std::string LinePlot(const Plot& p) {
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  for (const Series& s : p.series) {
    for (auto [x, y] : s.points) {
      x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
    }
  }
  if (x0 > x1) return "<p class=\"note\">No data to plot.</p>";
  for (const Marker& m : p.markers) x0 = std::min(x0, m.x), x1 = std::max(x1, m.x);
  if (p.y_from_zero) y0 = std::min(y0, 0.0);
  if (x1 <= x0) x1 = x0 + 1;
  if (y1 <= y0) y1 = y0 + (y0 == 0 ? 1 : std::abs(y0) * 0.1);
  const double pad = (y1 - y0) * 0.05;
  y1 += pad;
  if (!p.y_from_zero || y0 < 0) y0 -= pad;
  const int L = 62, R = 14, T = 18, B = 36;
  const double pw = p.width - L - R, ph = p.height - T - B;
  auto X = [&](double x) { return L + (x - x0) / (x1 - x0) * pw; };
  auto Y = [&](double y) { return T + (1 - (y - y0) / (y1 - y0)) * ph; };
  std::string o = "<svg" + (p.id.empty() ? "" : " id=\"" + p.id + "\"") +
                  " class=\"plot\" width=\"" + std::to_string(p.width) + "\" height=\"" +
                  std::to_string(p.height) + "\" viewBox=\"0 0 " + std::to_string(p.width) + " " +
                  std::to_string(p.height) + "\">";
  // Axes, grid and ticks.
  const std::vector<double> yt = Ticks(y0, y1, 4), xt = Ticks(x0, x1, 8);
  const double ys = yt.size() > 1 ? yt[1] - yt[0] : 1, xs = xt.size() > 1 ? xt[1] - xt[0] : 1;
  for (double t : yt) {
    o += "<line class=\"grid\" x1=\"" + Num("%.1f", L) + "\" x2=\"" + Num("%.1f", L + pw) +
         "\" y1=\"" + Num("%.1f", Y(t)) + "\" y2=\"" + Num("%.1f", Y(t)) +
         "\"/><text class=\"tick\"" + " text-anchor=\"end\" x=\"" + std::to_string(L - 4) +
         "\" y=\"" + Num("%.1f", Y(t) + 3) + "\">" + TickLabel(t, ys) + "</text>";
  }
  for (double t : xt) {
    o += "<line class=\"axisline\" x1=\"" + Num("%.1f", X(t)) + "\" x2=\"" + Num("%.1f", X(t)) +
         "\" y1=\"" + Num("%.1f", T + ph) + "\" y2=\"" + Num("%.1f", T + ph + 4) +
         "\"/><text class=\"tick\" text-anchor=\"middle\" x=\"" + Num("%.1f", X(t)) + "\" y=\"" +
         Num("%.1f", T + ph + 14) + "\">" + TickLabel(t, xs) + p.x_unit_suffix + "</text>";
  }
  o += "<line class=\"axisline\" x1=\"" + std::to_string(L) + "\" x2=\"" + Num("%.1f", L + pw) +
       "\" y1=\"" + Num("%.1f", T + ph) + "\" y2=\"" + Num("%.1f", T + ph) + "\"/>";
  o += "<line class=\"axisline\" x1=\"" + std::to_string(L) + "\" x2=\"" + std::to_string(L) +
       "\" y1=\"" + std::to_string(T) + "\" y2=\"" + Num("%.1f", T + ph) + "\"/>";
  o += "<text class=\"label\" text-anchor=\"middle\" x=\"" + Num("%.1f", L + pw / 2) + "\" y=\"" +
       std::to_string(p.height - 4) + "\">" + Esc(p.x_label) + "</text>";
  o += "<text class=\"label\" text-anchor=\"middle\" transform=\"translate(12," +
       Num("%.1f", T + ph / 2) + ") rotate(-90)\">" + Esc(p.y_label) + "</text>";
  for (const Marker& m : p.markers) {
    o += "<line class=\"marker\" x1=\"" + Num("%.1f", X(m.x)) + "\" x2=\"" + Num("%.1f", X(m.x)) +
         "\" y1=\"" + std::to_string(T) + "\" y2=\"" + Num("%.1f", T + ph) +
         "\"/><text class=\"markerlabel\"" +
         (X(m.x) > L + pw * 0.8 ? " text-anchor=\"end\" x=\"" + Num("%.1f", X(m.x) - 3)
                                : " x=\"" + Num("%.1f", X(m.x) + 3)) +
         "\" y=\"" + std::to_string(T - 5) + "\">" + Esc(m.label) + "</text>";
  }
  // The series; a point each carries a tooltip while there are few enough to hover.
  size_t total = 0;
  for (const Series& s : p.series) total += s.points.size();
  for (const Series& s : p.series) {
    std::string pts;
    for (auto [x, y] : s.points) pts += Num("%.1f", X(x)) + "," + Num("%.1f", Y(y)) + " ";
    o += "<polyline fill=\"none\" stroke=\"" + s.colour + "\" stroke-width=\"" +
         Num("%.1f", s.width) + "\" points=\"" + pts + "\"><title>" + Esc(s.name) +
         "</title></polyline>";
    if (total > 1500) continue;
    for (auto [x, y] : s.points) {
      o += "<circle class=\"pt\" cx=\"" + Num("%.1f", X(x)) + "\" cy=\"" + Num("%.1f", Y(y)) +
           "\" r=\"3\"><title>" + Esc(s.name) + "\n" + Esc(p.x_label) + ": " + Num("%.6g", x) +
           "\n" + Esc(p.y_label) + ": " + Num("%.6g", y) + "</title></circle>";
    }
  }
  o += "</svg>";
  std::string legend;
  for (const Series& s : p.series) {
    if (!s.in_legend) continue;
    legend += "<span class=\"key\"><i style=\"background:" + s.colour + "\"></i>" + Esc(s.name) +
              "</span>";
  }
  return "<figure>" + o + (legend.empty() ? "" : "<div class=\"legend\">" + legend + "</div>") +
         "</figure>";
}

}  // namespace megascope::controller::svg
