#include "megascope/detector/fleet_sim.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <random>

namespace megascope::detector {
namespace {

enum Metric {
  kCpu,
  kMem,
  kNetTx,
  kNetRx,
  kPfc,
  kGpuUtil,
  kGpuPower,
  kGpuTemp,
  kGpuMem,
  kNvlink,
  kTensor,
  kStepTime,
  kXid,
  kEcc,
  kNumMetrics
};
const char* const kMetricNames[kNumMetrics] = {
    "cpu_util",          "mem_used_gb", "net_tx_gbps",    "net_rx_gbps",     "pfc_tx_pause_pps",
    "gpu_util",          "gpu_power_w", "gpu_temp_c",     "gpu_mem_used_gb", "nvlink_tx_gbps",
    "gpu_tensor_active", "step_time_s", "gpu_xid_errors", "gpu_ecc_errors"};
bool IsGpuMetric(int m) { return m >= kGpuUtil && m != kStepTime; }

enum FaultType {
  kEccError,
  kXidError,
  kCudaError,
  kPcieDowngrade,
  kNicDropout,
  kNicFlap,
  kGpuOffBus,
  kNvlinkError,
  kUnreachable,
  kThermal,
  kNumFaultTypes
};
const std::vector<std::string> kFaultNames = {
    "ecc_error", "xid_error",   "cuda_error",   "pcie_downgrade", "nic_dropout",
    "nic_flap",  "gpu_off_bus", "nvlink_error", "unreachable",    "thermal_throttle"};
// Approximate production mix (Minder's fault shares).
const double kFaultWeights[kNumFaultTypes] = {0.30, 0.10, 0.12, 0.08, 0.05,
                                              0.05, 0.05, 0.05, 0.08, 0.12};
bool IsFatal(int t) {
  return t == kXidError || t == kCudaError || t == kNicDropout || t == kGpuOffBus ||
         t == kUnreachable;
}

enum JobEvent { kCheckpoint, kEval, kDataStall, kRestart, kLrChange };

// Deterministic noise for (seed, machine, tick, salt): samples can be generated in any order.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
double Uniform(uint64_t h) { return static_cast<double>(h >> 11) * 0x1.0p-53; }
double Gauss(uint64_t h) {
  double u1 = std::max(Uniform(h), 1e-12), u2 = Uniform(Mix(h));
  return std::sqrt(-2 * std::log(u1)) * std::cos(2 * std::numbers::pi * u2);
}

}  // namespace

const std::vector<std::string>& FleetFaultTypes() { return kFaultNames; }

FleetSim::FleetSim(FleetSimConfig config) : cfg_(std::move(config)) {
  for (int m = 0; m < cfg_.machines; ++m) machine_names_.push_back("node" + std::to_string(m));
  metric_names_.assign(kMetricNames, kMetricNames + kNumMetrics);
  std::mt19937_64 rng(cfg_.seed);
  std::uniform_real_distribution<double> u(0, 1);
  const double total = cfg_.hours * 3600;

  // Job-wide rhythm: checkpoints every 30 min, evaluations every 20 min, rare data stalls and
  // learning-rate changes.
  for (double t = 1800 * u(rng); t < total; t += 1800)
    events_.push_back({kCheckpoint, t, t + 40 + 40 * u(rng)});
  for (double t = 600 + 1200 * u(rng); t < total; t += 1200) events_.push_back({kEval, t, t + 60});
  for (double t = 3600 * u(rng); t < total; t += 1800 + 3600 * u(rng))
    events_.push_back({kDataStall, t, t + 10 + 20 * u(rng)});
  for (double t = 2400 * u(rng); t < total; t += 2400 + 2400 * u(rng))
    events_.push_back({kLrChange, t, total});

  // Faults: one per slot of the timeline, never overlapping, each on a random machine.
  std::vector<int> types;
  for (const std::string& name : cfg_.fault_types) {
    auto it = std::find(kFaultNames.begin(), kFaultNames.end(), name);
    if (it != kFaultNames.end()) types.push_back(static_cast<int>(it - kFaultNames.begin()));
  }
  std::discrete_distribution<int> mix(std::begin(kFaultWeights), std::end(kFaultWeights));
  const double slot = total / std::max(1, cfg_.faults);
  for (int i = 0; i < cfg_.faults; ++i) {
    const int type = types.empty() ? mix(rng) : types[static_cast<size_t>(i) % types.size()];
    // Durations from 3 minutes to most of a slot (log-uniform), shorter for fatal faults
    // (the job restarts on a spare).
    double max_len = std::min(IsFatal(type) ? 600.0 : 2400.0, std::max(180.0, slot - 360));
    double len = 180 * std::pow(max_len / 180, u(rng));
    double start = i * slot + 120 + (slot - len - 240) * u(rng);
    if (start < i * slot + 60) start = i * slot + 60;
    Fault f{static_cast<int>(rng() % static_cast<uint64_t>(cfg_.machines)), type, start,
            start + len, 0.5 + 0.5 * u(rng)};
    faults_.push_back(f);
    labels_.push_back({machine_names_[f.machine], cfg_.start_s + f.start, cfg_.start_s + f.end,
                       kFaultNames[type]});
    if (IsFatal(type)) events_.push_back({kRestart, f.end, f.end + 60 + 60 * u(rng)});
  }
}

std::vector<std::pair<std::string, std::string>> FleetSim::Groups() const {
  std::vector<std::pair<std::string, std::string>> g;
  g.reserve(static_cast<size_t>(std::max(0, cfg_.machines)));
  const int per_stage = std::max(1, cfg_.machines / std::max(1, cfg_.stages));
  for (int m = 0; m < cfg_.machines; ++m) {
    g.emplace_back(machine_names_[m],
                   "stage" + std::to_string(std::min(m / per_stage, cfg_.stages - 1)));
  }
  return g;
}

// The simulator's event loop: one pass over time, every machine's metrics and faults in it (an
// exception to the function-size limit, named in .clang-tidy).
// NOLINTNEXTLINE(readability-function-size)
void FleetSim::Run(const std::function<void(int, int, double, double)>& sink) const {
  const int n = cfg_.machines;
  const auto ticks = static_cast<int64_t>(cfg_.hours * 3600);
  const uint64_t seed = Mix(cfg_.seed * 0x51ed27ULL + 17);
  const int per_stage = std::max(1, n / std::max(1, cfg_.stages));
  auto rnd = [&](int m, int64_t t, int salt) {
    return Mix(seed ^ Mix((static_cast<uint64_t>(m) << 40) ^ (static_cast<uint64_t>(t) << 8) ^
                          static_cast<uint64_t>(salt)));
  };
  // Static per-machine character: healthy machines differ a little.
  std::vector<double> off_cpu(n), off_mem(n), off_pow(n), off_temp(n), phase(n), offset_s(n);
  for (int m = 0; m < n; ++m) {
    off_cpu[m] = 0.02 * Gauss(rnd(m, -1, 1));
    off_mem[m] = 2.0 * Gauss(rnd(m, -1, 2));
    off_pow[m] = 10 * Gauss(rnd(m, -1, 3));
    off_temp[m] = 2.0 * Gauss(rnd(m, -1, 4));
    phase[m] = 0.05 * Gauss(rnd(m, -1, 5));  // lockstep: ~100 ms of skew
    offset_s[m] = 0.9 * Uniform(rnd(m, -1, 6));
  }
  double v[kNumMetrics];
  bool emit[kNumMetrics];
  for (int64_t t = 0; t < ticks; ++t) {
    const double ts = static_cast<double>(t);
    // Job state at this tick (transitions reach each machine up to 2 s apart).
    double slow = 1.0, lr_factor = 1.0;
    int hang_cause = -1;
    for (const Fault& f : faults_) {
      if (ts < f.start || ts >= f.end) continue;
      if (IsFatal(f.type)) hang_cause = f.machine;
      if (f.type == kPcieDowngrade) slow *= 1 + 0.3 * f.severity;
      if (f.type == kNvlinkError) slow *= 1 + 0.15 * f.severity;
      if (f.type == kThermal) slow *= 1 + 0.2 * f.severity;
    }
    for (const Event& e : events_) {
      if (e.kind == kLrChange && ts >= e.start)
        lr_factor *= 1 + 0.03 * (Uniform(Mix(static_cast<uint64_t>(e.start))) - 0.5);
    }
    const double step = 2.0 * slow * lr_factor;
    for (int m = 0; m < n; ++m) {
      int job = -1;
      const double skew = 2.0 * Uniform(rnd(m, -1, 8));
      for (const Event& e : events_) {
        if (e.kind != kLrChange && ts >= e.start + skew && ts < e.end + skew) job = e.kind;
      }
      const Fault* fault = nullptr;
      for (const Fault& f : faults_) {
        if (f.machine == m && ts >= f.start && ts < f.end) fault = &f;
      }
      const bool hung = hang_cause >= 0 && hang_cause != m && ts >= 0;
      auto g = [&](int salt) { return Gauss(rnd(m, t, salt)); };
      const double osc = std::sin(2 * std::numbers::pi * (ts / step + phase[m]));
      const bool light = cfg_.light_first_stage && m / per_stage == 0;
      const double busy = light ? 0.82 : 0.92;

      v[kCpu] = 0.35 + off_cpu[m] + 0.03 * osc + 0.03 * g(20);
      v[kMem] = 180 + off_mem[m] + ts / 3600 + 0.3 * g(21);
      v[kNetTx] = 40 * (1 + 0.25 * osc) + 3 * g(22);
      v[kNetRx] = 40 * (1 - 0.25 * osc) + 3 * g(23);
      v[kPfc] = 50 + 8 * g(24);
      v[kGpuUtil] = busy / slow + 0.04 * osc + 0.02 * g(25);
      v[kGpuPower] = (light ? 540 : 600) + off_pow[m] + 40 * osc + 15 * g(26);
      v[kGpuMem] = (light ? 60 : 70) + 0.1 * g(27);
      v[kNvlink] = 150 * (1 + 0.2 * osc) + 8 * g(28);
      v[kTensor] = (light ? 0.45 : 0.55) / slow + 0.05 * osc + 0.02 * g(29);
      v[kStepTime] = step * (1 + 0.01 * g(30));
      v[kXid] = Uniform(rnd(m, t, 31)) < 1.0 / 21600 ? 1 : 0;  // healthy machines see rare ones
      v[kEcc] = Uniform(rnd(m, t, 32)) < 1.0 / 21600 ? 1 : 0;
      if (job == kCheckpoint) {
        v[kGpuUtil] = 0.05;
        v[kGpuPower] = 150 + off_pow[m];
        v[kTensor] = 0;
        v[kNvlink] = 2;
        v[kNetTx] = 15 + g(33);
        v[kNetRx] = 1;
        v[kCpu] = 0.8 + 0.03 * g(34);
        v[kPfc] = 5 + g(35);
      } else if (job == kEval) {
        v[kGpuUtil] = 0.6 + 0.02 * g(33);
        v[kGpuPower] = 420 + off_pow[m] + 10 * g(34);
        v[kTensor] = 0.3;
        v[kNetTx] *= 0.3;
        v[kNetRx] *= 0.3;
        v[kNvlink] *= 0.5;
      } else if (job == kDataStall) {
        v[kGpuUtil] = 0.1;
        v[kGpuPower] = 180 + off_pow[m];
        v[kNetTx] = 0.5;
        v[kNetRx] = 0.5;
        v[kTensor] = 0;
        v[kCpu] = 0.9 + 0.03 * g(33);
        v[kNvlink] = 1;
        v[kPfc] = 2;
      } else if (job == kRestart) {
        v[kGpuUtil] = 0.02;
        v[kGpuPower] = 120 + off_pow[m];
        v[kNetRx] = 20 + 2 * g(33);
        v[kNetTx] = 1;
        v[kCpu] = 0.6 + 0.03 * g(34);
        v[kTensor] = 0;
        v[kNvlink] = 1;
        v[kGpuMem] = 20 + 0.5 * g(35);
      }
      if (hung) {  // blocked in a collective: NCCL kernels spin, little traffic
        v[kGpuUtil] = 1.0;
        v[kGpuPower] = 350 + off_pow[m] + 5 * g(36);
        v[kTensor] = 0;
        v[kNetTx] = 5 + g(37);
        v[kNetRx] = 5 + g(38);
        v[kNvlink] = 0.5;
        v[kCpu] = 0.12 + 0.01 * g(39);
        v[kPfc] = 3 + g(40);
      }
      // Healthy jitter: a short blip on one metric, about once per machine per two hours.
      const int64_t blip_slot = t / 60;
      const uint64_t bh = rnd(m, blip_slot, 41);
      if (Uniform(bh) < 60.0 / 7200 && t % 60 < 2 + static_cast<int64_t>(Uniform(Mix(bh)) * 13)) {
        switch (Mix(bh) % 4) {
          case 0:
            v[kCpu] += 0.5;
            break;
          case 1:
            v[kNetTx] *= 0.3;
            v[kNetRx] *= 0.3;
            break;
          case 2:
            v[kPfc] *= 4;
            break;
          default:
            v[kGpuUtil] -= 0.3;
            break;
        }
      }
      std::fill(std::begin(emit), std::end(emit), true);
      if (fault != nullptr) {
        const double s = fault->severity;
        const double age = ts - fault->start;
        auto dead = [&] {
          v[kGpuUtil] = 0;
          v[kGpuPower] = 90 + off_pow[m] * 0.2;
          v[kTensor] = 0;
          v[kGpuMem] = 0.5;
          v[kNvlink] = 0;
          v[kNetTx] = 0.05;
          v[kNetRx] = 0.05;
          v[kCpu] = 0.03;
          v[kPfc] = 0;
        };
        switch (fault->type) {
          case kEccError:
            v[kEcc] = Uniform(rnd(m, t, 50)) < 0.2 + 0.6 * s
                          ? static_cast<double>(1 + (rnd(m, t, 51) % 3))
                          : 0;
            v[kGpuUtil] -= 0.03;
            break;
          case kXidError:
            if (age < 10)
              v[kXid] = 2;
            else
              dead();
            break;
          case kCudaError:
            dead();
            break;
          case kPcieDowngrade:
            v[kPfc] = 50 * (6 + 10 * s) + 40 * g(52);
            v[kNetTx] *= 1 - 0.4 * s;
            v[kNetRx] *= 1 - 0.4 * s;
            v[kGpuUtil] = busy - 0.05 + 0.02 * g(53);
            break;
          case kNicDropout:
            v[kNetTx] = 0;
            v[kNetRx] = 0;
            v[kPfc] = 0;
            v[kGpuUtil] = 1.0;
            v[kGpuPower] = 350 + off_pow[m];
            v[kTensor] = 0;
            v[kNvlink] = 0.5;
            v[kCpu] = 0.12;
            break;
          case kNicFlap:
            if ((static_cast<int64_t>(age) / 12) % 2 == 1) {
              v[kNetTx] = 0;
              v[kNetRx] = 0;
              v[kPfc] = 0;
            }
            break;
          case kGpuOffBus:
            dead();
            for (int k = 0; k < kNumMetrics; ++k) emit[k] = !IsGpuMetric(k);
            break;
          case kNvlinkError:
            v[kNvlink] *= 0.6 - 0.4 * s;
            v[kXid] = Uniform(rnd(m, t, 54)) < 0.05 ? 1 : v[kXid];
            v[kGpuUtil] = busy + 0.02 * g(55);
            break;
          case kUnreachable:
            std::fill(std::begin(emit), std::end(emit), false);
            break;
          case kThermal:
            v[kGpuTemp] = 0;  // set below from power, plus the throttle's heat
            v[kGpuPower] *= 1 - 0.25 * s;
            v[kTensor] = (light ? 0.45 : 0.55) * (1 - 0.2 * s) + 0.02 * g(56);
            v[kGpuUtil] = 0.95 + 0.02 * g(57);
            break;
        }
      }
      // Nic flapping stalls every peer while the link is down.
      for (const Fault& f : faults_) {
        if (f.type == kNicFlap && f.machine != m && ts >= f.start && ts < f.end &&
            (static_cast<int64_t>(ts - f.start) / 12) % 2 == 1) {
          v[kGpuUtil] *= 0.4;
          v[kNetTx] *= 0.5;
          v[kNetRx] *= 0.5;
        }
      }
      v[kGpuTemp] = 65 + off_temp[m] + 3 * std::sin(ts / 7200) + 0.03 * (v[kGpuPower] - 600) +
                    0.5 * g(58) +
                    (fault != nullptr && fault->type == kThermal ? 10 + 10 * fault->severity : 0);
      v[kGpuUtil] = std::clamp(v[kGpuUtil], 0.0, 1.0);
      for (double& x : v) x = std::max(0.0, x);
      // Exporters lose a sample now and then, and sometimes a few seconds of everything.
      const bool hiccup = Uniform(rnd(m, t / 8, 59)) < 8.0 / 14400;
      for (int k = 0; k < kNumMetrics; ++k) {
        if (!emit[k] || hiccup || Uniform(rnd(m, t, 60 + k)) < 0.005) continue;
        sink(m, k, cfg_.start_s + ts + offset_s[m], v[k]);
      }
    }
  }
}

}  // namespace megascope::detector
