// Faulty-machine detection among peers (Minder's idea, docs/architecture.md section 7). Samples are
// aligned into ticks (cumulative `_total` counters become per-second rates); per metric and tick
// each machine's recent values are denoised (a trimmed moving mean), normalised across its peers
// (robust z: median and MAD, never below the spread the peers usually show, so a job that is idle,
// stalled or loading -- every machine alike -- cannot turn noise into outliers), and a machine
// whose |z| exceeds the threshold is an outlier on that metric -- unless so many machines are that
// the whole job moved (a checkpoint, a data stall). A machine that stops reporting while its peers
// report is an outlier too.
//
// A verdict needs corroborated evidence for most of the continuity window: a strong signal (the
// machine silent, an error counter such as XID or ECC, its own training step or compute time off
// its peers) or outliers on two independent metric families at once (GPU, network, NVLink, CPU,
// memory), or on three metrics of one family (three sensors of one device agree). Weak evidence
// -- one family only, like a burst of PFC pauses or a cron job burning CPU -- needs the longer weak
// window, longer than the benign excursions real fleets show (up to a minute). Each verdict carries
// a confidence (a noisy-OR of its evidence families, so more corroboration never lowers it) and the
// evidence itself. FrameDetector is the seam the baselines share; Stream feeds raw samples to one.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "megascope/detector/samples.h"
#include "megascope/detector/semantics.h"
#include "megascope/tracer/verdict.h"

namespace megascope::detector {

// Names of machines and series (semantics.h: `base{labels}` keys), numbered in order of first
// appearance.
class Registry {
 public:
  int Machine(const std::string& name);
  int Metric(const std::string& name);
  const std::string& machine_name(int id) const { return machines_[id]; }
  const std::string& metric_name(int id) const { return metrics_[id]; }
  int machines() const { return static_cast<int>(machines_.size()); }
  int metrics() const { return static_cast<int>(metrics_.size()); }
  int FindMetric(const std::string& name) const;

 private:
  std::vector<std::string> machines_, metrics_;
  std::unordered_map<std::string, int> machine_ids_, metric_ids_;
};

// All samples that fell into one tick [tick*tick_s, (tick+1)*tick_s).
struct Frame {
  int64_t tick = 0;
  double end_s = 0;  // end of the tick: the data time at which a decision on it is made
  struct Cell {
    int machine, metric;
    double value;
  };
  std::vector<Cell> cells;
};

// Something that consumes frames in tick order and may emit verdicts.
class FrameDetector {
 public:
  virtual ~FrameDetector() = default;
  virtual void OnFrame(const Frame& f, const Registry& reg, std::vector<Verdict>* out) = 0;
  virtual const char* Name() const = 0;
};

// The registry's detector inputs, in its order.
std::vector<std::string> DefaultPriority();

struct DetectorConfig {
  double tick_s = 1.0;
  int denoise_window = 8;            // ticks in the denoising window
  int continuity = 30;               // ticks in the continuity window
  double continuity_fraction = 0.8;  // share of the window a machine must be an outlier
  int long_window = 90;  // ticks; catches machines that stand out only part of the time (flapping)
  double long_fraction = 0.5;
  double bias_ticks = 600;  // time constant of each machine's learned offset (ticks not alone)
  int warmup_ticks = 60;    // a machine's first ticks on a metric only teach its usual offset
  double threshold = 6.0;   // robust |z| above which a machine is an outlier on a metric
  std::map<std::string, double> metric_thresholds;  // per-metric overrides
  double spread_floor = 0.35;      // the spread never counts as below this share of its usual value
  double relative_floor = 0.02;    // the spread never counts as below 2% of the peers' median
  double job_wide_fraction = 0.2;  // more outliers than this share: the job moved, not a machine
  int min_peers = 4;               // fewer comparable machines: no judgement
  int error_memory_ticks = 12;  // a repeating error counter's outlier tick stays evidence this long
  int silence_ticks = 10;       // silent this long while peers report: an outlier
  int forget_ticks = 3600;      // silent this long: the machine left the job
  // Evidence of one metric family only (no strong signal, no second family) must hold for
  // `weak_fraction` of `weak_continuity` ticks (or half of `weak_long_window` when flapping). The
  // benign single-metric excursions production shows last up to a minute (a cron job, an incast
  // burst, a NIC dip, a temperature bump), so the weak window is 90 s.
  int weak_continuity = 90;
  // Two metric families agreeing name a machine faulty over this window (80 % of it): longer than
  // the benign excursions of one metric (up to a minute); three metrics of one family need the
  // weak window.
  int corroborated_continuity = 60;
  double weak_fraction = 0.8;
  int weak_long_window = 300;
  // A named machine can be named again once it stood out in at most this share of the last
  // `continuity` ticks while its job stepped (the fault it was named for is over, or was never
  // one), or at once when stronger evidence appears than the verdict had.
  double rearm_fraction = 0.1;
  // Metrics walked first: the detector inputs of the metric-name registry
  // (megascope/tracer/metric_names.h) in its order; the rest follow in name order. A name matches
  // in any of its spellings (with or without `megascope_`, `_total` or `_per_second`).
  std::vector<std::string> priority = DefaultPriority();
  std::map<std::string, std::string> groups;  // machine -> peer group; others share one group
  // Sources (ClassifySource): one silent this long while the machine's others and its peers'
  // report is a monitoring_gap verdict; two of a machine's sources that stop within
  // `together_ticks` of each other are its failure (strong evidence).
  int gap_report_ticks = 30;
  int together_ticks = 10;
  // Shared components: machines whose runs of outliers on one family begin within `cohort_ticks`
  // of each other, at least `cohort_min` of them (or 2 that share a component of `components`,
  // within `component_ticks`), move together for one cause -- a switch, a rack's cooling, a PDU.
  // That family's evidence is not held against any of them; once the cohort held for most of the
  // continuity window, a shared_component verdict names it. Hard evidence (errors, silence) is
  // never explained away.
  int cohort_ticks = 10;
  int cohort_min = 3;
  // The job's pace: a training duration's median over every machine (the step time, the peers'
  // wait in the all-reduce) longer by `pace_change` than its usual level is the job slowing. The
  // one machine whose deviation began within `pace_onset_ticks` of that change, alone, hurts the
  // job: hard evidence against it for as long as the pace stays changed (a thermally throttled GPU
  // sets every rank's step; a cron job or a hot but working machine does not slow the job).
  double pace_change = 0.08;
  int pace_onset_ticks = 15;
  int component_ticks = 30;
  std::map<std::string, std::vector<std::string>> components;  // machine -> "rack:r07", ...
};

class Detector final : public FrameDetector {
 public:
  explicit Detector(DetectorConfig config);
  ~Detector() override;
  void OnFrame(const Frame& f, const Registry& reg, std::vector<Verdict>* out) override;
  const char* Name() const override { return "megascope"; }
  // Puts `machine` into peer group `group` (as DetectorConfig::groups does); effective when the
  // machine has not been seen yet (a spare joining a running job). Returns false otherwise.
  bool SetPeerGroup(const std::string& machine, const std::string& group);
  // Per machine: the largest |z| of its last tick (for megascope_detector_score).
  const std::vector<double>& last_scores() const { return last_scores_; }

  // One metric's part in a verdict: its family, whether it is the machine's silence, and for how
  // many ticks it made the machine stand out.
  struct EvidenceItem {
    MetricFamily family = MetricFamily::kOther;
    bool silent = false;
    int ticks = 0;
    // A strong family's evidence that does not say the machine is at fault (it waits on its
    // peers longer than they do): it weighs as a weak family's.
    bool aside = false;
  };
  // A verdict's confidence from its evidence: a noisy-OR over families (strong ones weigh 0.9, the
  // others and evidence set aside 0.5, each in proportion to how much of `continuity` it held), at
  // most 0.99. Monotone: more evidence, or evidence held longer, never lowers it.
  static double Confidence(const std::vector<EvidenceItem>& evidence, int continuity);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::vector<double> last_scores_;
};

// Aligns raw samples into frames for a FrameDetector. Samples may arrive out of order by up to
// max_lateness_s; later ones (and ones more than 1e15 ticks from 0) are counted in late_samples()
// and ignored. Times may be negative.
class Stream {
 public:
  Stream(FrameDetector* detector, double tick_s = 1.0, double max_lateness_s = 60);
  void Add(const Sample& s);
  void Add(int machine, int metric, double time_s, double value);  // ids from registry()
  // Processes every buffered tick (end of input).
  void Flush();
  std::vector<Verdict> TakeVerdicts() { return std::exchange(verdicts_, {}); }
  Registry& registry() { return reg_; }
  int64_t late_samples() const { return late_; }
  int64_t frames() const { return frames_; }

 private:
  void EmitThrough(int64_t tick);
  void AddAligned(int machine, int metric, double time_s, double value);
  FrameDetector* det_;
  double tick_s_;
  int64_t lateness_ticks_;
  Registry reg_;
  // Raw metric name -> the series ids it feeds and, for a bitmask's bits, their masks (0: whole).
  std::unordered_map<std::string, std::vector<std::pair<int, uint64_t>>> plans_;
  std::map<int64_t, Frame> pending_;
  int64_t next_tick_ = INT64_MIN;  // first tick not yet emitted
  int64_t max_tick_ = INT64_MIN;
  int64_t late_ = 0, frames_ = 0;
  std::vector<Verdict> verdicts_;
  // Cumulative counters: per metric whether it is one, and per (metric, machine) the last sample.
  std::vector<int8_t> counter_;  // -1 unknown yet
  struct Last {
    bool seen = false;
    double time_s = 0, value = 0;
  };
  std::vector<std::vector<Last>> last_;
};

}  // namespace megascope::detector
