#include "megascope/detector/baselines.h"

#include <cmath>
#include <limits>

namespace megascope::detector {
namespace {

Verdict Alert(const Registry& reg, int machine, const Frame& f, const char* how) {
  Verdict v;
  v.kind = VerdictKind::kFaultyMachine;
  v.cause = how;
  v.root_nodes = {reg.machine_name(machine)};
  v.detected_at_ns = static_cast<int64_t>(f.end_s * 1e9);
  v.onset_at_ns = v.detected_at_ns;
  v.confidence = 0.5;
  return v;
}

bool CoolingDown(std::vector<int64_t>& last, int machine, int64_t tick, int cooldown) {
  if (static_cast<int>(last.size()) <= machine)
    last.resize(machine + 1, std::numeric_limits<int64_t>::min() / 2);
  if (tick - last[machine] < cooldown) return true;
  last[machine] = tick;
  return false;
}

// Wilson-Hilferty approximation of the chi-square quantile with k degrees of freedom.
double ChiSquareQuantile(int k, double p) {
  // Normal quantile by Acklam-free bisection on erfc: precise enough for a threshold.
  double lo = -10, hi = 10;
  for (int i = 0; i < 100; ++i) {
    double mid = (lo + hi) / 2;
    (0.5 * std::erfc(-mid / std::sqrt(2.0)) < p ? lo : hi) = mid;
  }
  const double z = lo, a = 2.0 / (9.0 * k);
  return k * std::pow(1 - a + z * std::sqrt(a), 3);
}

}  // namespace

void ZScoreBaseline::OnFrame(const Frame& f, const Registry& reg, std::vector<Verdict>* out) {
  std::vector<std::vector<std::pair<int, double>>> by_metric(reg.metrics());
  for (const Frame::Cell& c : f.cells) by_metric[c.metric].push_back({c.machine, c.value});
  std::vector<bool> flagged(reg.machines(), false);
  for (const auto& cells : by_metric) {
    if (cells.size() < 3) continue;
    double mean = 0, var = 0;
    for (const auto& [m, x] : cells) mean += x;
    mean /= static_cast<double>(cells.size());
    for (const auto& [m, x] : cells) var += (x - mean) * (x - mean);
    const double sd = std::sqrt(var / static_cast<double>(cells.size() - 1));
    if (sd <= 0) continue;
    for (const auto& [m, x] : cells) {
      if (std::fabs(x - mean) / sd > threshold_) flagged[m] = true;
    }
  }
  for (int m = 0; m < reg.machines(); ++m) {
    if (flagged[m] && !CoolingDown(last_alert_, m, f.tick, cooldown_))
      out->push_back(Alert(reg, m, f, "zscore"));
  }
}

void MahalanobisBaseline::OnFrame(const Frame& f, const Registry& reg, std::vector<Verdict>* out) {
  const int n = reg.machines(), k = reg.metrics();
  last_value_.resize(n);
  last_tick_.resize(n);
  for (int m = 0; m < n; ++m) {
    last_value_[m].resize(k, 0);
    last_tick_[m].resize(k, std::numeric_limits<int64_t>::min() / 2);
  }
  for (const Frame::Cell& c : f.cells) {
    last_value_[c.machine][c.metric] = c.value;
    last_tick_[c.machine][c.metric] = f.tick;
  }
  // Machines with a recent value of every metric; metrics standardised across them.
  std::vector<int> rows;
  for (int m = 0; m < n; ++m) {
    bool complete = true;
    for (int j = 0; j < k && complete; ++j) complete = f.tick - last_tick_[m][j] <= 5;
    if (complete) rows.push_back(m);
  }
  const int r = static_cast<int>(rows.size());
  if (r < 4 || k == 0) return;
  std::vector<double> mean(k, 0), sd(k, 0);
  for (int m : rows) {
    for (int j = 0; j < k; ++j) mean[j] += last_value_[m][j];
  }
  for (int j = 0; j < k; ++j) mean[j] /= r;
  for (int m : rows) {
    for (int j = 0; j < k; ++j) sd[j] += std::pow(last_value_[m][j] - mean[j], 2);
  }
  for (int j = 0; j < k; ++j) sd[j] = std::sqrt(sd[j] / (r - 1)) + 1e-9;
  std::vector<double> x(static_cast<size_t>(r) * k);
  for (int i = 0; i < r; ++i) {
    for (int j = 0; j < k; ++j) x[i * k + j] = (last_value_[rows[i]][j] - mean[j]) / sd[j];
  }
  // Covariance (correlation, after standardising) with a small ridge, then Cholesky.
  std::vector<double> c(static_cast<size_t>(k) * k, 0);
  for (int i = 0; i < r; ++i) {
    for (int a = 0; a < k; ++a) {
      for (int b = 0; b <= a; ++b) c[a * k + b] += x[i * k + a] * x[i * k + b] / (r - 1);
    }
  }
  for (int a = 0; a < k; ++a) c[a * k + a] += 1e-3;
  std::vector<double> l(static_cast<size_t>(k) * k, 0);
  for (int a = 0; a < k; ++a) {
    for (int b = 0; b <= a; ++b) {
      double s = c[a * k + b];
      for (int q = 0; q < b; ++q) s -= l[a * k + q] * l[b * k + q];
      l[a * k + b] = a == b ? std::sqrt(std::max(s, 1e-12)) : s / l[b * k + b];
    }
  }
  const double limit = ChiSquareQuantile(k, quantile_);
  std::vector<double> y(k);
  for (int i = 0; i < r; ++i) {
    double d2 = 0;
    for (int a = 0; a < k; ++a) {  // solve L y = x_i
      double s = x[i * k + a];
      for (int q = 0; q < a; ++q) s -= l[a * k + q] * y[q];
      y[a] = s / l[a * k + a];
      d2 += y[a] * y[a];
    }
    if (d2 > limit && !CoolingDown(last_alert_, rows[i], f.tick, cooldown_)) {
      out->push_back(Alert(reg, rows[i], f, "mahalanobis"));
    }
  }
}

}  // namespace megascope::detector
