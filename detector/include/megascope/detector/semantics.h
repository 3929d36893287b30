// What a metric means, from its owner: one table of the DCGM fields (dcgm-exporter's names),
// node_exporter's and InfiniBand's counters and megascope's own trainer metrics -- each with its
// type (gauge, counter, bitmask, code), unit, entity (machine, GPU, port), what "bad" means and the
// spellings an exporter upgrade gave it -- and, for names the table does not hold, the same facts
// guessed from the name's words (any exporter's spelling must work: docs/formats.md section 3).
//
// A series is named as Prometheus names it: `base{label="value",...}`. The labels that name an
// entity or a sub-series (gpu, device, port, mode, ...) stay part of its identity, so GPU 3 of a
// machine is compared with GPU 3 of its peers; labels that change with the exporter and not with
// the thing measured (instance, UUID, Hostname, the driver version, an XID's message) are dropped,
// and a renamed field is read under its current name, so an exporter upgrade does not cut a series.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace megascope::detector {

// What a metric tells, from its name's words (any exporter's spelling: cpu_util,
// node_cpu_utilization_ratio, DCGM_FI_DEV_XID_ERRORS, ...). Error counters and training metrics
// are strong evidence on their own; the others are families whose agreement corroborates.
enum class MetricFamily { kErrors, kTraining, kNvlink, kNetwork, kGpu, kCpu, kMemory, kOther };
MetricFamily ClassifyMetric(std::string_view name);
const char* MetricFamilyName(MetricFamily f);
inline bool IsStrong(MetricFamily f) {
  return f == MetricFamily::kErrors || f == MetricFamily::kTraining;
}
// Which exporter a metric comes from, from its name (DCGM_FI_*, nvidia_*, gpu_* -> the GPU
// exporter; node_*, cpu, memory, network -> the host's; step and compute times -> the trainer). A
// machine is silent only when every source stops; one source stopping while the others report is a
// monitoring gap (an exporter restarting or not deployed), never evidence against the machine --
// unless two of its sources stop together (its GPU fell off the bus and its trainer with it).
enum class MetricSource { kGpu, kHost, kTrainer, kOther };
constexpr int kMetricSources = 4;
MetricSource ClassifySource(std::string_view name);
const char* MetricSourceName(MetricSource s);  // gpu_exporter, node_exporter, trainer, other
// A metric of work done (utilisation, traffic: not temperature, power, memory or pause frames):
// such a metric at nothing while the peers' is busy means the machine stopped working -- hard
// evidence, the job waits on it.
bool IsWorkMetric(std::string_view name);
// A counter of a link's state changes (carrier changes, link downed, flaps): each count is a link
// going down or coming back, never a healthy card's routine correction, so a link that went down
// twice within the weak window's length is a flapping link, whatever its period.
bool IsLinkStateCounter(std::string_view name);
// An error gauge whose value names the error, not a count of them: DCGM's DCGM_FI_DEV_XID_ERRORS
// ("value of the last XID error encountered", dcgm-exporter) or an `..._xid_code` of another
// exporter. A new value is a new error (XID 74, an NVLink error, after XID 48, a double-bit ECC
// one).
bool IsErrorCode(std::string_view name);
// How many counts one flap (down, then up) adds to a link state counter: 2 for one of every
// carrier change (node_exporter's carrier_changes_total), 1 for one of downs alone (InfiniBand's
// link_downed, carrier_down_changes, flaps); 0 for any other metric.
int CountsPerLinkFlap(std::string_view name);
// A duration by its name's words (step_time_s, trainer_allreduce_wait_ms, ..._seconds): for a
// training metric, longer is slower.
bool IsDuration(std::string_view name);
// For a training metric, the sign of a deviation from its peers that says the machine holds its
// job back: +1 for a time of its own work (step_time_s, compute seconds: slower), -1 for a wait on
// its peers (in a collective the slowest machine waits least, and its peers wait on it) and for a
// rate of work (tokens, MFU, steps). A machine that waits longer than its peers is held back by
// them; that is no evidence that it is at fault.
int HoldsJobBackSign(std::string_view name);
// A cumulative counter: the table says so, or Prometheus's naming rule does (`_total`, any case).
// Stream turns its samples into per-second rates, resets skipped.
bool IsCumulativeCounter(std::string_view name);

// ---------------------------------------------------------------- the semantics table

// How a metric's value is read. FORMATS spellings: gauge, counter, bitmask, code.
enum class MetricKind {
  kGauge,    // a level (utilisation, temperature, bytes in use)
  kCounter,  // cumulative since its process started: its rate is its meaning; resets to 0
  kBitmask,  // bits that each mean something (DCGM's clock-event reasons): compared bit by bit
  kCode,     // a value that names something (the last XID): a new value is a new event
};
std::string_view MetricKindName(MetricKind k);
enum class MetricEntity { kMachine, kGpu, kPort };
std::string_view MetricEntityName(MetricEntity e);
// What one error means. kFatal: one event is a fault (an uncorrectable ECC error, an XID, a row
// remap failure). kBackground: healthy hardware shows a few (a corrected ECC error, an NVLink CRC
// retry, an InfiniBand symbol error): only a rate well above its peers' is evidence, and a single
// blip never is.
enum class ErrorWeight { kNone, kFatal, kBackground };

// One meaningful bit of a bitmask metric.
struct MetricBit {
  uint64_t mask;
  const char* name;  // the series' `reason` label (hw_thermal, sw_power_cap, ...)
  bool harm;         // set on one machine alone, it is hard evidence (the GPU is slowed down)
};

struct MetricSemantics {
  const char* name;                  // its owner's current spelling
  std::vector<const char*> aliases;  // older spellings (an exporter upgrade renamed it)
  MetricKind kind;
  const char* unit;
  MetricEntity entity;
  MetricFamily family;
  ErrorWeight errors;                // for error counters and codes
  const char* owner;                 // dcgm, node_exporter, megascope
  const char* bad;                   // what "bad" means, for people (docs/formats.md)
  std::vector<MetricBit> bits = {};  // kBitmask only
};

// The table, in docs/formats.md's order.
const std::vector<MetricSemantics>& KnownMetrics();
// The entry for a base name (no labels) or one of its aliases, any case; nullptr if unknown.
const MetricSemantics* FindMetric(std::string_view base);

// A series name taken apart: its base name (an alias replaced by the current name) and its labels,
// the volatile ones dropped, in name order.
struct SeriesName {
  std::string base;
  std::vector<std::pair<std::string, std::string>> labels;
  // `base{k="v",...}` (or `base` without labels): the series' identity in the detector.
  std::string Key() const;
  const std::string* Label(std::string_view name) const;
};
// Parses `base{k="v",...}` (Prometheus's text format: escapes \\ \" \n in values). Malformed
// label sets are kept whole in the base name (the series still works, as an unknown name).
SeriesName ParseSeries(std::string_view name);
// The base name of a series key, without its labels.
std::string_view BaseName(std::string_view key);

// What the detector does with one raw series: the series it feeds (a bitmask feeds one per
// meaningful bit, each 0 or 1) and whether its values are cumulative.
struct SeriesPlan {
  struct Target {
    std::string key;
    uint64_t mask = 0;  // 0: the value itself; else 1 when any of these bits is set
  };
  std::vector<Target> targets;
  bool cumulative = false;
};
SeriesPlan PlanSeries(std::string_view raw_name);

// Whether an error series carries fatal or background errors (kNone for other metrics). Unknown
// names: by their words (crc, replay, symbol, corrected, sbe: background; xid, dbe, uncorrectable,
// fatal: fatal); other error counters are background, so a fleet whose healthy machines all show
// some is judged against that rate, while errors on one machine of a quiet fleet still stand out.
ErrorWeight ErrorWeightOf(std::string_view key);

}  // namespace megascope::detector
