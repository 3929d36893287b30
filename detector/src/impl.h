// Detector::Impl, the faulty-machine detector's state, and its phases (detector.h): one tick is
// OnFrame's walk through them, each cut into the file of its part --
//   detector.cc   the public API, Ingest (samples and membership) and OnFrame, the driver
//   score.cc      Denoise, ScoreGroup and Judge per metric and peer group; work stops,
//                 background errors, silences, siblings (one GPU or port against the machine's)
//   job.cc        the job's pace (NotePace, PaceLeader) and pauses (NotePauses), membership
//                 (Left, QuietWithReform: machines that left a re-formed job)
//   sources.cc    NoteSources: exporters that stop (monitoring gaps, sources stopping together)
//   cohorts.cc    GroupCohorts: machines that move together for one cause (shared components)
//   verdicts.cc   Conclude: continuity windows, levels, re-arming, a second fault; the verdicts
// Private to src/: nothing outside the detector includes it.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "megascope/detector/detector.h"
#include "megascope/tracer/metric_names.h"

namespace megascope::detector {

inline constexpr int64_t kNever = std::numeric_limits<int64_t>::min() / 2;
inline constexpr int kFamilies = static_cast<int>(MetricFamily::kOther) + 1;
inline constexpr int64_t kRunGap = 5;  // ticks without a hit that end a run of outlier ticks
// Ticks over which a group's usual rate of background errors is learned (a running mean until
// then), and the usual rate per healthy machine (per second) above which they are background: one
// error in 17 minutes.
inline constexpr double kBackgroundTicks = 600;
inline constexpr double kBackgroundRate = 1e-3;
// Ticks an elastic job takes at most to re-form (its processes restarted: torchrun's rendezvous
// and the checkpoint load); a job stopped longer with a member gone hangs on that member.
inline constexpr int64_t kReformTicks = 120;
inline constexpr double kStoppedShare =
    0.02;  // a work metric this far below its peers' median: stopped
inline constexpr int kStopRun =
    3;  // ticks stopped in a row that count as one stop of a flapping link
// Evidence "metrics" beside the real ones: -1 the machine silent, -2 two sources stopped together,
// -3 the job's pace changed as it began to deviate, -4 a source stopped alone as the job stopped.
inline constexpr int kPaceLed = -3;
inline constexpr int kStoppedWithJob = -4;
constexpr uint32_t Bit(MetricFamily f) { return 1u << static_cast<int>(f); }

// Tick `tick`'s slot in a ring of `n` (ticks before the epoch included).
inline size_t Slot(int64_t tick, int64_t n) { return static_cast<size_t>(((tick % n) + n) % n); }

inline double MedianInPlace(std::vector<double>& v) {
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
  void Clear() {  // forget every flag, keep the clock
    std::fill(flags_.begin(), flags_.end(), 0);
    count_ = 0;
  }
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

struct Detector::Impl {
  DetectorConfig cfg;

  // One (machine, metric) history: its last `denoise_window` samples, and how often it reports (an
  // exporter scraped every 5 s, a trainer that reports once a step).
  struct Series {
    std::vector<double> values;
    std::vector<int64_t> ticks;
    size_t next = 0;      // slot of the next sample
    double interval = 1;  // ticks between its samples (a moving average)
    int64_t last_tick = kNever;
    // This machine's usual offset from its peers on this metric (raw units): learned from ticks
    // where it did not stand out, so healthy heterogeneity (a GPU that always runs 3 C warmer)
    // is not a fault, while a sudden change still is.
    double bias = 0;
    int64_t last_hit = kNever;  // last tick it stood out, and by how much
    double last_z = 0;
    int64_t last_burst = kNever,
            prev_burst = 2 * kNever;  // starts of its last two runs of outlier ticks
    int64_t third_burst = kNever;     // and of the one before (kNever: none)
    // A work metric's stops: runs of ticks at nothing while its peers worked at their usual level
    // (a flapping link stops again and again). `busy_since`: since when its peers have; the
    // current run's start and last tick; the starts of the last three runs that count -- at least
    // `kStopRun` ticks, its peers busy from before its samples fell until after they came back. A
    // machine first into or last out of a stall of the whole job has no such run.
    int64_t busy_since = kNever, stop_start = kNever, last_stop = kNever;
    std::array<int64_t, 3> stop_runs{kNever, kNever, kNever};
    int64_t learned = 0;       // ticks seen in warm-up
    std::vector<double> warm;  // deviations seen in warm-up; their median becomes the bias
    void Add(int64_t now, double v) {
      if (last_tick == now) {  // a second sample in one tick replaces the first
        values[(next + values.size() - 1) % values.size()] = v;
        return;
      }
      if (last_tick != kNever && now > last_tick)
        interval += (std::min(60.0, static_cast<double>(now - last_tick)) - interval) / 8;
      values[next] = v;
      ticks[next] = now;
      next = (next + 1) % values.size();
      last_tick = now;
    }
    double Latest() const { return values[(next + values.size() - 1) % values.size()]; }
    double denoised_now = std::nan("");  // this tick's denoised value (NaN: none)
    // Ticks after which it counts as silent: `quiet`, or three of its usual intervals.
    int64_t Quiet(int quiet) const { return std::max<int64_t>(quiet, std::llround(3 * interval)); }
    // Its samples of the last `window` ticks (of three intervals when it reports more rarely),
    // denoised; NaN when fewer than half of those expected are there.
    double Denoised(int64_t now, std::vector<double>& scratch) const {
      const int window = static_cast<int>(values.size());
      const double horizon = std::max<double>(window, std::ceil(3 * interval));
      const int min_valid =
          std::max(1, std::min(window / 2, static_cast<int>(std::lround(horizon / interval / 2))));
      scratch.clear();
      for (size_t i = 0; i < ticks.size(); ++i) {
        if (static_cast<double>(ticks[i]) > static_cast<double>(now) - horizon)
          scratch.push_back(values[i]);
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
    int metric;  // >= 0, or the evidence codes above (kPaceLed, kStoppedWithJob, ...)
    double z;
    bool silent;
    bool stopped = false;  // a work metric at zero while its peers' is not: the job waits on it
    // Off its peers, but with company (a few machines together): no evidence against it, only a
    // sign for GroupCohorts that a shared component moved them.
    bool company = false;
    // Off its siblings too (the machine's other GPUs or ports on the same metric): one entity of
    // the machine, not the machine's workload -- a second, independent comparison agreeing.
    bool sibling = false;
  };
  // A strong family's evidence that weighs as a weak one's: a training metric off its peers in
  // the direction that says they hold it back (it waits on them longer than they do) stands out
  // but does not hurt the job; a rate of background errors (ErrorWeight::kBackground: corrected,
  // retried) above its peers', where healthy machines show them too, is a magnitude, which needs
  // duration as any other -- healthy links show bursts of them for seconds to a minute.
  bool Aside(int metric, double z) const {
    if (metric < 0) return false;
    if (InBackground(metric)) return true;
    return family[metric] == MetricFamily::kTraining && z * holds_back[metric] < 0;
  }
  bool Aside(const Hit& h) const { return !h.silent && Aside(h.metric, h.z); }
  struct MachineState {
    int group = 0;
    // Membership: the last tick its trainer reported, and whether it is outside the job (the
    // fleet's trainers report and its own never did: an idle hot spare, a machine of another
    // job). A machine outside is compared with no one and its silence is no one's concern.
    int64_t trainer_last = kNever;
    bool outside = false;
    bool idle = false;            // last tick: a GPU work metric at nothing while its peers' worked
    int64_t left = kNever;        // when it left its job (Left), until its trainer reports again
    std::vector<int> components;  // ids in component_names
    int64_t first_tick = kNever, last_tick = kNever;
    Rolling hard, hard_long;      // hard evidence: errors, silence, the job hurt (faulty)
    Rolling corr, corr_long;      // two families or three metrics agree (faulty when it lasts)
    Rolling two;                  // two families agree (faulty over the corroborated window)
    Rolling strong, strong_long;  // hard or corroborated, over the short windows (suspect)
    Rolling weak, weak_long;      // ticks with any evidence (suspect)
    Rolling recent;               // ticks with any evidence, over the continuity window (re-arming)
    Rolling fresh;   // named faulty: ticks of a hard signal it was not named for (a second fault)
    Rolling former;  // named faulty: ticks it still showed what it was named for
    Rolling explained;  // ticks a cohort explained away some of its evidence (lone outliers)
    Rolling grouped;    // ticks it was in a cohort found through a component of the topology
    Rolling cohort;     // ticks it was in any cohort (re-arming its shared_component verdict)
    int named = 0;      // level of its last verdict while not re-armed: 0 none, 1 suspect, 2 faulty
    std::set<int> named_for;  // named faulty: the metrics (and evidence codes) its verdicts gave
    std::set<std::pair<int, double>> named_codes;  // and the error codes (an XID) they showed
    bool component_named = false;  // a shared_component verdict named it (until re-armed)
    // metric (-1 silent) -> (ticks, the z of largest magnitude)
    std::map<int, std::pair<int, double>> evidence;
    std::set<int> stopped;  // work metrics of the evidence at zero
    // Per source: its last report; the last stop looked at and whether the peers still reported
    // that source when it stopped; sources whose gap a monitoring_gap verdict named.
    std::array<int64_t, kMetricSources> source_last, stop_seen;
    std::array<bool, kMetricSources> stop_alone{};
    std::array<int, kMetricSources> gap_run{};  // ticks in a row silent while the peers report it
    std::array<double, kMetricSources> source_interval;  // ticks between its reports (average)
    uint32_t gap_named = 0;
    uint32_t stopped_together = 0;  // the sources of its last sources_stopped evidence
    // Per family: the current run of outlier ticks (gaps up to kRunGap ticks inside).
    std::array<int64_t, kFamilies> run_start, run_last;
    MachineState() {
      source_last.fill(kNever);
      source_interval.fill(1);
      stop_seen.fill(kNever);
      run_start.fill(kNever);
      run_last.fill(kNever);
    }
  };
  // Machines that stand out together on one family: one cause (formats.md's shared_component).
  struct Cohort {
    int component;  // -1: found by their onsets alone
    MetricFamily family;
    std::vector<int> members;
    int64_t onset;
  };

  std::vector<std::vector<Series>> series;  // [metric][machine]
  std::vector<MachineState> machines;
  std::vector<double> spread_ewma;  // per metric: long-run typical spread (a floor for quiet times)
  std::vector<int> priority_rank;   // per metric
  std::vector<MetricFamily> family;  // per metric
  std::vector<MetricSource> source;  // per metric
  std::vector<uint8_t> work;         // per metric: IsWorkMetric
  std::vector<uint8_t> link_state;   // per metric: CountsPerLinkFlap
  std::vector<uint8_t> error_code;   // per metric: IsErrorCode
  std::vector<uint8_t> duration;     // per metric: a training metric that is a duration
  // Per metric: the sign of a deviation that holds the job back (HoldsJobBackSign; training only)
  std::vector<int8_t> holds_back;
  std::array<bool, kMetricSources> source_present{};
  std::map<std::string, int> component_ids;
  std::vector<std::string> component_names;
  std::vector<int> component_size;  // machines per component
  std::vector<Cohort> cohorts;      // this tick's
  // Per peer group, the job's pauses (its trainers stop stepping: a checkpoint, an evaluation):
  // whether it steps, since when its last pause began and when it last resumed.
  struct JobPause {
    bool stepping = false;
    int64_t paused = kNever, resumed = kNever;
    // Whether the last pause re-formed the job: its GPUs went idle, the processes gone (an elastic
    // restart, a scale-down, a preemption) -- not a hang, where every peer spins in NCCL with its
    // GPU busy. This tick's votes of the group's GPU work metrics (idle, all).
    bool reformed = false;
    int idle_votes = 0, work_votes = 0;
  };
  std::vector<JobPause> pauses;
  std::vector<double> level_ewma;  // per metric: long-run typical |median| (a floor when idle)
  // Per metric, per peer group (grown as groups appear): a work metric's long-run typical median
  // (its usual work; groups differ, a pipeline stage with a lighter load works less).
  std::vector<std::vector<double>> work_level;
  // Per metric: whether it counts background errors (ErrorWeightOf), and per peer group their
  // usual rate on a healthy machine (a long-run mean of the group's lower nine tenths).
  std::vector<uint8_t> background;
  std::vector<std::vector<double>> error_rate;
  std::vector<int> sibling_group;                 // per metric: SiblingGroup
  std::vector<std::vector<int>> siblings;         // per sibling group: its metrics
  std::map<std::string, int> sibling_ids;         // sibling key -> group
  std::vector<std::vector<int64_t>> error_ticks;  // ticks each has learned from
  // The job's pace, per training duration: its usual median over every machine, and since when it
  // moved off it (kNever: it did not).
  std::vector<double> pace_usual;
  std::vector<int64_t> pace_moved;
  std::vector<double> thresholds;  // per metric
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
      m.fresh = Rolling(cfg.continuity);
      m.former = Rolling(cfg.continuity);
      m.hard = Rolling(cfg.continuity);
      m.hard_long = Rolling(cfg.long_window);
      m.corr = Rolling(cfg.weak_continuity);
      m.corr_long = Rolling(cfg.weak_long_window);
      m.two = Rolling(cfg.corroborated_continuity);
      m.explained = Rolling(cfg.continuity);
      m.grouped = Rolling(cfg.continuity);
      m.cohort = Rolling(cfg.continuity);
      auto c = cfg.components.find(name);
      if (c != cfg.components.end()) {
        for (const std::string& comp : c->second) {
          auto [it, added] =
              component_ids.try_emplace(comp, static_cast<int>(component_names.size()));
          if (added) {
            component_names.push_back(comp);
            component_size.push_back(0);
          }
          ++component_size[it->second];
          m.components.push_back(it->second);
        }
      }
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
      source.push_back(ClassifySource(name));
      work.push_back(IsWorkMetric(name) ? 1 : 0);
      link_state.push_back(static_cast<uint8_t>(CountsPerLinkFlap(name)));
      error_code.push_back(IsErrorCode(name) ? 1 : 0);
      background.push_back(ErrorWeightOf(name) == ErrorWeight::kBackground ? 1 : 0);
      error_rate.emplace_back();
      error_ticks.emplace_back();
      duration.push_back(ClassifyMetric(name) == MetricFamily::kTraining && IsDuration(name) ? 1
                                                                                             : 0);
      holds_back.push_back(static_cast<int8_t>(HoldsJobBackSign(name)));
      sibling_group.push_back(SiblingGroup(name, static_cast<int>(sibling_group.size())));
      source_present[static_cast<int>(source.back())] = true;
      level_ewma.push_back(0);
      work_level.emplace_back();
      pace_usual.push_back(std::nan(""));
      pace_moved.push_back(kNever);
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
  // A machine named faulty: a hard signal it was not named for (NoteFresh), what its verdicts
  // named (NoteNamed), and a verdict on what is new once that held (NameAgain).
  void NoteFresh(int64_t now, int m, const std::vector<Hit>& hits, bool leads_pace);
  void NoteNamed(int m);
  bool NewCode(int k, int m) const;
  Verdict Name(int m, int level, const Rolling& window, const Frame& f, const Registry& reg);
  Verdict NameAgain(int m, const Frame& f, const Registry& reg);
  // One piece of machine m's evidence as a reader reads it ("X [gpu] off its peers by ...").
  std::string Fact(int m, int metric, int ticks, double z, const char* sep,
                   const std::string& name) const;

  // One frame, in phases over the detector's state (OnFrame is the driver): its cells stored,
  // every metric scored within every peer group, silences noted, then each machine's evidence held
  // against the continuity windows.
  void Ingest(const Frame& f);
  // Metric k's denoised value on every machine this tick (NaN where too few are valid).
  void Denoise(int k, int64_t now, std::vector<double>* denoised);
  // Whether member m left its job: the job re-formed and resumed without it (NotePauses).
  bool Left(const MachineState& m, int64_t now) const;
  int64_t Rejoin(const MachineState& m) const;  // ticks its trainer has to report after a resume
  // Whether m fell silent as its job re-formed, before the job is back long enough to tell.
  bool QuietWithReform(const MachineState& m, int64_t now) const;
  // Per-entity comparison: a metric of one GPU or port (a `gpu`, `device` or `port` label) has
  // siblings, the same metric of the machine's other entities. Metric `id`'s sibling group, or -1.
  int SiblingGroup(const std::string& name, int id);
  // Marks the hits that stand off their siblings as well as off their peers.
  void NoteSiblings(std::vector<std::vector<Hit>>* hits);
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
  // A named machine quiet while its job steps is re-armed, its evidence windows emptied.
  void Rearm(int64_t now, MachineState* s) const;
  // Per machine and source: a source stopped alone is a monitoring gap (a verdict of its own once
  // it lasts); two stopped together are strong evidence against the machine.
  void NoteSources(int64_t now, std::vector<std::vector<Hit>>* hits, const Frame& f,
                   const Registry& reg, std::vector<Verdict>* out);
  // The sources of machine m (its bits in `alone`) that stopped alone as the whole job stopped
  // stepping, while its other metrics stand out (0: none).
  // Each peer group's pauses this tick (`pauses`).
  void NotePauses(int64_t now);
  uint32_t StoppedWithJob(size_t m, uint32_t alone, const std::vector<Hit>& hits) const;
  // Machines standing out together on one family (by onset, or sharing a component): that
  // family's hits are explained away, and a lasting cohort is named as a shared component.
  void GroupCohorts(int64_t now, std::vector<std::vector<Hit>>* hits, const Frame& f,
                    const Registry& reg, std::vector<Verdict>* out);
  void FindCohorts(std::vector<int> ms, MetricFamily fam, int component, int min, int window);
  // This tick's cohorts (`cohorts`), each machine's runs of outliers per family updated.
  void FindAllCohorts(int64_t now, const std::vector<std::vector<Hit>>& hits);
  // Each member's explained and grouped ticks; a cohort that held is named (`out`).
  void NameCohorts(int64_t now, const std::vector<std::vector<Hit>>& hits,
                   const std::vector<uint32_t>& explained, const std::vector<uint8_t>& grouped,
                   const Frame& f, const Registry& reg, std::vector<Verdict>* out);
  Verdict ComponentVerdict(const Cohort& c, const std::vector<std::vector<Hit>>& hits,
                           const Frame& f, const Registry& reg) const;
  // Training duration k's median over every machine against its usual level (pace_moved[k]).
  void NotePace(int k, int64_t now, const std::vector<double>& denoised);
  // The one machine whose deviation began with the job's pace change (-1: none, or several);
  // `*by_links`: only its links, not its GPU, were off its peers.
  int PaceLeader(int64_t now, const std::vector<std::vector<Hit>>& hits, bool* by_links) const;
  // One tick of machine `s` into its continuity windows and its evidence tally.
  void Remember(int64_t now, const std::vector<Hit>& hits, bool hard, bool corr, bool two,
                bool leads_pace, MachineState* s) const;
  // Each machine's hits against the continuity windows: a verdict when it stands out long enough.
  void Conclude(int64_t now, const std::vector<std::vector<Hit>>& hits, const Frame& f,
                const Registry& reg, std::vector<Verdict>* out);

  // Whether error counter k's last burst still counts: bursts within the continuity window keep
  // it for `error_memory_ticks`; three within the long window (a link that flaps every minute)
  // for as long as the last gap between them. A link that went down twice within the weak
  // window's length (a link that goes down every two minutes) keeps it for as long as those
  // downs span: two bursts of a counter of downs, three of one that counts every change (down,
  // then up seconds later: one flap can be two bursts).
  // Whether metric k counts background errors that healthy machines show too (in group g, or in
  // any group): then bursts between quiet spells are what healthy machines look like, and only a
  // rate above theirs for most of the window is evidence. Where healthy machines show none, any
  // lasting error stands out as before.
  bool InBackground(int k, int g = -1) const {
    if (!background[k]) return false;
    const auto& rates = error_rate[static_cast<size_t>(k)];
    for (size_t i = 0; i < rates.size(); ++i) {
      if ((g < 0 || i == static_cast<size_t>(g)) && rates[i] > kBackgroundRate) return true;
    }
    return false;
  }
  bool RepeatingErrors(int k, const Series& s, int64_t now) const {
    const int64_t quiet = now - s.last_hit;
    if (s.last_burst - s.prev_burst <= cfg.continuity && quiet <= cfg.error_memory_ticks)
      return true;
    const int64_t first = link_state[k] == 1 ? s.prev_burst : s.third_burst;
    if (first == kNever) return false;
    const int64_t span = s.last_burst - first;
    if (link_state[k])
      return span <= std::max(cfg.long_window, cfg.weak_long_window) && quiet <= span;
    return span <= cfg.long_window && quiet <= s.last_burst - s.prev_burst;
  }
  // Work metric k of machine m this tick (its peers' median `med`, their usual one `usual`; `hit`:
  // it stood out): stopped, or flapping.
  void NoteWork(int k, int m, int64_t now, double med, double usual, bool hit,
                std::vector<Hit>* hits);
  // Work metric k's usual median in peer group g, taught this tick's `med` (work_level).
  double UsualWork(int k, int g, double med);
  // Background error metric k's spread floor in peer group g (its usual rate taught by this tick).
  double BackgroundSpread(int k, int g, const std::vector<double>& denoised);
  // A work metric's tick for its stops (Series::stop_runs): its peers `busy`, it `stopped` (a
  // stopped hit), its latest sample `at_nothing`.
  void NoteStop(Series* s, int64_t now, bool busy, bool stopped, bool at_nothing) const;
  // Whether work metric series `s` is flapping: three stops within the long window, the last of
  // them begun within the last long window, and its last tick stopped no longer ago than the spell
  // between the last two stops.
  bool Flapping(const Series& s, int64_t now) const {
    if (s.stop_runs[2] == kNever || s.stop_runs[0] - s.stop_runs[2] > cfg.long_window ||
        now - s.stop_runs[0] > cfg.long_window)
      return false;
    return now - s.last_stop <= s.stop_runs[0] - s.stop_runs[1];
  }
  // Whether machine m is past its warm-up on metric k (its usual place known).
  bool Learned(int k, int m) const { return series[k][m].learned >= cfg.warmup_ticks; }
  // Whether a majority of `group` reported `metric` (or anything, metric < 0) within 2 ticks (or
  // two of the metric's intervals).
  bool PeersActive(int group, int metric, int64_t now) const {
    return Majority(group, [&](size_t m) {
      if (machines[m].first_tick == kNever) return -1;
      const int64_t last = metric < 0 ? machines[m].last_tick : series[metric][m].last_tick;
      if (metric >= 0 && last == kNever) return -1;
      const double interval = metric < 0 ? 1.0 : series[metric][m].interval;
      return last >= now - Lately(interval) ? 1 : 0;
    });
  }
  // Whether a majority of the group's machines that ever reported source `src` reported it after
  // tick `after`.
  bool SourceContinued(int group, int src, int64_t after) const {
    return Majority(group, [&](size_t m) {
      const int64_t last = machines[m].source_last[src];
      return last == kNever ? -1 : last > after ? 1 : 0;
    });
  }
  // The same for a source: a majority of the group's machines that ever reported it did so
  // lately (a trainer that reports once a step: within two of its intervals).
  bool SourceActive(int group, int src, int64_t now) const {
    return Majority(group, [&](size_t m) {
      const int64_t last = machines[m].source_last[src];
      if (last == kNever) return -1;
      return last >= now - Lately(machines[m].source_interval[src]) ? 1 : 0;
    });
  }
  // Ticks within which a series reporting every `interval` ticks counts as reporting lately.
  static int64_t Lately(double interval) {
    return std::max<int64_t>(2, std::llround(2 * interval));
  }
  // Whether at least min_peers machines of `group` count (vote(m) >= 0) and most of them vote 1.
  template <typename Vote>
  bool Majority(int group, Vote vote) const {
    int yes = 0, total = 0;
    for (size_t m = 0; m < machines.size(); ++m) {
      if (machines[m].group != group || machines[m].outside) continue;
      const int v = vote(m);
      if (v < 0) continue;
      ++total;
      yes += v;
    }
    return total >= cfg.min_peers && 2 * yes > total;
  }
};

}  // namespace megascope::detector
