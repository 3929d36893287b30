#include "megascope/tracer/metric_names.h"

#include <array>

namespace megascope::tracer::metrics {
namespace {

constexpr std::array kAll = {kStep,
                             kStepDuration,
                             kStepSeconds,
                             kStepCompute,
                             kStepCommWait,
                             kCompute,
                             kCommWait,
                             kCollectiveDuration,
                             kTokensPerSecond,
                             kMfu,
                             kHeartbeatAge,
                             kTraceRecords,
                             kTraceDropped,
                             kNodeCpu,
                             kNodeMemory,
                             kNodeNetRx,
                             kNodeNetTx,
                             kNodeNetRxErrors,
                             kNodeNetTxErrors,
                             kNodeDiskRead,
                             kNodeDiskWritten,
                             kGpuUtil,
                             kGpuPower,
                             kGpuTemp,
                             kGpuMemory,
                             kGpuXid,
                             kAgentRows,
                             kAgentDbErrors,
                             kStoreRows,
                             kStoreLag,
                             kStoreDropped,
                             kStoreErrors,
                             kRestarts,
                             kEvictions,
                             kDetectorScore,
                             kVerdicts};

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

std::span<const Def> All() { return kAll; }

std::string_view SignalName(std::string_view name) {
  if (name.rfind("megascope_", 0) == 0) name.remove_prefix(10);
  if (name.rfind("gpu", 0) == 0) {  // "gpu0.gpu_power_watts": one series per GPU in trace.db
    const auto dot = name.find('.');
    if (dot != std::string_view::npos) name.remove_prefix(dot + 1);
  }
  for (std::string_view suffix : {std::string_view("_total"), std::string_view("_per_second")}) {
    if (EndsWith(name, suffix)) return name.substr(0, name.size() - suffix.size());
  }
  return name;
}

const Def* Find(std::string_view name) {
  if (name.rfind("megascope_", 0) == 0) name.remove_prefix(10);
  const std::string_view signal = SignalName(name);
  for (const Def& d : kAll) {
    if (d.name == name) return &d;
  }
  for (const Def& d : kAll) {  // another spelling: a counter's rate, a GPU's series
    if (d.name == signal || (d.type == Type::kCounter && SignalName(d.name) == signal)) return &d;
  }
  return nullptr;
}

std::string PrometheusName(const Def& d) { return "megascope_" + std::string(d.name); }

std::string ExportName(std::string_view name) {
  if (EndsWith(name, "_total")) return std::string(name.substr(0, name.size() - 6)) + "_per_second";
  return std::string(name);
}

}  // namespace megascope::tracer::metrics
