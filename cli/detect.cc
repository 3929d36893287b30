// `megascope detect` (offline faulty-machine detection over a metrics CSV) and
// `megascope fleet-sim` (a labelled synthetic fleet to evaluate it on).
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <functional>
#include <memory>
#include <sstream>

#include "command.h"
#include "megascope/detector/baselines.h"
#include "megascope/detector/detector.h"
#include "megascope/detector/elastic_fleet.h"
#include "megascope/detector/evaluate.h"
#include "megascope/detector/fleet_sim.h"
#include "megascope/detector/incident_fleet.h"
#include "megascope/detector/prom_fleet.h"
#include "megascope/detector/time_order.h"
#include "megascope/tracer/format.h"

namespace megascope::cli {
namespace {

using namespace megascope::detector;

// Data time for people: UTC date and time for epoch timestamps, else seconds since the start.
std::string When(int64_t ns) {
  const time_t secs = static_cast<time_t>(ns / 1'000'000'000);
  if (secs < 1'000'000'000) return tracer::Format("t=%llds", static_cast<long long>(secs));
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%SZ", &tm);
  return buf;
}

// The detector named by --baseline: megascope's, or one of the baselines it is compared with.
std::unique_ptr<FrameDetector> MakeDetector(const std::string& baseline,
                                            const DetectorConfig& cfg) {
  if (baseline == "megascope") return std::make_unique<Detector>(cfg);
  if (baseline == "zscore") return std::make_unique<ZScoreBaseline>();
  if (baseline == "mahalanobis") return std::make_unique<MahalanobisBaseline>();
  return nullptr;
}

// Where `detect` reads its samples from: the file in time order (sorted in bounded memory), or as
// it is (--presorted: a live-like stream, the lateness bound applies).
struct SampleSource {
  std::function<bool(Sample*)> next;
  std::function<double()> done;  // share of the work done, for progress
  std::function<Status()> status;
  bool large = false;
};

Result<SampleSource> OpenSource(const std::string& path, bool presorted,
                                std::shared_ptr<void>* keep) {
  SampleSource src;
  if (presorted) {
    ASSIGN_OR_RETURN(auto reader, MetricsCsvReader::Open(path));
    std::shared_ptr<MetricsCsvReader> r(std::move(reader));
    *keep = r;
    src.large = r->file_size() > (32 << 20);
    src.next = [r](Sample* s) { return r->Next(s); };
    src.done = [r] {
      return static_cast<double>(r->bytes_read()) / static_cast<double>(r->file_size());
    };
    src.status = [r] { return r->status(); };
    return src;
  }
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  const bool large = !ec && size > (32u << 20);
  TimeOrderedReader::Options opts;
  auto last = std::chrono::steady_clock::now();
  if (large) {
    opts.progress = [&last](int64_t read, int64_t total) {
      auto now = std::chrono::steady_clock::now();
      if (now - last < std::chrono::seconds(2)) return;
      last = now;
      std::fprintf(stderr, "[detect] reading and sorting by time %3.0f%%\n",
                   100.0 * static_cast<double>(read) / static_cast<double>(total));
    };
  }
  ASSIGN_OR_RETURN(auto reader, TimeOrderedReader::Open(path, opts));
  std::shared_ptr<TimeOrderedReader> r(std::move(reader));
  *keep = r;
  src.large = large;
  src.next = [r](Sample* s) { return r->Next(s); };
  src.done = [r] {
    return r->rows() == 0
               ? 1.0
               : static_cast<double>(r->rows_returned()) / static_cast<double>(r->rows());
  };
  src.status = [r] { return r->status(); };
  return src;
}

// Feeds every sample of `src` to `stream`, printing verdicts as they come (`print`) and, for a
// large file, progress on stderr. Returns the rows read.
Result<int64_t> DetectOver(const SampleSource& src, Stream& stream,
                           const std::function<void(std::vector<Verdict>)>& print,
                           const std::vector<Verdict>& all) {
  auto last_report = std::chrono::steady_clock::now();
  Sample s;
  int64_t rows = 0;
  while (src.next(&s)) {
    stream.Add(s);
    if ((++rows & 0xffff) != 0) continue;
    print(stream.TakeVerdicts());
    auto now = std::chrono::steady_clock::now();
    if (src.large && now - last_report > std::chrono::seconds(2)) {
      last_report = now;
      std::fprintf(stderr, "[detect] %3.0f%%  %lld rows, %zu verdicts\n", 100.0 * src.done(),
                   static_cast<long long>(rows), all.size());
    }
  }
  if (Status st = src.status(); !st.ok()) {
    print(stream.TakeVerdicts());
    return st;
  }
  stream.Flush();
  print(stream.TakeVerdicts());
  return rows;
}

}  // namespace

namespace {

// What `detect` was asked.
struct DetectArgs {
  std::string metrics, labels, groups, topology, baseline = "megascope";
  bool json = false, presorted = false;
  double lateness = 60;
  DetectorConfig cfg;
};

po::options_description DetectOptions(DetectArgs& a) {
  DetectorConfig& cfg = a.cfg;
  po::options_description opts("Options");
  opts.add_options()("help,h", "show this help")("metrics", po::value(&a.metrics)->required(),
                                                 "metrics CSV (timestamp_s,machine,metric,value)")(
      "labels", po::value(&a.labels),
      "labels CSV (machine,fault_start_s,fault_end_s,fault_type): score the verdicts")(
      "groups", po::value(&a.groups),
      "peer groups CSV (machine,group): compare machines only within a group")(
      "topology", po::value(&a.topology),
      "shared components CSV (machine,component; component as kind:name, e.g. rack:r03): machines "
      "of one component that stand out together are named as that component, not as faulty")(
      "json", po::bool_switch(&a.json), "print verdicts as JSON lines (docs/formats.md section 2)")(
      "window", po::value(&cfg.denoise_window)->default_value(cfg.denoise_window),
      "denoising window (ticks)")("continuity",
                                  po::value(&cfg.continuity)->default_value(cfg.continuity),
                                  "continuity window (ticks) a machine must stay the outlier on "
                                  "strong evidence (silent, an error "
                                  "counter, a training metric) or on two metric families at once")(
      "weak-continuity", po::value(&cfg.weak_continuity)->default_value(cfg.weak_continuity),
      "window (ticks) for evidence from one metric family alone: longer than benign excursions")(
      "threshold", po::value(&cfg.threshold)->default_value(cfg.threshold),
      "robust |z| that makes an outlier")("tick", po::value(&cfg.tick_s)->default_value(cfg.tick_s),
                                          "tick length in seconds")(
      "presorted", po::bool_switch(&a.presorted),
      "read the file as it is, as a live stream: rows more than --max-lateness out of time order "
      "are ignored (default: the file is read in time order whatever its rows' order -- series "
      "by series, as promtool tsdb dump writes it -- sorted in bounded memory)")(
      "max-lateness", po::value(&a.lateness)->default_value(a.lateness),
      "with --presorted: seconds a sample may arrive out of time order; later ones are ignored "
      "and counted")("baseline", po::value(&a.baseline)->default_value(a.baseline),
                     "detector: megascope, zscore or mahalanobis");
  return opts;
}

// The topology and peer groups files (either may be empty: none) into the detector's settings.
Status ReadPeers(const std::string& topology, const std::string& groups, DetectorConfig* cfg) {
  if (!topology.empty()) {
    ASSIGN_OR_RETURN(auto t, ReadTopologyCsv(topology));
    for (auto& [machine, component] : t) cfg->components[machine].push_back(component);
  }
  if (!groups.empty()) {
    ASSIGN_OR_RETURN(auto g, ReadGroupsCsv(groups));
    for (auto& [machine, group] : g) cfg->groups[machine] = group;
  }
  return Status::Ok();
}

}  // namespace

int RunDetect(const Args& args) {
  DetectArgs a;
  const std::string &metrics = a.metrics, &labels = a.labels, &groups = a.groups,
                    &baseline = a.baseline;
  const bool& json = a.json;
  const double& lateness = a.lateness;
  DetectorConfig& cfg = a.cfg;
  po::options_description opts = DetectOptions(a);
  po::variables_map vm;
  if (auto rc = ParseArgs("detect",
                          "megascope detect --metrics M.csv [--labels L.csv] [--groups G.csv] "
                          "[--topology T.csv] [--json]",
                          args, opts, {}, &vm)) {
    return *rc;
  }
  if (cfg.denoise_window < 1 || cfg.continuity < 1 || cfg.weak_continuity < 1 || cfg.tick_s <= 0 ||
      cfg.threshold <= 0) {
    return Fail(
        "detect",
        "--window, --continuity, --weak-continuity, --tick and --threshold must be positive",
        kExitUsage);
  }
  if (Status st = ReadPeers(a.topology, groups, &cfg); !st.ok())
    return Fail("detect", st.message());
  std::vector<Label> truth;
  if (!labels.empty()) {
    auto l = ReadLabelsCsv(labels);
    if (!l.ok()) return Fail("detect", l.status().message());
    truth = std::move(l).value();
  }
  std::unique_ptr<FrameDetector> det = MakeDetector(baseline, cfg);
  if (det == nullptr)
    return Fail("detect", "--baseline must be megascope, zscore or mahalanobis", kExitUsage);
  std::shared_ptr<void> keep;
  auto source = OpenSource(metrics, a.presorted, &keep);
  if (!source.ok()) return Fail("detect", source.status().message());
  Stream stream(det.get(), cfg.tick_s, lateness);
  std::vector<Verdict> all;
  auto print = [&](std::vector<Verdict> vs) {
    for (Verdict& v : vs) {
      if (json) {
        std::printf("%s\n", VerdictToJson(v).c_str());
      } else {
        std::string nodes;
        for (const std::string& n : v.root_nodes) nodes += (nodes.empty() ? "" : ",") + n;
        const std::string kind =
            std::string(Name(v.kind)) +
            (v.kind == VerdictKind::kFaultyMachine ? " " + std::string(Name(v.level)) : "");
        std::printf("%s  %s  %s (%s), onset %s\n  %s\n", When(v.detected_at_ns).c_str(),
                    nodes.c_str(), kind.c_str(), v.cause.c_str(), When(v.onset_at_ns).c_str(),
                    v.explanation.c_str());
      }
      all.push_back(std::move(v));
    }
    std::fflush(stdout);
  };
  auto rows = DetectOver(*source, stream, print, all);
  if (!rows.ok()) return Fail("detect", rows.status().message());
  if (*rows == 0) {
    return Fail("detect", metrics + " has a header but no sample: no machine to judge");
  }
  if (stream.late_samples() > 0) {
    std::fprintf(
        stderr,
        "[detect] warning: %lld samples arrived more than %.0f s out of order and were ignored "
        "(raise --max-lateness, or leave out --presorted to read the file in time order)\n",
        static_cast<long long>(stream.late_samples()), lateness);
  }
  if (!json) {
    std::printf("%lld rows, %d machines, %d metrics, %lld ticks: %zu verdicts\n",
                static_cast<long long>(*rows), stream.registry().machines(),
                stream.registry().metrics(), static_cast<long long>(stream.frames()), all.size());
  }
  if (!labels.empty()) {
    Evaluation e = Evaluate(all, truth);
    std::printf("%s", json ? (EvaluationToJson(e) + "\n").c_str() : FormatEvaluation(e).c_str());
  }
  return 0;
}

namespace {

// Either generator behind one face: names, labels, groups (fleet-sim only) and the samples.
struct FleetSource {
  std::vector<std::string> machines, metrics;
  std::vector<Label> labels;
  std::vector<std::pair<std::string, std::string>> groups;
  std::vector<std::pair<std::string, std::vector<std::string>>> topology;  // incident only
  std::function<void(const std::function<void(int, int, double, double)>&)> run;
  double start_s = 0;
};

// What every generator offers, taken from `sim` (kept alive by the source's run).
template <typename Sim>
void Adopt(std::shared_ptr<Sim> sim, double start_s, FleetSource* f) {
  f->machines = sim->machines();
  f->metrics = sim->metrics();
  f->labels = sim->labels();
  f->start_s = start_s;
  f->run = [sim](const auto& sink) { sim->Run(sink); };
}

// The settings every generator shares, from fleet-sim's flags.
template <typename Config>
Config FromFlags(const FleetSimConfig& cfg) {
  Config c;
  c.machines = cfg.machines;
  c.minutes = cfg.hours * 60;
  c.seed = cfg.seed;
  c.random_faults = cfg.faults;
  c.random_fault_types = cfg.fault_types;
  return c;
}

// The generator --family names, configured from `cfg`.
Result<FleetSource> MakeFleet(const FleetSimConfig& cfg, const std::string& family) {
  FleetSource f;
  if (family == "incident") {
    const auto ic = FromFlags<IncidentFleetConfig>(cfg);
    ASSIGN_OR_RETURN(IncidentFleet made, IncidentFleet::Make(ic));
    f.topology = made.Topology();
    Adopt(std::make_shared<IncidentFleet>(std::move(made)), ic.start_s, &f);
    return f;
  }
  if (family == "elastic") {
    const auto ec = FromFlags<ElasticFleetConfig>(cfg);
    ASSIGN_OR_RETURN(ElasticFleet made, ElasticFleet::Make(ec));
    Adopt(std::make_shared<ElasticFleet>(std::move(made)), ec.start_s, &f);
    return f;
  }
  if (family == "prom") {
    auto pc = FromFlags<PromFleetConfig>(cfg);
    pc.stages = cfg.stages;
    pc.hot_machines = std::max(1, cfg.machines / 32);
    ASSIGN_OR_RETURN(PromFleet made, PromFleet::Make(pc));
    Adopt(std::make_shared<PromFleet>(std::move(made)), pc.start_s, &f);
    return f;
  }
  auto sim = std::make_shared<FleetSim>(cfg);
  f.groups = sim->Groups();
  Adopt(std::move(sim), cfg.start_s, &f);
  return f;
}

// The arguments of fleet-sim checked, the fault types read into cfg: empty, or what is wrong.
std::string CheckFleetArgs(const std::string& family, const std::string& types,
                           FleetSimConfig& cfg) {
  if (cfg.machines < 2 || cfg.hours <= 0 || cfg.faults < 0 || cfg.stages < 1 ||
      cfg.stages > cfg.machines)
    return "need --machines >= 2, --hours > 0, --faults >= 0, 1 <= --stages <= --machines";
  if (family != "fleet-sim" && family != "prom" && family != "incident" && family != "elastic")
    return "unknown --family '" + family + "' (known: fleet-sim, prom, incident, elastic)";
  if (family == "fleet-sim" && cfg.faults > 0 && cfg.hours * 3600 / cfg.faults < 600)
    return "at most one fault per 10 minutes fits (fleet-sim's faults never overlap)";
  std::stringstream ss(types);
  for (std::string t; std::getline(ss, t, ',');) {
    const auto& known = family == "prom"       ? PromFleetFaultTypes()
                        : family == "incident" ? IncidentFleetFaultTypes()
                        : family == "elastic"  ? ElasticFleetFaultTypes()
                                               : FleetFaultTypes();
    if (std::find(known.begin(), known.end(), t) == known.end()) {
      std::string list;
      for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
      return "unknown fault type '" + t + "' (known: " + list + ")";
    }
    cfg.fault_types.push_back(t);
  }
  return "";
}

// Writes the fleet's samples to `path`, with progress on stderr: how many.
Result<int64_t> WriteSamples(const FleetSource& f, const std::string& path, double total_s) {
  ASSIGN_OR_RETURN(auto out, MetricsCsvWriter::Open(path, 1, 12));
  int64_t rows = 0;
  auto last_report = std::chrono::steady_clock::now();
  f.run([&](int m, int k, double t, double v) {
    out->Row(t, f.machines[m], f.metrics[k], v);
    if ((++rows & 0xfffff) == 0) {
      auto now = std::chrono::steady_clock::now();
      if (now - last_report > std::chrono::seconds(2)) {
        last_report = now;
        std::fprintf(stderr, "[fleet-sim] %3.0f%%  %lld rows\n", 100 * (t - f.start_s) / total_s,
                     static_cast<long long>(rows));
      }
    }
  });
  RETURN_IF_ERROR(out->Close());
  return rows;
}

}  // namespace

int RunFleetSim(const Args& args) {
  FleetSimConfig cfg;
  std::string out_dir, types, family = "fleet-sim";
  po::options_description opts("Options");
  opts.add_options()("help,h", "show this help")(
      "machines", po::value(&cfg.machines)->default_value(cfg.machines), "machines in the job")(
      "hours", po::value(&cfg.hours)->default_value(cfg.hours), "hours of second-level metrics")(
      "faults", po::value(&cfg.faults)->default_value(cfg.faults),
      "faults to inject (never overlapping)")("seed", po::value(&cfg.seed)->default_value(cfg.seed),
                                              "random seed")(
      "stages", po::value(&cfg.stages)->default_value(cfg.stages), "pipeline stages (peer groups)")(
      "light-first-stage", po::bool_switch(&cfg.light_first_stage),
      "stage 0 legitimately runs a lighter GPU load than the others")(
      "fault-types", po::value(&types),
      "comma-separated fault types to use (default: the production mix)")(
      "family", po::value(&family)->default_value(family),
      "generator: fleet-sim, or prom (written independently: exporter names and units, cumulative "
      "counters, pipeline stages and two GPU generations without a groups file, clock skew, "
      "exporter gaps, benign excursions, faults that may overlap), or incident (written from "
      "production incident reports: Llama 3's fault causes, exporter restarts, switch congestion, "
      "backups and cooling rows, three exporters with their own cadences, racks behind leaf "
      "switches; writes topology.csv), or elastic (an elastic cloud job exported per GPU and "
      "port by dcgm-exporter and node_exporter: labelled series, idle hot spares, a preemption "
      "and a scale-down, a rolling exporter upgrade that renames a field, symbol-error blips, "
      "noisy neighbours; --hours may be fractional)")(
      "out,o", po::value(&out_dir)->required(),
      "output directory (metrics.csv, labels.csv, groups.csv or topology.csv)");
  po::variables_map vm;
  if (auto rc = ParseArgs("fleet-sim",
                          "megascope fleet-sim --machines N --hours H --faults F --seed S -o DIR",
                          args, opts, {}, &vm)) {
    return *rc;
  }
  if (std::string err = CheckFleetArgs(family, types, cfg); !err.empty())
    return Fail("fleet-sim", err, kExitUsage);
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return Fail("fleet-sim", "cannot create " + out_dir + ": " + ec.message());
  auto fleet = MakeFleet(cfg, family);
  if (!fleet.ok()) return Fail("fleet-sim", fleet.status().message(), kExitUsage);
  const std::string mpath = out_dir + "/metrics.csv";
  const double total_s = cfg.hours * 3600;
  auto rows = WriteSamples(*fleet, mpath, total_s);
  if (!rows.ok()) return Fail("fleet-sim", rows.status().message());
  if (Status st = WriteLabelsCsv(out_dir + "/labels.csv", fleet->labels); !st.ok())
    return Fail("fleet-sim", st.message());
  if (!fleet->groups.empty()) {
    if (Status st = WriteGroupsCsv(out_dir + "/groups.csv", fleet->groups); !st.ok())
      return Fail("fleet-sim", st.message());
  }
  if (!fleet->topology.empty()) {
    if (Status st = WriteTopologyCsv(out_dir + "/topology.csv", fleet->topology); !st.ok())
      return Fail("fleet-sim", st.message());
  }
  std::printf(
      "wrote %s (%lld samples: %d machines x %zu metrics x %.0f s), labels.csv (%zu fault%s)%s\n",
      mpath.c_str(), static_cast<long long>(*rows), cfg.machines, fleet->metrics.size(), total_s,
      fleet->labels.size(), fleet->labels.size() == 1 ? "" : "s",
      !fleet->topology.empty() ? ", topology.csv (use it with detect --topology)"
      : fleet->groups.empty()  ? " (no groups file: the detector finds peers itself)"
                               : ", groups.csv");
  return 0;
}

}  // namespace megascope::cli
