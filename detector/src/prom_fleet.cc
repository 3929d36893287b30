#include "megascope/detector/prom_fleet.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "megascope/tracer/format.h"

namespace megascope::detector {
namespace {

enum Metric {
  kCpu,
  kMem,
  kTxBytes,
  kRxBytes,
  kPfc,
  kGpuUtil,
  kPower,
  kTemp,
  kTensor,
  kFb,
  kNvlink,
  kXid,
  kEcc,
  kSmClock,
  kCompute,
  kIteration,
  kCarrier,
  kNumMetrics
};
const char* const kNames[kNumMetrics] = {"node_cpu_utilization_ratio",
                                         "node_memory_used_bytes",
                                         "node_network_transmit_bytes_total",
                                         "node_network_receive_bytes_total",
                                         "node_rdma_pfc_tx_pause_frames_per_second",
                                         "DCGM_FI_DEV_GPU_UTIL",
                                         "DCGM_FI_DEV_POWER_USAGE",
                                         "DCGM_FI_DEV_GPU_TEMP",
                                         "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
                                         "DCGM_FI_DEV_FB_USED",
                                         "DCGM_FI_PROF_NVLINK_TX_BYTES",
                                         "DCGM_FI_DEV_XID_ERRORS",
                                         "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
                                         "DCGM_FI_DEV_SM_CLOCK",
                                         "train_step_compute_seconds",
                                         "train_iteration_seconds",
                                         "node_network_carrier_changes_total"};
bool FromDcgm(int k) { return k >= kGpuUtil && k <= kSmClock; }

enum Fault {
  kEccFault,
  kXidFault,
  kCuda,
  kPcie,
  kNicDrop,
  kNicFlap,
  kOffBus,
  kNvlinkErr,
  kUnreachable,
  kThermal,
  kSlowHost,
  kNumFaults
};
const std::vector<std::string> kFaultNames = {
    "ecc_error",   "xid_error",    "cuda_error",  "pcie_downgrade",   "nic_dropout", "nic_flap",
    "gpu_off_bus", "nvlink_error", "unreachable", "thermal_throttle", "slow_host"};
// Roughly production's mix (Minder's paper), with thermal throttling and slow hosts added.
const double kFaultMix[kNumFaults] = {0.30, 0.08, 0.12, 0.08, 0.06, 0.04,
                                      0.04, 0.04, 0.06, 0.08, 0.10};
bool Fatal(int f) {
  return f == kXidFault || f == kCuda || f == kNicDrop || f == kOffBus || f == kUnreachable;
}

enum Excursion { kCronCpu, kIncastPfc, kNicDip, kTempBump, kNumExcursions };
const std::vector<std::string> kExcursionNames = {"cron_cpu", "incast_pfc", "nic_dip", "temp_bump"};

enum Phase { kTrain, kLoading, kCheckpoint, kEval, kStall, kHung, kRestart };

struct Window {
  double start, end;
  int kind;
  double size;
};

// Student-t (4 degrees of freedom) scaled to unit variance: heavier tails than a Gaussian.
double StudentT(std::mt19937_64& rng) {
  std::normal_distribution<double> n(0, 1);
  std::uniform_real_distribution<double> u(1e-12, 1);
  const double chi2 = -2 * std::log(u(rng) * u(rng));
  return n(rng) / std::sqrt(chi2 / 4) / std::sqrt(2.0);
}

double Uniform01(std::mt19937_64& g) { return static_cast<double>(g() >> 11) * 0x1.0p-53; }

}  // namespace

const std::vector<std::string>& PromFleetFaultTypes() { return kFaultNames; }
const std::vector<std::string>& PromFleetExcursionKinds() { return kExcursionNames; }

Result<PromFleet> PromFleet::Make(PromFleetConfig config) {
  PromFleet f;
  f.cfg_ = std::move(config);
  const PromFleetConfig& c = f.cfg_;
  if (c.machines < 2 || c.minutes <= 0 || c.stages < 1 || c.stages > c.machines) {
    return InvalidArgument("prom fleet: need machines >= 2, minutes > 0, 1 <= stages <= machines");
  }
  for (const std::string& e : c.excursion_kinds) {
    if (std::find(kExcursionNames.begin(), kExcursionNames.end(), e) == kExcursionNames.end()) {
      return InvalidArgument("prom fleet: unknown excursion kind '" + e + "'");
    }
  }
  auto type_of = [](const std::string& name) {
    auto it = std::find(kFaultNames.begin(), kFaultNames.end(), name);
    return it == kFaultNames.end() ? -1 : static_cast<int>(it - kFaultNames.begin());
  };
  for (const std::string& t : c.random_fault_types) {
    if (type_of(t) < 0) return InvalidArgument("prom fleet: unknown fault type '" + t + "'");
  }
  for (int m = 0; m < c.machines; ++m) {
    std::string name = tracer::Format("gpu-r%02d-n%02d", m / 16, m % 16);
    f.machine_names_.push_back(name);
  }
  f.metric_names_.assign(kNames, kNames + kNumMetrics);
  const double total = c.minutes * 60;
  std::mt19937_64 rng(c.seed * 7919 + 3);
  std::uniform_real_distribution<double> u(0, 1);
  for (const PromFault& pf : c.faults) {
    const int t = type_of(pf.type);
    if (t < 0) return InvalidArgument("prom fleet: unknown fault type '" + pf.type + "'");
    if (pf.machine < 0 || pf.machine >= c.machines) {
      return InvalidArgument("prom fleet: fault on machine " + std::to_string(pf.machine) + " of " +
                             std::to_string(c.machines));
    }
    f.faults_.push_back({t, pf.machine, pf.start_s, std::min(total, pf.start_s + pf.duration_s),
                         0.5 + 0.5 * u(rng)});
  }
  std::vector<int> types;
  for (const std::string& t : c.random_fault_types) types.push_back(type_of(t));
  std::discrete_distribution<int> mix(std::begin(kFaultMix), std::end(kFaultMix));
  for (int i = 0; i < c.random_faults; ++i) {
    const int t = types.empty() ? mix(rng) : types[static_cast<size_t>(i) % types.size()];
    const double lo = Fatal(t) ? 180 : 240, hi = Fatal(t) ? 600 : 1800;
    const double len = std::min(lo * std::pow(hi / lo, u(rng)), total / 3);
    const double earliest = c.startup_s + 60;
    const double start = earliest + (total - len - earliest) * u(rng);
    f.faults_.push_back({t, static_cast<int>(rng() % static_cast<uint64_t>(c.machines)), start,
                         start + len, 0.5 + 0.5 * u(rng)});
  }
  for (const Resolved& r : f.faults_) {
    f.labels_.push_back(
        {f.machine_names_[r.machine], c.start_s + r.start, c.start_s + r.end, kFaultNames[r.type]});
  }
  return f;
}

// The simulator's event loop (an exception to the function-size limit, named in .clang-tidy).
// NOLINTNEXTLINE(readability-function-size)
void PromFleet::Run(const std::function<void(int, int, double, double)>& sink) const {
  const PromFleetConfig& c = cfg_;
  const int n = c.machines;
  const auto seconds = static_cast<int64_t>(c.minutes * 60);
  const auto seconds_f = static_cast<double>(seconds);  // the plan's times are doubles
  std::mt19937_64 plan(c.seed * 104729 + 11);
  std::uniform_real_distribution<double> u(0, 1);

  // Job-wide events: checkpoints every 20-40 min, evaluations every 30 min, rare data stalls, and a
  // restart (loading again) after every fatal fault. Each reaches machine m `stagger[m][e]` late.
  std::vector<Window> events;
  if (c.job_events) {
    for (double t = c.startup_s + 600 + 900 * u(plan); t < seconds_f; t += 1200 + 1200 * u(plan)) {
      events.push_back({t, t + 30 + 60 * u(plan), kCheckpoint, 0});
    }
    for (double t = c.startup_s + 1800 * u(plan); t < seconds_f; t += 1800)
      events.push_back({t, t + 45, kEval, 0});
    for (double t = c.startup_s + 2400 * u(plan); t < seconds_f; t += 1800 + 3600 * u(plan)) {
      events.push_back({t, t + 8 + 25 * u(plan), kStall, 0});
    }
  }
  for (const Resolved& r : faults_) {
    if (Fatal(r.type)) events.push_back({r.end, r.end + 60 + 60 * u(plan), kRestart, 0});
  }

  // Machines: stage, GPU generation, clock skew, static character, benign excursions, gaps.
  std::vector<int> stage(n);
  std::vector<bool> old_gen(n), hot(n, false), drifting(n, false);
  std::vector<double> skew(n), startup_lag(n), off_pow(n), off_temp(n), off_mem(n), off_cpu(n),
      ecc_base(n), step_phase(n);
  std::vector<std::vector<Window>> excursions(n), gaps(n);
  std::vector<std::vector<double>> stagger(n);
  std::vector<int> order(n);
  for (int m = 0; m < n; ++m) order[m] = m;
  std::shuffle(order.begin(), order.end(), plan);
  const int old_count = static_cast<int>(std::lround(c.old_generation_share * n));
  for (int i = 0; i < n; ++i) old_gen[order[i]] = i < old_count;
  std::shuffle(order.begin(), order.end(), plan);
  for (int i = 0; i < std::min(c.hot_machines, n); ++i) hot[order[i]] = true;
  std::mt19937_64 drift_rng(c.seed * 31 +
                            7);  // its own stream: the rest of the plan stays as it was
  std::shuffle(order.begin(), order.end(), drift_rng);
  for (int i = 0; i < std::min(c.drifting_machines, n); ++i) drifting[order[i]] = true;
  std::vector<int> kinds;
  for (const std::string& e : c.excursion_kinds) {
    kinds.push_back(static_cast<int>(std::find(kExcursionNames.begin(), kExcursionNames.end(), e) -
                                     kExcursionNames.begin()));
  }
  if (kinds.empty()) kinds = {kCronCpu, kIncastPfc, kNicDip, kTempBump};
  std::normal_distribution<double> gauss(0, 1);
  for (int m = 0; m < n; ++m) {
    stage[m] = m * c.stages / n;
    skew[m] = c.max_clock_skew_s * (2 * u(plan) - 1);
    startup_lag[m] = c.event_stagger_s * u(plan);
    off_pow[m] = 12 * gauss(plan);
    off_temp[m] = 1.5 * gauss(plan) + (hot[m] ? 6 + 4 * u(plan) : 0);
    off_mem[m] = 4e9 * gauss(plan);
    off_cpu[m] = 0.02 * gauss(plan);
    ecc_base[m] = std::floor(40 * u(plan) * u(plan));  // corrected errors from the card's past
    step_phase[m] = 0.15 * u(plan);
    for (size_t e = 0; e < events.size(); ++e) stagger[m].push_back(c.event_stagger_s * u(plan));
    std::exponential_distribution<double> next_excursion(c.excursions_per_hour / 3600);
    // Each excursion is one episode: the next starts at least 5 minutes after it ended.
    for (double t = c.excursions_per_hour > 0 ? next_excursion(plan) : 1e18; t < seconds_f;) {
      const int kind = kinds[plan() % kinds.size()];
      const double end = t + 5 + 55 * u(plan);
      excursions[m].push_back({t, end, kind, 0.5 + 0.5 * u(plan)});
      t = end + 300 + next_excursion(plan);
    }
    std::exponential_distribution<double> next_gap(c.exporter_gaps_per_hour / 3600);
    for (double t = c.exporter_gaps_per_hour > 0 ? next_gap(plan) : 1e18; t < seconds_f;) {
      const double end = t + 3 + 22 * u(plan);
      gaps[m].push_back({t, end, 0, 0});
      t = end + 300 + next_gap(plan);
    }
  }

  // Per (machine, metric) AR(1) noise state and a per-machine generator: each machine's samples
  // depend only on the seed and the machine.
  std::vector<std::mt19937_64> rng;
  rng.reserve(static_cast<size_t>(n));
  for (int m = 0; m < n; ++m) rng.emplace_back(c.seed * 1000003 + static_cast<uint64_t>(m) * 7 + 5);
  std::vector<std::vector<double>> ar(n, std::vector<double>(kNumMetrics, 0));
  std::vector<double> tx_total(n), rx_total(n), ecc_total(ecc_base), carrier(n, 2);
  std::vector<bool> link_down(n, false);
  std::vector<int> xid_code(n, 0);
  std::vector<double> xid_until(n, -1);
  std::vector<double> compute(n), value(kNumMetrics);
  std::vector<bool> emit(kNumMetrics);
  const double stage_load[4] = {0.80, 0.92, 0.90, 0.97};

  for (int64_t ti = 0; ti < seconds; ++ti) {
    const double t = static_cast<double>(ti);
    // The job: fatal faults hang it; slow machines stretch every step.
    bool hung = false;
    int dead_machine = -1;
    std::vector<double> slow(n, 1.0);
    bool flap_down = false;
    for (const Resolved& r : faults_) {
      if (t < r.start || t >= r.end) continue;
      if (Fatal(r.type) && t >= r.start + 2 + 6 * r.severity) hung = true;
      if (Fatal(r.type)) dead_machine = r.machine;
      const double s = r.severity;
      if (r.type == kPcie) slow[r.machine] *= 1.25 + 0.35 * s;
      if (r.type == kThermal) slow[r.machine] *= 1.2 + 0.3 * s;
      if (r.type == kSlowHost) slow[r.machine] *= 1.2 + 0.3 * s;
      if (r.type == kNvlinkErr) slow[r.machine] *= 1.05 + 0.1 * s;
      if (r.type == kNicFlap && static_cast<int64_t>((t - r.start) / (10 + 10 * s)) % 2 == 1)
        flap_down = true;
    }
    double iteration = 0;
    for (int m = 0; m < n; ++m) {
      const double load = c.stages == 1 ? 0.9 : stage_load[std::min(3, stage[m] * 4 / c.stages)];
      compute[m] = 2.4 * (0.7 + 0.3 * load) * (old_gen[m] ? 1.3 : 1.0) * slow[m];
      iteration = std::max(iteration, compute[m]);
    }
    iteration += 0.6;                                    // gradient all-reduce and pipeline bubbles
    const double drift_temp = 2.0 * std::sin(t / 5400);  // the room warms and cools
    const double leak = 0.5e9 * t / 3600;                // every host's page cache grows

    for (int m = 0; m < n; ++m) {
      std::mt19937_64& g = rng[m];
      auto noise = [&](int k) {  // AR(1), unit variance, heavy-tailed innovations
        double& z = ar[m][k];
        z = 0.8 * z + 0.6 * StudentT(g);
        return z;
      };
      Phase phase = t < c.startup_s + startup_lag[m] ? kLoading : kTrain;
      for (size_t e = 0; e < events.size(); ++e) {
        const Window& w = events[e];
        if (t >= w.start + stagger[m][e] && t < w.end + stagger[m][e])
          phase = static_cast<Phase>(w.kind);
      }
      if (hung && m != dead_machine && phase == kTrain) phase = kHung;
      if (flap_down && phase == kTrain) phase = kStall;
      const Resolved* fault = nullptr;
      for (const Resolved& r : faults_) {
        if (r.machine == m && t >= r.start && t < r.end) fault = &r;
      }
      const bool is_old = old_gen[m];
      const double pmax = is_old ? 400 : 700, pidle = is_old ? 55 : 75,
                   clock = is_old ? 1410 : 1980;
      const double tensor_max = is_old ? 0.42 : 0.58;
      const double fb = (is_old ? 36000 : 62000) + 1500 * stage[m];
      // Share of this second the GPU computes: the step's compute part, averaged over the second.
      double busy = 0;
      for (int q = 0; q < 4; ++q) {
        const double pos = std::fmod((t + 0.25 * q) / iteration + step_phase[m], 1.0);
        busy += pos < compute[m] / iteration ? 0.25 : 0.05;
      }
      double net_rate =
          (3e9 + 1.5e9 * (stage[m] % 2)) * (1.4 - busy);  // bytes/s, all-reduce in the gaps
      double cpu = 0.25 + off_cpu[m] + 0.02 * noise(kCpu);
      double pfc = 300 * std::exp(0.35 * noise(kPfc));
      double nvlink = 60e9 * (1.2 - busy) + 3e9 * noise(kNvlink);
      double util = 100 * busy;
      double tensor = tensor_max * busy;
      double sm_clock = clock + 15 * noise(kSmClock);
      double fb_used = fb + 200 * noise(kFb);
      bool steps = true;
      switch (phase) {
        case kTrain:
          break;
        case kLoading:
        case kRestart:
          util = 3;
          tensor = 0;
          net_rate = 0.8e9 + 0.05e9 * noise(kTxBytes);
          nvlink = 0.1e9;
          cpu = 0.55;
          pfc = 20;
          fb_used = 800;
          steps = false;
          break;
        case kCheckpoint:
          util = 8;
          tensor = 0;
          net_rate = 2e9;
          nvlink = 0.5e9;
          cpu = 0.65;
          steps = false;
          break;
        case kEval:
          util = 70;
          tensor *= 0.6;
          net_rate *= 0.3;
          nvlink *= 0.4;
          break;
        case kStall:
          util = 2;
          tensor = 0;
          net_rate = 0.05e9;
          nvlink = 0.05e9;
          cpu = 0.9;
          pfc = 10;
          steps = false;
          break;
        case kHung:  // spinning in an NCCL kernel: busy GPU, no math, no traffic
          util = 100;
          tensor = 0;
          net_rate = 0.002e9;
          nvlink = 0.01e9;
          cpu = 0.06;
          pfc = 2;
          steps = false;
          break;
      }
      util = std::clamp(util + 1.5 * noise(kGpuUtil), 0.0, 100.0);
      double power = pidle +
                     (pmax - pidle) * (0.15 + 0.85 * util / 100) *
                         (0.4 + 0.6 * (tensor / tensor_max + 0.3)) / 1.3 +
                     off_pow[m] + 8 * noise(kPower);
      if (phase == kHung) power = pidle + 0.4 * (pmax - pidle) + 6 * noise(kPower);
      std::fill(emit.begin(), emit.end(), true);
      double ecc_rate = 0.0;
      int xid = 0;
      // Benign excursions: one metric of one machine for 5-60 s.
      double temp_extra = 0;
      for (const Window& w : excursions[m]) {
        if (t < w.start || t >= w.end) continue;
        switch (w.kind) {
          case kCronCpu:
            cpu += 0.3 + 0.4 * w.size;
            break;
          case kIncastPfc:
            pfc *= 5 + 15 * w.size;
            break;
          case kNicDip:
            net_rate *= 0.6 - 0.4 * w.size;
            break;
          case kTempBump:
            temp_extra += 5 + 5 * w.size;
            break;
        }
      }
      if (fault != nullptr) {
        const double s = fault->severity, age = t - fault->start;
        auto dead = [&] {
          util = 0;
          tensor = 0;
          power = pidle + 5 * noise(kPower);
          fb_used = 450;
          nvlink = 0;
          net_rate = 0.001e9;
          cpu = 0.03;
          pfc = 0;
          steps = false;
        };
        switch (fault->type) {
          case kEccFault:
            ecc_rate = 0.05 + 0.4 * s;
            util -= 1.5;
            break;
          case kXidFault:
            xid = 43;
            if (age > 5 + 15 * s) dead();
            break;
          case kCuda:
            dead();
            break;
          case kPcie:
            pfc *= 4 + 6 * s;
            net_rate *= 0.7 - 0.2 * s;
            break;
          case kNicDrop:
            net_rate = 0;
            pfc = 0;
            break;
          case kNicFlap:
            if (static_cast<int64_t>(age / (10 + 10 * s)) % 2 == 1) {
              net_rate = 0;
              pfc = 0;
            }
            break;
          case kOffBus:
            dead();
            for (int k = 0; k < kNumMetrics; ++k) emit[k] = emit[k] && !FromDcgm(k);
            break;
          case kNvlinkErr:
            nvlink *= 0.5 - 0.4 * s;
            xid = 74;
            break;
          case kUnreachable:
            std::fill(emit.begin(), emit.end(), false);
            break;
          case kThermal:
            temp_extra += 12 + 13 * s;
            sm_clock *= 0.8 - 0.15 * s;
            power *= 0.85 - 0.15 * s;
            tensor *= 0.85 - 0.1 * s;
            break;
          case kSlowHost:
            cpu += 0.3 + 0.2 * s;
            break;
        }
      }
      if (xid != 0) {
        xid_code[m] = xid;
        xid_until[m] = t + 60;  // the exporter shows the last XID for a minute
      } else if (t >= xid_until[m]) {
        xid_code[m] = 0;
      }
      // The kernel counts every carrier change of the NIC (node_exporter's carrier_changes_total).
      const bool down =
          fault != nullptr && (fault->type == kNicDrop || fault->type == kNicFlap) && net_rate == 0;
      if (down != link_down[m]) carrier[m] += 1;
      link_down[m] = down;
      if (Uniform01(g) < ecc_rate) ecc_total[m] += 1 + static_cast<double>(g() % 3);
      if (Uniform01(g) < 1.0 / 30000)
        ecc_total[m] += 1;  // a healthy card corrects one now and then
      tx_total[m] += std::max(0.0, net_rate * (1 + 0.04 * noise(kTxBytes)));
      rx_total[m] += std::max(0.0, net_rate * (1 + 0.04 * noise(kRxBytes)));
      // A drifting host: a slow leak (4 GB an hour) and a GPU warming by 3 C an hour (dust).
      const double creep = drifting[m] ? t / 3600 : 0;
      const double temp = 27 + drift_temp + off_temp[m] + 3 * creep + 0.055 * power +
                          0.4 * noise(kTemp) + temp_extra;
      value[kCpu] = std::clamp(cpu, 0.0, 1.0);
      value[kMem] = 320e9 + off_mem[m] + leak + 4e9 * creep + 0.2e9 * noise(kMem);
      value[kTxBytes] = tx_total[m];
      value[kRxBytes] = rx_total[m];
      value[kPfc] = std::max(0.0, pfc);
      value[kGpuUtil] = std::clamp(util, 0.0, 100.0);
      value[kPower] = std::max(0.0, power);
      value[kTemp] = temp;
      value[kTensor] = std::clamp(tensor + 0.01 * noise(kTensor), 0.0, 1.0);
      value[kFb] = fb_used;
      value[kNvlink] = std::max(0.0, nvlink);
      value[kXid] = xid_code[m];
      value[kEcc] = ecc_total[m];
      value[kSmClock] = phase == kTrain || phase == kEval ? sm_clock : 210 + 5 * noise(kSmClock);
      value[kCompute] = compute[m] * (1 + 0.015 * noise(kCompute));
      value[kIteration] = iteration * (1 + 0.003 * noise(kIteration));
      value[kCarrier] = carrier[m];
      if (!steps) emit[kCompute] = emit[kIteration] = false;  // no step finished: nothing to report
      bool gap = false;
      for (const Window& w : gaps[m]) gap = gap || (t >= w.start && t < w.end);
      if (gap) continue;
      const double stamp = c.start_s + t + skew[m] + 0.2 * Uniform01(g);
      for (int k = 0; k < kNumMetrics; ++k) {
        if (emit[k] && Uniform01(g) >= 0.003)
          sink(m, k, stamp, value[k]);  // a lost scrape now and then
      }
    }
  }
}

}  // namespace megascope::detector
