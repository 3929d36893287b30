// The registry of machine and series names, and Stream: raw samples aligned into ticks.
#include <cmath>

#include "megascope/detector/detector.h"

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

// Ticks further from 0 are no clock's (and would overflow the detector's tick arithmetic).
constexpr double kMaxTicks = 1e15;

Stream::Stream(FrameDetector* detector, double tick_s, double max_lateness_s)
    : det_(detector),
      tick_s_(tick_s),
      lateness_ticks_(static_cast<int64_t>(std::ceil(max_lateness_s / tick_s))) {}

void Stream::Add(const Sample& s) {
  // The raw name as the exporter wrote it -> the series it feeds (labels that name no entity
  // dropped, a renamed field under its current name, a bitmask as one series per meaningful bit).
  auto it = plans_.find(s.metric);
  if (it == plans_.end()) {
    std::vector<std::pair<int, uint64_t>> targets;
    for (const SeriesPlan::Target& t : PlanSeries(s.metric).targets)
      targets.emplace_back(reg_.Metric(t.key), t.mask);
    it = plans_.emplace(s.metric, std::move(targets)).first;
  }
  const int machine = reg_.Machine(s.machine);
  for (const auto& [metric, mask] : it->second) {
    if (mask == 0) {
      Add(machine, metric, s.time_s, s.value);
    } else if (std::isfinite(s.value) && s.value >= 0 && s.value < 1.8e19) {
      const auto bits = static_cast<uint64_t>(s.value);
      Add(machine, metric, s.time_s, (bits & mask) != 0 ? 1.0 : 0.0);
    }
  }
}

void Stream::Add(int machine, int metric, double time_s, double value) {
  if (!std::isfinite(value) || !std::isfinite(time_s)) return;
  if (metric >= static_cast<int>(counter_.size())) {
    counter_.resize(metric + 1, -1);
    last_.resize(metric + 1);
  }
  if (counter_[metric] < 0)
    counter_[metric] = IsCumulativeCounter(reg_.metric_name(metric)) ? 1 : 0;
  if (counter_[metric] == 1) {
    // A counter's meaning is its rate; its value depends on when the process started.
    auto& per = last_[metric];
    if (machine >= static_cast<int>(per.size())) per.resize(machine + 1);
    Last& last = per[machine];
    const Last prev = last;
    if (prev.seen && time_s <= prev.time_s) return;  // out of order: no rate to take
    last = {true, time_s, value};
    if (!prev.seen || value < prev.value) return;  // the first sample, or a counter reset
    value = (value - prev.value) / (time_s - prev.time_s);
  }
  AddAligned(machine, metric, time_s, value);
}

void Stream::AddAligned(int machine, int metric, double time_s, double value) {
  const double t = std::floor(time_s / tick_s_);
  if (std::fabs(t) > kMaxTicks) {  // beyond any clock (and any int64_t)
    ++late_;
    return;
  }
  const auto tick = static_cast<int64_t>(t);
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

}  // namespace megascope::detector
