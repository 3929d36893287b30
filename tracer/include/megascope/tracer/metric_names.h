// The metric names of docs/formats.md section 5, declared once. The agent registers its Prometheus
// families from this table and writes its trace.db samples under these names; `megascope metrics
// export` writes them (counters as `_per_second` rates); the detector walks them first; the
// dashboards and docs use them (a test checks every `megascope_` name there is declared here).
//
// `name` is the name without the `megascope_` prefix, as it stands in trace.db's metrics table and
// in the detector's input. Counters end in `_total`; their rates end in `_per_second` instead.
#pragma once

#include <span>
#include <string>
#include <string_view>

namespace megascope::tracer::metrics {

enum class Type { kGauge, kCounter, kHistogram };
enum class Scope { kRank, kNode, kGpu };  // labels: job, node (+ rank, dp, pp, tp | + gpu)

struct Def {
  std::string_view name;
  Type type;
  Scope scope;
  std::string_view help;
  int detector_priority;  // -1: not a detector input; else the order the detector walks it in
};

// Per rank (the training loop and the flight recorder).
inline constexpr Def kStep{"step", Type::kGauge, Scope::kRank, "Last finished training step", -1};
inline constexpr Def kStepDuration{"step_duration_seconds", Type::kHistogram, Scope::kRank,
                                   "Training step time", -1};
// The rank's last step, as gauges the detector compares across machines (histograms it skips).
inline constexpr Def kStepSeconds{"step_seconds", Type::kGauge, Scope::kRank,
                                  "Time of the rank's last training step", 0};
inline constexpr Def kStepCompute{
    "step_compute_seconds", Type::kGauge, Scope::kRank,
    "Time in forward, backward, optimizer and compute spans during the rank's last step", 1};
inline constexpr Def kStepCommWait{"step_comm_wait_seconds", Type::kGauge, Scope::kRank,
                                   "Time in communication spans during the rank's last step", 2};
inline constexpr Def kCompute{"compute_seconds_total", Type::kCounter, Scope::kRank,
                              "Time in forward, backward and optimizer spans", -1};
inline constexpr Def kCommWait{"comm_wait_seconds_total", Type::kCounter, Scope::kRank,
                               "Time in communication spans", -1};
inline constexpr Def kCollectiveDuration{"collective_duration_seconds", Type::kHistogram,
                                         Scope::kRank,
                                         "Collective and p2p op time, enqueue to completion", -1};
inline constexpr Def kTokensPerSecond{"tokens_per_second", Type::kGauge, Scope::kRank,
                                      "Training throughput of the last step", 3};
inline constexpr Def kMfu{"mfu_ratio", Type::kGauge, Scope::kRank,
                          "Model FLOPs utilisation of the last step (GPU only)", 4};
inline constexpr Def kHeartbeatAge{"heartbeat_age_seconds", Type::kGauge, Scope::kRank,
                                   "Seconds since the rank's last heartbeat", -1};
inline constexpr Def kTraceRecords{"trace_records_total", Type::kCounter, Scope::kRank,
                                   "Trace records drained from the rank's ring", -1};
inline constexpr Def kTraceDropped{"trace_dropped_records_total", Type::kCounter, Scope::kRank,
                                   "Trace records dropped because the ring was full", -1};
// Per node (the host).
inline constexpr Def kNodeCpu{"node_cpu_utilization_ratio", Type::kGauge, Scope::kNode,
                              "Host CPU utilisation", 10};
inline constexpr Def kNodeMemory{"node_memory_used_bytes", Type::kGauge, Scope::kNode,
                                 "Host memory in use (total - available)", 14};
inline constexpr Def kNodeNetRx{"node_network_receive_bytes_total", Type::kCounter, Scope::kNode,
                                "Bytes received, all interfaces but lo", 12};
inline constexpr Def kNodeNetTx{"node_network_transmit_bytes_total", Type::kCounter, Scope::kNode,
                                "Bytes sent, all interfaces but lo", 11};
inline constexpr Def kNodeNetRxErrors{"node_network_receive_errors_total", Type::kCounter,
                                      Scope::kNode,
                                      "Receive errors, all interfaces but lo (bad frames, CRC)", 5};
inline constexpr Def kNodeNetTxErrors{"node_network_transmit_errors_total", Type::kCounter,
                                      Scope::kNode, "Transmit errors, all interfaces but lo", 6};
inline constexpr Def kNodeDiskRead{"node_disk_read_bytes_total", Type::kCounter, Scope::kNode,
                                   "Bytes read from whole disks", 15};
inline constexpr Def kNodeDiskWritten{"node_disk_written_bytes_total", Type::kCounter, Scope::kNode,
                                      "Bytes written to whole disks", 16};
// Per GPU (NVML, when present).
inline constexpr Def kGpuUtil{"gpu_utilization_ratio", Type::kGauge, Scope::kGpu,
                              "GPU utilisation (NVML)", 8};
inline constexpr Def kGpuPower{"gpu_power_watts", Type::kGauge, Scope::kGpu,
                               "GPU power draw (NVML)", 9};
inline constexpr Def kGpuTemp{"gpu_temperature_celsius", Type::kGauge, Scope::kGpu,
                              "GPU temperature (NVML)", 13};
inline constexpr Def kGpuMemory{"gpu_memory_used_bytes", Type::kGauge, Scope::kGpu,
                                "GPU memory in use (NVML)", 17};
inline constexpr Def kGpuXid{"gpu_xid_errors_total", Type::kCounter, Scope::kGpu,
                             "XID errors the driver reported (NVML)", 7};
// The agent itself and the controller.
inline constexpr Def kAgentRows{"agent_rows_written_total", Type::kCounter, Scope::kNode,
                                "Rows the agent wrote to trace.db", -1};
inline constexpr Def kAgentDbErrors{"agent_db_errors_total", Type::kCounter, Scope::kNode,
                                    "Failed trace.db transactions (records stay in the rings)", -1};
// The agent's ClickHouse sink (docs/formats.md section 4b), when a store is configured.
inline constexpr Def kStoreRows{"store_rows_total", Type::kCounter, Scope::kNode,
                                "Rows the ClickHouse store acknowledged", -1};
inline constexpr Def kStoreLag{"store_lag_rows", Type::kGauge, Scope::kNode,
                               "Rows in trace.db the ClickHouse store has not acknowledged yet",
                               -1};
inline constexpr Def kStoreDropped{
    "store_dropped_rows_total", Type::kCounter, Scope::kNode,
    "Rows trace.db's retention removed before the ClickHouse store acknowledged them", -1};
inline constexpr Def kStoreErrors{
    "store_errors_total", Type::kCounter, Scope::kNode,
    "Failed batches to the ClickHouse store (the rows wait in trace.db)", -1};
inline constexpr Def kRestarts{"restarts_total", Type::kCounter, Scope::kNode,
                               "Restarts of the job by the controller, by cause", -1};
inline constexpr Def kEvictions{"evictions_total", Type::kCounter, Scope::kNode,
                                "Nodes evicted by the controller, by reason", -1};
inline constexpr Def kDetectorScore{"detector_score", Type::kGauge, Scope::kNode,
                                    "Largest robust z of the node on its last detector tick", -1};
inline constexpr Def kVerdicts{"verdicts_total", Type::kCounter, Scope::kNode,
                               "Verdicts by kind and cause", -1};

// Every declared metric, in the order above.
std::span<const Def> All();
// The declared metric of `name` (with or without the prefix; a `_per_second` rate finds its
// counter; a per-GPU sample's "gpuN." prefix is ignored), or nullptr.
const Def* Find(std::string_view name);
// "megascope_" + name.
std::string PrometheusName(const Def& d);
// The name `megascope metrics export` writes: a counter's `_total` becomes `_per_second`.
std::string ExportName(std::string_view name);
// The name without `_total` / `_per_second` and without a "gpuN." prefix: one signal's spellings
// compare equal by it.
std::string_view SignalName(std::string_view name);

}  // namespace megascope::tracer::metrics
