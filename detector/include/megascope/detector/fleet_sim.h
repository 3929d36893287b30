// A synthetic fleet for evaluating the detector: second-level metrics of N machines running one
// synchronous training job (per-step rhythm, checkpoints, evaluations, data stalls, learning-rate
// changes, restarts that hit every machine), healthy jitter that must not alarm, and faults with
// the signatures production shows (Minder's and MegaScale's papers): ECC and XID errors, CUDA
// errors killing the process, PCIe downgrade, NIC dropout and flapping, GPU off the bus, NVLink
// errors, an unreachable machine, thermal throttling. A fatal fault hangs the peers until the job
// restarts.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "megascope/detector/samples.h"

namespace megascope::detector {

struct FleetSimConfig {
  int machines = 16;
  double hours = 2;
  int faults = 10;
  uint64_t seed = 1;
  double start_s = 1763700000;           // timestamp of the first sample
  std::vector<std::string> fault_types;  // empty: the production mix
  // Pipeline stages (machines split evenly); stage 0 legitimately runs lighter GPU load when
  // light_first_stage is set (e.g. the embedding stage), which peer groups must absorb.
  int stages = 1;
  bool light_first_stage = false;
};

// The fault types fleet-sim knows.
const std::vector<std::string>& FleetFaultTypes();

class FleetSim {
 public:
  explicit FleetSim(FleetSimConfig config);
  const std::vector<std::string>& machines() const { return machine_names_; }
  const std::vector<std::string>& metrics() const { return metric_names_; }
  const std::vector<Label>& labels() const { return labels_; }
  // machine -> "stage<k>"
  std::vector<std::pair<std::string, std::string>> Groups() const;
  // Calls sink(machine, metric, time_s, value) for every sample, in time order.
  void Run(
      const std::function<void(int machine, int metric, double time_s, double value)>& sink) const;

 private:
  struct Event {
    int kind;
    double start, end;
  };
  struct Fault {
    int machine;
    int type;
    double start, end, severity;
  };
  FleetSimConfig cfg_;
  std::vector<std::string> machine_names_, metric_names_;
  std::vector<Label> labels_;
  std::vector<Event> events_;
  std::vector<Fault> faults_;
};

}  // namespace megascope::detector
