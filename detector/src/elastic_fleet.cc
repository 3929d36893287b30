#include "megascope/detector/elastic_fleet.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include "megascope/tracer/format.h"

namespace megascope::detector {
namespace {

enum Kind {
  kUtil,
  kPower,
  kTemp,
  kClock,
  kReasonsOld,
  kReasonsNew,
  kXid,  // per GPU
  kTx,
  kSymbol,  // per port
  kCpuUser,
  kCpuSteal,
  kMemAvail,
  kSwapIn,
  kOom,
  kStep,  // per machine
  kKinds
};
constexpr int kGpuKinds = kXid + 1;
const char* const kBase[kKinds] = {"DCGM_FI_DEV_GPU_UTIL",
                                   "DCGM_FI_DEV_POWER_USAGE",
                                   "DCGM_FI_DEV_GPU_TEMP",
                                   "DCGM_FI_DEV_SM_CLOCK",
                                   "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
                                   "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
                                   "DCGM_FI_DEV_XID_ERRORS",
                                   "node_infiniband_port_data_transmitted_bytes_total",
                                   "node_infiniband_symbol_error_total",
                                   "node_cpu_seconds_total",
                                   "node_cpu_seconds_total",
                                   "node_memory_MemAvailable_bytes",
                                   "node_vmstat_pswpin",
                                   "node_vmstat_oom_kill",
                                   "trainer_step_time_seconds"};

enum Fault { kThrottle, kXidCrash, kNicHalf, kLeak, kPsuCap, kHang, kNumFaults };
const std::vector<std::string> kFaultNames = {"gpu_throttle",     "xid_crash",     "nic_half_rate",
                                              "host_memory_leak", "psu_power_cap", "hang"};
// Faults that end the machine's part in the job (it crashes, or the job hangs on it and is
// restarted without it).
bool Ends(int f) { return f == kXidCrash || f == kLeak || f == kHang; }
// How much a fault slows the synchronous job while it lasts.
double Slowdown(int f) {
  return f == kThrottle ? 1.12 : f == kNicHalf ? 1.06 : f == kPsuCap ? 1.15 : 1;
}

double U01(std::mt19937_64& g) { return static_cast<double>(g() >> 11) * 0x1.0p-53; }

struct Interval {
  double a, b;
  bool In(double t) const { return t >= a && t < b; }
};

const std::vector<std::string> kBenignKinds = {
    "preemption",   "scale_down",       "dcgm_upgrade", "node_exporter_restart",
    "symbol_blips", "noisy_neighbours", "ntp_step",     "checkpoint_writers"};

}  // namespace

const std::vector<std::string>& ElasticFleetFaultTypes() { return kFaultNames; }
const std::vector<std::string>& ElasticFleetBenignKinds() { return kBenignKinds; }

bool ElasticFleet::Shows(const std::string& kind) const {
  if (!cfg_.benign) return false;
  return cfg_.benign_kinds.empty() || std::find(cfg_.benign_kinds.begin(), cfg_.benign_kinds.end(),
                                                kind) != cfg_.benign_kinds.end();
}

// Series names as Prometheus holds them (labels included), one per machine and unit.
void ElasticFleet::NameSeries() {
  const ElasticFleetConfig& c = cfg_;
  const int total_machines = c.machines + c.spares;
  for (int k = 0; k < kKinds; ++k) {
    offset_.push_back(per_machine_);
    per_machine_ += k < kGpuKinds ? c.gpus : k <= kSymbol ? c.ports : 1;
  }
  for (int m = 0; m < total_machines; ++m) {
    const std::string host = ",Hostname=\"" + machine_names_[static_cast<size_t>(m)] + "\"";
    for (int k = 0; k < kKinds; ++k) {
      const int units = k < kGpuKinds ? c.gpus : k <= kSymbol ? c.ports : 1;
      for (int u = 0; u < units; ++u) {
        std::string name = kBase[k];
        if (k < kGpuKinds) {
          name += "{gpu=\"" + std::to_string(u) + "\",UUID=\"GPU-" + std::to_string(m) + "-" +
                  std::to_string(u) + "\"" + host + ",modelName=\"NVIDIA H100 80GB HBM3\"}";
        } else if (k <= kSymbol) {
          name += "{device=\"mlx5_" + std::to_string(u) + "\",port=\"1\",instance=\"" +
                  machine_names_[static_cast<size_t>(m)] + ":9100\"}";
        } else if (k == kCpuUser || k == kCpuSteal) {
          name += std::string("{mode=\"") + (k == kCpuUser ? "user" : "steal") + "\"}";
        }
        metric_names_.push_back(name);
      }
    }
  }
}

Result<ElasticFleet> ElasticFleet::Make(ElasticFleetConfig config) {
  ElasticFleet f;
  f.cfg_ = std::move(config);
  const ElasticFleetConfig& c = f.cfg_;
  if (c.machines < 4 || c.spares < 0 || c.minutes < 10 || c.gpus < 1 || c.ports < 1)
    return InvalidArgument("elastic fleet: need machines >= 4, spares >= 0, minutes >= 10");
  auto type_of = [](const std::string& name) {
    auto it = std::find(kFaultNames.begin(), kFaultNames.end(), name);
    return it == kFaultNames.end() ? -1 : static_cast<int>(it - kFaultNames.begin());
  };
  for (const std::string& t : c.random_fault_types) {
    if (type_of(t) < 0) return InvalidArgument("elastic fleet: unknown fault type '" + t + "'");
  }
  for (const std::string& b : c.benign_kinds) {
    if (std::find(kBenignKinds.begin(), kBenignKinds.end(), b) == kBenignKinds.end())
      return InvalidArgument("elastic fleet: unknown benign kind '" + b + "'");
  }
  std::mt19937_64 rng(c.seed * 104729 + 11);
  const int total_machines = c.machines + c.spares;
  for (int m = 0; m < total_machines; ++m) {  // cloud names: no rack, no order
    std::string name = tracer::Format("a3-%s-%05llx", m < c.machines ? "job" : "pool",
                                      static_cast<unsigned long long>(rng() & 0xfffff));
    f.machine_names_.push_back(name);
  }
  f.NameSeries();
  const double total = c.minutes * 60;
  const double upgrade = total * (0.2 + 0.2 * U01(rng)), restart = total * (0.45 + 0.2 * U01(rng));
  const double preempt = total * (0.3 + 0.1 * U01(rng)), down = total * (0.75 + 0.1 * U01(rng));
  const int preempted = static_cast<int>(rng() % static_cast<uint64_t>(c.machines));
  if (f.Shows("dcgm_upgrade")) f.upgrade_at_ = upgrade;
  if (f.Shows("node_exporter_restart")) f.restart_at_ = restart;
  if (f.Shows("preemption")) {
    f.preempt_at_ = preempt;
    f.preempted_ = preempted;
  }
  if (f.Shows("scale_down")) f.scale_down_at_ = down;
  std::vector<int> busy(static_cast<size_t>(c.machines), 0);
  if (f.preempted_ >= 0) busy[static_cast<size_t>(f.preempted_)] = 1;
  auto add_fault = [&](int t, int m, double start, double len) {
    const int units = t == kNicHalf ? c.ports : c.gpus;
    f.faults_.push_back({t, m, static_cast<int>(rng() % static_cast<uint64_t>(units)), start,
                         std::min(total, start + len)});
    busy[static_cast<size_t>(m)] = 1;
  };
  for (const ElasticFault& ef : c.faults) {
    const int t = type_of(ef.type);
    if (t < 0) return InvalidArgument("elastic fleet: unknown fault type '" + ef.type + "'");
    if (ef.machine < 0 || ef.machine >= c.machines)
      return InvalidArgument("elastic fleet: fault on machine " + std::to_string(ef.machine));
    add_fault(t, ef.machine, ef.start_s, ef.duration_s);
  }
  // Random faults, one after another (never overlapping), each on a machine not yet struck.
  const int n = c.random_faults;
  for (int i = 0; i < n; ++i) {
    const int t =
        c.random_fault_types.empty()
            ? static_cast<int>(rng() % kNumFaults)
            : type_of(c.random_fault_types[static_cast<size_t>(i) % c.random_fault_types.size()]);
    const double slot = (total - 240) / n;
    const double start = 240 + slot * i + 0.2 * slot * U01(rng);
    const double len = std::min(0.7 * slot, 240 + 300 * U01(rng));
    int m = static_cast<int>(rng() % static_cast<uint64_t>(c.machines));
    for (int tries = 0; busy[static_cast<size_t>(m)] && tries < c.machines; ++tries)
      m = (m + 1) % c.machines;
    add_fault(t, m, start, len);
  }
  // Scale-down: two members neither struck nor preempted.
  if (f.Shows("scale_down")) {
    for (int m = c.machines - 1; m >= 0 && f.scaled_down_.size() < 2; --m) {
      if (!busy[static_cast<size_t>(m)]) f.scaled_down_.push_back(m);
    }
  }
  for (const Resolved& r : f.faults_) {
    // A fault that ends the machine's part is labelled until the job re-formed without it.
    const double end = Ends(r.type) ? std::min(total, r.end + 120) : r.end;
    f.labels_.push_back({f.machine_names_[static_cast<size_t>(r.machine)], c.start_s + r.start,
                         c.start_s + end, kFaultNames[static_cast<size_t>(r.type)]});
  }
  return f;
}

// The simulator's loop (an exception to the function-size limit, named in .clang-tidy).
// NOLINTNEXTLINE(readability-function-size)
void ElasticFleet::Run(const std::function<void(int, int, double, double)>& sink) const {
  const ElasticFleetConfig& c = cfg_;
  const int total_machines = c.machines + c.spares;
  const double total = c.minutes * 60;
  std::mt19937_64 rng(c.seed * 15485863 + 5);
  std::normal_distribution<double> z(0, 1);
  // When each machine is a member: [from, until).
  std::vector<Interval> member(static_cast<size_t>(total_machines), {-1, -1});
  std::vector<double> gone(static_cast<size_t>(total_machines), 1e18);  // stops reporting at all
  for (int m = 0; m < c.machines; ++m) member[static_cast<size_t>(m)] = {0, 1e18};
  std::vector<Interval> pauses = {{0, 90}};  // loading
  int next_spare = c.machines;
  auto replace = [&](int m, double at) {  // m leaves at `at`; the job re-forms with a spare
    member[static_cast<size_t>(m)].b = at;
    pauses.push_back({at + 5, at + 95});
    if (next_spare < total_machines) member[static_cast<size_t>(next_spare++)] = {at + 95, 1e18};
  };
  if (preempted_ >= 0) {
    replace(preempted_, preempt_at_);
    gone[static_cast<size_t>(preempted_)] = preempt_at_;
  }
  for (int m : scaled_down_) {
    member[static_cast<size_t>(m)].b = scale_down_at_;
    gone[static_cast<size_t>(m)] = scale_down_at_ + 60;
  }
  if (!scaled_down_.empty()) pauses.push_back({scale_down_at_, scale_down_at_ + 60});
  std::vector<Interval> hangs;
  for (const Resolved& r : faults_) {
    if (r.type == kHang) {
      hangs.push_back({r.start, r.end});
      replace(r.machine, r.end);
    } else if (r.type == kXidCrash || r.type == kLeak) {
      replace(r.machine, r.end);
    }
  }
  // Per machine: its scrape phases, clock offset (one machine's NTP steps), neighbours, writers.
  std::vector<int> phase10(static_cast<size_t>(total_machines)),
      phase5(static_cast<size_t>(total_machines));
  std::vector<double> temp_offset(static_cast<size_t>(total_machines * c.gpus));
  for (auto& p : phase10) p = static_cast<int>(rng() % 10);
  for (auto& p : phase5) p = static_cast<int>(rng() % 5);
  for (auto& o : temp_offset) o = 3 * z(rng);
  const int ntp_machine =
      c.benign ? static_cast<int>(rng() % static_cast<uint64_t>(c.machines)) : -1;
  const double ntp_at = total * (0.5 + 0.3 * U01(rng));
  std::vector<int> neighbours, writers;
  for (int i = 0; i < 3; ++i) {
    const int pick = static_cast<int>(rng() % static_cast<uint64_t>(c.machines));
    if (Shows("noisy_neighbours")) neighbours.push_back(pick);
  }
  for (int i = 0; i < 4 && Shows("checkpoint_writers"); ++i) writers.push_back(i * c.machines / 4);
  // Blips: (machine, port, time) of one-sample symbol-error jumps.
  std::vector<std::tuple<int, int, double>> blips;
  for (int i = 0; Shows("symbol_blips") && i < static_cast<int>(total / 600); ++i)
    blips.emplace_back(static_cast<int>(rng() % static_cast<uint64_t>(total_machines)),
                       static_cast<int>(rng() % static_cast<uint64_t>(c.ports)), total * U01(rng));
  // Cumulative counters and AR noise.
  const size_t nm = static_cast<size_t>(total_machines);
  std::vector<double> tx(nm * static_cast<size_t>(c.ports), 0),
      sym(nm * static_cast<size_t>(c.ports), 0);
  std::vector<double> cpu_user(nm), cpu_steal(nm), swapin(nm), oom(nm),
      util_ar(nm * static_cast<size_t>(c.gpus));
  for (size_t m = 0; m < nm; ++m) cpu_user[m] = 1e7 * U01(rng);  // since boot
  std::vector<double> next_step(nm, 0);
  auto fault_on = [&](int m, int type, double t) -> const Resolved* {
    for (const Resolved& r : faults_) {
      if (r.machine == m && r.type == type && t >= r.start && t < r.end) return &r;
    }
    return nullptr;
  };
  for (int ti = 0; ti < static_cast<int>(total); ++ti) {
    const double t = ti;
    bool paused = false, hung = false;
    for (const Interval& p : pauses) paused = paused || p.In(t);
    for (const Interval& h : hangs) hung = hung || h.In(t);
    double slow = 1;
    for (const Resolved& r : faults_) {
      if (t >= r.start && t < r.end) slow *= Slowdown(r.type);
    }
    const bool checkpoint = std::fmod(t, 600) >= 300 && std::fmod(t, 600) < 340;
    for (int m = 0; m < total_machines; ++m) {
      const size_t ms = static_cast<size_t>(m);
      if (t >= gone[ms]) continue;
      const bool in_job = member[ms].In(t);
      const bool training = in_job && !paused && !hung;
      const bool hang_root =
          in_job && hung && std::any_of(faults_.begin(), faults_.end(), [&](const Resolved& r) {
            return r.type == kHang && r.machine == m && t >= r.start && t < r.end;
          });
      const double clock = t + (m == ntp_machine && t >= ntp_at ? 3.0 : 0.0) + 0.3 * (m % 7) / 7;
      const double ts = c.start_s + clock;
      const Resolved* throttle = fault_on(m, kThrottle, t);
      const Resolved* xid = fault_on(m, kXidCrash, t);
      const Resolved* nic = fault_on(m, kNicHalf, t);
      const Resolved* leak = fault_on(m, kLeak, t);
      const Resolved* psu = fault_on(m, kPsuCap, t);
      const bool is_writer = std::find(writers.begin(), writers.end(), m) != writers.end();
      // dcgm-exporter: every 10 s; the rolling upgrade leaves a 20-40 s gap and renames a field.
      const double up_at = upgrade_at_ + 15.0 * m;
      const bool upgraded = upgrade_at_ >= 0 && t >= up_at;
      const bool dcgm_gap = upgraded && t < up_at + 20 + (m % 3) * 10;
      if ((ti + phase10[ms]) % 10 == 0 && !dcgm_gap) {
        for (int g = 0; g < c.gpus; ++g) {
          const size_t gi = ms * static_cast<size_t>(c.gpus) + static_cast<size_t>(g);
          util_ar[gi] = 0.8 * util_ar[gi] + 0.6 * z(rng);
          double util, power, temp, sm;
          uint64_t reasons;
          if (training) {
            util = std::clamp(93 + util_ar[gi] * 2, 0.0, 100.0);
            power = 620 + 15 * z(rng);
            temp = 62 + temp_offset[gi] + z(rng);
            sm = 1980 + 5 * z(rng);
            reasons = U01(rng) < 0.6 ? 0x4 : 0;
          } else if (hung && in_job) {  // peers spin in NCCL; the root's GPUs wait on its host
            util = hang_root ? 0 : 100;
            power = hang_root ? 90 + 3 * z(rng) : 310 + 10 * z(rng);
            temp = (hang_root ? 40 : 52) + temp_offset[gi] + z(rng);
            sm = hang_root ? 345 : 1980;
            reasons = hang_root ? 0x1 : 0;
          } else {
            util = 0;
            power = 70 + 3 * z(rng);
            temp = 33 + temp_offset[gi] / 2 + z(rng);
            sm = 345;
            reasons = 0x1;
          }
          if (throttle != nullptr && g == throttle->unit && training) {
            temp = 89 + z(rng);
            sm = 1350 + 20 * z(rng);
            power = 470 + 15 * z(rng);
            reasons |= 0x40;
          }
          if (psu != nullptr && training) {
            power = 350 + 8 * z(rng);
            sm = 1600 + 20 * z(rng);
            reasons |= 0x4;
            if (U01(rng) < 0.5) reasons |= 0x80;
          }
          double xid_code = 0;
          if (xid != nullptr && g == xid->unit) {
            xid_code = 79;
            util = 0;
            power = 60;
          }
          if (is_writer && checkpoint && training) util -= 15;
          for (int k = 0; k < kGpuKinds; ++k) {
            if (k == kReasonsOld && upgraded) continue;
            if (k == kReasonsNew && !upgraded) continue;
            const double v = k == kUtil                             ? util
                             : k == kPower                          ? power
                             : k == kTemp                           ? temp
                             : k == kClock                          ? sm
                             : k == kReasonsOld || k == kReasonsNew ? static_cast<double>(reasons)
                                                                    : xid_code;
            sink(m, Index(m, k, g), ts, v);
          }
        }
      }
      // node_exporter: every 5 s; the rolling restart leaves a 5-15 s gap, then a CPU burst.
      const double rs_at = restart_at_ + 10.0 * m;
      const bool node_gap = restart_at_ >= 0 && t >= rs_at && t < rs_at + 5 + (m % 3) * 5;
      const bool burst = restart_at_ >= 0 && t >= rs_at + 5 && t < rs_at + 35;
      double user_rate = training ? 24 + z(rng) : 2 + 0.3 * z(rng);
      if (burst) user_rate += 30;
      if (is_writer && checkpoint && in_job) user_rate += 18;
      double steal_rate = 0;
      for (int nb : neighbours) {
        if (nb == m && std::fmod(t + 97.0 * m, 900) < 200) steal_rate = 4 + 2 * z(rng);
      }
      cpu_user[ms] += std::max(0.0, user_rate);
      cpu_steal[ms] += std::max(0.0, steal_rate);
      for (int p = 0; p < c.ports; ++p) {
        double rate = training ? 1.2e10 * (1 + 0.03 * z(rng)) / slow : 2e4;
        if (hung && in_job) rate = 1e5;
        if (nic != nullptr && p == nic->unit && training) rate *= 0.5;
        if (is_writer && checkpoint && in_job) rate += 3e9;
        tx[ms * static_cast<size_t>(c.ports) + static_cast<size_t>(p)] += rate;
      }
      for (const auto& [bm, bp, bt] : blips) {
        if (bm == m && ti == static_cast<int>(bt))
          sym[ms * static_cast<size_t>(c.ports) + static_cast<size_t>(bp)] +=
              1 + static_cast<double>(rng() % 3);
      }
      double avail = in_job ? 1.1e12 + 2e9 * z(rng) : 1.9e12 + 1e9 * z(rng);
      if (is_writer && checkpoint && in_job) avail -= 1.5e11;
      if (leak != nullptr) {
        const double done = (t - leak->start) / (leak->end - leak->start);
        avail -= 1.08e12 * done;
        if (done > 0.8) swapin[ms] += 4000 + 500 * z(rng);
        if (ti == static_cast<int>(leak->end) - 1) oom[ms] += 1;
      }
      if ((ti + phase5[ms]) % 5 == 0 && !node_gap) {
        for (int p = 0; p < c.ports; ++p) {
          const size_t pi = ms * static_cast<size_t>(c.ports) + static_cast<size_t>(p);
          sink(m, Index(m, kTx, p), ts, tx[pi]);
          sink(m, Index(m, kSymbol, p), ts, sym[pi]);
        }
        sink(m, Index(m, kCpuUser, 0), ts, cpu_user[ms]);
        sink(m, Index(m, kCpuSteal, 0), ts, cpu_steal[ms]);
        sink(m, Index(m, kMemAvail, 0), ts, avail);
        sink(m, Index(m, kSwapIn, 0), ts, swapin[ms]);
        sink(m, Index(m, kOom, 0), ts, oom[ms]);
      }
      // The trainer: one report per step, members only, while the job steps.
      if (training && t >= next_step[ms]) {
        const double step = 3.0 * slow * (1 + 0.01 * z(rng));
        sink(m, Index(m, kStep, 0), ts, step);
        next_step[ms] = t + step;
      }
    }
  }
}

int ElasticFleet::Index(int machine, int kind, int unit) const {
  return machine * per_machine_ + offset_[static_cast<size_t>(kind)] + unit;
}

}  // namespace megascope::detector
