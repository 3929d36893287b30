#include "megascope/detector/prometheus_text.h"

#include <charconv>
#include <cmath>
#include <map>

namespace megascope::detector {
namespace {

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// Finds label `key` in a `{a="x",b="y"}` block; values may hold escaped quotes.
Result<std::string> LabelValue(std::string_view labels, std::string_view key) {
  size_t i = 0;
  while (i < labels.size()) {
    size_t eq = labels.find('=', i);
    if (eq == std::string_view::npos) break;
    std::string_view name = labels.substr(i, eq - i);
    while (!name.empty() && (name.front() == ',' || name.front() == ' ')) name.remove_prefix(1);
    if (eq + 1 >= labels.size() || labels[eq + 1] != '"')
      return InvalidArgument("label value not quoted");
    std::string value;
    size_t j = eq + 2;
    for (; j < labels.size() && labels[j] != '"'; ++j) {
      if (labels[j] == '\\' && j + 1 < labels.size()) ++j;
      value += labels[j];
    }
    if (j >= labels.size()) return InvalidArgument("unterminated label value");
    if (name == key) return value;
    i = j + 1;
  }
  return std::string();
}

}  // namespace

Result<std::vector<Sample>> ParsePrometheusText(std::string_view text, double time_s) {
  std::map<std::pair<std::string, std::string>, std::pair<double, int>>
      acc;  // (node, metric) -> sum, n
  int line_no = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.remove_suffix(1);
    if (line.empty() || line.front() == '#') continue;
    const auto where = "line " + std::to_string(line_no);
    size_t brace = line.find('{');
    size_t name_end = brace == std::string_view::npos ? line.find(' ') : brace;
    if (name_end == std::string_view::npos) return InvalidArgument(where + ": no value");
    std::string_view name = line.substr(0, name_end);
    std::string_view labels, rest;
    if (brace != std::string_view::npos) {
      size_t close = line.rfind('}');
      if (close == std::string_view::npos || close < brace)
        return InvalidArgument(where + ": unterminated labels");
      labels = line.substr(brace + 1, close - brace - 1);
      rest = line.substr(close + 1);
    } else {
      rest = line.substr(name_end);
    }
    while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
    rest = rest.substr(0, rest.find(' '));  // drop an optional timestamp
    double value = 0;
    if (rest == "NaN" || rest == "+Inf" || rest == "-Inf") continue;
    auto [p, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), value);
    if (ec != std::errc() || p != rest.data() + rest.size()) {
      return InvalidArgument(where + ": value '" + std::string(rest) + "' is not a number");
    }
    if (EndsWith(name, "_bucket") || EndsWith(name, "_sum") || EndsWith(name, "_count")) continue;
    auto node = LabelValue(labels, "node");
    if (!node.ok()) return InvalidArgument(where + ": " + node.status().message());
    if (node->empty()) continue;
    std::string metric(name);
    if (metric.rfind("megascope_", 0) == 0) metric.erase(0, 10);
    auto& [sum, count] = acc[{*node, metric}];
    sum += value;
    ++count;
  }
  std::vector<Sample> out;
  for (const auto& [key, sc] : acc)
    out.push_back({time_s, key.first, key.second, sc.first / sc.second});
  return out;
}

}  // namespace megascope::detector
