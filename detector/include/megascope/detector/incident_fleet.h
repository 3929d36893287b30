// A third synthetic fleet, written from a different description than fleet_sim.h and prom_fleet.h:
// a cluster as production incident reports and operators describe it (Meta's Llama 3 report of
// 466 interruptions in 54 days -- faulty GPUs, HBM, network cables and switches, unplanned host
// reboots, NICs; MegaScale's and ByteRobust's accounts of everyday noise), not as the detector
// sees it.
//  - Machines sit in racks of `rack_size` behind one leaf switch; two racks share a PDU; eight
//    racks a cooling row. Topology() is that layout (a `megascope detect --topology` file).
//  - Three exporters per machine with cadences and failures of their own: a DCGM exporter every
//    second (it restarts for 10-90 s now and then, resetting its counters, and is missing on a few
//    machines from the start), a node exporter with InfiniBand counters every 2 s, and the trainer,
//    which reports once per step.
//  - A synchronous job: a warm-up, steps whose length drifts, checkpoints every 20-40 minutes
//    (GPUs idle, no steps), evaluation passes; a fatal fault hangs every peer until the job
//    restarts without the machine a few minutes later.
//  - Operations: backup or log-shipping jobs holding a host's CPU for minutes, a congested leaf
//    switch slowing its rack for 30-150 s (port transmit waits up, traffic down, the rack's
//    all-reduce waits up), a cooling row running hotter for 10-20 minutes, hot machines.
//  - Faults with signatures from those reports: a GPU off the bus (XID 79), uncorrectable HBM
//  errors
//    (XID 48), a GSP timeout (XID 119), a flapping InfiniBand link, a dead NIC, an unplanned host
//    reboot, a failed fan (throttling), a degraded PSU (power capped), NVLink errors (XID 74).
// Every value is a function of (seed, configuration).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "megascope/detector/samples.h"
#include "megascope/tracer/status.h"

namespace megascope::detector {

struct IncidentFault {
  std::string type;  // one of IncidentFleetFaultTypes()
  int machine = 0;
  double start_s = 0;  // from the start of the run
  double duration_s = 600;
};

// A fault or an operations event of the run (its kind, its machine, rack or row, when, how bad).
struct IncidentEpisode {
  int kind, target;
  double start, end, size;
};

struct IncidentFleetConfig {
  int machines = 64;
  double minutes = 60;
  uint64_t seed = 1;
  double start_s = 1765000000;
  int rack_size = 4;
  // Per machine (or per rack, per row) and hour, as separate episodes:
  double exporter_restarts_per_hour = 0.3;  // the DCGM exporter away for 10-90 s
  double exporter_missing_share = 0.02;     // machines without a DCGM exporter at all
  double backups_per_hour = 0.15;           // a host's CPU held for 3-12 minutes
  double switch_events_per_hour = 0.5;      // per rack: its leaf switch congested 30-150 s
  double cooling_events_per_hour = 0.1;     // per row: 5-9 C hotter for 10-20 minutes
  int hot_machines = -1;                    // -1: one in 40
  bool job_events = true;
  std::vector<IncidentFault> faults;
  int random_faults = 0;
  std::vector<std::string> random_fault_types;  // empty: the mix
};

const std::vector<std::string>& IncidentFleetFaultTypes();

class IncidentFleet {
 public:
  // Unknown fault names, a fault on a machine out of range or a rack size below 2 are errors.
  static Result<IncidentFleet> Make(IncidentFleetConfig config);
  const std::vector<std::string>& machines() const { return machine_names_; }
  const std::vector<std::string>& metrics() const { return metric_names_; }
  const std::vector<Label>& labels() const { return labels_; }
  // machine -> its components ("rack:r03", "switch:leaf03", "pdu:p01", "row:w00").
  std::vector<std::pair<std::string, std::vector<std::string>>> Topology() const;
  void Run(
      const std::function<void(int machine, int metric, double time_s, double value)>& sink) const;

 private:
  IncidentFleet() = default;
  IncidentFleetConfig cfg_;
  std::vector<std::string> machine_names_, metric_names_;
  std::vector<Label> labels_;
  std::vector<IncidentEpisode> faults_, ops_;
  std::vector<uint8_t> no_exporter_, hot_;
};

}  // namespace megascope::detector
