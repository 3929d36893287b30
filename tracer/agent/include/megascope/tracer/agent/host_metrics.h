// Host metrics from /proc (CPU utilisation, memory, network and disk bytes), read under a root
// directory so tests can point it at a fake /proc tree; and GPU metrics through NVML, loaded with
// dlopen when present so the agent runs everywhere.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "megascope/tracer/status.h"

namespace megascope::tracer::agent {

struct HostSample {
  double cpu_utilization = 0;    // 0..1 since the previous sample (0 on the first)
  double memory_used_bytes = 0;  // MemTotal - MemAvailable
  double network_receive_bytes = 0,
         network_transmit_bytes = 0;                 // cumulative, all interfaces but lo
  double disk_read_bytes = 0, disk_write_bytes = 0;  // cumulative, whole disks
  double network_receive_errors = 0, network_transmit_errors = 0;  // cumulative, as network_*
};

class HostSampler {
 public:
  explicit HostSampler(std::string proc_root = "/proc") : root_(std::move(proc_root)) {}
  Result<HostSample> Sample();

 private:
  std::string root_;
  uint64_t last_busy_ = 0, last_total_ = 0;
};

struct GpuSample {
  int index = 0;
  double utilization = 0;  // 0..1
  double power_watts = 0;
  double temperature_celsius = 0;
  double memory_used_bytes = 0;
};

// NVML through dlopen; Available() is false where libnvidia-ml is missing or finds no GPU.
class Nvml {
 public:
  static std::unique_ptr<Nvml> Load();  // never fails: an unavailable Nvml samples nothing
  ~Nvml();
  bool Available() const { return handle_ != nullptr && count_ > 0; }
  std::vector<GpuSample> Sample();

 private:
  void* handle_ = nullptr;
  unsigned count_ = 0;
  struct Fns;
  std::unique_ptr<Fns> fns_;
};

}  // namespace megascope::tracer::agent
