// Detector evaluation on fleet-sim fleets of 16, 128 and 1,024 machines, side by side with the
// baselines (per-metric z-score without continuity; Mahalanobis distance), plus the cost of one
// detector step over 1,024 machines x 20 metrics. Targets (issue 6): F1 >= 0.95, median delay
// <= 60 s, p90 <= 120 s, one step <= 50 ms.
//   detector_eval            evaluation seeds (101..106), never used for tuning
//   detector_eval --tune     tuning seeds (1..6)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include "megascope/detector/baselines.h"
#include "megascope/detector/detector.h"
#include "megascope/detector/evaluate.h"
#include "megascope/detector/fleet_sim.h"

using namespace megascope;
using namespace megascope::detector;

namespace {

struct Fleet {
  int machines;
  double hours;
  int faults;
  uint64_t seed;
};

struct Run {
  std::unique_ptr<FrameDetector> det;
  std::unique_ptr<Stream> stream;
};

void PrintRow(const char* fleet, const char* name, const Evaluation& e) {
  const Score& s = e.total;
  std::printf("  %-22s %-12s P %.3f  R %.3f  F1 %.3f  TP %3d FP %4d  faults %3d  delay median %6.1f s  p90 %6.1f s\n",
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
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
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
}

}  // namespace

int main(int argc, char** argv) {
  bool tune = false, verbose = false;
  DetectorConfig dcfg;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--threshold=", 12) == 0) dcfg.threshold = std::atof(argv[i] + 12);
    if (std::strncmp(argv[i], "--continuity=", 13) == 0) dcfg.continuity = std::atoi(argv[i] + 13);
    tune = tune || std::strcmp(argv[i], "--tune") == 0;
    verbose = verbose || std::strcmp(argv[i], "--verbose") == 0;  // print megascope's false positives
  }
  const uint64_t base = tune ? 0 : 100;
  const std::vector<Fleet> fleets = {
      {16, 8, 32, base + 1}, {16, 8, 32, base + 2}, {128, 3, 14, base + 3},
      {128, 3, 14, base + 4}, {1024, 1, 6, base + 5}, {1024, 1, 6, base + 6},
  };
  std::printf("detector evaluation on %s seeds (%llu..%llu)\n", tune ? "TUNING" : "held-out evaluation",
              static_cast<unsigned long long>(base + 1), static_cast<unsigned long long>(base + 6));
  const char* names[3] = {"megascope", "zscore", "mahalanobis"};
  Evaluation total[3];
  for (const Fleet& fl : fleets) {
    FleetSimConfig cfg;
    cfg.machines = fl.machines;
    cfg.hours = fl.hours;
    cfg.faults = fl.faults;
    cfg.seed = fl.seed;
    FleetSim sim(cfg);
    Run runs[3];
    runs[0].det = std::make_unique<Detector>(dcfg);
    runs[1].det = std::make_unique<ZScoreBaseline>();
    runs[2].det = std::make_unique<MahalanobisBaseline>();
    for (Run& r : runs) {
      r.stream = std::make_unique<Stream>(r.det.get(), 1.0, 5.0);
      for (const auto& m : sim.machines()) r.stream->registry().Machine(m);
      for (const auto& k : sim.metrics()) r.stream->registry().Metric(k);
    }
    auto t0 = std::chrono::steady_clock::now();
    sim.Run([&](int m, int k, double t, double v) {
      for (Run& r : runs) r.stream->Add(m, k, t, v);
    });
    char label[64];
    std::snprintf(label, sizeof(label), "%dx%.0fh seed %llu", fl.machines, fl.hours,
                  static_cast<unsigned long long>(fl.seed));
    for (int i = 0; i < 3; ++i) {
      runs[i].stream->Flush();
      std::vector<Verdict> vs = runs[i].stream->TakeVerdicts();
      Evaluation e = Evaluate(vs, sim.labels());
      for (const Verdict& v : vs) {
        if (!verbose || i != 0) break;
        const double t = static_cast<double>(v.detected_at_ns) / 1e9;
        bool matched = false;
        for (const Label& l : sim.labels()) {
          matched |= l.machine == v.root_nodes[0] && t >= l.fault_start_s && t <= l.fault_end_s;
        }
        if (!matched) std::printf("    FP t=%.0f (+%.0f s) %s\n", t, t - 1763700000, v.explanation.c_str());
      }
      PrintRow(label, names[i], e);
      Accumulate(&total[i], e);
    }
    std::printf("  (%.1f s)\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    std::fflush(stdout);
  }
  std::printf("\nall fleets together:\n");
  for (int i = 0; i < 3; ++i) PrintRow("all", names[i], total[i]);
  std::printf("\nmegascope by fault type:\n%s", FormatEvaluation(total[0]).c_str());
  std::printf("\none detector step, 1024 machines x 20 metrics: median %.2f ms (target <= 50 ms)\n", StepCostMs());
  const Score& s = total[0].total;
  const bool met = s.f1() >= 0.95 && s.median_delay_s() <= 60 && s.p90_delay_s() <= 120;
  std::printf("targets (F1 >= 0.95, median delay <= 60 s, p90 <= 120 s): %s\n", met ? "met" : "MISSED");
  return 0;
}
