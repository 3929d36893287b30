// Inline SVG for the HTML report: escaping, tick marks and the line plot every figure of the page
// is drawn with (ticked axes with units, a legend, markers such as restarts, a readable tooltip on
// each point). No script: the page prints as it shows.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace megascope::controller::svg {

// `s` safe inside HTML text and attribute values.
std::string Esc(const std::string& s);
// printf of one number.
std::string Num(const char* fmt, double v);
// About `n` round tick positions covering [lo, hi]: steps of 1, 2 or 5 times a power of ten.
std::vector<double> Ticks(double lo, double hi, int n);
// A tick's label: no more digits than the step between ticks needs.
std::string TickLabel(double v, double step);

// The series colours, in order; red is kept for what a verdict names.
const std::vector<std::string>& Palette();
inline constexpr const char* kRed = "#d62728";
inline constexpr const char* kGrey = "#9a9a9a";

struct Series {
  std::string name;  // the legend's and the tooltip's
  std::vector<std::pair<double, double>> points;
  std::string colour = kGrey;
  double width = 1.2;
  bool in_legend = true;
};
// A vertical line across the plot at `x`, labelled at its top (a restart, a verdict).
struct Marker {
  double x = 0;
  std::string label;
};
struct Plot {
  std::string id;  // the svg element's id ("" for none)
  int width = 700, height = 200;
  std::string x_label, y_label;  // with units: "step", "loss", "seconds from the verdict"
  std::vector<Series> series;    // drawn in order: the one to see last
  std::vector<Marker> markers;
  std::string x_unit_suffix;  // appended to tick labels ("" or " s")
  bool y_from_zero = false;
};
// The plot as an <svg> with its legend under it; a note when no series has a point.
std::string LinePlot(const Plot& p);

}  // namespace megascope::controller::svg
