#include "megascope/tracer/agent/host_metrics.h"

#include <dlfcn.h>

#include <fstream>
#include <regex>
#include <sstream>

namespace megascope::tracer::agent {

Result<HostSample> HostSampler::Sample() {
  HostSample s;
  {
    std::ifstream in(root_ + "/stat");
    std::string cpu;
    uint64_t v[10] = {};
    if (!(in >> cpu) || cpu != "cpu") return NotFound("cannot read " + root_ + "/stat");
    for (uint64_t& x : v) in >> x;
    // user nice system idle iowait irq softirq steal guest guest_nice; guest time is in user.
    const uint64_t idle = v[3] + v[4],
                   total = v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7];
    const uint64_t busy = total - idle;
    if (last_total_ != 0 && total > last_total_) {
      s.cpu_utilization =
          static_cast<double>(busy - last_busy_) / static_cast<double>(total - last_total_);
    }
    last_busy_ = busy;
    last_total_ = total;
  }
  {
    std::ifstream in(root_ + "/meminfo");
    std::string key;
    uint64_t value = 0, total = 0, available = 0;
    std::string unit;
    while (in >> key >> value) {
      std::getline(in, unit);
      if (key == "MemTotal:") total = value;
      if (key == "MemAvailable:") available = value;
    }
    if (total == 0) return NotFound("cannot read MemTotal from " + root_ + "/meminfo");
    s.memory_used_bytes = static_cast<double>(total - available) * 1024;
  }
  {
    std::ifstream in(root_ + "/net/dev");
    std::string line;
    while (std::getline(in, line)) {
      const auto colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string iface = line.substr(0, colon);
      iface.erase(0, iface.find_first_not_of(' '));
      if (iface == "lo") continue;
      std::istringstream f(line.substr(colon + 1));
      uint64_t x[16] = {};
      for (uint64_t& v : x) f >> v;
      s.network_receive_bytes += static_cast<double>(x[0]);
      s.network_transmit_bytes += static_cast<double>(x[8]);
      s.network_receive_errors += static_cast<double>(x[2]);
      s.network_transmit_errors += static_cast<double>(x[10]);
    }
  }
  {
    std::ifstream in(root_ + "/diskstats");
    static const std::regex kWhole(R"(^((sd|vd|xvd|hd)[a-z]+|nvme\d+n\d+|mmcblk\d+)$)");
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream f(line);
      uint64_t major, minor, reads, rmerged, rsectors, rms, writes, wmerged, wsectors;
      std::string name;
      if (!(f >> major >> minor >> name >> reads >> rmerged >> rsectors >> rms >> writes >>
            wmerged >> wsectors))
        continue;
      if (!std::regex_match(name, kWhole)) continue;  // partitions would count twice
      s.disk_read_bytes += static_cast<double>(rsectors) * 512;
      s.disk_write_bytes += static_cast<double>(wsectors) * 512;
    }
  }
  return s;
}

// The few NVML entry points we use, declared here (nvml.h is not needed to build).
struct Nvml::Fns {
  using Device = void*;
  struct Utilization {
    unsigned gpu, memory;
  };
  struct Memory {
    unsigned long long total, free, used;
  };
  int (*init)() = nullptr;
  int (*shutdown)() = nullptr;
  int (*count)(unsigned*) = nullptr;
  int (*handle)(unsigned, Device*) = nullptr;
  int (*util)(Device, Utilization*) = nullptr;
  int (*power)(Device, unsigned*) = nullptr;
  int (*temp)(Device, int, unsigned*) = nullptr;
  int (*mem)(Device, Memory*) = nullptr;
};

std::unique_ptr<Nvml> Nvml::Load() {
  auto n = std::unique_ptr<Nvml>(new Nvml());
  n->fns_ = std::make_unique<Fns>();
  n->handle_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (n->handle_ == nullptr) return n;
  Fns& f = *n->fns_;
  auto sym = [&](const char* name) { return dlsym(n->handle_, name); };
  f.init = reinterpret_cast<int (*)()>(sym("nvmlInit_v2"));
  f.shutdown = reinterpret_cast<int (*)()>(sym("nvmlShutdown"));
  f.count = reinterpret_cast<int (*)(unsigned*)>(sym("nvmlDeviceGetCount_v2"));
  f.handle =
      reinterpret_cast<int (*)(unsigned, Fns::Device*)>(sym("nvmlDeviceGetHandleByIndex_v2"));
  f.util = reinterpret_cast<int (*)(Fns::Device, Fns::Utilization*)>(
      sym("nvmlDeviceGetUtilizationRates"));
  f.power = reinterpret_cast<int (*)(Fns::Device, unsigned*)>(sym("nvmlDeviceGetPowerUsage"));
  f.temp = reinterpret_cast<int (*)(Fns::Device, int, unsigned*)>(sym("nvmlDeviceGetTemperature"));
  f.mem = reinterpret_cast<int (*)(Fns::Device, Fns::Memory*)>(sym("nvmlDeviceGetMemoryInfo"));
  if (!f.init || !f.count || !f.handle || f.init() != 0 || f.count(&n->count_) != 0) {
    dlclose(n->handle_);
    n->handle_ = nullptr;
    n->count_ = 0;
  }
  return n;
}

Nvml::~Nvml() {
  if (handle_ != nullptr) {
    if (fns_->shutdown) fns_->shutdown();
    dlclose(handle_);
  }
}

std::vector<GpuSample> Nvml::Sample() {
  std::vector<GpuSample> out;
  if (!Available()) return out;
  Fns& f = *fns_;
  for (unsigned i = 0; i < count_; ++i) {
    Fns::Device d = nullptr;
    if (f.handle(i, &d) != 0) continue;
    GpuSample g;
    g.index = static_cast<int>(i);
    Fns::Utilization u{};
    if (f.util && f.util(d, &u) == 0) g.utilization = u.gpu / 100.0;
    unsigned mw = 0;
    if (f.power && f.power(d, &mw) == 0) g.power_watts = mw / 1000.0;
    unsigned t = 0;
    if (f.temp && f.temp(d, 0 /* NVML_TEMPERATURE_GPU */, &t) == 0) g.temperature_celsius = t;
    Fns::Memory m{};
    if (f.mem && f.mem(d, &m) == 0) g.memory_used_bytes = static_cast<double>(m.used);
    out.push_back(g);
  }
  return out;
}

}  // namespace megascope::tracer::agent
