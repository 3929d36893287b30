#include "megascope/detector/detector.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>
#include <set>
#include <utility>

#include "megascope/tracer/metric_names.h"

namespace megascope::detector {

// ---------------------------------------------------------------- detector

namespace {

constexpr int64_t kNever = std::numeric_limits<int64_t>::min() / 2;
constexpr int kFamilies = static_cast<int>(MetricFamily::kOther) + 1;
constexpr int64_t kRunGap = 5;  // ticks without a hit that end a run of outlier ticks
// Ticks over which a group's usual rate of background errors is learned (a running mean until
// then), and the usual rate per healthy machine (per second) above which they are background: one
// error in 17 minutes.
constexpr double kBackgroundTicks = 600;
constexpr double kBackgroundRate = 1e-3;
// Ticks an elastic job takes at most to re-form (its processes restarted: torchrun's rendezvous
// and the checkpoint load); a job stopped longer with a member gone hangs on that member.
constexpr int64_t kReformTicks = 120;
constexpr double kStoppedShare = 0.02;  // a work metric this far below its peers' median: stopped
constexpr int kStopRun = 3;  // ticks stopped in a row that count as one stop of a flapping link
// Evidence "metrics" beside the real ones: -1 the machine silent, -2 two sources stopped together,
// -3 the job's pace changed as it began to deviate, -4 a source stopped alone as the job stopped.
constexpr int kPaceLed = -3;
constexpr int kStoppedWithJob = -4;
constexpr uint32_t Bit(MetricFamily f) { return 1u << static_cast<int>(f); }

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

}  // namespace

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
    series[c.metric][c.machine].Add(now, c.value);
    MachineState& m = machines[c.machine];
    if (m.first_tick == kNever) m.first_tick = now;
    m.last_tick = now;
    const int src = static_cast<int>(source[c.metric]);
    if (m.source_last[src] != kNever && now > m.source_last[src]) {
      m.source_interval[src] +=
          (std::min(60.0, static_cast<double>(now - m.source_last[src])) - m.source_interval[src]) /
          8;
    }
    m.source_last[src] = now;
    if (source[c.metric] == MetricSource::kTrainer) m.trainer_last = now;
  }
  // Membership (docs/formats.md section 3): only machines doing the job's work are peers. Where
  // the job's trainers report, a machine whose trainer never did is outside the job; it joins as
  // soon as its trainer reports (a replacement under a new name). A member stays one: a machine
  // that left at a scale-down is not yet told apart from one whose trainer died.
  bool trainers = false;
  for (const MachineState& m : machines) trainers = trainers || m.trainer_last != kNever;
  for (MachineState& m : machines) {
    if (m.left != kNever && m.trainer_last > m.left) m.left = kNever;  // back in the job
    if (m.left == kNever && trainers && Left(m, now)) m.left = now;
    m.outside = trainers && (m.trainer_last == kNever || m.left != kNever);
    m.idle = false;
  }
}

void Detector::Impl::Denoise(int k, int64_t now, std::vector<double>* denoised) {
  for (size_t m = 0; m < machines.size(); ++m) {
    (*denoised)[m] = series[k][m].Denoised(now, scratch);
    series[k][m].denoised_now = (*denoised)[m];
  }
}

int Detector::Impl::SiblingGroup(const std::string& name, int id) {
  SeriesName s = ParseSeries(name);
  const size_t before = s.labels.size();
  std::erase_if(s.labels, [](const auto& l) {
    return l.first == "gpu" || l.first == "device" || l.first == "port";
  });
  if (s.labels.size() == before) return -1;
  auto [it, added] = sibling_ids.try_emplace(s.Key(), static_cast<int>(siblings.size()));
  if (added) siblings.emplace_back();
  siblings[static_cast<size_t>(it->second)].push_back(id);
  return it->second;
}

void Detector::Impl::NoteSiblings(std::vector<std::vector<Hit>>* hits) {
  for (size_t m = 0; m < machines.size(); ++m) {
    for (Hit& h : (*hits)[m]) {
      if (h.metric < 0 || h.silent || h.company || sibling_group[h.metric] < 0) continue;
      const std::vector<int>& group = siblings[static_cast<size_t>(sibling_group[h.metric])];
      const double x = series[h.metric][m].denoised_now;
      vals.clear();
      for (int j : group) {
        const double v = series[static_cast<size_t>(j)][m].denoised_now;
        if (std::isfinite(v)) vals.push_back(v);
      }
      if (!std::isfinite(x) || static_cast<int>(vals.size()) < cfg.min_peers) continue;
      sorted.assign(vals.begin(), vals.end());
      const double med = MedianInPlace(vals);
      for (double& v : vals) v = std::fabs(v - med);
      const double scale =
          std::max({1.4826 * MedianInPlace(vals), cfg.relative_floor * std::fabs(med), 1e-9});
      if (std::fabs(x - med) / scale <= thresholds[h.metric]) continue;
      // Alone among them: most of its siblings sit near the median, not near it.
      const auto near = std::count_if(sorted.begin(), sorted.end(), [&](double v) {
        return std::fabs(v - x) <= thresholds[h.metric] * scale;
      });
      h.sibling = 2 * near < static_cast<long>(sorted.size());
    }
  }
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
    if (machines[m].group == g && !machines[m].outside && std::isfinite(denoised[m])) {
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
  const double usual = work[k] ? UsualWork(k, g, med) : 0;
  if (work[k] && family[k] == MetricFamily::kGpu && usual > 0 &&
      static_cast<size_t>(g) < pauses.size()) {
    ++pauses[static_cast<size_t>(g)].work_votes;
    pauses[static_cast<size_t>(g)].idle_votes += med < kStoppedShare * 10 * usual ? 1 : 0;
  }
  const double scale = std::max({spread, cfg.spread_floor * typical,
                                 cfg.relative_floor * std::max(std::fabs(med), 0.5 * level),
                                 background[k] ? BackgroundSpread(k, g, denoised) : 0.0, 1e-6});
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
  int outliers = 0, together = 0;
  lone.assign(nmach, 0);
  for (int m : members) {
    if (std::fabs(denoised[m] - med) / scale <= thr) continue;
    // A training metric off only against its own usual offset, its value among its peers': back
    // in the pack (an offset learned while its job warmed up), and no machine among its peers
    // holds the job back; it learns its place again.
    if (family[k] == MetricFamily::kTraining &&
        std::fabs(denoised[m] + series[k][m].bias - med) / scale <= thr)
      continue;
    if (alone(sorted, denoised[m])) {
      lone[m] = 1;
      ++outliers;
    } else {
      lone[m] = 2;
      ++together;
    }
  }
  if (outliers > std::max(1.0, cfg.job_wide_fraction * n)) return;  // the job moved
  const bool few = outliers + together <= cfg.job_wide_fraction * n;
  for (int m : members) {
    if (lone[m] == 2 && few && Learned(k, m))
      hits[m].push_back({k, (denoised[m] - med) / scale, false, false, true});
    const size_t before = hits[m].size();
    Judge(k, m, now, denoised[m] - med, scale, thr, lone[m] == 1, &hits[m], &last_scores[m]);
    if (work[k] && med > 0) NoteWork(k, m, now, med, usual, hits[m].size() > before, &hits[m]);
  }
}

void Detector::Impl::NoteWork(int k, int m, int64_t now, double med, double usual, bool hit,
                              std::vector<Hit>* hits) {
  // A work metric (utilisation, traffic) at nothing while the peers' is busy: the machine stopped
  // working and the job waits on it -- as hard as an error counter.
  // Its latest sample decides (a flapping link is at nothing only while it is down).
  Series& sm = series[k][m];
  const bool busy = med >= 0.5 * usual;  // its peers at their usual work
  const bool at_nothing = sm.Latest() <= kStoppedShare * med;
  if (family[k] == MetricFamily::kGpu && busy && at_nothing) machines[m].idle = true;
  if (hit && now - sm.last_tick <= std::llround(sm.interval) && at_nothing) {
    hits->back().stopped = true;
    NoteStop(&sm, now, busy, true, at_nothing);
    return;
  }
  NoteStop(&sm, now, busy, false, at_nothing);
  // Stopped three times within the long window (a link going down and up): it stays stopped
  // through the spells between, as long as the last one lasted.
  if (!hit && Flapping(sm, now)) hits->push_back({k, sm.last_z, false, true});
}

double Detector::Impl::BackgroundSpread(int k, int g, const std::vector<double>& denoised) {
  // Healthy hardware shows a few corrected errors (an NVLink CRC retry, a symbol error): their
  // count over the denoising window is about Poisson, so a healthy machine's rate sits within a
  // few sqrt(rate / window) of the usual rate -- and a fault multiplies it. With no background
  // (no peer ever shows one) this is 0, and one machine's errors stand out as before.
  std::vector<double>& rates = error_rate[static_cast<size_t>(k)];
  if (rates.size() <= static_cast<size_t>(g)) rates.resize(static_cast<size_t>(g) + 1, -1);
  scratch.clear();
  for (int m : members) scratch.push_back(std::max(0.0, denoised[m]));
  std::sort(scratch.begin(), scratch.end());
  const size_t keep = std::max<size_t>(1, scratch.size() * 9 / 10);
  double sum = 0;
  for (size_t i = 0; i < keep && i < scratch.size(); ++i) sum += scratch[i];
  const double now_rate = scratch.empty() ? 0 : sum / static_cast<double>(keep);
  double& usual = rates[static_cast<size_t>(g)];
  auto& seen = error_ticks[static_cast<size_t>(k)];
  if (seen.size() <= static_cast<size_t>(g)) seen.resize(static_cast<size_t>(g) + 1, 0);
  const double n = std::min(kBackgroundTicks, static_cast<double>(++seen[static_cast<size_t>(g)]));
  usual = usual < 0 ? now_rate : usual + (now_rate - usual) / n;
  return std::sqrt(usual / cfg.denoise_window) + usual;
}

double Detector::Impl::UsualWork(int k, int g, double med) {
  std::vector<double>& levels = work_level[static_cast<size_t>(k)];
  if (levels.size() <= static_cast<size_t>(g)) levels.resize(static_cast<size_t>(g) + 1, 0);
  double& usual = levels[static_cast<size_t>(g)];
  usual += (std::fabs(med) - usual) / (usual == 0 ? 1.0 : 600.0);
  return usual;
}

void Detector::Impl::NoteStop(Series* s, int64_t now, bool busy, bool stopped,
                              bool at_nothing) const {
  if (!busy) {
    s->busy_since = kNever;
    return;
  }
  if (s->busy_since == kNever) s->busy_since = now;
  if (stopped) {
    if (s->last_stop != now - 1) s->stop_start = now;
    s->last_stop = now;
    return;
  }
  if (s->last_stop != now - 1 || at_nothing) return;  // no run just ended, or not back at work
  if (s->last_stop - s->stop_start + 1 >= kStopRun &&
      s->busy_since <= s->stop_start - cfg.denoise_window)
    s->stop_runs = {s->stop_start, s->stop_runs[0], s->stop_runs[1]};
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
      s.third_burst = s.prev_burst < kNever ? kNever : s.prev_burst;
      s.prev_burst = s.last_burst;
      s.last_burst = now;
    }
    s.last_hit = now;
    s.last_z = z;
  } else if (family[k] == MetricFamily::kErrors && !InBackground(k, machines[m].group) &&
             RepeatingErrors(k, s, now)) {
    // Errors that repeat with quiet seconds between (ECC corrections; a flapping link going down
    // every minute: three bursts within the long window) stay evidence through the quiet spell,
    // as long as the last one between bursts; a single burst never does, nor two a minute apart
    // (a healthy card corrects an error now and then).
    hits->push_back({k, s.last_z, false});
  } else if (family[k] != MetricFamily::kErrors && machines[m].named < 2) {
    // Errors are never anyone's usual place.
    // Not alone: wherever it sits is its usual place among its peers, so its offset follows
    // it. Offsets are thus learned in every regime: an older GPU generation runs cooler
    // under load but idles like everyone, and all of its machines move together when the
    // job changes regime (a sub-population, never alone). A machine that moves by itself --
    // a throttled GPU landing on the older generation's levels -- is alone against its own
    // usual place, and does not learn while it is. Nor does a machine named faulty: a fault that
    // moves one metric less than the threshold (the slowest machine waits least in the all-reduce)
    // would otherwise become its usual place, and once the fault is over its healthy level would
    // stand out for good.
    s.bias += offset / cfg.bias_ticks;
  }
}

void Detector::Impl::NoteSilences(int k, int64_t now, std::vector<std::vector<Hit>>* hits) {
  const int nmach = static_cast<int>(machines.size());
  if (k < 0) {  // the whole machine
    for (int m = 0; m < nmach; ++m) {
      const MachineState& s = machines[m];
      if (s.outside || QuietWithReform(s, now) || s.last_tick == kNever ||
          now - s.last_tick < cfg.silence_ticks || now - s.last_tick > cfg.forget_ticks)
        continue;
      if (PeersActive(s.group, -1, now)) (*hits)[m].push_back({-1, 0, true});
    }
    return;
  }
  // A machine that stopped reporting this metric while its peers still do.
  for (int m = 0; m < nmach; ++m) {
    const int64_t last = series[k][m].last_tick;
    if (machines[m].outside || last == kNever ||
        now - last < series[k][m].Quiet(cfg.silence_ticks) || now - last > cfg.forget_ticks)
      continue;
    if (machines[m].last_tick < now - cfg.silence_ticks) continue;  // whole machine silent
    const int src = static_cast<int>(source[k]);
    if (machines[m].source_last[src] < now - series[k][m].Quiet(cfg.silence_ticks))
      continue;  // the whole source: NoteSources'
    if (PeersActive(machines[m].group, k, now)) (*hits)[m].push_back({k, 0, true});
  }
}

void Detector::Impl::NotePace(int k, int64_t now, const std::vector<double>& denoised) {
  vals.clear();
  for (double x : denoised) {
    if (!std::isnan(x)) vals.push_back(x);
  }
  if (static_cast<int>(vals.size()) < cfg.min_peers) {
    pace_moved[k] = kNever;  // the job does not step now: no pace to compare
    return;
  }
  const double median = MedianInPlace(vals);
  double& usual = pace_usual[k];
  if (std::isnan(usual)) usual = median;
  // Slower: a duration (the step, the peers' wait) longer than usual. While it is, the usual level
  // holds still; back within half the bar the change is over, and one held past the long weak
  // window is the job's new pace. Otherwise the usual level follows a drift over a minute.
  const double slower = (median - usual) / std::max(std::fabs(usual), 1e-12);
  if (slower > (pace_moved[k] == kNever ? cfg.pace_change : cfg.pace_change / 2)) {
    if (pace_moved[k] == kNever) pace_moved[k] = now;
    if (now - pace_moved[k] <= cfg.weak_long_window) return;
    usual = median;
  }
  pace_moved[k] = kNever;
  usual += (median - usual) / 60;
}

int Detector::Impl::PaceLeader(int64_t now, const std::vector<std::vector<Hit>>& hits,
                               bool* by_links) const {
  int64_t pace_since = kNever;  // the earliest change of the job's pace still on
  for (int64_t moved : pace_moved) {
    if (moved != kNever && (pace_since == kNever || moved < pace_since)) pace_since = moved;
  }
  if (pace_since == kNever) return -1;
  int leader = -1;
  for (size_t m = 0; m < machines.size(); ++m) {
    // What a step is made of must be off its peers, by itself: its GPU (it computes slower) or its
    // links (it moves the job's data slower: a NIC on a downgraded PCIe link stalls its peers with
    // pause frames). A cron job's CPU does not set the job's pace, nor a switch's pause frames,
    // which move several machines together.
    bool gpu = false, links = false;
    for (const Hit& h : hits[m]) {
      if (h.metric < 0 || h.company) continue;
      const MetricFamily fam = family[h.metric];
      gpu = gpu || fam == MetricFamily::kGpu;
      links = links || fam == MetricFamily::kNvlink || fam == MetricFamily::kNetwork;
    }
    if (!gpu && !links) continue;
    const MachineState& s = machines[m];
    int64_t onset = kNever;  // where its deviation began: its earliest run still on
    for (int fi = 0; fi < kFamilies; ++fi) {
      if (s.run_last[fi] != kNever && now - s.run_last[fi] <= kRunGap &&
          (onset == kNever || s.run_start[fi] < onset))
        onset = s.run_start[fi];
    }
    if (onset == kNever || std::llabs(onset - pace_since) > cfg.pace_onset_ticks) continue;
    if (leader >= 0) return -1;  // two began with it: no one machine is to blame
    leader = static_cast<int>(m);
    *by_links = !gpu;
  }
  return leader;
}

void Detector::Impl::Conclude(int64_t now, const std::vector<std::vector<Hit>>& hits,
                              const Frame& f, const Registry& reg, std::vector<Verdict>* out) {
  const int nmach = static_cast<int>(machines.size());
  // Continuity: the same machine must stand out for most of a window. Hard evidence (silence, two
  // sources stopping together, an error counter, a training metric: the job is hurt) names it
  // faulty over the short window; two families agreeing (or three metrics of one) only over the
  // weak window, longer than any benign excursion -- over the short one they make it a suspect,
  // as one family alone does over the weak window. A machine that flaps (a NIC going up and down)
  // stands out only part of the time: the long windows catch it at half.
  auto need = [](double fraction, int window) {
    return static_cast<int>(std::ceil(fraction * window));
  };
  const int strong_need = need(cfg.continuity_fraction, cfg.continuity);
  const int strong_long_need = need(cfg.long_fraction, cfg.long_window);
  const int weak_need = need(cfg.weak_fraction, cfg.weak_continuity);
  const int weak_long_need = need(cfg.long_fraction, cfg.weak_long_window);
  const int two_need = need(cfg.continuity_fraction, cfg.corroborated_continuity);
  auto held = [&](const Rolling& a, const Rolling& b, int na, int nb) -> const Rolling* {
    if (a.Count() >= na) return &a;
    return b.Count() >= nb ? &b : nullptr;
  };
  // The job slowed with it: hard when its GPU is off its peers; with only its links off them, the
  // job's pace is a second family agreeing, held over the weak window -- an incast burst that
  // happens to begin as the job slows lasts a minute at most.
  bool by_links = false;
  const int leader = PaceLeader(now, hits, &by_links);
  for (int m = 0; m < nmach; ++m) {
    MachineState& s = machines[m];
    // Outside the job it is not judged: its windows and verdicts wait, unchanged, for its return
    // (a machine that left named faulty comes back named, not cleared by its absence).
    if (s.outside) continue;
    bool hard = m == leader && !by_links;
    uint32_t families = 0;
    std::array<int, kFamilies> metrics{};
    for (const Hit& h : hits[m]) {
      // The whole machine silent is hard; one metric missing (its ranks between steps while
      // their peers finish one) only counts for its family.
      const MetricFamily fam = h.metric < 0 ? MetricFamily::kErrors : family[h.metric];
      hard = hard || h.metric < 0 || h.stopped || (!h.silent && IsStrong(fam) && !Aside(h));
      families |= Bit(fam);
      if (!h.silent) ++metrics[static_cast<int>(fam)];
    }
    // Corroborated: two families agree, or three sensors of one device (a GPU's utilisation,
    // power and memory all off its peers); the benign excursions move one metric, two at most.
    const bool two = (families & (families - 1)) != 0;
    // Background errors above their peers' (a magnitude) count as a corroborated signal: a
    // suspect over the short window, faulty once they outlast a benign spell (the weak window).
    const bool lasting_errors = std::any_of(hits[m].begin(), hits[m].end(), [&](const Hit& h) {
      return h.metric >= 0 && !h.silent && InBackground(h.metric);
    });
    // One GPU or port off its siblings as well as off its peers: two comparisons agreeing.
    const bool by_siblings =
        std::any_of(hits[m].begin(), hits[m].end(), [](const Hit& h) { return h.sibling; });
    const bool corr = two || m == leader || lasting_errors || by_siblings ||
                      *std::max_element(metrics.begin(), metrics.end()) >= 3;
    const bool any = !hits[m].empty();
    s.recent.Push(now, any);
    Rearm(now, &s);
    if (s.named >= 2) NoteFresh(now, m, hits[m], m == leader && !by_links);
    Remember(now, hits[m], hard, corr, two, m == leader, &s);
    int level = 0;
    const Rolling* window = held(s.hard, s.hard_long, strong_need, strong_long_need);
    if (window == nullptr) window = held(s.two, s.two, two_need, two_need);
    if (window == nullptr) window = held(s.corr, s.corr_long, weak_need, weak_long_need);
    if (window != nullptr) {
      level = 2;
    } else {
      window = held(s.strong, s.strong_long, strong_need, strong_long_need);
      if (window == nullptr) window = held(s.weak, s.weak_long, weak_need, weak_long_need);
      if (window != nullptr) level = 1;
    }
    if (level > s.named) {
      out->push_back(Name(m, level, *window, f, reg));
    } else if (s.named >= 2 && s.fresh.Count() >= strong_need) {
      out->push_back(NameAgain(m, f, reg));
    }
  }
}

void Detector::Impl::Remember(int64_t now, const std::vector<Hit>& hits, bool hard, bool corr,
                              bool two, bool leads_pace, MachineState* s) const {
  const bool any = !hits.empty();
  s->hard.Push(now, hard);
  s->hard_long.Push(now, hard);
  s->corr.Push(now, corr);
  s->two.Push(now, two);
  s->corr_long.Push(now, corr);
  s->strong.Push(now, hard || corr);
  s->strong_long.Push(now, hard || corr);
  s->weak.Push(now, any);
  s->weak_long.Push(now, any);
  if (s->weak_long.Count() == 0) {
    s->evidence.clear();
    s->stopped.clear();
  }
  for (const Hit& h : hits) {
    if (h.stopped) s->stopped.insert(h.metric);
    auto& e = s->evidence[h.metric];
    ++e.first;
    if (std::fabs(h.z) > std::fabs(e.second)) e.second = h.z;
  }
  if (leads_pace) ++s->evidence[kPaceLed].first;
}

// A hard signal of a machine named faulty that its verdicts did not give: a second fault that
// began before the first ended (a repaired machine back with a new one). An error it had not shown
// -- a counter, or a code (XID 74 after XID 48) -- is news at once; the job hurt by it (longer
// steps, the job's pace) only once what it was named for is over, as the first fault's course
// hurts the job too. Its going silent or stopping work once named is that course, never news.
void Detector::Impl::NoteFresh(int64_t now, int m, const std::vector<Hit>& hits, bool leads_pace) {
  MachineState& s = machines[static_cast<size_t>(m)];
  bool error = false, hurt = leads_pace && s.named_for.count(kPaceLed) == 0, former = false;
  for (const Hit& h : hits) {
    former = former || s.named_for.count(h.metric) > 0;
    if (h.metric < 0 || h.silent || !IsStrong(family[h.metric]) || Aside(h)) continue;
    const bool is_error = family[h.metric] == MetricFamily::kErrors;
    if (s.named_for.count(h.metric) > 0 && !NewCode(h.metric, m)) continue;
    if (error_code[h.metric] && series[h.metric][m].Latest() == 0) continue;  // no code now
    (is_error ? error : hurt) = true;
  }
  s.former.Push(now, former);
  s.fresh.Push(now, error || (hurt && s.former.Count() == 0));
}

// Whether error code metric k of machine m shows a code its verdicts have not given.
bool Detector::Impl::NewCode(int k, int m) const {
  if (!error_code[k]) return false;
  const double code = series[k][m].Latest();
  return code != 0 && machines[static_cast<size_t>(m)].named_codes.count({k, code}) == 0;
}

// What a faulty verdict on machine m gave: its evidence's metrics and the error codes they show.
void Detector::Impl::NoteNamed(int m) {
  MachineState& s = machines[static_cast<size_t>(m)];
  for (const auto& e : s.evidence) {
    s.named_for.insert(e.first);
    if (e.first >= 0 && error_code[e.first]) {
      const double code = series[e.first][m].Latest();
      if (code != 0) s.named_codes.insert({e.first, code});
    }
  }
}

// Named at `level` over `window` (a suspect, or faulty).
Verdict Detector::Impl::Name(int m, int level, const Rolling& window, const Frame& f,
                             const Registry& reg) {
  machines[static_cast<size_t>(m)].named = level;
  Verdict v = MakeVerdict(m, window, f, reg);
  if (level >= 2) NoteNamed(m);
  return v;
}

// Named faulty again on what is new: the evidence its earlier verdicts gave is left out, so the
// verdict says what the second fault shows, and its window is the one the new signal held over.
Verdict Detector::Impl::NameAgain(int m, const Frame& f, const Registry& reg) {
  MachineState& s = machines[static_cast<size_t>(m)];
  for (int k : s.named_for) {
    if (k < 0 || !NewCode(k, m)) s.evidence.erase(k);
  }
  Verdict v = MakeVerdict(m, s.fresh, f, reg);
  NoteNamed(m);
  s.fresh.Clear();
  return v;
}

// Re-armed once it no longer stands out while its job steps (the fault is over, or was never one;
// a checkpoint idles every machine, and the fault is back as the job resumes). Its windows still
// hold the old fault's evidence -- the long ones for minutes after it ended -- so they are emptied,
// with the evidence they gathered: a new fault soon after is judged, explained and weighed on its
// own evidence, not hidden behind the verdict given.
void Detector::Impl::Rearm(int64_t now, MachineState* s) const {
  const JobPause& job = pauses[static_cast<size_t>(s->group)];
  const bool stepped =
      job.paused == kNever || (job.stepping && now - job.resumed >= cfg.continuity);
  if (s->named == 0 || !stepped || s->recent.Count() > cfg.rearm_fraction * cfg.continuity) return;
  s->named = 0;
  s->named_for.clear();
  s->named_codes.clear();
  for (Rolling* r : {&s->hard, &s->hard_long, &s->corr, &s->two, &s->corr_long, &s->strong,
                     &s->strong_long, &s->weak, &s->weak_long, &s->fresh, &s->former})
    r->Clear();
  s->evidence.clear();
  s->stopped.clear();
}

void Detector::Impl::NotePauses(int64_t now) {
  pauses.resize(group_ids.size());
  for (size_t g = 0; g < pauses.size(); ++g) {
    JobPause& p = pauses[g];
    const bool stepping =
        SourceActive(static_cast<int>(g), static_cast<int>(MetricSource::kTrainer), now);
    if (p.stepping && !stepping) {
      p.paused = now;
      p.reformed = false;
    }
    if (!p.stepping && stepping) p.resumed = now;
    p.stepping = stepping;
    if (!stepping && p.paused != kNever && p.work_votes > 0 && 2 * p.idle_votes > p.work_votes)
      p.reformed = true;
    p.idle_votes = p.work_votes = 0;
  }
}

int64_t Detector::Impl::Rejoin(const MachineState& m) const {
  const auto trainer = static_cast<size_t>(MetricSource::kTrainer);
  return std::max<int64_t>(cfg.silence_ticks, std::llround(3 * m.source_interval[trainer]));
}

bool Detector::Impl::Left(const MachineState& m, int64_t now) const {
  // Its job re-formed (its GPUs idle: the processes restarted) and resumed without it: its trainer
  // did not come back, and it does no work -- it is silent, or its GPUs idle while its peers'
  // work. A machine whose trainer is merely late, its GPUs busy, is still a member; so is one
  // named faulty, whose absence is its fault's course (it comes back named, not anew).
  if (static_cast<size_t>(m.group) >= pauses.size() || m.named >= 2) return false;
  const JobPause& p = pauses[static_cast<size_t>(m.group)];
  if (!p.reformed || !p.stepping || p.resumed <= p.paused || m.trainer_last >= p.resumed ||
      now - p.resumed < Rejoin(m))
    return false;
  return now - m.last_tick >= cfg.silence_ticks || m.idle;
}

bool Detector::Impl::QuietWithReform(const MachineState& m, int64_t now) const {
  // Gone as its job re-forms: wait for the job to resume (Left decides then) -- unless the job
  // hangs on it, its peers' GPUs spinning, which is no re-forming.
  if (static_cast<size_t>(m.group) >= pauses.size() || m.last_tick == kNever) return false;
  const JobPause& p = pauses[static_cast<size_t>(m.group)];
  if (!p.reformed || m.last_tick < p.paused - 2 * cfg.together_ticks) return false;
  if (!p.stepping) return now - p.paused < kReformTicks;  // longer: the job hangs on it
  return now - p.resumed < Rejoin(m);
}

uint32_t Detector::Impl::StoppedWithJob(size_t m, uint32_t alone,
                                        const std::vector<Hit>& hits) const {
  // A GPU that falls off the bus stops its exporter, and the job stops at its next collective,
  // within a step: every trainer stops, so the machine's own trainer never stopped alone (its
  // peers never reported a step after it). A source that stopped alone as the job's trainers
  // stopped is its failure. Not when the machine is otherwise like its peers: an exporter that
  // restarts as a checkpoint begins stops alone as the job stops too, and leaves the host as it
  // was.
  const MachineState& s = machines[m];
  const int job = static_cast<int>(MetricSource::kTrainer);
  const int64_t job_last = s.source_last[job];
  if (job_last == kNever || pauses[static_cast<size_t>(s.group)].stepping) return 0;
  const auto every = std::max<int64_t>(1, std::llround(s.source_interval[job]));
  uint32_t found = 0;
  for (int src = 0; src < kMetricSources; ++src) {
    if (src == job || !(alone >> src & 1u)) continue;
    const int64_t last = s.source_last[src];
    // The peers' trainers stepped until about then (one step before it at most) and not after.
    if (std::llabs(job_last - last) <= cfg.together_ticks + every &&
        SourceContinued(s.group, job, last - cfg.together_ticks - every) &&
        !SourceContinued(s.group, job, last + cfg.together_ticks))
      found |= 1u << src;
  }
  if (found == 0) return 0;
  for (const Hit& h : hits) {
    if (h.metric >= 0 && !h.silent && !h.company &&
        !(found >> static_cast<int>(source[h.metric]) & 1u) &&
        static_cast<int>(source[h.metric]) != job)
      return found | 1u << job;
  }
  return 0;
}

void Detector::Impl::NoteSources(int64_t now, std::vector<std::vector<Hit>>* hits, const Frame& f,
                                 const Registry& reg, std::vector<Verdict>* out) {
  for (size_t m = 0; m < machines.size(); ++m) {
    MachineState& s = machines[m];
    if (s.outside || QuietWithReform(s, now)) continue;
    if (s.last_tick == kNever || now - s.last_tick >= cfg.silence_ticks) continue;  // all silent
    uint32_t gaps = 0, alone = 0;
    for (int src = 0; src < kMetricSources; ++src) {
      const int64_t last = s.source_last[src];
      const int run = std::exchange(s.gap_run[src], 0);
      if (!source_present[src] || (last != kNever && now - last > cfg.forget_ticks)) continue;
      const int64_t every = std::max<int64_t>(1, std::llround(s.source_interval[src]));
      if (last != kNever && now - last == 2 * every && s.stop_seen[src] != last) {
        // Two of its intervals after its last report (a lost scrape is one): did its peers
        // report it since, a whole interval later? (At a checkpoint every trainer stops.)
        s.stop_seen[src] = last;
        s.stop_alone[src] = SourceContinued(s.group, src, last + every - 1);
      }
      const int64_t quiet =
          std::max<int64_t>(cfg.silence_ticks, std::llround(3 * s.source_interval[src]));
      if (last != kNever && now - last < quiet) {
        s.gap_named &= ~(1u << src);  // reporting
        continue;
      }
      if (last == kNever && now - s.first_tick < cfg.silence_ticks) continue;
      if (last != kNever && s.stop_seen[src] == last && s.stop_alone[src]) alone |= 1u << src;
      if (SourceActive(s.group, src, now)) {
        gaps |= 1u << src;
        s.gap_run[src] = run + 1;
      }
    }
    if (gaps == 0) continue;
    if (const uint32_t with_job = StoppedWithJob(m, alone, (*hits)[m]); with_job != 0) {
      s.stopped_together = with_job;
      (*hits)[m].push_back({kStoppedWithJob, 0, true});
      continue;
    }
    // Two sources that each stopped while the peers went on, within seconds: the machine failed.
    uint32_t together = 0;
    for (int a = 0; a < kMetricSources; ++a) {
      for (int b = a + 1; b < kMetricSources; ++b) {
        if ((alone >> a & 1u) && (alone >> b & 1u) &&
            std::llabs(s.source_last[a] - s.source_last[b]) <= cfg.together_ticks)
          together |= (1u << a) | (1u << b);
      }
    }
    if (together != 0) {
      s.stopped_together = together;
      (*hits)[m].push_back({-2, 0, true});
      continue;
    }
    // A machine that stands out otherwise: the gap is part of what is wrong with it, not a
    // monitoring problem.
    if (s.named > 0 || s.recent.Count() > cfg.rearm_fraction * cfg.continuity) continue;
    for (int src = 0; src < kMetricSources; ++src) {
      if (!(gaps >> src & 1u) || (s.gap_named >> src & 1u) || s.gap_run[src] < cfg.gap_report_ticks)
        continue;
      const int64_t since = now - s.gap_run[src] + 1;  // since its peers report it
      s.gap_named |= 1u << src;
      Verdict v;
      v.kind = VerdictKind::kMonitoringGap;
      v.cause = megascope::Name(Cause::kSourceSilent);
      v.root_nodes = {reg.machine_name(static_cast<int>(m))};
      v.detected_at_ns = static_cast<int64_t>(f.end_s * 1e9);
      v.onset_at_ns = static_cast<int64_t>(static_cast<double>(since) * cfg.tick_s * 1e9);
      v.confidence = 0.9;
      const char* name = MetricSourceName(static_cast<MetricSource>(src));
      v.evidence.emplace_back(name);
      char buf[320];
      std::snprintf(buf, sizeof(buf),
                    "%s's %s sent nothing for %d s (%s) while its other sources and its "
                    "peers' %s report: a monitoring gap (an exporter restarting or not deployed), "
                    "not evidence against the machine",
                    reg.machine_name(static_cast<int>(m)).c_str(), name, s.gap_run[src],
                    s.source_last[src] == kNever ? "never since it joined" : "it stopped", name);
      v.explanation = buf;
      out->push_back(std::move(v));
    }
  }
}

void Detector::Impl::FindCohorts(std::vector<int> ms, MetricFamily fam, int component, int min,
                                 int window) {
  const int fi = static_cast<int>(fam);
  std::sort(ms.begin(), ms.end(),
            [&](int a, int b) { return machines[a].run_start[fi] < machines[b].run_start[fi]; });
  size_t i = 0;
  while (i < ms.size()) {
    size_t j = i;
    const int64_t first = machines[ms[i]].run_start[fi];
    while (j < ms.size() && machines[ms[j]].run_start[fi] - first <= window) ++j;
    if (static_cast<int>(j - i) < min) {
      ++i;
      continue;
    }
    cohorts.push_back(
        {component, fam,
         std::vector<int>(ms.begin() + static_cast<long>(i), ms.begin() + static_cast<long>(j)),
         first});
    i = j;
  }
}

void Detector::Impl::GroupCohorts(int64_t now, std::vector<std::vector<Hit>>* hits_io,
                                  const Frame& f, const Registry& reg, std::vector<Verdict>* out) {
  std::vector<std::vector<Hit>>& hits = *hits_io;
  const int nmach = static_cast<int>(machines.size());
  FindAllCohorts(now, hits);
  std::vector<uint32_t> explained(nmach, 0);
  std::vector<uint8_t> grouped(nmach, 0);
  for (const Cohort& c : cohorts) {
    for (int m : c.members) {
      explained[m] |= Bit(c.family);
      grouped[m] = grouped[m] || c.component >= 0;
    }
  }
  NameCohorts(now, hits, explained, grouped, f, reg, out);
  for (int m = 0; m < nmach; ++m) {
    auto& h = hits[m];
    h.erase(std::remove_if(h.begin(), h.end(),
                           [&](const Hit& x) {
                             return x.company || (x.metric >= 0 && !x.stopped &&
                                                  (explained[m] & Bit(family[x.metric])) != 0);
                           }),
            h.end());
  }
}

void Detector::Impl::FindAllCohorts(int64_t now, const std::vector<std::vector<Hit>>& hits) {
  const int nmach = static_cast<int>(machines.size());
  // A deviation that ceased only while the whole job paused and came back as it resumed is the
  // same deviation: its onset stays where it began. Else every machine still faulty after a
  // checkpoint would begin again at the same tick, a cohort by onset, and be explained away.
  // (The trainers' pause is seen up to two steps late; the deviation may return a step before
  // they report again.)
  const int64_t slack = kRunGap + cfg.cohort_ticks;
  auto across_pause = [&](const MachineState& s, int fi) {
    const JobPause& p = pauses[static_cast<size_t>(s.group)];
    return p.paused != kNever && s.run_last[fi] != kNever && s.run_last[fi] >= p.paused - slack &&
           (!p.stepping || (p.resumed > p.paused && now - p.resumed <= slack));
  };
  std::array<std::vector<int>, kFamilies> on;  // machines standing out on each family now
  for (int m = 0; m < nmach; ++m) {
    uint32_t fams = 0;
    for (const Hit& h : hits[m]) {
      if (h.metric >= 0 && !h.stopped && family[h.metric] != MetricFamily::kErrors)
        fams |= Bit(family[h.metric]);
    }

    MachineState& s = machines[m];
    for (int fi = 0; fi < kFamilies; ++fi) {
      if (!(fams >> fi & 1u)) continue;
      if (now - s.run_last[fi] > kRunGap && !across_pause(s, fi)) s.run_start[fi] = now;
      s.run_last[fi] = now;
      on[fi].push_back(m);
    }
  }
  cohorts.clear();
  for (int fi = 0; fi < kFamilies; ++fi) {
    if (on[fi].size() < 2) continue;
    const auto fam = static_cast<MetricFamily>(fi);
    FindCohorts(on[fi], fam, -1, cfg.cohort_min, cfg.cohort_ticks);
    std::map<int, std::vector<int>> by_component;
    for (int m : on[fi]) {
      for (int c : machines[m].components) by_component[c].push_back(m);
    }
    // At least two of the component's machines, and a quarter of them (a row of 32 racks' worth
    // of machines is no cohort because two of them deviate).
    for (auto& [c, ms] : by_component) {
      const int need = std::max(2, (component_size[c] + 3) / 4);
      if (static_cast<int>(ms.size()) >= need)
        FindCohorts(std::move(ms), fam, c, need, cfg.component_ticks);
    }
  }
}

void Detector::Impl::NameCohorts(int64_t now, const std::vector<std::vector<Hit>>& hits,
                                 const std::vector<uint32_t>& explained,
                                 const std::vector<uint8_t>& grouped, const Frame& f,
                                 const Registry& reg, std::vector<Verdict>* out) {
  const int nmach = static_cast<int>(machines.size());
  const int need = static_cast<int>(std::ceil(cfg.continuity_fraction * cfg.continuity));
  for (int m = 0; m < nmach; ++m) {
    // Explained away: evidence (not mere company) of a family its cohort moved on.
    bool lone = false;
    for (const Hit& h : hits[m]) {
      lone = lone || (h.metric >= 0 && !h.company && !h.stopped &&
                      (explained[m] & Bit(family[h.metric])) != 0);
    }
    machines[m].explained.Push(now, lone);
    machines[m].grouped.Push(now, grouped[m] != 0);
    machines[m].cohort.Push(now, explained[m] != 0);
  }
  // Named once it held for most of the continuity window: a cohort by onset alone only when it
  // explained evidence away (machines that merely keep company -- another GPU generation at a
  // change of regime -- are a sub-population, never named); one the topology knows always.
  for (const Cohort& c : cohorts) {
    bool due = false, fresh = false;
    for (int m : c.members) {
      const MachineState& s = machines[m];
      due = due || (c.component >= 0 ? s.grouped : s.explained).Count() >= need;
      fresh = fresh || !s.component_named;
    }
    if (!due || !fresh) continue;
    for (int m : c.members) machines[m].component_named = true;
    out->push_back(ComponentVerdict(c, hits, f, reg));
  }
  // Re-armed once out of every cohort for most of the window (not while a member that just
  // joined has few cohort ticks yet: that named the same cohort again every tick).
  for (int m = 0; m < nmach; ++m) {
    MachineState& s = machines[m];
    if (explained[m] == 0 && s.cohort.Count() <= cfg.rearm_fraction * cfg.continuity)
      s.component_named = false;
  }
}

Verdict Detector::Impl::ComponentVerdict(const Cohort& c, const std::vector<std::vector<Hit>>& hits,
                                         const Frame& f, const Registry& reg) const {
  Verdict v;
  v.kind = VerdictKind::kSharedComponent;
  v.cause =
      megascope::Name(c.component >= 0 ? Cause::kComponentOutlier : Cause::kSimultaneousOnset);
  if (c.component >= 0) v.group = component_names[c.component];
  std::set<std::string> metrics;
  std::string names;
  for (int m : c.members) {
    v.root_nodes.push_back(reg.machine_name(m));
    names += (names.empty() ? "" : ", ") + reg.machine_name(m);
    for (const Hit& h : hits[m]) {
      if (h.metric >= 0 && family[h.metric] == c.family) metrics.insert(reg.metric_name(h.metric));
    }
  }
  v.evidence.assign(metrics.begin(), metrics.end());
  v.detected_at_ns = static_cast<int64_t>(f.end_s * 1e9);
  v.onset_at_ns = static_cast<int64_t>(static_cast<double>(c.onset) * cfg.tick_s * 1e9);
  v.confidence = c.component >= 0 ? 0.9 : 0.7;
  const std::string where = c.component >= 0
                                ? "sharing " + v.group
                                : "their deviations beginning within " +
                                      std::to_string(cfg.cohort_ticks) + " s of each other";
  v.explanation = std::to_string(c.members.size()) + " machines (" + names +
                  ") stand out together on " + MetricFamilyName(c.family) + " metrics, " + where +
                  ": one shared cause (a switch, a rack's cooling or power), not " +
                  std::to_string(c.members.size()) +
                  " faulty machines; none is blamed for that evidence";
  return v;
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
    if (d.duration[k]) d.NotePace(k, now, denoised);
    for (int g = 0; g < static_cast<int>(d.group_ids.size()); ++g)
      d.ScoreGroup(k, g, now, denoised, &hits, &last_scores_);
    d.NoteSilences(k, now, &hits);
  }
  d.NoteSilences(-1, now, &hits);
  d.NoteSiblings(&hits);
  d.NotePauses(now);
  d.NoteSources(now, &hits, f, reg, out);
  d.GroupCohorts(now, &hits, f, reg, out);
  d.Conclude(now, hits, f, reg, out);
}

double Detector::Confidence(const std::vector<EvidenceItem>& evidence, int continuity) {
  // Noisy-OR over metric families: each family's evidence is a chance the machine is faulty,
  // weighted by its kind and by how long it held. Adding evidence never lowers the result.
  std::map<MetricFamily, double> best;
  for (const EvidenceItem& e : evidence) {
    const double weight = e.silent || (IsStrong(e.family) && !e.aside) ? 0.9 : 0.5;
    const double p = weight * std::min(1.0, static_cast<double>(e.ticks) / std::max(1, continuity));
    double& b = best[e.silent ? MetricFamily::kErrors : e.family];
    b = std::max(b, p);
  }
  double miss = 1;
  for (const auto& [fam, p] : best) miss *= 1 - p;
  return std::min(0.99, 1 - miss);
}

std::string Detector::Impl::Fact(int m, int metric, int ticks, double z, const char* sep,
                                 const std::string& name) const {
  const MachineState& s = machines[m];
  char buf[240];
  if (metric == -1) {
    std::snprintf(buf, sizeof(buf), "%ssent no samples for %d s", sep, ticks);
  } else if (metric == kPaceLed) {
    std::snprintf(buf, sizeof(buf),
                  "%sits deviation began within %d s of the job's pace changing by over %.0f%% "
                  "(its step time, or its peers' wait), and no other machine's did (%d ticks)",
                  sep, cfg.pace_onset_ticks, 100 * cfg.pace_change, ticks);
  } else if (metric == -2 || metric == kStoppedWithJob) {
    std::string which;
    for (int src = 0; src < kMetricSources; ++src) {
      if (s.stopped_together >> src & 1u)
        which += (which.empty() ? "" : " and ") +
                 std::string(MetricSourceName(static_cast<MetricSource>(src)));
    }
    if (metric == -2) {
      std::snprintf(
          buf, sizeof(buf),
          "%sits %s stopped within %d s of each other while its peers' went on (%d ticks)", sep,
          which.c_str(), cfg.together_ticks, ticks);
    } else {
      std::snprintf(buf, sizeof(buf),
                    "%sits %s stopped as the whole job's trainers did (within %d s), the "
                    "exporter's alone while its peers' went on, and its other metrics stand out: "
                    "the job stopped with it (%d ticks)",
                    sep, which.c_str(), cfg.together_ticks, ticks);
    }
  } else if (s.stopped.count(metric) > 0) {
    std::snprintf(buf, sizeof(buf), "%s%s [%s] at nothing while its peers work (%d ticks)", sep,
                  name.c_str(), MetricFamilyName(family[metric]), ticks);
  } else if (z == 0) {
    std::snprintf(buf, sizeof(buf), "%s%s missing while peers report it (%d ticks)", sep,
                  name.c_str(), ticks);
  } else if (z > 1000) {  // the peers are flat (an event counter at zero)
    std::snprintf(buf, sizeof(buf), "%s%s nonzero while its peers stay flat (%d ticks)", sep,
                  name.c_str(), ticks);
  } else {
    std::snprintf(buf, sizeof(buf), "%s%s [%s] off its peers by up to %.1f robust sd%s (%d ticks)",
                  sep, name.c_str(), MetricFamilyName(family[metric]), std::fabs(z),
                  Aside(metric, z) && !InBackground(metric)
                      ? ", held back by them"
                      : (InBackground(metric) ? ", above the errors its peers correct" : ""),
                  ticks);
  }
  return buf;
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
  auto rank = [&](int metric) { return metric < 0 ? metric : d.priority_rank[metric]; };
  auto strong = [&](const auto& e) {
    return e.first < 0 || (IsStrong(d.family[e.first]) && !d.Aside(e.first, e.second.second));
  };
  std::sort(ev.begin(), ev.end(), [&](const auto& a, const auto& b) {
    const bool a_major = a.second.first >= half, b_major = b.second.first >= half;
    if (a_major != b_major) return a_major;
    if (strong(a) != strong(b)) return strong(a);
    if (rank(a.first) != rank(b.first)) return rank(a.first) < rank(b.first);
    return a.first < b.first;
  });
  std::vector<EvidenceItem> items;
  items.reserve(ev.size());
  for (const auto& [metric, stat] : ev) {
    items.push_back({metric < 0 ? MetricFamily::kOther : d.family[metric],
                     metric < 0 || s.stopped.count(metric) > 0, stat.first,
                     d.Aside(metric, stat.second)});
  }
  Verdict v;
  v.kind = VerdictKind::kFaultyMachine;
  v.level = s.named >= 2 ? VerdictLevel::kFaulty : VerdictLevel::kSuspect;
  v.root_nodes = {reg.machine_name(m)};
  v.detected_at_ns = static_cast<int64_t>(f.end_s * 1e9);
  v.onset_at_ns = static_cast<int64_t>(static_cast<double>(onset) * cfg.tick_s * 1e9);
  // Held as long as a verdict needs: full weight (a hard signal at 0.9 when it is named).
  v.confidence =
      Confidence(items, static_cast<int>(std::ceil(cfg.continuity_fraction * cfg.continuity)));
  const bool silent = !ev.empty() && ev.front().first == -1;
  v.cause = silent ? "machine_silent" : "metric_outlier";
  std::string facts;
  for (const auto& [metric, stat] : ev) {
    std::string name = metric == -1                ? "no_samples"
                       : metric == -2              ? "sources_stopped"
                       : metric == kPaceLed        ? "job_slowed_with_it"
                       : metric == kStoppedWithJob ? "stopped_with_job"
                                                   : reg.metric_name(metric);
    v.evidence.push_back(name);
    if (facts.size() >= 240) continue;
    facts += Fact(m, metric, stat.first, stat.second, facts.empty() ? "" : "; ", name);
  }
  char head[256];
  std::snprintf(head, sizeof(head),
                " stood out from its peers for %d of the last %d ticks (%s, confidence %.2f): ",
                window.Count(), window.Size(),
                s.named >= 2 ? "faulty: a hard signal, or two families agreeing for longer than "
                               "a benign excursion lasts"
                             : "suspect: corroborated only briefly, or one family alone",
                v.confidence);
  v.explanation = reg.machine_name(m) + head + facts;
  return v;
}

}  // namespace megascope::detector
