#include "megascope/detector/evaluate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>

#include "megascope/tracer/format.h"

namespace megascope::detector {
namespace {

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  double pos = q * static_cast<double>(v.size() - 1);
  size_t lo = static_cast<size_t>(std::floor(pos)), hi = static_cast<size_t>(std::ceil(pos));
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

}  // namespace

std::string FormatCalibration(const std::vector<std::pair<double, bool>>& scored) {
  static constexpr double kEdges[] = {0, 0.6, 0.75, 0.9, 1.01};
  std::string out = "calibration (faulty verdicts by confidence):\n";
  std::string buf;
  for (size_t b = 0; b + 1 < std::size(kEdges); ++b) {
    int n = 0, good = 0;
    for (const auto& [c, ok] : scored) {
      if (c >= kEdges[b] && c < kEdges[b + 1]) {
        ++n;
        good += ok ? 1 : 0;
      }
    }
    buf = tracer::Format("  confidence [%.2f, %.2f)  %4d verdicts  %4d true  %s\n", kEdges[b],
                         std::min(1.0, kEdges[b + 1]), n, good,
                         n == 0 ? "-" : (std::to_string(100 * good / n) + " % true").c_str());
    out += buf;
  }
  return out;
}

double Score::precision() const {
  int n = true_positives + false_positives;
  return n == 0 ? 1.0 : static_cast<double>(true_positives) / n;
}
double Score::recall() const { return faults == 0 ? 1.0 : static_cast<double>(detected) / faults; }
double Score::f1() const {
  double p = precision(), r = recall();
  return p + r == 0 ? 0 : 2 * p * r / (p + r);
}
double Score::median_delay_s() const { return Quantile(delays_s, 0.5); }
double Score::p90_delay_s() const { return Quantile(delays_s, 0.9); }

Evaluation Evaluate(const std::vector<Verdict>& verdicts, const std::vector<Label>& labels) {
  Evaluation e;
  std::vector<bool> detected(labels.size(), false);
  e.total.faults = static_cast<int>(labels.size());
  for (const Label& l : labels) ++e.by_type[l.fault_type].faults;
  std::vector<const Verdict*> ordered;
  ordered.reserve(verdicts.size());
  for (const Verdict& v : verdicts) ordered.push_back(&v);
  std::stable_sort(ordered.begin(), ordered.end(), [](const Verdict* a, const Verdict* b) {
    return a->detected_at_ns < b->detected_at_ns;
  });
  for (const Verdict* v : ordered) {
    if (v->kind != VerdictKind::kFaultyMachine) {
      ++e.alerts;
      continue;
    }
    const double t = static_cast<double>(v->detected_at_ns) / 1e9;
    const std::string machine = v->root_nodes.empty() ? "" : v->root_nodes.front();
    int match = -1;
    for (size_t i = 0; i < labels.size(); ++i) {
      if (labels[i].machine == machine && t >= labels[i].fault_start_s &&
          t <= labels[i].fault_end_s) {
        match = static_cast<int>(i);
        if (!detected[i]) break;  // prefer an undetected fault
      }
    }
    if (v->level == VerdictLevel::kSuspect) {
      ++(match < 0 ? e.suspects_false : e.suspects_true);
      continue;
    }
    if (match < 0 || !detected[match]) e.calibration.emplace_back(v->confidence, match >= 0);
    if (match < 0) {
      ++e.total.false_positives;
    } else if (detected[match]) {
      ++e.total.duplicates;
    } else {
      detected[match] = true;
      const double delay = t - labels[match].fault_start_s;
      for (Score* s : {&e.total, &e.by_type[labels[match].fault_type]}) {
        ++s->true_positives;
        ++s->detected;
        s->delays_s.push_back(delay);
      }
    }
  }
  return e;
}

std::string FormatEvaluation(const Evaluation& e) {
  std::string buf;
  const Score& s = e.total;
  std::string out;
  buf = tracer::Format(
      "precision %.3f  recall %.3f  F1 %.3f  (%d true, %d false positives, %d "
      "duplicates; %d/%d faults)\n"
      "delay: median %.1f s, p90 %.1f s\n",
      s.precision(), s.recall(), s.f1(), s.true_positives, s.false_positives, s.duplicates,
      s.detected, s.faults, s.median_delay_s(), s.p90_delay_s());
  out += buf;
  buf = tracer::Format(
      "not counted: %d suspects (%d on a labelled fault, %d not), %d alerts naming no "
      "machine (monitoring gaps, shared components)\n",
      e.suspects_true + e.suspects_false, e.suspects_true, e.suspects_false, e.alerts);
  out += buf;
  out += FormatCalibration(e.calibration);
  out += "by fault type:\n";
  for (const auto& [type, t] : e.by_type) {
    buf = tracer::Format(
        "  %-18s detected %3d/%-3d  recall %.3f  median delay %6.1f s  p90 %6.1f s\n", type.c_str(),
        t.detected, t.faults, t.recall(), t.median_delay_s(), t.p90_delay_s());
    out += buf;
  }
  return out;
}

std::string EvaluationToJson(const Evaluation& e) {
  auto num = [](double x) { return std::isfinite(x) ? std::to_string(x) : std::string("null"); };
  const Score& s = e.total;
  std::string j =
      "{\"format\":\"megascope-detector-score\",\"version\":1,\"precision\":" + num(s.precision()) +
      ",\"recall\":" + num(s.recall()) + ",\"f1\":" + num(s.f1()) +
      ",\"true_positives\":" + std::to_string(s.true_positives) +
      ",\"false_positives\":" + std::to_string(s.false_positives) +
      ",\"faults\":" + std::to_string(s.faults) + ",\"median_delay_s\":" + num(s.median_delay_s()) +
      ",\"p90_delay_s\":" + num(s.p90_delay_s()) + ",\"by_type\":{";
  bool first = true;
  for (const auto& [type, t] : e.by_type) {
    j += (first ? "\"" : ",\"") + type + "\":{\"faults\":" + std::to_string(t.faults) +
         ",\"detected\":" + std::to_string(t.detected) +
         ",\"median_delay_s\":" + num(t.median_delay_s()) + "}";
    first = false;
  }
  return j + "}}";
}

}  // namespace megascope::detector
