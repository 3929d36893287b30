// A fourth synthetic fleet (`megascope fleet-sim --family elastic`), written from a description of
// production cloud jobs rather than from the detector: an elastic training job on rented machines,
// exported per GPU and per InfiniBand port by dcgm-exporter and node_exporter as Prometheus holds
// it (labelled series: `DCGM_FI_DEV_GPU_UTIL{gpu="3",UUID=...,Hostname=...}`, 10-s and 5-s
// scrapes, cumulative counters), with the trainer's step time from the job's members only.
//  - hot spares that sit idle beside the job; a preemption (a member vanishes, the job re-forms
//    and a spare takes its place) and a scale-down (two members leave; their machines are
//    deprovisioned a minute later);
//  - a rolling dcgm-exporter upgrade that renames the clock-throttle reasons bitmask
//    (DCGM_FI_DEV_CLOCK_THROTTLE_REASONS -> DCGM_FI_DEV_CLOCKS_EVENT_REASONS), with a scrape gap
//    per machine; a rolling node_exporter restart with a CPU burst as it starts;
//  - routine bits of that bitmask (the power cap under load, idle) set everywhere;
//  - InfiniBand symbol-error blips (one sample), an NTP step of one machine's clock, noisy
//    neighbours (CPU steal on shared hosts), checkpoints and evaluations written by four machines;
//  - faults: one GPU of eight throttled (HW thermal), an XID then a crash, one port of eight at
//    half rate, a host memory leak to swap and an OOM kill, a PSU power cap (the HW power brake
//    on every GPU of a machine), a hang rooted on one machine (its GPUs idle in host code while
//    every peer spins in NCCL).
// Everything is a function of (seed, configuration).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "megascope/detector/samples.h"

namespace megascope::detector {

struct ElasticFault {
  std::string type;  // one of ElasticFleetFaultTypes()
  int machine = 0;   // a member at the start
  double start_s = 0;
  double duration_s = 300;
};

struct ElasticFleetConfig {
  int machines = 32;  // members at the start
  int spares = 2;     // idle hot spares beside them
  int gpus = 8, ports = 8;
  double minutes = 40;
  uint64_t seed = 1;
  double start_s = 1765000000;
  // The benign phenomena it shows (ElasticFleetBenignKinds()); empty: every one of them.
  std::vector<std::string> benign_kinds;
  bool benign = true;  // false: none of them (spares still sit idle)
  std::vector<ElasticFault> faults;
  int random_faults = 0;
  std::vector<std::string> random_fault_types;
};

const std::vector<std::string>& ElasticFleetFaultTypes();
// preemption, scale_down, dcgm_upgrade, node_exporter_restart, symbol_blips, noisy_neighbours,
// ntp_step, checkpoint_writers.
const std::vector<std::string>& ElasticFleetBenignKinds();

class ElasticFleet {
 public:
  static Result<ElasticFleet> Make(ElasticFleetConfig config);
  const std::vector<std::string>& machines() const { return machine_names_; }
  const std::vector<std::string>& metrics() const { return metric_names_; }
  const std::vector<Label>& labels() const { return labels_; }
  void Run(
      const std::function<void(int machine, int metric, double time_s, double value)>& sink) const;

 private:
  ElasticFleet() = default;
  ElasticFleetConfig cfg_;
  std::vector<std::string> machine_names_, metric_names_;
  std::vector<Label> labels_;
  struct Resolved {
    int type, machine, unit;  // unit: the GPU or port it strikes
    double start, end;
  };
  std::vector<Resolved> faults_;
  bool Shows(const std::string& kind) const;
  void NameSeries();  // metric_names_, offset_ and per_machine_, from the machines' names
  double preempt_at_ = -1, scale_down_at_ = -1, upgrade_at_ = -1, restart_at_ = -1;
  int preempted_ = -1;
  std::vector<int> scaled_down_;
  // The metric index of (machine, kind, unit): machines' series are laid out alike.
  int Index(int machine, int kind, int unit) const;
  int per_machine_ = 0;
  std::vector<int> offset_;  // per kind: its first series within a machine's
};

}  // namespace megascope::detector
