// A second synthetic fleet, written independently of fleet_sim.h to evaluate the detector on data
// whose noise it was not tuned on. It looks like what a Prometheus server scraping DCGM and
// node exporters holds for one synchronous training job:
//  - exporter-style names and units (DCGM_FI_DEV_GPU_UTIL in percent, cumulative `_total` counters
//    for bytes, ECC errors and NIC carrier changes, an XID gauge holding the last XID code);
//  - pipeline stages with different baselines and no groups file; two GPU generations in one job;
//  - autocorrelated, heavy-tailed noise (AR(1) with Student-t innovations), a step rhythm sampled
//    at 1 Hz, slow drifts, clock skew between machines, exporter gaps of a few seconds;
//  - job-wide events (loading at start, checkpoints, evaluations, data stalls, restarts) that reach
//    machines seconds apart;
//  - benign single-machine excursions of 5-60 s on one metric (a cron job burning CPU, an incast
//    burst of PFC pauses, a short NIC dip, a temperature bump), persistently hot healthy GPUs;
//  - faults (production's kinds and signatures, from Minder's and MegaScale's papers) that may
//  overlap in time, and may be
//    present from the first sample. A fatal fault hangs every peer until the job restarts.
// Everything is a function of (seed, configuration): the same scenario gives the same samples.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "megascope/detector/samples.h"

namespace megascope::detector {

struct PromFault {
  std::string type;  // one of PromFleetFaultTypes()
  int machine = 0;
  double start_s = 0;  // from the start of the run
  double duration_s = 600;
};

struct PromFleetConfig {
  int machines = 32;
  double minutes = 60;
  uint64_t seed = 1;
  double start_s = 1764000000;  // timestamp of the run's start
  int stages = 4;               // pipeline stages, each with its own GPU and network baseline
  double old_generation_share = 0.25;  // machines with the older GPU generation
  double max_clock_skew_s = 2.5;       // each machine's clock is off by up to this much
  // Per machine, as separate episodes (at least 5 minutes apart):
  double exporter_gaps_per_hour = 0.5;       // each gap 3-25 s with no samples at all
  double excursions_per_hour = 1.0;          // benign excursions (5-60 s, one metric)
  std::vector<std::string> excursion_kinds;  // empty: all (PromFleetExcursionKinds())
  int hot_machines = 1;        // healthy GPUs running 6-10 C hotter than their peers, always
  int drifting_machines = 0;   // healthy hosts whose memory and GPU temperature creep up slowly
  double event_stagger_s = 5;  // a job-wide event reaches machines up to this far apart
  double startup_s = 90;       // loading before the first step: every machine idle
  bool job_events = true;      // checkpoints, evaluations, data stalls
  // Faults: the explicit ones plus `random_faults` drawn from production's mix (they may overlap).
  std::vector<PromFault> faults;
  int random_faults = 0;
  std::vector<std::string> random_fault_types;  // empty: the mix
};

const std::vector<std::string>& PromFleetFaultTypes();
const std::vector<std::string>& PromFleetExcursionKinds();

class PromFleet {
 public:
  // Unknown fault or excursion names, or a fault on a machine out of range, are errors.
  static Result<PromFleet> Make(PromFleetConfig config);
  const std::vector<std::string>& machines() const { return machine_names_; }
  const std::vector<std::string>& metrics() const { return metric_names_; }
  const std::vector<Label>& labels() const { return labels_; }
  // Calls sink(machine, metric, time_s, value) for every sample; time_s carries each machine's
  // clock skew, so samples of one second come out up to 2 * max_clock_skew_s out of order.
  void Run(
      const std::function<void(int machine, int metric, double time_s, double value)>& sink) const;

 private:
  PromFleet() = default;
  PromFleetConfig cfg_;
  std::vector<std::string> machine_names_, metric_names_;
  std::vector<Label> labels_;
  struct Resolved {
    int type, machine;
    double start, end, severity;
  };
  std::vector<Resolved> faults_;
};

}  // namespace megascope::detector
