// A node's /metrics page as the scale benchmarks serve it (bench/fleet_scale, bench/
// controller_scale): per rank the step gauges, per GPU utilisation and temperature, per node CPU
// and network (the registry's names). Node `n` (named `node`) holds ranks n * ranks_per_node on;
// `round` is the sample's second. A `hot` node is a failing one: its GPUs 25 degrees hotter and a
// third less busy, its steps 1.5x longer.
#pragma once

#include <cstdio>
#include <string>

namespace megascope::bench {

inline std::string FleetMetricsPage(const std::string& node, int n, int ranks_per_node, int round,
                                    bool hot) {
  std::string out;
  out.reserve(4096);
  char line[256];
  auto put = [&](const char* name, const std::string& labels, double v) {
    std::snprintf(line, sizeof(line), "%s{job=\"scale\",node=\"%s\"%s} %.6g\n", name, node.c_str(),
                  labels.c_str(), v);
    out += line;
  };
  const double wiggle = 0.002 * ((n * 7 + round * 3) % 11);
  for (int l = 0; l < ranks_per_node; ++l) {
    const std::string r = ",rank=\"" + std::to_string(n * ranks_per_node + l) + "\",dp=\"" +
                          std::to_string(n) + "\",pp=\"0\",tp=\"" + std::to_string(l) + "\"";
    const double slow = hot ? 1.5 : 1.0;  // a failing GPU: hot, less busy, its steps longer
    put("megascope_step", r, 100 + round);
    put("megascope_step_seconds", r, 0.2 * slow + wiggle);
    put("megascope_step_compute_seconds", r, 0.1 * slow + wiggle);
    put("megascope_step_comm_wait_seconds", r, 0.05 + wiggle);
    const std::string g = ",gpu=\"" + std::to_string(l) + "\"";
    put("megascope_gpu_utilization_ratio", g, (hot ? 0.6 : 0.9) - wiggle);
    put("megascope_gpu_temperature_celsius", g, 60 + 10 * wiggle + (hot ? 25 : 0));
  }
  put("megascope_node_cpu_utilization_ratio", "", 0.4 + wiggle);
  put("megascope_node_network_receive_bytes_total", "", 1e9 * (round + 1));
  return out;
}

}  // namespace megascope::bench
