// Data-driven detector scenarios: each tests/data/detector/*.json names a fleet-sim fleet and what
// the detector must conclude on it (faults detected, false positives, worst delay).
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include <gtest/gtest.h>

#include "megascope/detector/detector.h"
#include "megascope/detector/evaluate.h"
#include "megascope/detector/fleet_sim.h"

namespace megascope::detector {
namespace {

namespace fs = std::filesystem;

class Scenario : public ::testing::TestWithParam<std::string> {};

TEST_P(Scenario, DetectorConcludesAsExpected) {
  std::ifstream in(GetParam());
  nlohmann::json j = nlohmann::json::parse(in);
  const auto& f = j["fleet"];
  FleetSimConfig cfg;
  cfg.machines = f["machines"];
  cfg.hours = f["hours"];
  cfg.faults = f["faults"];
  cfg.seed = f["seed"];
  cfg.stages = f.value("stages", 1);
  cfg.light_first_stage = f.value("light_first_stage", false);
  if (f.contains("fault_types")) cfg.fault_types = f["fault_types"].get<std::vector<std::string>>();
  FleetSim sim(cfg);
  DetectorConfig dc;
  if (j.value("use_groups", false)) {
    for (const auto& [machine, group] : sim.Groups()) dc.groups[machine] = group;
  }
  Detector det(dc);
  Stream stream(&det, 1.0, 5.0);
  for (const auto& m : sim.machines()) stream.registry().Machine(m);
  for (const auto& k : sim.metrics()) stream.registry().Metric(k);
  sim.Run([&](int m, int k, double t, double v) { stream.Add(m, k, t, v); });
  stream.Flush();
  std::vector<Verdict> verdicts = stream.TakeVerdicts();
  Evaluation e = Evaluate(verdicts, sim.labels());
  const auto& want = j["expect"];
  std::string seen;
  for (const Verdict& v : verdicts) {
    seen += "\n  t+" + std::to_string(v.detected_at_ns / 1'000'000'000 - static_cast<int64_t>(cfg.start_s)) + " " +
            v.explanation;
  }
  EXPECT_EQ(e.total.detected, want["detected"].get<int>()) << j["description"] << seen;
  EXPECT_EQ(e.total.false_positives, want["false_positives"].get<int>()) << j["description"] << seen;
  if (want.contains("max_delay_s")) {
    for (double d : e.total.delays_s) EXPECT_LE(d, want["max_delay_s"].get<double>()) << j["description"];
  }
  for (const Verdict& v : verdicts) {
    EXPECT_EQ(v.kind, "faulty_machine");
    EXPECT_LE(v.onset_at_ns, v.detected_at_ns);
    EXPECT_FALSE(v.evidence.empty());
  }
}

std::vector<std::string> ScenarioFiles() {
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(MEGASCOPE_TEST_DATA "/detector")) {
    if (entry.path().extension() == ".json") files.push_back(entry.path().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

INSTANTIATE_TEST_SUITE_P(Detector, Scenario, ::testing::ValuesIn(ScenarioFiles()),
                         [](const auto& info) { return fs::path(info.param).stem().string(); });

}  // namespace
}  // namespace megascope::detector
