#include "megascope/detector/incident_fleet.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <random>

#include "megascope/tracer/format.h"

namespace megascope::detector {
namespace {

enum Metric {
  kSmActive,
  kDramActive,
  kPower,
  kMemTemp,
  kSmClock,
  kNvlinkRx,
  kXid,
  kDbe,
  kLoad,
  kMemAvail,
  kIbTx,
  kIbRx,
  kIbWait,
  kLinkDowned,
  kCompute,
  kAllreduceWait,
  kNumMetrics
};
const char* const kNames[kNumMetrics] = {"DCGM_FI_PROF_SM_ACTIVE",
                                         "DCGM_FI_PROF_DRAM_ACTIVE",
                                         "DCGM_FI_DEV_POWER_USAGE",
                                         "DCGM_FI_DEV_MEMORY_TEMP",
                                         "DCGM_FI_DEV_SM_CLOCK",
                                         "DCGM_FI_PROF_NVLINK_RX_BYTES",
                                         "DCGM_FI_DEV_XID_ERRORS",
                                         "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
                                         "node_load1",
                                         "node_memory_MemAvailable_bytes",
                                         "node_infiniband_port_data_transmitted_bytes_total",
                                         "node_infiniband_port_data_received_bytes_total",
                                         "node_infiniband_port_transmit_wait_total",
                                         "node_infiniband_link_downed_total",
                                         "trainer_step_compute_ms",
                                         "trainer_allreduce_wait_ms"};

enum Fault { kOffBus, kHbm, kGsp, kLinkFlap, kNicDead, kReboot, kFan, kPsu, kNvlink, kNumFaults };
const std::vector<std::string> kFaultNames = {"gpu_off_bus",  "hbm_uncorrectable", "gsp_timeout",
                                              "ib_link_flap", "nic_dead",          "host_reboot",
                                              "fan_failure",  "psu_degraded",      "nvlink_errors"};
// Llama 3's interruption shares, the categories a metric can show (software bugs and silent data
// corruption cannot be seen here): GPUs and their NVLink ~30 %, HBM 17 %, network 8 %, host 5 %.
const double kFaultMix[kNumFaults] = {0.20, 0.17, 0.05, 0.10, 0.05, 0.08, 0.12, 0.08, 0.15};
bool Fatal(int f) {
  return f == kOffBus || f == kHbm || f == kGsp || f == kNicDead || f == kReboot;
}

enum Ops { kExporterRestart, kBackup, kSwitch, kCooling };

double Uniform(std::mt19937_64& g) { return static_cast<double>(g() >> 11) * 0x1.0p-53; }

// Episodes of a Poisson process at `per_hour`, each `lo`-`hi` s long and at least 5 minutes apart.
template <typename F>
void Episodes(std::mt19937_64& g, double per_hour, double total, double lo, double hi, F add) {
  if (per_hour <= 0) return;
  double t = -std::log(1 - Uniform(g)) * 3600 / per_hour;
  while (t < total) {
    const double len = lo + (hi - lo) * Uniform(g);
    add(t, std::min(total, t + len));
    t += len + 300 - std::log(1 - Uniform(g)) * 3600 / per_hour;
  }
}

}  // namespace

const std::vector<std::string>& IncidentFleetFaultTypes() { return kFaultNames; }

Result<IncidentFleet> IncidentFleet::Make(IncidentFleetConfig config) {
  IncidentFleet f;
  f.cfg_ = std::move(config);
  const IncidentFleetConfig& c = f.cfg_;
  if (c.machines < 4 || c.minutes <= 0 || c.rack_size < 2) {
    return InvalidArgument("incident fleet: need machines >= 4, minutes > 0, rack_size >= 2");
  }
  // Random faults take a slot of at least 5 minutes each between a 10-minute warm-up and end;
  // fewer minutes would drop faults (or overlap them) without a word.
  if (c.random_faults > 0 && (c.minutes - 10) / c.random_faults < 5) {
    return InvalidArgument("incident fleet: " + std::to_string(c.random_faults) +
                           " random faults need at least " +
                           std::to_string(10 + 5 * c.random_faults) + " minutes (" +
                           std::to_string(static_cast<int>(c.minutes)) +
                           " asked): one fault per 5 minutes after a 10-minute warm-up");
  }
  auto type_of = [](const std::string& name) {
    auto it = std::find(kFaultNames.begin(), kFaultNames.end(), name);
    return it == kFaultNames.end() ? -1 : static_cast<int>(it - kFaultNames.begin());
  };
  for (const std::string& t : c.random_fault_types) {
    if (type_of(t) < 0) return InvalidArgument("incident fleet: unknown fault type '" + t + "'");
  }
  for (int m = 0; m < c.machines; ++m) {
    std::string name = tracer::Format("h100-%03d-%d", m / c.rack_size, m % c.rack_size);
    f.machine_names_.push_back(name);
  }
  f.metric_names_.assign(kNames, kNames + kNumMetrics);
  const double total = c.minutes * 60;
  std::mt19937_64 g(c.seed * 104729 + 17);
  for (const IncidentFault& x : c.faults) {
    const int t = type_of(x.type);
    if (t < 0) return InvalidArgument("incident fleet: unknown fault type '" + x.type + "'");
    if (x.machine < 0 || x.machine >= c.machines)
      return InvalidArgument("incident fleet: fault machine " + std::to_string(x.machine) +
                             " out of range");
    f.faults_.push_back({t, x.machine, x.start_s, x.start_s + x.duration_s, Uniform(g)});
  }
  std::discrete_distribution<int> mix(std::begin(kFaultMix), std::end(kFaultMix));
  for (int i = 0; i < c.random_faults; ++i) {
    // Spread over the run, after the warm-up, a machine at a time.
    const double slot = (total - 600) / c.random_faults;
    const double start = 400 + slot * i + (slot - 300) * Uniform(g) * 0.5;
    int type = mix(g);
    if (!c.random_fault_types.empty())
      type = type_of(c.random_fault_types[g() % c.random_fault_types.size()]);
    const int machine = static_cast<int>(g() % static_cast<uint64_t>(c.machines));
    const double len = std::min(total - start, 600 + 1200 * Uniform(g));
    if (len > 120) f.faults_.push_back({type, machine, start, start + len, Uniform(g)});
  }
  for (const IncidentEpisode& e : f.faults_) {
    f.labels_.push_back(
        {f.machine_names_[e.target], c.start_s + e.start, c.start_s + e.end, kFaultNames[e.kind]});
  }
  const int racks = (c.machines + c.rack_size - 1) / c.rack_size, rows = (racks + 7) / 8;
  for (int m = 0; m < c.machines; ++m) {
    Episodes(g, c.exporter_restarts_per_hour, total, 10, 90, [&](double a, double b) {
      f.ops_.push_back({kExporterRestart, m, a, b, 0});
    });
    Episodes(g, c.backups_per_hour, total, 180, 720, [&](double a, double b) {
      f.ops_.push_back({kBackup, m, a, b, Uniform(g)});
    });
  }
  for (int r = 0; r < racks; ++r) {
    Episodes(g, c.switch_events_per_hour, total, 30, 150, [&](double a, double b) {
      f.ops_.push_back({kSwitch, r, a, b, Uniform(g)});
    });
  }
  for (int w = 0; w < rows; ++w) {
    Episodes(g, c.cooling_events_per_hour, total, 600, 1200, [&](double a, double b) {
      f.ops_.push_back({kCooling, w, a, b, Uniform(g)});
    });
  }
  f.no_exporter_.assign(c.machines, 0);
  f.hot_.assign(c.machines, 0);
  const int hot = c.hot_machines >= 0 ? c.hot_machines : c.machines / 40;
  for (int i = 0; i < hot; ++i) f.hot_[g() % static_cast<uint64_t>(c.machines)] = 1;
  for (int m = 0; m < c.machines; ++m) f.no_exporter_[m] = Uniform(g) < c.exporter_missing_share;
  return f;
}

std::vector<std::pair<std::string, std::vector<std::string>>> IncidentFleet::Topology() const {
  std::vector<std::pair<std::string, std::vector<std::string>>> out;
  for (int m = 0; m < cfg_.machines; ++m) {
    const int rack = m / cfg_.rack_size;
    out.push_back({machine_names_[m],
                   {tracer::Format("rack:r%03d", rack), tracer::Format("switch:leaf%03d", rack),
                    tracer::Format("pdu:p%03d", rack / 2), tracer::Format("row:w%02d", rack / 8)}});
  }
  return out;
}

namespace {

// Everything a machine carries from one second to the next.
struct MachineRun {
  double off_power = 0, off_temp = 0, skew = 0, phase = 0, lag = 0, speed = 1;
  std::array<double, kNumMetrics> ar{};
  double tx = 0, rx = 0, wait = 0, downed = 0, dbe = 0, xid = 0, xid_until = 0, next_step = 0;
  bool link_down = false, exporter_away = false;
};

// What holds for the whole job in one second.
struct JobSecond {
  bool hung = false, warm = false, checkpoint = false, eval = false, flap_down = false;
  double step = 0;
  std::vector<uint8_t> out, away;  // machines the job left behind; DCGM exporters away
  std::vector<double> slow, comm, traffic, wait_rate, temp_up, cpu_up;
  std::vector<const IncidentEpisode*> fault;
  bool Training() const { return !hung && !warm && !checkpoint && !eval && !flap_down; }
};

struct JobEvent {
  double start, end;
  bool checkpoint;
};
struct Restart {
  double hang, restart, repaired;  // the job hangs, restarts without it; it is back once repaired
  int machine;
};

void ApplyOps(const IncidentFleetConfig& c, const std::vector<IncidentEpisode>& ops, double t,
              JobSecond* j) {
  const int n = c.machines;
  for (const IncidentEpisode& o : ops) {
    if (t < o.start || t >= o.end) continue;
    if (o.kind == kExporterRestart) j->away[o.target] = 1;
    if (o.kind == kBackup) j->cpu_up[o.target] += 18 + 20 * o.size;
    if (o.kind == kSwitch) {
      for (int m = o.target * c.rack_size; m < std::min(n, (o.target + 1) * c.rack_size); ++m) {
        j->comm[m] = 1.3 + 0.4 * o.size;
        j->traffic[m] = 0.7 - 0.2 * o.size;
        j->wait_rate[m] = 20 + 30 * o.size;
      }
    }
    if (o.kind == kCooling) {
      const int row = 8 * c.rack_size;
      for (int m = o.target * row; m < std::min(n, (o.target + 1) * row); ++m)
        j->temp_up[m] += 5 + 4 * o.size;
    }
  }
}

JobSecond JobAt(const IncidentFleetConfig& c, const std::vector<IncidentEpisode>& faults,
                const std::vector<IncidentEpisode>& ops, const std::vector<JobEvent>& events,
                const std::vector<Restart>& restarts, const std::vector<MachineRun>& run,
                double t) {
  const int n = c.machines;
  JobSecond j;
  j.warm = t < 180;
  j.out.assign(n, 0);
  j.away.assign(n, 0);
  j.slow.assign(n, 1.0);
  j.comm.assign(n, 1.0);
  j.traffic.assign(n, 1.0);
  j.wait_rate.assign(n, 1.0);
  j.temp_up.assign(n, 0.0);
  j.cpu_up.assign(n, 0.0);
  j.fault.assign(n, nullptr);
  for (const Restart& r : restarts) {
    j.hung = j.hung || (t >= r.hang && t < r.restart);
    j.warm = j.warm || (t >= r.restart && t < r.restart + 90);
    if (t >= r.hang && t < r.repaired) j.out[r.machine] = 1;
  }
  for (const JobEvent& e : events) {
    if (t >= e.start && t < e.end) (e.checkpoint ? j.checkpoint : j.eval) = true;
  }
  ApplyOps(c, ops, t, &j);
  for (const IncidentEpisode& e : faults) {
    if (t < e.start || t >= e.end) continue;
    j.fault[e.target] = &e;
    if (e.kind == kFan) j.slow[e.target] = 1.25 + 0.15 * e.size;
    if (e.kind == kPsu) j.slow[e.target] = 1.15 + 0.15 * e.size;
    if (e.kind == kNvlink) j.slow[e.target] = 1.05 + 0.1 * e.size;
    if (e.kind == kLinkFlap && std::fmod(t - e.start, 30 + 40 * e.size) < 5 + 10 * e.size)
      j.flap_down = true;
  }
  // The slowest machine sets the step; a congested switch slows everyone's all-reduce.
  double compute = 0, comm = 1;
  for (int m = 0; m < n; ++m) {
    if (j.out[m]) continue;
    compute = std::max(compute, 3.6 * run[m].speed * j.slow[m]);
    comm = std::max(comm, j.comm[m]);
  }
  j.step = (compute + 1.4 * comm) * (1 + 0.04 * std::sin(t / 700));
  return j;
}

// One machine's levels in one second: the job's phase, then its fault.
struct Levels {
  double sm = 0.72, dram = 0.45, clock = 1980, nvl = 180e9, load = 24, ib = 40e9, power = 560;
  bool steps = true, gpu_readable = true, host_up = true, down = false;
};

Levels PhaseLevels(const JobSecond& j, const MachineRun& r, int m) {
  Levels l;
  l.sm /= j.slow[m];
  l.dram /= j.slow[m];
  l.ib *= j.traffic[m];
  l.power += r.off_power;
  l.steps = j.Training();
  auto set = [&](double sm, double dram, double power, double nvl, double ib) {
    l.sm = sm;
    l.dram = dram;
    l.power = power;
    l.nvl = nvl;
    l.ib = ib;
  };
  if (j.warm || j.out[m]) {
    set(0.01, 0, 95 + r.off_power / 4, 0, 0.2e9);
    l.load = 6;
    l.steps = false;
  } else if (j.hung) {
    set(0.12, 0.01, 210 + r.off_power / 3, 0.1e9, 0.05e9);
  } else if (j.checkpoint) {
    set(0.02, 0.05, 120 + r.off_power / 4, 0, 12e9);
    l.load = 30;
  } else if (j.eval) {
    set(0.5, 0.3, 430 + r.off_power, 60e9, 5e9);
  } else if (j.flap_down) {
    set(0.1, l.dram, 200 + r.off_power / 3, 0, 0.5e9);
  }
  l.power += 140 * (l.sm - 0.72);
  return l;
}

void FaultLevels(const IncidentEpisode& e, double t, std::mt19937_64& g, MachineRun& r,
                 JobSecond& j, int m, Levels& l) {
  switch (e.kind) {
    case kOffBus:
      l.gpu_readable = l.steps = false;
      l.ib = 0;
      l.load = 2;
      break;
    case kHbm:
      if (t - e.start < 60) r.xid = 48, r.xid_until = t + 60;
      if (t - e.start < 1) r.dbe += 1 + static_cast<double>(g() % 2);
      if (t - e.start > 2 + 3 * e.size) {
        l.sm = l.dram = l.ib = 0;
        l.power = 90;
        l.steps = false;
      }
      break;
    case kGsp:
      r.xid = 119, r.xid_until = t + 60;
      l.sm = 1.0;
      l.dram = l.ib = 0;
      l.power = 140;
      l.steps = false;
      break;
    case kLinkFlap:
      l.down = std::fmod(t - e.start, 30 + 40 * e.size) < 5 + 10 * e.size;
      if (l.down) l.ib = 0;
      break;
    case kNicDead:
      l.down = true;
      l.ib = 0;
      l.steps = false;
      break;
    case kReboot:
      l.host_up = false;
      break;
    case kFan:
      j.temp_up[m] += 15 + 10 * e.size;
      l.clock *= 0.75 - 0.05 * e.size;
      l.power *= 0.85;
      break;
    case kPsu:
      l.power = std::min(l.power, 0.6 * (560 + r.off_power));
      l.clock *= 0.8;
      break;
    case kNvlink:
      l.nvl *= 0.6 - 0.3 * e.size;
      if (Uniform(g) < 0.04) r.xid = 74, r.xid_until = t + 60;
      break;
    default:
      break;
  }
}

// The machine's exporters report what it did this second: DCGM every second (unless away or never
// deployed), the node exporter every 2 s, the trainer once a step.
void EmitSecond(const IncidentFleetConfig& c, int m, int64_t ti, const JobSecond& j,
                const Levels& l, bool no_exporter, std::mt19937_64& g,
                std::normal_distribution<double>& normal, MachineRun& r,
                const std::function<void(int, int, double, double)>& sink) {
  const auto t = static_cast<double>(ti);
  auto noise = [&](int k) {  // AR(1) with a rare spike
    double& z = r.ar[k];
    z = 0.7 * z + 0.71 * normal(g);
    return Uniform(g) < 0.0005 ? 3 * z : z;
  };
  if (l.down && !r.link_down) r.downed += 1;
  r.link_down = l.down;
  if (t >= r.xid_until) r.xid = 0;
  r.tx += std::max(0.0, l.ib * (1 + 0.03 * noise(kIbTx)));
  r.rx += std::max(0.0, l.ib * (1 + 0.03 * noise(kIbRx)));
  r.wait +=
      std::max(0.0, 1e6 * j.wait_rate[m] * (l.ib > 1e9 ? 1 : 0.1) * (1 + 0.2 * noise(kIbWait)));
  if (j.away[m] && !r.exporter_away) r.dbe = 0;  // a restarted exporter counts from zero
  r.exporter_away = j.away[m] != 0;
  const double stamp = c.start_s + t + r.skew + 0.1 * r.phase;
  auto emit = [&](int k, double v) {
    if (Uniform(g) >= 0.002) sink(m, k, stamp, v);  // a lost scrape now and then
  };
  if (l.gpu_readable && !j.away[m] && !no_exporter) {
    emit(kSmActive, std::clamp(l.sm + 0.015 * noise(kSmActive), 0.0, 1.0));
    emit(kDramActive, std::clamp(l.dram + 0.015 * noise(kDramActive), 0.0, 1.0));
    emit(kPower, std::max(50.0, l.power + 9 * noise(kPower)));
    emit(kMemTemp, 40 + 0.035 * l.power + r.off_temp + j.temp_up[m] + 0.5 * noise(kMemTemp));
    emit(kSmClock, (l.sm > 0.05 ? l.clock : 345) + 6 * noise(kSmClock));
    emit(kNvlinkRx, std::max(0.0, l.nvl * (1 + 0.05 * noise(kNvlinkRx))));
    emit(kXid, r.xid);
    emit(kDbe, r.dbe);
  }
  if ((ti + static_cast<int64_t>(2 * r.phase)) % 2 == 0) {
    emit(kLoad, std::max(0.0, l.load + j.cpu_up[m] + 1.5 * noise(kLoad)));
    emit(kMemAvail, 1.6e12 - 2e9 * t / 3600 - 4e9 * noise(kMemAvail));
    emit(kIbTx, r.tx);
    emit(kIbRx, r.rx);
    emit(kIbWait, r.wait);
    emit(kLinkDowned, r.downed);
  }
  if (!l.steps) {
    r.next_step = std::max(r.next_step, t + j.step);
  } else if (t >= r.next_step) {
    const double compute = 3600 * r.speed * j.slow[m] * (1 + 0.01 * noise(kCompute));
    emit(kCompute, compute);
    emit(kAllreduceWait,
         std::max(5.0, j.step * 1000 - compute) * j.comm[m] * (1 + 0.03 * noise(kAllreduceWait)));
    r.next_step = t + j.step;
  }
}

}  // namespace

void IncidentFleet::Run(
    const std::function<void(int machine, int metric, double time_s, double value)>& sink) const {
  const IncidentFleetConfig& c = cfg_;
  const int n = c.machines;
  const auto total = static_cast<int64_t>(c.minutes * 60);
  std::mt19937_64 g(c.seed * 15485863 + 5);
  std::normal_distribution<double> normal(0, 1);
  std::vector<MachineRun> run(n);
  for (MachineRun& r : run) {
    r.off_power = 25 * normal(g);
    r.off_temp = 1.5 * normal(g);
    r.skew = 2 * Uniform(g) - 1;
    r.phase = Uniform(g);
    r.lag = 20 * Uniform(g);
    r.speed = 1 + 0.01 * normal(g);  // the silicon lottery
    r.next_step = 240 + r.lag + 5 * r.phase;
  }
  for (int m = 0; m < n; ++m) run[m].off_temp += hot_[m] ? 8 : 0;
  // The job's own events: checkpoints every 20-40 min, evaluations hourly; a fatal fault hangs
  // the job from a few seconds after it until a restart 3-7 minutes later without the machine,
  // which is back (repaired, a spare in its place) when the fault's window ends.
  std::vector<JobEvent> events;
  const auto span = static_cast<double>(total);
  if (c.job_events) {
    for (double t = 1200 + 1200 * Uniform(g); t < span; t += 1200 + 1200 * Uniform(g))
      events.push_back({t, t + 40 + 50 * Uniform(g), true});
    for (double t = 3000 + 600 * Uniform(g); t < span; t += 3600)
      events.push_back({t, t + 60 + 60 * Uniform(g), false});
  }
  std::vector<Restart> restarts;
  for (const IncidentEpisode& e : faults_) {
    if (Fatal(e.kind))
      restarts.push_back({e.start + 2 + 8 * e.size, e.start + 180 + 240 * e.size, e.end, e.target});
  }
  for (int64_t ti = 0; ti < total; ++ti) {
    const auto t = static_cast<double>(ti);
    JobSecond j = JobAt(c, faults_, ops_, events, restarts, run, t);
    for (int m = 0; m < n; ++m) {
      MachineRun& r = run[m];
      Levels l = PhaseLevels(j, r, m);
      if (j.fault[m] != nullptr) FaultLevels(*j.fault[m], t, g, r, j, m, l);
      if (!l.host_up) continue;  // nothing at all: the host is rebooting
      EmitSecond(c, m, ti, j, l, no_exporter_[m] != 0, g, normal, r, sink);
    }
  }
}

}  // namespace megascope::detector
