// Detector evaluation on three independently written fleet generators -- fleet-sim (detector/
// fleet_sim.h), prom-fleet (detector/prom_fleet.h: exporter names, stages without a groups
// file, two GPU generations, clock skew, exporter gaps, benign excursions, overlapping faults) and
// incident-fleet (detector/incident_fleet.h: production incident reports' faults, exporter
// restarts, switch congestion, backups, cooling rows, three exporters' cadences, a topology) --
// at 16, 128 and 1,024 machines, side by side with the baselines (per-metric z-score without
// continuity; Mahalanobis distance), with the confidence of true and false verdicts and the
// precision-recall curve over a confidence threshold. Plus the cost of one detector step over
// 1,024 machines x 20 metrics.
//   detector_eval                 the frozen held-out set of every family (tests/data/
//                                 detector-eval/heldout_fleets.json; never used for tuning)
//   detector_eval --tune          the tuning seeds
//   detector_eval --dev           the development seeds: neither tuned on nor held out, the set
//                                 whose misses and false verdicts may be studied one by one
//   detector_eval --family=prom   one family only (fleet, prom or incident)
//   detector_eval --verbose       print every false verdict and missed fault of the detector
//   detector_eval --step-cost     only the cost of one step (seconds: to compare two builds)
//   detector_eval --cross         choose settings on one family's tuning seeds (a grid), score them
//                                 on both families' held-out seeds; both directions
//   detector_eval --leave-one-out choose settings on two families' tuning fleets, score them on the
//                                 third's held-out fleets (up to 128 machines); every direction
// Targets (issue 16), on each family: precision >= 0.98, recall >= 0.95, median delay <= 45 s,
// p90 <= 90 s; one step <= 10 ms.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "bench_main.h"
#include "megascope/detector/baselines.h"
#include "megascope/detector/detector.h"
#include "megascope/detector/evaluate.h"
#include "megascope/detector/fleet_sim.h"
#include "megascope/detector/incident_fleet.h"
#include "megascope/detector/prom_fleet.h"

using namespace megascope;
using namespace megascope::detector;

namespace {

struct Fleet {
  const char* family;  // "fleet" or "prom"
  int machines;
  double hours;
  int faults;
  uint64_t seed;
};

// One generated fleet behind a common face.
struct Source {
  std::vector<std::string> machines, metrics;
  std::vector<Label> labels;
  std::function<void(const std::function<void(int, int, double, double)>&)> run;
  double start_s = 0;
  std::map<std::string, std::vector<std::string>> components;  // incident-fleet's topology
};

// The detector for a source: `base` plus the source's topology.
DetectorConfig For(const Source& src, DetectorConfig base) {
  base.components = src.components;
  return base;
}

Source Make(const Fleet& fl) {
  Source s;
  if (std::strcmp(fl.family, "fleet") == 0) {
    FleetSimConfig cfg;
    cfg.machines = fl.machines;
    cfg.hours = fl.hours;
    cfg.faults = fl.faults;
    cfg.seed = fl.seed;
    auto sim = std::make_shared<FleetSim>(cfg);
    s.machines = sim->machines();
    s.metrics = sim->metrics();
    s.labels = sim->labels();
    s.start_s = cfg.start_s;
    s.run = [sim](const auto& sink) { sim->Run(sink); };
  } else if (std::strcmp(fl.family, "incident") == 0) {
    IncidentFleetConfig cfg;
    cfg.machines = fl.machines;
    cfg.minutes = fl.hours * 60;
    cfg.random_faults = fl.faults;
    cfg.seed = fl.seed;
    auto sim = std::make_shared<IncidentFleet>(std::move(*IncidentFleet::Make(cfg)));
    s.machines = sim->machines();
    s.metrics = sim->metrics();
    s.labels = sim->labels();
    s.start_s = cfg.start_s;
    for (auto& [machine, comps] : sim->Topology()) s.components[machine] = comps;
    s.run = [sim](const auto& sink) { sim->Run(sink); };
  } else {
    PromFleetConfig cfg;
    cfg.machines = fl.machines;
    cfg.minutes = fl.hours * 60;
    cfg.random_faults = fl.faults;
    cfg.seed = fl.seed;
    cfg.hot_machines = std::max(1, fl.machines / 32);
    auto sim = std::make_shared<PromFleet>(std::move(*PromFleet::Make(cfg)));
    s.machines = sim->machines();
    s.metrics = sim->metrics();
    s.labels = sim->labels();
    s.start_s = cfg.start_s;
    s.run = [sim](const auto& sink) { sim->Run(sink); };
  }
  return s;
}

void PrintRow(const char* fleet, const char* name, const Evaluation& e) {
  const Score& s = e.total;
  std::printf(
      "  %-26s %-12s P %.3f  R %.3f  F1 %.3f  TP %3d FP %5d  faults %3d  delay median %6.1f s  p90 "
      "%6.1f s\n",
      fleet, name, s.precision(), s.recall(), s.f1(), s.true_positives, s.false_positives, s.faults,
      s.median_delay_s(), s.p90_delay_s());
}

double StepCostMs() {
  constexpr int kMachines = 1024, kMetrics = 20, kTicks = 200;
  Detector det(DetectorConfig{});
  Registry reg;
  for (int m = 0; m < kMachines; ++m) reg.Machine("node" + std::to_string(m));
  for (int k = 0; k < kMetrics; ++k) reg.Metric("metric" + std::to_string(k));
  std::mt19937_64 rng(7);
  std::normal_distribution<double> noise(0, 1);
  std::vector<double> ms;
  std::vector<Verdict> out;
  for (int t = 0; t < kTicks; ++t) {
    Frame f;
    f.tick = t;
    f.end_s = t + 1;
    for (int m = 0; m < kMachines; ++m) {
      for (int k = 0; k < kMetrics; ++k) f.cells.push_back({m, k, 100 + k + noise(rng)});
    }
    auto t0 = std::chrono::steady_clock::now();
    det.OnFrame(f, reg, &out);
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

void Accumulate(Evaluation* into, const Evaluation& e) {
  auto add = [](Score* a, const Score& b) {
    a->true_positives += b.true_positives;
    a->false_positives += b.false_positives;
    a->duplicates += b.duplicates;
    a->faults += b.faults;
    a->detected += b.detected;
    a->delays_s.insert(a->delays_s.end(), b.delays_s.begin(), b.delays_s.end());
  };
  add(&into->total, e.total);
  for (const auto& [type, s] : e.by_type) add(&into->by_type[type], s);
  into->suspects_true += e.suspects_true;
  into->suspects_false += e.suspects_false;
  into->alerts += e.alerts;
  into->calibration.insert(into->calibration.end(), e.calibration.begin(), e.calibration.end());
}

bool Matches(const Verdict& v, const std::vector<Label>& labels) {
  const double t = static_cast<double>(v.detected_at_ns) / 1e9;
  for (const Label& l : labels) {
    if (l.machine == v.root_nodes[0] && t >= l.fault_start_s && t <= l.fault_end_s) return true;
  }
  return false;
}

// Every fleet's verdicts and labels, for curves over the confidence threshold.
struct Outcome {
  std::vector<Verdict> verdicts;
  std::vector<Label> labels;
};

void PrintConfidence(const char* family, const std::vector<Outcome>& outcomes) {
  int tp[10] = {}, fp[10] = {};
  for (const Outcome& o : outcomes) {
    for (const Verdict& v : o.verdicts) {
      const int bin = std::clamp(static_cast<int>(v.confidence * 10), 0, 9);
      (Matches(v, o.labels) ? tp : fp)[bin]++;
    }
  }
  std::printf("\n%s: confidence of the detector's verdicts (true faults named / not a fault)\n",
              family);
  for (int b = 0; b < 10; ++b) {
    if (tp[b] + fp[b] == 0) continue;
    std::printf("  [%.1f, %.1f)  true %4d  false %4d\n", b / 10.0, (b + 1) / 10.0, tp[b], fp[b]);
  }
  std::printf(
      "%s: precision-recall over the confidence threshold (act only on verdicts >= threshold)\n",
      family);
  for (double th : {0.0, 0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95}) {
    Evaluation total;
    for (const Outcome& o : outcomes) {
      std::vector<Verdict> kept;
      for (const Verdict& v : o.verdicts) {
        if (v.confidence >= th) kept.push_back(v);
      }
      Accumulate(&total, Evaluate(kept, o.labels));
    }
    std::printf("  >= %.2f  P %.3f  R %.3f  F1 %.3f  (TP %d, FP %d)\n", th, total.total.precision(),
                total.total.recall(), total.total.f1(), total.total.true_positives,
                total.total.false_positives);
  }
}

// The tuning fleets, or (held_out) the frozen evaluation set in tests/data/detector.
enum class Set { kHeldOut, kTune, kDev };

std::vector<Fleet> Fleets(Set set) {
  if (set == Set::kDev) {
    // Studied miss by miss while a change is made, so the held-out set stays unseen.
    return {
        {"fleet", 16, 8, 32, 201},     {"fleet", 16, 8, 32, 202},     {"fleet", 128, 3, 14, 203},
        {"fleet", 128, 3, 14, 204},    {"prom", 16, 8, 24, 211},      {"prom", 16, 8, 24, 212},
        {"prom", 128, 3, 14, 213},     {"prom", 128, 3, 14, 214},     {"incident", 16, 8, 24, 301},
        {"incident", 16, 8, 24, 302},  {"incident", 16, 8, 24, 303},  {"incident", 16, 8, 24, 304},
        {"incident", 16, 8, 24, 305},  {"incident", 16, 8, 24, 306},  {"incident", 16, 8, 24, 307},
        {"incident", 16, 8, 24, 308},  {"incident", 128, 3, 14, 311}, {"incident", 128, 3, 14, 312},
        {"incident", 128, 3, 14, 313}, {"incident", 128, 3, 14, 314},
    };
  }
  if (set == Set::kTune) {
    // fleet-sim's faults never overlap; prom-fleet draws them independently, so they may.
    return {
        {"fleet", 16, 8, 32, 1},      {"fleet", 16, 8, 32, 2},      {"fleet", 128, 3, 14, 3},
        {"fleet", 128, 3, 14, 4},     {"fleet", 1024, 1, 6, 5},     {"fleet", 1024, 1, 6, 6},
        {"prom", 16, 8, 24, 11},      {"prom", 16, 8, 24, 12},      {"prom", 128, 3, 14, 13},
        {"prom", 128, 3, 14, 14},     {"prom", 1024, 1, 6, 15},     {"prom", 1024, 1, 6, 16},
        {"incident", 16, 8, 24, 21},  {"incident", 16, 8, 24, 22},  {"incident", 128, 3, 14, 23},
        {"incident", 128, 3, 14, 24}, {"incident", 1024, 1, 6, 25}, {"incident", 1024, 1, 6, 26},
    };
  }
  std::ifstream in(MEGASCOPE_HELDOUT_FLEETS);
  if (!in) {
    std::fprintf(stderr, "detector_eval: cannot read %s\n", MEGASCOPE_HELDOUT_FLEETS);
    std::exit(1);
  }
  static std::vector<std::string> families;  // owns the family names Fleet points to
  std::vector<Fleet> out;
  const nlohmann::json doc = nlohmann::json::parse(in);  // kept: the loop reads into it
  for (const auto& f : doc["fleets"]) {
    families.push_back(f["family"]);
    out.push_back({nullptr, f["machines"], f["hours"], f["faults"], f["seed"]});
  }
  for (size_t i = 0; i < out.size(); ++i) out[i].family = families[i].c_str();
  return out;
}

// Runs one detector per configuration over every fleet of `family` (all fed by one pass of the
// generator) and returns their evaluations.
std::vector<Evaluation> RunConfigs(const std::vector<DetectorConfig>& configs,
                                   const std::string& family, bool held_out,
                                   int max_machines = 1 << 30) {
  std::vector<Evaluation> total(configs.size());
  for (const Fleet& fl : Fleets(held_out ? Set::kHeldOut : Set::kTune)) {
    if (family != fl.family || fl.machines > max_machines) continue;
    Source src = Make(fl);
    std::vector<std::unique_ptr<Detector>> dets;
    std::vector<std::unique_ptr<Stream>> streams;
    for (const DetectorConfig& c : configs) {
      dets.push_back(std::make_unique<Detector>(For(src, c)));
      streams.push_back(std::make_unique<Stream>(dets.back().get(), 1.0, 8.0));
      for (const auto& m : src.machines) streams.back()->registry().Machine(m);
      for (const auto& k : src.metrics) streams.back()->registry().Metric(k);
    }
    src.run([&](int m, int k, double t, double v) {
      for (auto& st : streams) st->Add(m, k, t, v);
    });
    for (size_t i = 0; i < configs.size(); ++i) {
      streams[i]->Flush();
      Accumulate(&total[i], Evaluate(streams[i]->TakeVerdicts(), src.labels));
    }
  }
  return total;
}

// Cross-evaluation: choose the settings on one family's tuning seeds only (best F1, then lower
// median delay, over a grid), evaluate them on both families' held-out seeds; both directions.
int Cross() {
  std::vector<DetectorConfig> grid;
  std::vector<std::string> names;
  for (double threshold : {5.0, 6.0, 7.0}) {
    for (int continuity : {20, 30}) {
      for (int weak : {60, 90, 120}) {
        DetectorConfig c;
        c.threshold = threshold;
        c.continuity = continuity;
        c.weak_continuity = weak;
        grid.push_back(c);
        char buf[96];
        std::snprintf(buf, sizeof(buf), "threshold %.0f, continuity %d, weak continuity %d",
                      threshold, continuity, weak);
        names.emplace_back(buf);
      }
    }
  }
  std::printf(
      "cross-evaluation: settings chosen on one family's tuning seeds, scored on held-out seeds\n");
  for (const char* tuned : {"fleet", "prom"}) {
    std::vector<Evaluation> scores = RunConfigs(grid, tuned, false);
    size_t best = 0;
    for (size_t i = 1; i < grid.size(); ++i) {
      const Score &a = scores[i].total, &b = scores[best].total;
      if (a.f1() > b.f1() + 1e-9 ||
          (std::fabs(a.f1() - b.f1()) <= 1e-9 && a.median_delay_s() < b.median_delay_s())) {
        best = i;
      }
    }
    std::printf("\ntuned on %s (tuning seeds, %zu settings): best %s, F1 %.3f there\n", tuned,
                grid.size(), names[best].c_str(), scores[best].total.f1());
    for (const char* evaluated : {"fleet", "prom"}) {
      Evaluation e = RunConfigs({grid[best]}, evaluated, true)[0];
      char label[64];
      std::snprintf(label, sizeof(label), "tuned %s -> held-out %s", tuned, evaluated);
      PrintRow(label, "megascope", e);
      std::fflush(stdout);
    }
  }
  return 0;
}

// Leave one family out: settings chosen on the other two families' tuning fleets (16 and 128
// machines; best F1 over both, then lower median delay), scored on the left-out family's held-out
// fleets of 16 and 128 machines. Every direction.
int LeaveOneOut() {
  std::vector<DetectorConfig> grid;
  std::vector<std::string> names;
  for (double threshold : {5.0, 6.0, 7.0}) {
    for (int weak : {60, 90}) {
      DetectorConfig c;
      c.threshold = threshold;
      c.weak_continuity = weak;
      grid.push_back(c);
      names.push_back("threshold " + std::to_string(static_cast<int>(threshold)) +
                      ", weak continuity " + std::to_string(weak));
    }
  }
  const char* const families[] = {"fleet", "prom", "incident"};
  std::printf(
      "leave one family out: settings (%zu) chosen on two families' tuning fleets of 16 and 128 "
      "machines, scored on the third's held-out fleets of 16 and 128 machines\n",
      grid.size());
  for (const char* left : families) {
    std::vector<Evaluation> scores(grid.size());
    std::string tuned;
    for (const char* f : families) {
      if (std::strcmp(f, left) == 0) continue;
      tuned += tuned.empty() ? f : std::string(" + ") + f;
      std::vector<Evaluation> part = RunConfigs(grid, f, false, 128);
      for (size_t i = 0; i < grid.size(); ++i) Accumulate(&scores[i], part[i]);
    }
    size_t best = 0;
    for (size_t i = 1; i < grid.size(); ++i) {
      const Score &a = scores[i].total, &b = scores[best].total;
      if (a.f1() > b.f1() + 1e-9 ||
          (std::fabs(a.f1() - b.f1()) <= 1e-9 && a.median_delay_s() < b.median_delay_s()))
        best = i;
    }
    std::printf("\ntuned on %s: best %s (F1 %.3f there)\n", tuned.c_str(), names[best].c_str(),
                scores[best].total.f1());
    Evaluation e = RunConfigs({grid[best]}, left, true, 128)[0];
    char label[64];
    std::snprintf(label, sizeof(label), "-> held-out %s", left);
    PrintRow(label, "megascope", e);
    std::printf("%s", FormatEvaluation(e).c_str());
    std::fflush(stdout);
  }
  return 0;
}

// With --verbose: every false positive of megascope's verdicts and every fault it missed.
void PrintMisses(const std::vector<Verdict>& vs, const std::vector<Label>& labels, double start_s) {
  for (const Verdict& v : vs) {
    if (!Matches(v, labels)) {
      const double t = static_cast<double>(v.detected_at_ns) / 1e9;
      std::printf("    FP t+%.0f s conf %.2f %s\n", t - start_s, v.confidence,
                  v.explanation.c_str());
    }
  }
  for (const Label& l : labels) {
    bool found = false;
    for (const Verdict& v : vs) {
      const double t = static_cast<double>(v.detected_at_ns) / 1e9;
      found = found || (v.root_nodes[0] == l.machine && t >= l.fault_start_s && t <= l.fault_end_s);
    }
    if (!found) {
      std::printf("    MISSED %s on %s from t+%.0f s for %.0f s\n", l.fault_type.c_str(),
                  l.machine.c_str(), l.fault_start_s - start_s, l.fault_end_s - l.fault_start_s);
    }
  }
}

const char* const kDetectors[3] = {"megascope", "zscore", "mahalanobis"};

// One fleet through the three detectors side by side: a row each, added to `totals`; megascope's
// verdicts kept in `outcomes`.
void RunFleet(const Fleet& fl, const DetectorConfig& dcfg, bool verbose,
              std::array<Evaluation, 3>& totals, std::vector<Outcome>& outcomes) {
  Source src = Make(fl);
  struct RunState {
    std::unique_ptr<FrameDetector> det;
    std::unique_ptr<Stream> stream;
  } runs[3];
  runs[0].det = std::make_unique<Detector>(For(src, dcfg));
  runs[1].det = std::make_unique<ZScoreBaseline>();
  runs[2].det = std::make_unique<MahalanobisBaseline>();
  for (RunState& r : runs) {
    r.stream = std::make_unique<Stream>(r.det.get(), 1.0, 8.0);
    for (const auto& m : src.machines) r.stream->registry().Machine(m);
    for (const auto& k : src.metrics) r.stream->registry().Metric(k);
  }
  auto t0 = std::chrono::steady_clock::now();
  src.run([&](int m, int k, double t, double v) {
    for (RunState& r : runs) r.stream->Add(m, k, t, v);
  });
  char label[64];
  std::snprintf(label, sizeof(label), "%s %dx%.0fh seed %llu", fl.family, fl.machines, fl.hours,
                static_cast<unsigned long long>(fl.seed));
  for (int i = 0; i < 3; ++i) {
    runs[i].stream->Flush();
    std::vector<Verdict> vs = runs[i].stream->TakeVerdicts();
    Evaluation e = Evaluate(vs, src.labels);
    if (i == 0) {  // the verdicts that count: faulty machines (suspects and alerts are tallied)
      std::vector<Verdict> faulty;
      for (const Verdict& v : vs) {
        if (v.kind == VerdictKind::kFaultyMachine && v.level == VerdictLevel::kFaulty)
          faulty.push_back(v);
      }
      if (verbose) PrintMisses(faulty, src.labels, src.start_s);
      outcomes.push_back({std::move(faulty), src.labels});
    }
    PrintRow(label, kDetectors[i], e);
    Accumulate(&totals[i], e);
  }
  std::printf("  (%.1f s)\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  std::fflush(stdout);
}

constexpr const char* kUsage =
    "usage: detector_eval [--tune | --dev] [--family=fleet|prom|incident] [--verbose] [--cross]\n"
    "                     [--leave-one-out] [--step-cost] [--threshold=Z] [--continuity=TICKS]\n"
    "                     [--weak-continuity=TICKS] [--pace-change=SHARE]\n"
    "  (no flag)        the frozen held-out set (tests/data/detector-eval/heldout_fleets.json)\n"
    "  --tune           the tuning seeds instead\n"
    "  --dev            the development seeds: neither tuned on nor held out, the set whose\n"
    "                   misses and false verdicts may be studied one by one\n"
    "  --family=F       one generator only: fleet (fleet-sim), prom (prom-fleet), incident\n"
    "  --verbose        every false verdict and missed fault of the detector\n"
    "  --cross          settings chosen on one family's tuning seeds, scored on the others'\n"
    "  --leave-one-out  settings chosen on two families, scored on the third; every direction\n"
    "  --step-cost      only the cost of one detector step over 1,024 machines x 20 metrics\n"
    "  --threshold, --continuity, --weak-continuity, --pace-change  the detector's settings\n"
    "                   (defaults: its own; --pace-change=inf turns the job's-pace evidence off)\n";

struct Args {
  bool tune = false, dev = false, verbose = false, cross = false, loo = false, help = false,
       step_cost = false;
  std::string only, error;
  DetectorConfig dcfg;
};

Args Parse(int argc, char** argv) {
  Args a;
  auto value = [](const char* arg, const char* flag) -> const char* {
    const size_t n = std::strlen(flag);
    return std::strncmp(arg, flag, n) == 0 ? arg + n : nullptr;
  };
  for (int i = 1; i < argc; ++i) {
    const char* arg = argv[i];
    if (const char* v = value(arg, "--threshold=")) {
      a.dcfg.threshold = std::atof(v);
    } else if (const char* v = value(arg, "--continuity=")) {
      a.dcfg.continuity = std::atoi(v);
    } else if (const char* v = value(arg, "--weak-continuity=")) {
      a.dcfg.weak_continuity = std::atoi(v);
    } else if (const char* v = value(arg, "--pace-change=")) {
      a.dcfg.pace_change = std::atof(v);
    } else if (const char* v = value(arg, "--family=")) {
      a.only = v;
      if (a.only != "fleet" && a.only != "prom" && a.only != "incident")
        a.error = "unknown family '" + a.only + "' (known: fleet, prom, incident)";
    } else if (std::strcmp(arg, "--tune") == 0) {
      a.tune = true;
    } else if (std::strcmp(arg, "--dev") == 0) {
      a.dev = true;
    } else if (std::strcmp(arg, "--step-cost") == 0) {
      a.step_cost = true;
    } else if (std::strcmp(arg, "--cross") == 0) {
      a.cross = true;
    } else if (std::strcmp(arg, "--leave-one-out") == 0) {
      a.loo = true;
    } else if (std::strcmp(arg, "--verbose") == 0) {
      a.verbose = true;
    } else if (std::strcmp(arg, "--help") == 0 || std::strcmp(arg, "-h") == 0) {
      a.help = true;
    } else {
      a.error = std::string("unknown argument '") + arg + "'";
    }
  }
  return a;
}

int Run(int argc, char** argv) {
  const Args args = Parse(argc, argv);
  if (args.help) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (!args.error.empty()) {
    std::fprintf(stderr, "detector_eval: %s\n%s", args.error.c_str(), kUsage);
    return 2;
  }
  const bool tune = args.tune, verbose = args.verbose, cross = args.cross, loo = args.loo;
  const std::string& only = args.only;
  const DetectorConfig& dcfg = args.dcfg;
  if (args.step_cost) {
    std::printf("one detector step, 1024 machines x 20 metrics: median %.2f ms (target <= 10 ms)\n",
                StepCostMs());
    return 0;
  }
  if (cross) return Cross();
  if (loo) return LeaveOneOut();
  if (tune && args.dev) {
    std::fprintf(stderr, "detector_eval: --tune and --dev name two sets; give one\n%s", kUsage);
    return 2;
  }
  const Set set = tune ? Set::kTune : args.dev ? Set::kDev : Set::kHeldOut;
  const std::vector<Fleet> fleets = Fleets(set);
  std::printf(
      "detector evaluation on the %s\n",
      set == Set::kTune  ? "TUNING seeds (fleet-sim 1..6, prom-fleet 11..16, incident-fleet 21..26)"
      : set == Set::kDev ? "DEVELOPMENT seeds (fleet-sim 201..204, prom-fleet 211..214, "
                           "incident-fleet 301..308, 311..314; neither tuned nor held out)"
                         : "frozen held-out set (tests/data/detector-eval/heldout_fleets.json)");
  std::map<std::string, std::array<Evaluation, 3>> totals;
  std::map<std::string, std::vector<Outcome>> outcomes;
  for (const Fleet& fl : fleets) {
    if (only.empty() || only == fl.family)
      RunFleet(fl, dcfg, verbose, totals[fl.family], outcomes[fl.family]);
  }
  for (const auto& [family, t] : totals) {
    std::printf("\n%s, all fleets together:\n", family.c_str());
    for (int i = 0; i < 3; ++i) PrintRow(family.c_str(), kDetectors[i], t[i]);
    std::printf("megascope on %s by fault type:\n%s", family.c_str(),
                FormatEvaluation(t[0]).c_str());
    PrintConfidence(family.c_str(), outcomes[family]);
  }
  std::printf("\none detector step, 1024 machines x 20 metrics: median %.2f ms (target <= 10 ms)\n",
              StepCostMs());
  for (const auto& [family, t] : totals) {
    const Score& s = t[0].total;
    const bool met = s.precision() >= 0.98 && s.recall() >= 0.95 && s.median_delay_s() <= 45 &&
                     s.p90_delay_s() <= 90;
    std::printf("targets on %s (P >= 0.98, R >= 0.95, median delay <= 45 s, p90 <= 90 s): %s\n",
                family.c_str(), met ? "met" : "MISSED");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return megascope::bench::Main("detector_eval", Run, argc, argv); }
