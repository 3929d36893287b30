#include "megascope/detector/detector.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <set>

namespace megascope::detector {

// ---------------------------------------------------------------- registry

int Registry::Machine(const std::string& name) {
  auto [it, added] = machine_ids_.try_emplace(name, static_cast<int>(machines_.size()));
  if (added) machines_.push_back(name);
  return it->second;
}

int Registry::Metric(const std::string& name) {
  auto [it, added] = metric_ids_.try_emplace(name, static_cast<int>(metrics_.size()));
  if (added) metrics_.push_back(name);
  return it->second;
}

int Registry::FindMetric(const std::string& name) const {
  auto it = metric_ids_.find(name);
  return it == metric_ids_.end() ? -1 : it->second;
}

// ---------------------------------------------------------------- stream

Stream::Stream(FrameDetector* detector, double tick_s, double max_lateness_s)
    : det_(detector), tick_s_(tick_s),
      lateness_ticks_(static_cast<int64_t>(std::ceil(max_lateness_s / tick_s))) {}

void Stream::Add(const Sample& s) { Add(reg_.Machine(s.machine), reg_.Metric(s.metric), s.time_s, s.value); }

void Stream::Add(int machine, int metric, double time_s, double value) {
  if (!std::isfinite(value) || !std::isfinite(time_s)) return;
  const auto tick = static_cast<int64_t>(std::floor(time_s / tick_s_));
  if (tick < next_tick_) {
    ++late_;
    return;
  }
  Frame& f = pending_[tick];
  if (f.cells.empty()) {
    f.tick = tick;
    f.end_s = static_cast<double>(tick + 1) * tick_s_;
  }
  f.cells.push_back({machine, metric, value});
  if (tick > max_tick_) {
    max_tick_ = tick;
    if (max_tick_ - lateness_ticks_ >= next_tick_ || next_tick_ == INT64_MIN) {
      EmitThrough(max_tick_ - lateness_ticks_);
    }
  }
}

void Stream::EmitThrough(int64_t tick) {
  if (next_tick_ == INT64_MIN) {
    if (pending_.empty() || pending_.begin()->first > tick) return;
    next_tick_ = pending_.begin()->first;
  }
  for (; next_tick_ <= tick; ++next_tick_) {
    auto it = pending_.find(next_tick_);
    if (it != pending_.end()) {
      det_->OnFrame(it->second, reg_, &verdicts_);
      pending_.erase(it);
    } else {
      Frame empty;  // ticks without samples still pass: silence is evidence
      empty.tick = next_tick_;
      empty.end_s = static_cast<double>(next_tick_ + 1) * tick_s_;
      det_->OnFrame(empty, reg_, &verdicts_);
    }
    ++frames_;
  }
}

void Stream::Flush() {
  if (max_tick_ != INT64_MIN) EmitThrough(max_tick_);
}

// ---------------------------------------------------------------- detector

namespace {

constexpr int64_t kNever = std::numeric_limits<int64_t>::min() / 2;

double MedianInPlace(std::vector<double>& v) {
  const size_t n = v.size(), mid = n / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<long>(mid), v.end());
  double m = v[mid];
  if (n % 2 == 0) m = (m + *std::max_element(v.begin(), v.begin() + static_cast<long>(mid))) / 2;
  return m;
}

}  // namespace

struct Detector::Impl {
  DetectorConfig cfg;

  // One (machine, metric) history: the last `denoise_window` values by tick.
  struct Series {
    std::vector<double> values;
    std::vector<int64_t> ticks;
    int64_t last_tick = kNever;
    // This machine's usual offset from its peers on this metric (raw units): learned from ticks
    // where it did not stand out, so healthy heterogeneity (a GPU that always runs 3 C warmer)
    // is not a fault, while a sudden change still is.
    double bias = 0;
    int64_t learned = 0;  // ticks seen in warm-up
    std::vector<double> warm;  // deviations seen in warm-up; their median becomes the bias
    double Denoised(int64_t now, int min_valid, std::vector<double>& scratch) const {
      scratch.clear();
      for (size_t i = 0; i < ticks.size(); ++i) {
        if (ticks[i] > now - static_cast<int64_t>(ticks.size())) scratch.push_back(values[i]);
      }
      const size_t n = scratch.size();
      if (static_cast<int>(n) < min_valid) return std::nan("");
      // A trimmed mean (a quarter cut from each end): spikes shorter than a quarter of the window
      // vanish, and a missing sample in a signal that alternates with the training step (sampled
      // at twice its period) shifts it little, where a median would jump to one side.
      std::sort(scratch.begin(), scratch.end());
      const size_t cut = n / 4;
      double sum = 0;
      for (size_t i = cut; i < n - cut; ++i) sum += scratch[i];
      const double trimmed = sum / static_cast<double>(n - 2 * cut);
      if (trimmed != 0.0) return trimmed;
      // Sparse event counters (XID, ECC): trimming mostly-zero values hides a machine that has
      // events every few seconds, so such series are averaged whole.
      for (size_t i = 0; i < cut; ++i) sum += scratch[i] + scratch[n - 1 - i];
      return sum / static_cast<double>(n);
    }
  };
  struct Hit {  // why a machine stood out in one tick
    int metric;  // -1: the whole machine went silent
    double z;
    bool silent;
  };
  struct MachineState {
    int group = 0;
    int64_t first_tick = kNever, last_tick = kNever;
    std::vector<uint8_t> window;  // outlier flag per tick of the long window (circular)
    std::vector<int64_t> window_ticks;
    int count = 0;  // outlier ticks in the continuity window
    int long_count = 0;  // outlier ticks in the long window
    bool armed = true;
    int clean_run = 0;
    std::map<int, std::pair<int, double>> evidence;  // metric (-1 silent) -> (ticks, max |z|)
  };

  std::vector<std::vector<Series>> series;  // [metric][machine]
  std::vector<MachineState> machines;
  std::vector<double> spread_ewma;  // per metric: long-run typical spread (a floor for quiet times)
  std::vector<int> priority_rank;  // per metric
  std::vector<double> thresholds;  // per metric
  std::map<std::string, int> group_ids;
  std::vector<double> scratch, vals;
  std::vector<int> members;

  void Grow(const Registry& reg) {
    while (static_cast<int>(machines.size()) < reg.machines()) {
      MachineState m;
      const std::string& name = reg.machine_name(static_cast<int>(machines.size()));
      auto g = cfg.groups.find(name);
      std::string group = g == cfg.groups.end() ? "" : g->second;
      m.group = group_ids.try_emplace(group, static_cast<int>(group_ids.size())).first->second;
      m.window.assign(cfg.long_window, 0);
      m.window_ticks.assign(cfg.long_window, kNever);
      machines.push_back(std::move(m));
    }
    while (static_cast<int>(series.size()) < reg.metrics()) {
      const std::string& name = reg.metric_name(static_cast<int>(series.size()));
      auto p = std::find(cfg.priority.begin(), cfg.priority.end(), name);
      priority_rank.push_back(static_cast<int>(p - cfg.priority.begin()));
      auto t = cfg.metric_thresholds.find(name);
      thresholds.push_back(t == cfg.metric_thresholds.end() ? cfg.threshold : t->second);
      spread_ewma.push_back(0);
      series.emplace_back();
    }
    for (auto& per_metric : series) {
      while (per_metric.size() < machines.size()) {
        Series s;
        s.values.assign(cfg.denoise_window, 0);
        s.ticks.assign(cfg.denoise_window, kNever);
        per_metric.push_back(std::move(s));
      }
    }
  }

  // Whether a majority of `group` reported `metric` (or anything, metric < 0) within 2 ticks.
  bool PeersActive(int group, int metric, int64_t now) const {
    int active = 0, total = 0;
    for (size_t m = 0; m < machines.size(); ++m) {
      if (machines[m].group != group || machines[m].first_tick == kNever) continue;
      int64_t last = metric < 0 ? machines[m].last_tick : series[metric][m].last_tick;
      if (metric >= 0 && last == kNever) continue;
      ++total;
      if (last >= now - 2) ++active;
    }
    return total >= cfg.min_peers && 2 * active > total;
  }
};

Detector::Detector(DetectorConfig config) : impl_(std::make_unique<Impl>()) {
  impl_->cfg = std::move(config);
}
Detector::~Detector() = default;

void Detector::OnFrame(const Frame& f, const Registry& reg, std::vector<Verdict>* out) {
  Impl& d = *impl_;
  const DetectorConfig& cfg = d.cfg;
  d.Grow(reg);
  const int64_t now = f.tick;
  const int nmach = static_cast<int>(d.machines.size());
  for (const Frame::Cell& c : f.cells) {
    Impl::Series& s = d.series[c.metric][c.machine];
    const size_t slot = static_cast<size_t>(now % cfg.denoise_window);
    s.values[slot] = c.value;
    s.ticks[slot] = now;
    s.last_tick = now;
    Impl::MachineState& m = d.machines[c.machine];
    if (m.first_tick == kNever) m.first_tick = now;
    m.last_tick = now;
  }

  // Per tick: which machines stand out, and why.
  std::vector<std::vector<Impl::Hit>> hits(nmach);
  last_scores_.assign(nmach, 0);
  const int min_valid = std::max(1, cfg.denoise_window / 2);
  const int ngroups = static_cast<int>(d.group_ids.size());
  std::vector<double> denoised(nmach);
  for (int k = 0; k < static_cast<int>(d.series.size()); ++k) {
    for (int m = 0; m < nmach; ++m) denoised[m] = d.series[k][m].Denoised(now, min_valid, d.scratch);
    for (int g = 0; g < ngroups; ++g) {
      d.members.clear();
      d.vals.clear();
      for (int m = 0; m < nmach; ++m) {
        if (d.machines[m].group == g && std::isfinite(denoised[m])) {
          denoised[m] -= d.series[k][m].bias;
          d.members.push_back(m);
          d.vals.push_back(denoised[m]);
        }
      }
      const int n = static_cast<int>(d.members.size());
      if (n < cfg.min_peers) continue;
      const double med = MedianInPlace(d.vals);
      for (int i = 0; i < n; ++i) d.vals[i] = std::fabs(denoised[d.members[i]] - med);
      const double spread = 1.4826 * MedianInPlace(d.vals);
      double& typical = d.spread_ewma[k];
      typical = typical == 0 ? spread : typical + (spread - typical) / 600.0;
      const double scale = std::max({spread, 0.25 * typical, cfg.relative_floor * std::fabs(med), 1e-6});
      int outliers = 0;
      for (int m : d.members) outliers += std::fabs(denoised[m] - med) / scale > d.thresholds[k] ? 1 : 0;
      if (outliers > std::max(1.0, cfg.job_wide_fraction * n)) continue;  // the job moved
      for (int m : d.members) {
        const double z = (denoised[m] - med) / scale;
        Impl::Series& s = d.series[k][m];
        if (s.learned < cfg.warmup_ticks) {
          // A machine's first ticks on a metric only teach its usual offset: the median of its
          // deviations, so a transient (one XID event) does not become its baseline.
          s.warm.push_back(denoised[m] - med);
          if (++s.learned == cfg.warmup_ticks) {
            s.bias = MedianInPlace(s.warm);
            std::vector<double>().swap(s.warm);
          }
          continue;
        }
        last_scores_[m] = std::max(last_scores_[m], std::fabs(z));
        if (std::fabs(z) > d.thresholds[k]) {
          hits[m].push_back({k, z, false});
        } else if (std::fabs(z) < 0.8 * d.thresholds[k]) {
          s.bias += (denoised[m] - med) / cfg.bias_ticks;
        }
      }
    }
    // A machine that stopped reporting this metric while its peers still do.
    for (int m = 0; m < nmach; ++m) {
      const int64_t last = d.series[k][m].last_tick;
      if (last == kNever || now - last < cfg.silence_ticks || now - last > cfg.forget_ticks) continue;
      if (d.machines[m].last_tick < now - cfg.silence_ticks) continue;  // whole machine silent
      if (d.PeersActive(d.machines[m].group, k, now)) hits[m].push_back({k, 0, true});
    }
  }
  for (int m = 0; m < nmach; ++m) {
    const Impl::MachineState& s = d.machines[m];
    if (s.last_tick == kNever || now - s.last_tick < cfg.silence_ticks || now - s.last_tick > cfg.forget_ticks) continue;
    if (d.PeersActive(s.group, -1, now)) hits[m].push_back({-1, 0, true});
  }

  // Continuity: the same machine must stand out for most of the window.
  // A machine that flaps (a NIC going up and down) stands out only part of the time: the long
  // window catches it at a lower share.
  const int need = static_cast<int>(std::ceil(cfg.continuity_fraction * cfg.continuity));
  const int long_need = static_cast<int>(std::ceil(cfg.long_fraction * cfg.long_window));
  for (int m = 0; m < nmach; ++m) {
    Impl::MachineState& s = d.machines[m];
    const size_t slot = static_cast<size_t>(now % cfg.long_window);
    const size_t leaving = static_cast<size_t>((now - cfg.continuity) % cfg.long_window);
    const uint8_t flag = hits[m].empty() ? 0 : 1;
    if (s.window_ticks[leaving] == now - cfg.continuity) s.count -= s.window[leaving];
    s.count += flag;
    s.long_count += flag - s.window[slot];
    s.window[slot] = flag;
    s.window_ticks[slot] = now;
    if (s.long_count == 0) s.evidence.clear();
    for (const Impl::Hit& h : hits[m]) {
      auto& e = s.evidence[h.metric];
      ++e.first;
      e.second = std::max(e.second, std::fabs(h.z));
    }
    s.clean_run = flag ? 0 : s.clean_run + 1;
    if (!s.armed && s.clean_run >= cfg.rearm_ticks) s.armed = true;
    if (!s.armed || (s.count < need && s.long_count < long_need)) continue;

    s.armed = false;
    const int64_t span = s.count >= need ? cfg.continuity : cfg.long_window;
    int64_t onset = now;
    for (int i = 0; i < cfg.long_window; ++i) {
      if (s.window[i] && s.window_ticks[i] > now - span && s.window_ticks[i] < onset) onset = s.window_ticks[i];
    }
    // Evidence in priority order: metrics that made the machine stand out for most ticks first.
    std::vector<std::pair<int, std::pair<int, double>>> ev(s.evidence.begin(), s.evidence.end());
    auto rank = [&](int metric) { return metric < 0 ? -1 : d.priority_rank[metric]; };
    std::sort(ev.begin(), ev.end(), [&](const auto& a, const auto& b) {
      bool a_major = 2 * a.second.first >= need, b_major = 2 * b.second.first >= need;
      if (a_major != b_major) return a_major;
      if (rank(a.first) != rank(b.first)) return rank(a.first) < rank(b.first);
      return a.first < b.first;
    });
    Verdict v;
    v.kind = "faulty_machine";
    v.root_nodes = {reg.machine_name(m)};
    v.detected_at_ns = static_cast<int64_t>(f.end_s * 1e9);
    v.onset_at_ns = static_cast<int64_t>(static_cast<double>(onset) * cfg.tick_s * 1e9);
    v.confidence = std::min(1.0, std::max(static_cast<double>(s.count) / cfg.continuity,
                                          static_cast<double>(s.long_count) / cfg.long_window));
    const bool silent = !ev.empty() && ev.front().first < 0;
    v.cause = silent ? "machine_silent" : "metric_outlier";
    std::string facts;
    for (const auto& [metric, stat] : ev) {
      std::string name = metric < 0 ? "no_samples" : reg.metric_name(metric);
      v.evidence.push_back(name);
      if (facts.size() < 200) {
        char buf[160];
        if (metric < 0) {
          std::snprintf(buf, sizeof(buf), "%ssent no samples for %d of the last %d s", facts.empty() ? "" : "; ",
                        stat.first, cfg.continuity);
        } else if (stat.second == 0) {
          std::snprintf(buf, sizeof(buf), "%s%s missing while peers report it (%d ticks)", facts.empty() ? "" : "; ",
                        name.c_str(), stat.first);
        } else if (stat.second > 1000) {  // the peers are flat (an event counter at zero)
          std::snprintf(buf, sizeof(buf), "%s%s nonzero while its peers stay flat (%d ticks)",
                        facts.empty() ? "" : "; ", name.c_str(), stat.first);
        } else {
          std::snprintf(buf, sizeof(buf), "%s%s off its peers by up to %.1f robust sd (%d ticks)",
                        facts.empty() ? "" : "; ", name.c_str(), stat.second, stat.first);
        }
        facts += buf;
      }
    }
    v.explanation = reg.machine_name(m) + " stood out from its " + std::to_string(nmach - 1) +
                    " peers for " + std::to_string(s.count) + " of the last " + std::to_string(cfg.continuity) +
                    " ticks: " + facts;
    out->push_back(std::move(v));
  }
}

}  // namespace megascope::detector
