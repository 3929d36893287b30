#include "megascope/detector/semantics.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <unordered_map>

#include "megascope/detector/detector.h"
#include "megascope/tracer/enum_names.h"
#include "megascope/tracer/metric_names.h"

namespace megascope::detector {

// ---------------------------------------------------------------- the semantics table

namespace {

// docs/formats.md section 3's spellings, indexed by the enums' values.
constexpr std::array<std::string_view, 4> kKindNames = {"gauge", "counter", "bitmask", "code"};
constexpr std::array<std::string_view, 3> kEntityNames = {"machine", "gpu", "port"};
constexpr std::array<std::string_view, 8> kFamilyNames = {"errors", "training", "nvlink", "network",
                                                          "gpu",    "cpu",      "memory", "other"};
constexpr std::array<std::string_view, kMetricSources> kSourceNames = {
    "gpu_exporter", "node_exporter", "trainer", "other"};

}  // namespace

std::string_view MetricKindName(MetricKind k) { return tracer::NameFrom(kKindNames, k); }
std::string_view MetricEntityName(MetricEntity e) { return tracer::NameFrom(kEntityNames, e); }

namespace {

MetricFamily FamilyByWords(std::string_view key);
ErrorWeight ErrorWeightByWords(std::string_view key);
bool IsCumulativeByName(std::string_view name);

using K = MetricKind;
using E = MetricEntity;
using F = MetricFamily;
using W = ErrorWeight;

// DCGM's clock-event reasons (dcgm_fields.h DCGM_CLOCKS_EVENT_REASON_*, formerly
// DCGM_CLOCKS_THROTTLE_REASON_*). DCGM's own diagnostic counts HW slowdown, SW and HW thermal
// slowdown and the HW power brake as failures; a power cap, idling and sync boost are routine.
std::vector<MetricBit> ClockEventBits() {
  return {{0x1, "gpu_idle", false},   {0x4, "sw_power_cap", false}, {0x8, "hw_slowdown", true},
          {0x20, "sw_thermal", true}, {0x40, "hw_thermal", true},   {0x80, "hw_power_brake", true}};
}

// The table is data, one entry a line pair: an exception to the function-size limit, named in
// .clang-tidy.
// NOLINTNEXTLINE(readability-function-size)
std::vector<MetricSemantics> BuildTable() {
  const char* dcgm = "dcgm";
  const char* node = "node_exporter";
  // clang-format off
  std::vector<MetricSemantics> t = {
      // DCGM fields as dcgm-exporter names them (dcgm_fields.h; dcgm-exporter's counters CSV).
      {"DCGM_FI_DEV_GPU_UTIL", {}, K::kGauge, "%", E::kGpu, F::kGpu, W::kNone, dcgm,
       "near 0 while its peers work: the GPU stopped"},
      {"DCGM_FI_PROF_GR_ENGINE_ACTIVE", {}, K::kGauge, "ratio", E::kGpu, F::kGpu, W::kNone, dcgm,
       "below its peers: the GPU does less work"},
      {"DCGM_FI_PROF_SM_ACTIVE", {}, K::kGauge, "ratio", E::kGpu, F::kGpu, W::kNone, dcgm,
       "below its peers"},
      {"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", {}, K::kGauge, "ratio", E::kGpu, F::kGpu, W::kNone, dcgm,
       "below its peers"},
      {"DCGM_FI_PROF_DRAM_ACTIVE", {}, K::kGauge, "ratio", E::kGpu, F::kGpu, W::kNone, dcgm,
       "off its peers"},
      {"DCGM_FI_DEV_SM_CLOCK", {}, K::kGauge, "MHz", E::kGpu, F::kGpu, W::kNone, dcgm,
       "below its peers: throttled"},
      {"DCGM_FI_DEV_MEM_CLOCK", {}, K::kGauge, "MHz", E::kGpu, F::kGpu, W::kNone, dcgm,
       "below its peers: throttled"},
      {"DCGM_FI_DEV_GPU_TEMP", {}, K::kGauge, "C", E::kGpu, F::kGpu, W::kNone, dcgm,
       "above its peers: cooling"},
      {"DCGM_FI_DEV_MEMORY_TEMP", {}, K::kGauge, "C", E::kGpu, F::kGpu, W::kNone, dcgm,
       "above its peers: cooling"},
      {"DCGM_FI_DEV_POWER_USAGE", {}, K::kGauge, "W", E::kGpu, F::kGpu, W::kNone, dcgm,
       "off its peers: capped or idle"},
      {"DCGM_FI_DEV_ENFORCED_POWER_LIMIT", {}, K::kGauge, "W", E::kGpu, F::kGpu, W::kNone, dcgm,
       "below its peers: a power cap (the PSU, the BMC)"},
      {"DCGM_FI_DEV_POWER_MGMT_LIMIT", {}, K::kGauge, "W", E::kGpu, F::kGpu, W::kNone, dcgm,
       "below its peers: a power cap"},
      {"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", {},
       K::kCounter, "mJ", E::kGpu, F::kGpu, W::kNone, dcgm,
       "its rate (power) off its peers"},
      {"DCGM_FI_DEV_POWER_VIOLATION", {}, K::kCounter, "us", E::kGpu, F::kGpu, W::kNone, dcgm,
       "its rate: the share of time held back by power"},
      {"DCGM_FI_DEV_THERMAL_VIOLATION", {}, K::kCounter, "us", E::kGpu, F::kGpu, W::kNone, dcgm,
       "its rate: the share of time held back by heat"},
      {"DCGM_FI_DEV_FB_USED", {}, K::kGauge, "MiB", E::kGpu, F::kGpu, W::kNone, dcgm,
       "off its peers"},
      {"DCGM_FI_DEV_FB_FREE", {}, K::kGauge, "MiB", E::kGpu, F::kGpu, W::kNone, dcgm,
       "off its peers"},
      {"DCGM_FI_DEV_PCIE_LINK_GEN", {}, K::kGauge, "gen", E::kGpu, F::kGpu, W::kNone, dcgm,
       "below its peers: a downgraded PCIe link"},
      {"DCGM_FI_DEV_PCIE_LINK_WIDTH", {}, K::kGauge, "lanes", E::kGpu, F::kGpu, W::kNone, dcgm,
       "below its peers: a downgraded PCIe link"},
      {"DCGM_FI_PROF_PCIE_TX_BYTES", {}, K::kGauge, "B/s", E::kGpu, F::kGpu, W::kNone, dcgm,
       "below its peers"},
      {"DCGM_FI_PROF_PCIE_RX_BYTES", {}, K::kGauge, "B/s", E::kGpu, F::kGpu, W::kNone, dcgm,
       "below its peers"},
      {"DCGM_FI_PROF_NVLINK_TX_BYTES", {}, K::kGauge, "B/s", E::kGpu, F::kNvlink, W::kNone, dcgm,
       "below its peers"},
      {"DCGM_FI_PROF_NVLINK_RX_BYTES", {}, K::kGauge, "B/s", E::kGpu, F::kNvlink, W::kNone, dcgm,
       "below its peers"},
      {"DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", {},
       K::kCounter, "B", E::kGpu, F::kNvlink, W::kNone, dcgm,
       "its rate below its peers'"},
      {"DCGM_FI_DEV_CLOCKS_EVENT_REASONS", {"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"},
       K::kBitmask, "", E::kGpu, F::kGpu, W::kNone, dcgm,
       "a harmful bit (HW slowdown, SW or HW thermal, HW power brake) set while its peers' is"
       " not", ClockEventBits()},
      {"DCGM_FI_DEV_XID_ERRORS", {}, K::kCode, "xid", E::kGpu, F::kErrors, W::kFatal, dcgm,
       "the last XID: a value its peers do not show, a new value a new error"},
      {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", {},
       K::kCounter, "errors", E::kGpu, F::kErrors, W::kFatal, dcgm,
       "any: an uncorrectable memory error"},
      {"DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", {},
       K::kCounter, "errors", E::kGpu, F::kErrors, W::kFatal, dcgm,
       "any: an uncorrectable memory error"},
      {"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", {},
       K::kCounter, "errors", E::kGpu, F::kErrors, W::kBackground, dcgm,
       "a rate well above its peers': failing memory"},
      {"DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", {},
       K::kCounter, "errors", E::kGpu, F::kErrors, W::kBackground, dcgm,
       "a rate well above its peers'"},
      {"DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", {},
       K::kCounter, "rows", E::kGpu, F::kErrors, W::kFatal, dcgm,
       "any: a row retired after an uncorrectable error"},
      {"DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", {},
       K::kCounter, "rows", E::kGpu, F::kErrors, W::kBackground, dcgm,
       "a rate well above its peers'"},
      {"DCGM_FI_DEV_ROW_REMAP_FAILURE", {}, K::kGauge, "bool", E::kGpu, F::kErrors, W::kFatal, dcgm,
       "1: a row could not be remapped (the GPU needs service)"},
      {"DCGM_FI_DEV_PCIE_REPLAY_COUNTER", {},
       K::kCounter, "replays", E::kGpu, F::kErrors, W::kBackground, dcgm,
       "a rate well above its peers': a bad PCIe link"},
      {"DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", {},
       K::kCounter, "errors", E::kGpu, F::kErrors, W::kBackground, dcgm,
       "a rate well above its peers': a bad NVLink"},
      {"DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", {},
       K::kCounter, "errors", E::kGpu, F::kErrors, W::kBackground, dcgm,
       "a rate well above its peers'"},
      {"DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", {},
       K::kCounter, "errors", E::kGpu, F::kErrors, W::kBackground, dcgm,
       "a rate well above its peers'"},
      {"DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", {},
       K::kCounter, "errors", E::kGpu, F::kErrors, W::kFatal, dcgm,
       "any: an NVLink went down and was retrained"},
      // node_exporter (its collectors: cpu, meminfo, vmstat, netdev, netclass, infiniband,
      // pressure).
      {"node_cpu_seconds_total", {}, K::kCounter, "s", E::kMachine, F::kCpu, W::kNone, node,
       "per mode: steal or iowait above its peers'"},
      {"node_load1", {}, K::kGauge, "tasks", E::kMachine, F::kCpu, W::kNone, node,
       "above its peers"},
      {"node_memory_MemAvailable_bytes", {},
       K::kGauge, "B", E::kMachine, F::kMemory, W::kNone, node,
       "below its peers: a leak"},
      {"node_memory_MemFree_bytes", {}, K::kGauge, "B", E::kMachine, F::kMemory, W::kNone, node,
       "below its peers"},
      {"node_memory_SwapFree_bytes", {}, K::kGauge, "B", E::kMachine, F::kMemory, W::kNone, node,
       "below its peers: swapping"},
      {"node_vmstat_pswpin", {}, K::kCounter, "pages", E::kMachine, F::kErrors, W::kFatal, node,
       "any lasting rate: a training host swapping (its memory is exhausted)"},
      {"node_vmstat_pswpout", {}, K::kCounter, "pages", E::kMachine, F::kErrors, W::kFatal, node,
       "any lasting rate: a training host swapping (its memory is exhausted)"},
      {"node_vmstat_oom_kill", {}, K::kCounter, "kills", E::kMachine, F::kErrors, W::kFatal, node,
       "any: the kernel killed a process for memory"},
      {"node_pressure_memory_waiting_seconds_total", {},
       K::kCounter, "s", E::kMachine, F::kMemory, W::kNone, node,
       "a rate above its peers'"},
      {"node_pressure_cpu_waiting_seconds_total", {},
       K::kCounter, "s", E::kMachine, F::kCpu, W::kNone, node,
       "a rate above its peers'"},
      {"node_network_receive_bytes_total", {},
       K::kCounter, "B", E::kPort, F::kNetwork, W::kNone, node,
       "its rate near 0 while its peers' is not"},
      {"node_network_transmit_bytes_total", {},
       K::kCounter, "B", E::kPort, F::kNetwork, W::kNone, node,
       "its rate near 0 while its peers' is not"},
      {"node_network_receive_errs_total", {},
       K::kCounter, "errors", E::kPort, F::kErrors, W::kBackground, node,
       "a rate well above its peers'"},
      {"node_network_transmit_errs_total", {},
       K::kCounter, "errors", E::kPort, F::kErrors, W::kBackground, node,
       "a rate well above its peers'"},
      {"node_network_carrier_changes_total", {},
       K::kCounter, "changes", E::kPort, F::kErrors, W::kFatal, node,
       "any: the link went down (2 per flap)"},
      {"node_network_carrier_down_changes_total", {},
       K::kCounter, "changes", E::kPort, F::kErrors, W::kFatal, node,
       "any: the link went down"},
      {"node_network_up", {}, K::kGauge, "bool", E::kPort, F::kNetwork, W::kNone, node,
       "0 while its peers' is 1"},
      {"node_network_speed_bytes", {}, K::kGauge, "B/s", E::kPort, F::kNetwork, W::kNone, node,
       "below its peers: negotiated down"},
      {"node_infiniband_port_data_received_bytes_total", {},
       K::kCounter, "B", E::kPort, F::kNetwork, W::kNone, node,
       "its rate below its peers'"},
      {"node_infiniband_port_data_transmitted_bytes_total", {},
       K::kCounter, "B", E::kPort, F::kNetwork, W::kNone, node,
       "its rate below its peers'"},
      {"node_infiniband_port_transmit_wait_total", {},
       K::kCounter, "ticks", E::kPort, F::kNetwork, W::kNone, node,
       "a rate above its peers': congestion"},
      {"node_infiniband_rate_bytes_per_second", {},
       K::kGauge, "B/s", E::kPort, F::kNetwork, W::kNone, node,
       "below its peers: a port at reduced rate"},
      {"node_infiniband_state_id", {}, K::kGauge, "state", E::kPort, F::kNetwork, W::kNone, node,
       "not 4 (ACTIVE) while its peers' is"},
      {"node_infiniband_physical_state_id", {},
       K::kGauge, "state", E::kPort, F::kNetwork, W::kNone, node,
       "not 5 (LinkUp) while its peers' is"},
      {"node_infiniband_symbol_error_total", {},
       K::kCounter, "errors", E::kPort, F::kErrors, W::kBackground, node,
       "a rate well above its peers' (one blip is noise)"},
      {"node_infiniband_port_errors_received_total", {},
       K::kCounter, "errors", E::kPort, F::kErrors, W::kBackground, node,
       "a rate well above its peers'"},
      {"node_infiniband_link_error_recovery_total", {},
       K::kCounter, "errors", E::kPort, F::kErrors, W::kBackground, node,
       "a rate well above its peers'"},
      {"node_infiniband_link_downed_total", {},
       K::kCounter, "downs", E::kPort, F::kErrors, W::kFatal, node,
       "any: the port went down"},
  };
  // clang-format on
  // megascope's own trainer and agent metrics (the registry's detector inputs).
  for (const tracer::metrics::Def& d : tracer::metrics::All()) {
    if (d.detector_priority < 0) continue;
    const std::string_view name = d.name;
    if (std::any_of(t.begin(), t.end(), [&](const MetricSemantics& m) { return m.name == name; }))
      continue;  // megascope's agent writes node_exporter's name
    const bool counter = d.type == tracer::metrics::Type::kCounter;
    const MetricFamily family = FamilyByWords(name);
    const MetricEntity entity = d.scope == tracer::metrics::Scope::kGpu ? E::kGpu : E::kMachine;
    t.push_back({d.name.data(),
                 {},
                 counter ? K::kCounter : K::kGauge,
                 "",
                 entity,
                 family,
                 family == F::kErrors ? ErrorWeightByWords(name) : W::kNone,
                 "megascope",
                 d.help.data()});
  }
  return t;
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

struct Index {
  std::vector<MetricSemantics> table = BuildTable();
  std::unordered_map<std::string, size_t> by_name;  // lower-case name or alias -> entry
  Index() {
    for (size_t i = 0; i < table.size(); ++i) {
      by_name.emplace(Lower(table[i].name), i);
      for (const char* a : table[i].aliases) by_name.emplace(Lower(a), i);
    }
  }
};

const Index& TheIndex() {
  static const Index* index = new Index();
  return *index;
}

// Labels that change with the exporter, not with what is measured: never a series' identity.
bool Volatile(std::string_view label) {
  for (const char* v : {"instance",
                        "job",
                        "hostname",
                        "uuid",
                        "modelname",
                        "pci_bus_id",
                        "dcgm_fi_driver_version",
                        "driver_version",
                        "err_code",
                        "err_msg",
                        "container",
                        "pod",
                        "namespace",
                        "node",
                        "kubernetes_node",
                        "exported_pod",
                        "exported_namespace",
                        "exported_container",
                        "exported_instance",
                        "exported_job",
                        "__name__",
                        "device_name",
                        "serial"}) {
    if (Lower(label) == v) return true;
  }
  return false;
}

}  // namespace

const std::vector<MetricSemantics>& KnownMetrics() { return TheIndex().table; }

const MetricSemantics* FindMetric(std::string_view base) {
  const Index& idx = TheIndex();
  auto it = idx.by_name.find(Lower(base));
  return it == idx.by_name.end() ? nullptr : &idx.table[it->second];
}

std::string_view BaseName(std::string_view key) {
  const size_t brace = key.find('{');
  return brace == std::string_view::npos || key.back() != '}' ? key : key.substr(0, brace);
}

std::string SeriesName::Key() const {
  if (labels.empty()) return base;
  std::string out = base + "{";
  for (size_t i = 0; i < labels.size(); ++i) {
    if (i > 0) out += ',';
    out += labels[i].first + "=\"";
    for (char c : labels[i].second) {
      if (c == '"' || c == '\\') out += '\\';
      out += c;
    }
    out += '"';
  }
  return out + "}";
}

const std::string* SeriesName::Label(std::string_view name) const {
  for (const auto& [k, v] : labels) {
    if (k == name) return &v;
  }
  return nullptr;
}

SeriesName ParseSeries(std::string_view name) {
  SeriesName out;
  const std::string_view base = BaseName(name);
  out.base = std::string(base);
  if (base.size() != name.size()) {
    // {k="v",k2="v2"}: label names are [A-Za-z_][A-Za-z0-9_]*, values quoted with escapes.
    std::string_view rest = name.substr(base.size() + 1, name.size() - base.size() - 2);
    bool ok = true;
    while (ok && !rest.empty()) {
      while (!rest.empty() && (rest.front() == ' ' || rest.front() == ',')) rest.remove_prefix(1);
      if (rest.empty()) break;
      const size_t eq = rest.find('=');
      if (eq == std::string_view::npos || eq + 1 >= rest.size() || rest[eq + 1] != '"') {
        ok = false;
        break;
      }
      std::string key(rest.substr(0, eq));
      while (!key.empty() && key.back() == ' ') key.pop_back();
      std::string value;
      size_t i = eq + 2;
      for (; i < rest.size() && rest[i] != '"'; ++i) {
        if (rest[i] == '\\' && i + 1 < rest.size()) {
          ++i;
          value += rest[i] == 'n' ? '\n' : rest[i];
        } else {
          value += rest[i];
        }
      }
      if (i >= rest.size() || key.empty()) {
        ok = false;
        break;
      }
      rest.remove_prefix(i + 1);
      if (!Volatile(key)) out.labels.emplace_back(std::move(key), std::move(value));
    }
    if (!ok) {
      out.base = std::string(name);
      out.labels.clear();
    }
    std::sort(out.labels.begin(), out.labels.end());
  }
  if (const MetricSemantics* m = FindMetric(out.base)) out.base = m->name;
  return out;
}

SeriesPlan PlanSeries(std::string_view raw_name) {
  SeriesPlan plan;
  SeriesName s = ParseSeries(raw_name);
  const MetricSemantics* m = FindMetric(s.base);
  if (m != nullptr && m->kind == MetricKind::kBitmask) {
    for (const MetricBit& bit : m->bits) {
      SeriesName b = s;
      b.labels.emplace_back("reason", bit.name);
      std::sort(b.labels.begin(), b.labels.end());
      plan.targets.push_back({b.Key(), bit.mask});
    }
    return plan;
  }
  plan.targets.push_back({s.Key(), 0});
  plan.cumulative = IsCumulativeCounter(plan.targets[0].key);
  return plan;
}

namespace {

// A series' table entry and, for a bitmask's series, its bit (by its `reason` label).
struct Known {
  const MetricSemantics* m = nullptr;
  const MetricBit* bit = nullptr;
};

Known Lookup(std::string_view key) {
  Known k;
  const std::string_view base = BaseName(key);
  k.m = FindMetric(base);
  if (k.m == nullptr || k.m->kind != MetricKind::kBitmask || base.size() == key.size()) return k;
  const SeriesName s = ParseSeries(key);
  if (const std::string* reason = s.Label("reason")) {
    for (const MetricBit& b : k.m->bits) {
      if (*reason == b.name) k.bit = &b;
    }
  }
  return k;
}

}  // namespace

// ---------------------------------------------------------------- metric families

namespace {

std::vector<std::string> Words(std::string_view key) {
  std::vector<std::string> words(1);
  for (char c : BaseName(key)) {
    if (std::isalnum(static_cast<unsigned char>(c))) {
      words.back() += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    } else if (!words.back().empty()) {
      words.emplace_back();
    }
  }
  if (words.back().empty()) words.pop_back();
  return words;
}

// Whether any of `words` is one of `any`.
bool HasWord(const std::vector<std::string>& words, std::initializer_list<const char*> any) {
  for (const std::string& word : words) {
    for (const char* a : any) {
      if (word == a) return true;
    }
  }
  return false;
}

}  // namespace

std::vector<std::string> DefaultPriority() {
  std::vector<const tracer::metrics::Def*> defs;
  for (const tracer::metrics::Def& d : tracer::metrics::All()) {
    if (d.detector_priority >= 0) defs.push_back(&d);
  }
  std::sort(defs.begin(), defs.end(),
            [](auto* a, auto* b) { return a->detector_priority < b->detector_priority; });
  std::vector<std::string> out;
  out.reserve(defs.size());
  for (auto* d : defs) out.emplace_back(d->name);
  return out;
}

MetricFamily ClassifyMetric(std::string_view name) {
  if (const Known k = Lookup(name); k.m != nullptr) {
    if (k.bit != nullptr) return k.bit->harm ? MetricFamily::kErrors : k.m->family;
    return k.m->family;
  }
  return FamilyByWords(name);
}

namespace {

MetricFamily FamilyByWords(std::string_view name) {
  const std::vector<std::string> w = Words(name);
  auto has = [&](std::initializer_list<const char*> any) { return HasWord(w, any); };
  // Order matters: "gpu_xid_errors" is an error counter before it is a GPU metric, and
  // "nvlink_tx" is NVLink before it is network.
  if (has({"xid", "xids", "ecc", "error", "errors", "sbe", "dbe", "retired", "remapped",
           "faults"}) ||
      IsLinkStateCounter(name)) {
    return MetricFamily::kErrors;
  }
  // A rank's own step, compute or collective wait time: how much it holds the job back.
  if (has({"step", "steps", "iteration", "mfu", "tokens"}) ||
      (has({"compute"}) && has({"seconds", "s", "ms", "time"})) ||
      (has({"wait"}) && has({"allreduce", "collective", "collectives", "nccl", "comm"}))) {
    return MetricFamily::kTraining;
  }
  if (has({"nvlink", "nvl"})) return MetricFamily::kNvlink;
  if (has({"net", "network", "nic", "pfc", "rdma", "ib", "infiniband", "roce", "tx", "rx",
           "transmit", "transmitted", "receive", "received", "xmit", "rcv"})) {
    return MetricFamily::kNetwork;
  }
  if (has({"gpu", "dcgm", "sm", "tensor", "power", "temp", "temperature", "fb", "clock", "pcie"})) {
    return MetricFamily::kGpu;
  }
  if (has({"cpu", "load", "load1", "load5", "load15"})) return MetricFamily::kCpu;
  if (has({"mem", "memory"})) return MetricFamily::kMemory;
  return MetricFamily::kOther;
}

bool IsErrorCodeByWords(std::string_view name) {
  const std::vector<std::string> words = Words(name);
  return HasWord(words, {"xid", "xids"}) && HasWord(words, {"code"}) &&
         !IsCumulativeByName(BaseName(name));
}

// Words alone (the table is built with these, so they never look it up).
ErrorWeight ErrorWeightByWords(std::string_view key) {
  const std::vector<std::string> w = Words(key);
  if (IsLinkStateCounter(key) || IsErrorCodeByWords(key) ||
      HasWord(w, {"xid", "xids", "dbe", "uncorrectable", "uncorrected", "fatal", "downed", "oom",
                  "remap", "retired"}))
    return ErrorWeight::kFatal;
  return ErrorWeight::kBackground;  // crc, replay, symbol, sbe, corrected -- and plain "errors"
}

}  // namespace

// The spellings index the enums' values; each is a literal, so data() is null-terminated.
const char* MetricFamilyName(MetricFamily f) { return tracer::NameFrom(kFamilyNames, f).data(); }

MetricSource ClassifySource(std::string_view name) {
  if (const Known k = Lookup(name); k.m != nullptr) {
    const std::string_view owner = k.m->owner;
    if (owner == "dcgm") return MetricSource::kGpu;
    if (owner == "node_exporter") return MetricSource::kHost;
  }
  const std::vector<std::string> w = Words(name);
  // The exporter's prefix when there is one (megascope's own names carry theirs after it).
  const size_t at = !w.empty() && w[0] == "megascope" ? 1 : 0;
  const std::string lead = at < w.size() ? w[at] : "";
  for (const char* g : {"dcgm", "nvidia", "nvml", "gpu", "nvsmi"}) {
    if (lead == g) return MetricSource::kGpu;
  }
  for (const char* h : {"node", "host", "ipmi", "process"}) {
    if (lead == h) return MetricSource::kHost;
  }
  switch (ClassifyMetric(name)) {
    case MetricFamily::kTraining:
      return MetricSource::kTrainer;
    case MetricFamily::kGpu:
    case MetricFamily::kNvlink:
      return MetricSource::kGpu;
    case MetricFamily::kCpu:
    case MetricFamily::kMemory:
    case MetricFamily::kNetwork:
      return MetricSource::kHost;
    case MetricFamily::kErrors:
      for (const std::string& word : w) {
        for (const char* g : {"xid", "xids", "ecc", "sbe", "dbe", "retired", "remapped"}) {
          if (word == g) return MetricSource::kGpu;
        }
      }
      return MetricSource::kHost;  // a NIC's carrier changes, link errors
    case MetricFamily::kOther:
      break;
  }
  return MetricSource::kOther;
}

const char* MetricSourceName(MetricSource s) { return tracer::NameFrom(kSourceNames, s).data(); }

bool IsWorkMetric(std::string_view name) {
  const MetricFamily f = ClassifyMetric(name);
  if (f != MetricFamily::kGpu && f != MetricFamily::kNetwork && f != MetricFamily::kNvlink)
    return false;
  bool work = false;
  for (const std::string& w : Words(name)) {
    for (const char* no :
         {"pfc", "pause", "drop", "drops", "dropped", "temp", "temperature", "mem", "memory", "fb",
          "power", "clock", "errors", "discard", "discards", "wait", "waits"}) {
      if (w == no) return false;
    }
    for (const char* yes : {"util", "utilization", "active", "tx", "rx", "transmit", "receive",
                            "bytes", "gbps", "throughput", "bandwidth", "bw", "packets"}) {
      work = work || w == yes;
    }
  }
  return work;
}

bool IsDuration(std::string_view name) {
  return HasWord(Words(name), {"time", "seconds", "ms", "duration", "wait", "latency"});
}

int HoldsJobBackSign(std::string_view name) {
  const std::vector<std::string> w = Words(name);
  if (HasWord(w, {"wait", "waits", "waiting"})) return -1;
  return IsDuration(name) ? 1 : -1;
}

int CountsPerLinkFlap(std::string_view name) {
  const std::vector<std::string> words = Words(name);
  auto has = [&](std::initializer_list<const char*> any) { return HasWord(words, any); };
  if (has({"carrier"}) && has({"changes"}))
    return has({"down", "up"}) ? 1 : 2;  // node_exporter's carrier_down_changes: downs alone
  return (has({"carrier"}) && has({"flaps"})) ||
                 (has({"link"}) && has({"downed", "flaps", "flapped"}))
             ? 1
             : 0;
}

bool IsLinkStateCounter(std::string_view name) { return CountsPerLinkFlap(name) > 0; }

bool IsErrorCode(std::string_view name) {
  if (const Known k = Lookup(name); k.m != nullptr)
    return k.m->kind == MetricKind::kCode && k.m->errors != ErrorWeight::kNone;
  return IsErrorCodeByWords(name);
}

bool IsCumulativeCounter(std::string_view key) {
  if (const Known k = Lookup(key); k.m != nullptr) return k.m->kind == MetricKind::kCounter;
  return IsCumulativeByName(BaseName(key));
}

namespace {

bool IsCumulativeByName(std::string_view name) {
  if (name.size() < 6) return false;
  std::string tail(name.substr(name.size() - 6));
  for (char& c : tail) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return tail == "_total";
}

}  // namespace

ErrorWeight ErrorWeightOf(std::string_view key) {
  const Known k = Lookup(key);
  if (k.m != nullptr) {
    if (k.bit != nullptr) return k.bit->harm ? ErrorWeight::kFatal : ErrorWeight::kNone;
    return k.m->family == MetricFamily::kErrors ? k.m->errors : ErrorWeight::kNone;
  }
  return ClassifyMetric(key) == MetricFamily::kErrors ? ErrorWeightByWords(key)
                                                      : ErrorWeight::kNone;
}

}  // namespace megascope::detector
