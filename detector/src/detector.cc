#include "megascope/detector/detector.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>
#include <set>

#include "megascope/tracer/metric_names.h"

namespace megascope::detector {

// ---------------------------------------------------------------- metric families

namespace {

std::vector<std::string> Words(std::string_view name) {
  std::vector<std::string> words(1);
  for (char c : name) {
    if (std::isalnum(static_cast<unsigned char>(c))) {
      words.back() += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    } else if (!words.back().empty()) {
      words.emplace_back();
    }
  }
  if (words.back().empty()) words.pop_back();
  return words;
}

}  // namespace

std::vector<std::string> DefaultPriority() {
  std::vector<const tracer::metrics::Def*> defs;
  for (const tracer::metrics::Def& d : tracer::metrics::All()) {
    if (d.detector_priority >= 0) defs.push_back(&d);
  }
  std::sort(defs.begin(), defs.end(),
            [](auto* a, auto* b) { return a->detector_priority < b->detector_priority; });
  std::vector<std::string> out;
  out.reserve(defs.size());
  for (auto* d : defs) out.emplace_back(d->name);
  return out;
}

MetricFamily ClassifyMetric(std::string_view name) {
  const std::vector<std::string> w = Words(name);
  auto has = [&](std::initializer_list<const char*> any) {
    for (const std::string& word : w) {
      for (const char* a : any) {
        if (word == a) return true;
      }
    }
    return false;
  };
  // Order matters: "gpu_xid_errors" is an error counter before it is a GPU metric, and
  // "nvlink_tx" is NVLink before it is network.
  if (has({"xid", "xids", "ecc", "error", "errors", "sbe", "dbe", "retired", "remapped",
           "faults"}) ||
      (has({"carrier"}) && has({"changes", "flaps"}))) {
    return MetricFamily::kErrors;
  }
  if (has({"step", "steps", "iteration", "mfu", "tokens"}) ||
      (has({"compute"}) && has({"seconds", "s"}))) {
    return MetricFamily::kTraining;
  }
  if (has({"nvlink", "nvl"})) return MetricFamily::kNvlink;
  if (has({"net", "network", "nic", "pfc", "rdma", "ib", "roce", "tx", "rx", "transmit",
           "receive"})) {
    return MetricFamily::kNetwork;
  }
  if (has({"gpu", "dcgm", "sm", "tensor", "power", "temp", "temperature", "fb", "clock", "pcie"})) {
    return MetricFamily::kGpu;
  }
  if (has({"cpu", "load"})) return MetricFamily::kCpu;
  if (has({"mem", "memory"})) return MetricFamily::kMemory;
  return MetricFamily::kOther;
}

const char* MetricFamilyName(MetricFamily f) {
  switch (f) {
    case MetricFamily::kErrors:
      return "errors";
    case MetricFamily::kTraining:
      return "training";
    case MetricFamily::kNvlink:
      return "nvlink";
    case MetricFamily::kNetwork:
      return "network";
    case MetricFamily::kGpu:
      return "gpu";
    case MetricFamily::kCpu:
      return "cpu";
    case MetricFamily::kMemory:
      return "memory";
    case MetricFamily::kOther:
      return "other";
  }
  return "other";
}

bool IsCumulativeCounter(std::string_view name) {
  if (name.size() < 6) return false;
  std::string tail(name.substr(name.size() - 6));
  for (char& c : tail) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return tail == "_total";
}

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
  Add(reg_.Machine(s.machine), reg_.Metric(s.metric), s.time_s, s.value);
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

// ---------------------------------------------------------------- detector

namespace {

constexpr int64_t kNever = std::numeric_limits<int64_t>::min() / 2;

// Tick `tick`'s slot in a ring of `n` (ticks before the epoch included).
size_t Slot(int64_t tick, int64_t n) { return static_cast<size_t>(((tick % n) + n) % n); }

double MedianInPlace(std::vector<double>& v) {
  const size_t n = v.size(), mid = n / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<long>(mid), v.end());
  double m = v[mid];
  if (n % 2 == 0) m = (m + *std::max_element(v.begin(), v.begin() + static_cast<long>(mid))) / 2;
  return m;
}

// Flags of the last `size` ticks and how many are set. Ticks arrive in increasing order; ticks
// skipped count as unset.
class Rolling {
 public:
  Rolling() = default;
  explicit Rolling(int size) : flags_(static_cast<size_t>(std::max(1, size)), 0) {}
  void Push(int64_t tick, bool flag) {
    const auto n = static_cast<int64_t>(flags_.size());
    if (last_ == kNever || tick - last_ >= n) {
      std::fill(flags_.begin(), flags_.end(), 0);
      count_ = 0;
    } else {
      for (int64_t t = last_ + 1; t < tick; ++t) Set(t, 0);
    }
    Set(tick, flag ? 1 : 0);
    last_ = tick;
  }
  int Count() const { return count_; }
  int Size() const { return static_cast<int>(flags_.size()); }
  // The earliest flagged tick still in the window (now when none).
  int64_t Onset() const {
    const auto n = static_cast<int64_t>(flags_.size());
    for (int64_t t = last_ - n + 1; t <= last_; ++t) {
      if (flags_[Slot(t, n)]) return t;
    }
    return last_;
  }

 private:
  void Set(int64_t tick, uint8_t flag) {
    const auto n = static_cast<int64_t>(flags_.size());
    uint8_t& slot = flags_[Slot(tick, n)];
    count_ += flag - slot;
    slot = flag;
  }
  std::vector<uint8_t> flags_;
  int count_ = 0;
  int64_t last_ = kNever;
};

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
    int64_t last_hit = kNever;  // last tick it stood out, and by how much
    double last_z = 0;
    int64_t last_burst = kNever,
            prev_burst = 2 * kNever;  // starts of its last two runs of outlier ticks
    int64_t learned = 0;              // ticks seen in warm-up
    std::vector<double> warm;         // deviations seen in warm-up; their median becomes the bias
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
  struct Hit {   // why a machine stood out in one tick
    int metric;  // -1: the whole machine went silent
    double z;
    bool silent;
  };
  struct MachineState {
    int group = 0;
    int64_t first_tick = kNever, last_tick = kNever;
    Rolling strong, strong_long;  // ticks with strong or corroborated evidence
    Rolling weak, weak_long;      // ticks with any evidence
    Rolling recent;               // ticks with any evidence, over the continuity window (re-arming)
    int named =
        0;  // evidence level of its last verdict while not re-armed: 0 none, 1 weak, 2 strong
    std::map<int, std::pair<int, double>> evidence;  // metric (-1 silent) -> (ticks, max |z|)
  };

  std::vector<std::vector<Series>> series;  // [metric][machine]
  std::vector<MachineState> machines;
  std::vector<double> spread_ewma;  // per metric: long-run typical spread (a floor for quiet times)
  std::vector<int> priority_rank;   // per metric
  std::vector<MetricFamily> family;  // per metric
  std::vector<double> level_ewma;    // per metric: long-run typical |median| (a floor when idle)
  std::vector<double> thresholds;    // per metric
  std::map<std::string, int> group_ids;
  std::set<std::string> seen;  // machines given a group
  std::vector<double> scratch, vals, sorted;
  std::vector<uint8_t> lone;
  std::vector<int> members;

  void Grow(const Registry& reg) {
    while (static_cast<int>(machines.size()) < reg.machines()) {
      MachineState m;
      const std::string& name = reg.machine_name(static_cast<int>(machines.size()));
      seen.insert(name);
      auto g = cfg.groups.find(name);
      std::string group = g == cfg.groups.end() ? "" : g->second;
      m.group = group_ids.try_emplace(group, static_cast<int>(group_ids.size())).first->second;
      m.strong = Rolling(cfg.continuity);
      m.strong_long = Rolling(cfg.long_window);
      m.weak = Rolling(cfg.weak_continuity);
      m.weak_long = Rolling(cfg.weak_long_window);
      m.recent = Rolling(cfg.continuity);
      machines.push_back(std::move(m));
    }
    while (static_cast<int>(series.size()) < reg.metrics()) {
      const std::string& name = reg.metric_name(static_cast<int>(series.size()));
      const std::string_view signal = tracer::metrics::SignalName(name);
      auto p = std::find_if(cfg.priority.begin(), cfg.priority.end(), [&](const std::string& q) {
        return tracer::metrics::SignalName(q) == signal;
      });
      priority_rank.push_back(static_cast<int>(p - cfg.priority.begin()));
      family.push_back(ClassifyMetric(name));
      level_ewma.push_back(0);
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

  Verdict MakeVerdict(int m, const Rolling& window, const Frame& f, const Registry& reg) const;

  // One frame, in phases over the detector's state (OnFrame is the driver): its cells stored,
  // every metric scored within every peer group, silences noted, then each machine's evidence held
  // against the continuity windows.
  void Ingest(const Frame& f);
  // Metric k's denoised value on every machine this tick (NaN where too few are valid).
  void Denoise(int k, int64_t now, std::vector<double>* denoised);
  // The machines of group g that stand out on metric k (hits), their scores, and the offsets that
  // each machine's usual place teaches.
  void ScoreGroup(int k, int g, int64_t now, std::vector<double>& denoised,
                  std::vector<std::vector<Hit>>* hits, std::vector<double>* scores);
  // Machine m on metric k, `offset` from its group's median (`scale` its spread, `thr` the metric's
  // threshold, `lone` whether it stands out alone): warm-up, a hit, or its usual place learned.
  void Judge(int k, int m, int64_t now, double offset, double scale, double thr, bool lone,
             std::vector<Hit>* hits, double* score);
  // Machines that stopped reporting metric k (k < 0: anything) while their peers still do.
  void NoteSilences(int k, int64_t now, std::vector<std::vector<Hit>>* hits);
  // Each machine's hits against the continuity windows: a verdict when it stands out long enough.
  void Conclude(int64_t now, const std::vector<std::vector<Hit>>& hits, const Frame& f,
                const Registry& reg, std::vector<Verdict>* out);

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

bool Detector::SetPeerGroup(const std::string& machine, const std::string& group) {
  auto it = impl_->cfg.groups.find(machine);
  if (it != impl_->cfg.groups.end() && it->second == group) return true;
  if (impl_->seen.count(machine)) return false;
  impl_->cfg.groups[machine] = group;
  return true;
}

void Detector::Impl::Ingest(const Frame& f) {
  const int64_t now = f.tick;
  for (const Frame::Cell& c : f.cells) {
    Series& s = series[c.metric][c.machine];
    const size_t slot = Slot(now, cfg.denoise_window);
    s.values[slot] = c.value;
    s.ticks[slot] = now;
    s.last_tick = now;
    MachineState& m = machines[c.machine];
    if (m.first_tick == kNever) m.first_tick = now;
    m.last_tick = now;
  }
}

void Detector::Impl::Denoise(int k, int64_t now, std::vector<double>* denoised) {
  const int min_valid = std::max(1, cfg.denoise_window / 2);
  for (size_t m = 0; m < machines.size(); ++m)
    (*denoised)[m] = series[k][m].Denoised(now, min_valid, scratch);
}

void Detector::Impl::ScoreGroup(int k, int g, int64_t now, std::vector<double>& denoised,
                                std::vector<std::vector<Hit>>* hits_out,
                                std::vector<double>* scores) {
  const int nmach = static_cast<int>(machines.size());
  std::vector<std::vector<Hit>>& hits = *hits_out;
  std::vector<double>& last_scores = *scores;
  members.clear();
  vals.clear();
  for (int m = 0; m < nmach; ++m) {
    if (machines[m].group == g && std::isfinite(denoised[m])) {
      denoised[m] -= series[k][m].bias;
      members.push_back(m);
      vals.push_back(denoised[m]);
    }
  }
  const int n = static_cast<int>(members.size());
  if (n < cfg.min_peers) return;
  const double med = MedianInPlace(vals);
  for (int i = 0; i < n; ++i) vals[i] = std::fabs(denoised[members[i]] - med);
  const double spread = 1.4826 * MedianInPlace(vals);
  // The spread never counts as much below what the peers usually show: while the whole job is
  // idle, stalled or loading every machine looks alike, and a near-zero spread would turn noise
  // into huge z-scores. The usual spread learns fast from normal ticks and only slowly from
  // collapsed ones; the usual level keeps the relative floor while the median sits near zero.
  double& typical = spread_ewma[k];
  if (typical == 0) {
    typical = spread;
  } else {
    typical += (spread - typical) / (spread >= 0.5 * typical ? 600.0 : 7200.0);
  }
  double& level = level_ewma[k];
  level += (std::fabs(med) - level) / (level == 0 ? 1.0 : 600.0);
  const double scale = std::max({spread, cfg.spread_floor * typical,
                                 cfg.relative_floor * std::max(std::fabs(med), 0.5 * level), 1e-6});
  // An outlier is a machine off its peers and alone there: when at least `min_peers` machines
  // sit together off the median (another GPU generation, a pipeline stage with a lighter load),
  // they are a sub-population doing other work, not a fault.
  const double thr = thresholds[k];
  auto alone = [&](const std::vector<double>& sorted, double x) {
    const double tol = thr * scale;
    const auto lo = std::lower_bound(sorted.begin(), sorted.end(), x - tol);
    const auto hi = std::upper_bound(sorted.begin(), sorted.end(), x + tol);
    return hi - lo < cfg.min_peers;
  };
  sorted.clear();
  for (int m : members) sorted.push_back(denoised[m]);
  std::sort(sorted.begin(), sorted.end());
  int outliers = 0;
  lone.assign(nmach, 0);
  for (int m : members) {
    if (std::fabs(denoised[m] - med) / scale > thr && alone(sorted, denoised[m])) {
      lone[m] = 1;
      ++outliers;
    }
  }
  if (outliers > std::max(1.0, cfg.job_wide_fraction * n)) return;  // the job moved
  for (int m : members)
    Judge(k, m, now, denoised[m] - med, scale, thr, lone[m] != 0, &hits[m], &last_scores[m]);
}

void Detector::Impl::Judge(int k, int m, int64_t now, double offset, double scale, double thr,
                           bool lone, std::vector<Hit>* hits, double* score) {
  const double z = offset / scale;
  Series& s = series[k][m];
  if (s.learned < cfg.warmup_ticks) {
    // A machine's first ticks on a metric only teach its usual offset: the median of its
    // deviations, so a transient (one XID event) does not become its baseline. A machine
    // that differs in level from the start (another GPU generation, the only machine of its
    // pipeline stage) is healthy character as far as its levels can tell; but errors while
    // its peers have none are never anyone's character: a machine faulty from its first
    // sample is named by them.
    s.warm.push_back(offset);
    if (++s.learned == cfg.warmup_ticks) {
      const double bias = MedianInPlace(s.warm);
      std::vector<double>().swap(s.warm);
      const bool errors_alone = family[k] == MetricFamily::kErrors && std::fabs(bias) / scale > thr;
      s.bias = errors_alone ? 0 : bias;
    }
    return;
  }
  *score = std::max(*score, std::fabs(z));
  if (lone) {
    hits->push_back({k, z, false});
    if (s.last_hit != now - 1) {  // a new burst
      s.prev_burst = s.last_burst;
      s.last_burst = now;
    }
    s.last_hit = now;
    s.last_z = z;
  } else if (family[k] == MetricFamily::kErrors && now - s.last_hit <= cfg.error_memory_ticks &&
             s.last_burst - s.prev_burst <= cfg.continuity) {
    // Errors that repeat with quiet seconds between (a flapping link, ECC corrections) stay
    // evidence through the quiet seconds; a single burst never does.
    hits->push_back({k, s.last_z, false});
  } else if (family[k] != MetricFamily::kErrors) {  // errors are never anyone's usual place
    // Not alone: wherever it sits is its usual place among its peers, so its offset follows
    // it. Offsets are thus learned in every regime: an older GPU generation runs cooler
    // under load but idles like everyone, and all of its machines move together when the
    // job changes regime (a sub-population, never alone). A machine that moves by itself --
    // a throttled GPU landing on the older generation's levels -- is alone against its own
    // usual place, and does not learn while it is.
    s.bias += offset / cfg.bias_ticks;
  }
}

void Detector::Impl::NoteSilences(int k, int64_t now, std::vector<std::vector<Hit>>* hits) {
  const int nmach = static_cast<int>(machines.size());
  if (k < 0) {  // the whole machine
    for (int m = 0; m < nmach; ++m) {
      const MachineState& s = machines[m];
      if (s.last_tick == kNever || now - s.last_tick < cfg.silence_ticks ||
          now - s.last_tick > cfg.forget_ticks)
        continue;
      if (PeersActive(s.group, -1, now)) (*hits)[m].push_back({-1, 0, true});
    }
    return;
  }
  // A machine that stopped reporting this metric while its peers still do.
  for (int m = 0; m < nmach; ++m) {
    const int64_t last = series[k][m].last_tick;
    if (last == kNever || now - last < cfg.silence_ticks || now - last > cfg.forget_ticks) continue;
    if (machines[m].last_tick < now - cfg.silence_ticks) continue;  // whole machine silent
    if (PeersActive(machines[m].group, k, now)) (*hits)[m].push_back({k, 0, true});
  }
}

void Detector::Impl::Conclude(int64_t now, const std::vector<std::vector<Hit>>& hits,
                              const Frame& f, const Registry& reg, std::vector<Verdict>* out) {
  const int nmach = static_cast<int>(machines.size());
  // Continuity: the same machine must stand out for most of a window. Strong evidence (silence, an
  // error counter, a training metric) or two metric families at once count in the short window;
  // one family alone only in the weak window, longer than a benign excursion. A machine that flaps
  // (a NIC going up and down) stands out only part of the time: the long windows catch it at half.
  auto need = [](double fraction, int window) {
    return static_cast<int>(std::ceil(fraction * window));
  };
  const int strong_need = need(cfg.continuity_fraction, cfg.continuity);
  const int strong_long_need = need(cfg.long_fraction, cfg.long_window);
  const int weak_need = need(cfg.weak_fraction, cfg.weak_continuity);
  const int weak_long_need = need(cfg.long_fraction, cfg.weak_long_window);
  for (int m = 0; m < nmach; ++m) {
    MachineState& s = machines[m];
    bool strong = false;
    uint32_t families = 0;
    for (const Hit& h : hits[m]) {
      // The whole machine silent is strong; one metric missing (its ranks between steps while
      // their peers finish one) only counts for its family.
      const MetricFamily fam = h.metric < 0 ? MetricFamily::kErrors : family[h.metric];
      strong = strong || h.metric < 0 || (!h.silent && IsStrong(fam));
      families |= 1u << static_cast<int>(fam);
    }
    // Corroborated: two families agree, or three sensors of one device (a GPU's utilisation,
    // power and memory all off its peers); the benign excursions move one metric, two at most.
    strong = strong || (families & (families - 1)) != 0 || hits[m].size() >= 3;
    const bool any = !hits[m].empty();
    s.strong.Push(now, strong);
    s.strong_long.Push(now, strong);
    s.weak.Push(now, any);
    s.weak_long.Push(now, any);
    s.recent.Push(now, any);
    if (s.weak_long.Count() == 0) s.evidence.clear();
    for (const Hit& h : hits[m]) {
      auto& e = s.evidence[h.metric];
      ++e.first;
      e.second = std::max(e.second, std::fabs(h.z));
    }
    int level = 0;
    const Rolling* window = nullptr;
    if (s.strong.Count() >= strong_need || s.strong_long.Count() >= strong_long_need) {
      level = 2;
      window = s.strong.Count() >= strong_need ? &s.strong : &s.strong_long;
    } else if (s.weak.Count() >= weak_need || s.weak_long.Count() >= weak_long_need) {
      level = 1;
      window = s.weak.Count() >= weak_need ? &s.weak : &s.weak_long;
    }
    // Re-armed once it no longer stands out (the fault is over, or was never one).
    if (level == 0 && s.recent.Count() <= cfg.rearm_fraction * cfg.continuity) s.named = 0;
    if (level <= s.named) continue;
    s.named = level;
    out->push_back(MakeVerdict(m, *window, f, reg));
  }
}

void Detector::OnFrame(const Frame& f, const Registry& reg, std::vector<Verdict>* out) {
  Impl& d = *impl_;
  d.Grow(reg);
  d.Ingest(f);
  const int64_t now = f.tick;
  const int nmach = static_cast<int>(d.machines.size());
  // Per tick: which machines stand out, and why.
  std::vector<std::vector<Impl::Hit>> hits(nmach);
  last_scores_.assign(nmach, 0);
  std::vector<double> denoised(nmach);
  for (int k = 0; k < static_cast<int>(d.series.size()); ++k) {
    d.Denoise(k, now, &denoised);
    for (int g = 0; g < static_cast<int>(d.group_ids.size()); ++g)
      d.ScoreGroup(k, g, now, denoised, &hits, &last_scores_);
    d.NoteSilences(k, now, &hits);
  }
  d.NoteSilences(-1, now, &hits);
  d.Conclude(now, hits, f, reg, out);
}

double Detector::Confidence(const std::vector<EvidenceItem>& evidence, int continuity) {
  // Noisy-OR over metric families: each family's evidence is a chance the machine is faulty,
  // weighted by its kind and by how long it held. Adding evidence never lowers the result.
  std::map<MetricFamily, double> best;
  for (const EvidenceItem& e : evidence) {
    const double weight = e.silent || IsStrong(e.family) ? 0.9 : 0.5;
    const double p = weight * std::min(1.0, static_cast<double>(e.ticks) / std::max(1, continuity));
    double& b = best[e.silent ? MetricFamily::kErrors : e.family];
    b = std::max(b, p);
  }
  double miss = 1;
  for (const auto& [fam, p] : best) miss *= 1 - p;
  return std::min(0.99, 1 - miss);
}

Verdict Detector::Impl::MakeVerdict(int m, const Rolling& window, const Frame& f,
                                    const Registry& reg) const {
  const Impl& d = *this;
  const Impl::MachineState& s = d.machines[m];
  const int64_t onset = window.Onset();
  // Evidence in priority order: strong signals first, then metrics that made the machine stand out
  // for most ticks, then Minder's order.
  std::vector<std::pair<int, std::pair<int, double>>> ev(s.evidence.begin(), s.evidence.end());
  const int half = window.Size() / 2;
  auto rank = [&](int metric) { return metric < 0 ? -1 : d.priority_rank[metric]; };
  auto strong = [&](int metric) { return metric < 0 || IsStrong(d.family[metric]); };
  std::sort(ev.begin(), ev.end(), [&](const auto& a, const auto& b) {
    const bool a_major = a.second.first >= half, b_major = b.second.first >= half;
    if (a_major != b_major) return a_major;
    if (strong(a.first) != strong(b.first)) return strong(a.first);
    if (rank(a.first) != rank(b.first)) return rank(a.first) < rank(b.first);
    return a.first < b.first;
  });
  std::vector<EvidenceItem> items;
  items.reserve(ev.size());
  for (const auto& [metric, stat] : ev) {
    items.push_back({metric < 0 ? MetricFamily::kOther : d.family[metric], metric < 0, stat.first});
  }
  Verdict v;
  v.kind = VerdictKind::kFaultyMachine;
  v.root_nodes = {reg.machine_name(m)};
  v.detected_at_ns = static_cast<int64_t>(f.end_s * 1e9);
  v.onset_at_ns = static_cast<int64_t>(static_cast<double>(onset) * cfg.tick_s * 1e9);
  v.confidence = Confidence(items, cfg.continuity);
  const bool silent = !ev.empty() && ev.front().first < 0;
  v.cause = silent ? "machine_silent" : "metric_outlier";
  std::string facts;
  for (const auto& [metric, stat] : ev) {
    std::string name = metric < 0 ? "no_samples" : reg.metric_name(metric);
    v.evidence.push_back(name);
    if (facts.size() >= 240) continue;
    char buf[200];
    const char* sep = facts.empty() ? "" : "; ";
    if (metric < 0) {
      std::snprintf(buf, sizeof(buf), "%ssent no samples for %d s", sep, stat.first);
    } else if (stat.second == 0) {
      std::snprintf(buf, sizeof(buf), "%s%s missing while peers report it (%d ticks)", sep,
                    name.c_str(), stat.first);
    } else if (stat.second > 1000) {  // the peers are flat (an event counter at zero)
      std::snprintf(buf, sizeof(buf), "%s%s nonzero while its peers stay flat (%d ticks)", sep,
                    name.c_str(), stat.first);
    } else {
      std::snprintf(buf, sizeof(buf), "%s%s [%s] off its peers by up to %.1f robust sd (%d ticks)",
                    sep, name.c_str(), MetricFamilyName(d.family[metric]), stat.second, stat.first);
    }
    facts += buf;
  }
  char head[160];
  std::snprintf(
      head, sizeof(head),
      " stood out from its peers for %d of the last %d ticks (%s evidence, confidence %.2f): ",
      window.Count(), window.Size(), s.named >= 2 ? "strong or corroborated" : "single-family",
      v.confidence);
  v.explanation = reg.machine_name(m) + head + facts;
  return v;
}

}  // namespace megascope::detector
