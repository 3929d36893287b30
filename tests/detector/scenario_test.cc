// Data-driven detector scenarios: each tests/data/detector/*.json names a fleet -- from fleet-sim,
// or (`"generator": "prom"`) from the independently written prom-fleet, one phenomenon per file --
// and what the detector must conclude on it (faults detected, false positives, worst delay).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>

#include "megascope/detector/detector.h"
#include "megascope/detector/elastic_fleet.h"
#include "megascope/detector/evaluate.h"
#include "megascope/detector/fleet_sim.h"
#include "megascope/detector/incident_fleet.h"
#include "megascope/detector/prom_fleet.h"

namespace megascope::detector {
namespace {

namespace fs = std::filesystem;

class Scenario : public ::testing::TestWithParam<std::string> {};

// The fleet a scenario names, behind one face.
struct Fleet {
  std::vector<std::string> machines, metrics;
  std::vector<Label> labels;
  std::vector<std::pair<std::string, std::string>> groups;
  std::vector<std::pair<std::string, std::vector<std::string>>> topology;
  std::function<void(const std::function<void(int, int, double, double)>&)> run;
  double start_s = 0;
};

// What every generator offers, taken from `sim` (kept alive by the fleet's run).
template <typename Sim>
Fleet Adopt(std::shared_ptr<Sim> sim, double start_s) {
  return {sim->machines(),
          sim->metrics(),
          sim->labels(),
          {},
          {},
          [sim](const auto& sink) { sim->Run(sink); },
          start_s};
}

// A generator made from `cfg` (a bad configuration fails the test).
template <typename Sim, typename Config>
std::shared_ptr<Sim> Made(const Config& cfg) {
  auto made = Sim::Make(cfg);
  EXPECT_TRUE(made.ok()) << made.status().ToString();
  return std::make_shared<Sim>(std::move(*made));
}

// A scenario's explicit faults, in any generator's fault type (type, machine, start_s, duration_s).
template <typename List>
List ScenarioFaults(const nlohmann::json& j) {
  List out;
  for (const auto& x : j.value("faults", nlohmann::json::array()))
    out.push_back({x["type"], x["machine"], x["start_s"], x["duration_s"]});
  return out;
}

Fleet MakeIncidentFleet(const nlohmann::json& j) {
  const auto& f = j["fleet"];
  IncidentFleetConfig cfg;
  cfg.machines = f["machines"];
  cfg.minutes = f["minutes"];
  cfg.seed = f["seed"];
  cfg.rack_size = f.value("rack_size", cfg.rack_size);
  cfg.exporter_restarts_per_hour =
      f.value("exporter_restarts_per_hour", cfg.exporter_restarts_per_hour);
  cfg.exporter_missing_share = f.value("exporter_missing_share", cfg.exporter_missing_share);
  cfg.backups_per_hour = f.value("backups_per_hour", cfg.backups_per_hour);
  cfg.switch_events_per_hour = f.value("switch_events_per_hour", cfg.switch_events_per_hour);
  cfg.cooling_events_per_hour = f.value("cooling_events_per_hour", cfg.cooling_events_per_hour);
  cfg.hot_machines = f.value("hot_machines", cfg.hot_machines);
  cfg.job_events = f.value("job_events", cfg.job_events);
  cfg.faults = ScenarioFaults<decltype(cfg.faults)>(j);
  cfg.random_faults = f.value("random_faults", 0);
  auto sim = Made<IncidentFleet>(cfg);
  Fleet out = Adopt(sim, cfg.start_s);
  if (j.value("use_topology", false)) out.topology = sim->Topology();
  return out;
}

Fleet MakeElasticFleet(const nlohmann::json& j) {
  const auto& f = j["fleet"];
  ElasticFleetConfig cfg;
  cfg.machines = f["machines"];
  cfg.minutes = f["minutes"];
  cfg.seed = f["seed"];
  cfg.spares = f.value("spares", cfg.spares);
  cfg.benign = f.value("benign", cfg.benign);
  cfg.benign_kinds = f.value("benign_kinds", cfg.benign_kinds);
  cfg.faults = ScenarioFaults<decltype(cfg.faults)>(j);
  cfg.random_faults = f.value("random_faults", 0);
  return Adopt(Made<ElasticFleet>(cfg), cfg.start_s);
}

Fleet MakeFleet(const nlohmann::json& j) {
  const auto& f = j["fleet"];
  Fleet out;
  if (j.value("generator", "fleet-sim") == "incident") return MakeIncidentFleet(j);
  if (j.value("generator", "fleet-sim") == "elastic") return MakeElasticFleet(j);
  if (j.value("generator", "fleet-sim") == "prom") {
    PromFleetConfig cfg;
    cfg.machines = f["machines"];
    cfg.minutes = f["minutes"];
    cfg.seed = f["seed"];
    cfg.stages = f.value("stages", cfg.stages);
    cfg.old_generation_share = f.value("old_generation_share", cfg.old_generation_share);
    cfg.max_clock_skew_s = f.value("max_clock_skew_s", cfg.max_clock_skew_s);
    cfg.exporter_gaps_per_hour = f.value("exporter_gaps_per_hour", cfg.exporter_gaps_per_hour);
    cfg.excursions_per_hour = f.value("excursions_per_hour", cfg.excursions_per_hour);
    cfg.excursion_kinds = f.value("excursion_kinds", cfg.excursion_kinds);
    cfg.hot_machines = f.value("hot_machines", cfg.hot_machines);
    cfg.drifting_machines = f.value("drifting_machines", cfg.drifting_machines);
    cfg.event_stagger_s = f.value("event_stagger_s", cfg.event_stagger_s);
    cfg.startup_s = f.value("startup_s", cfg.startup_s);
    cfg.job_events = f.value("job_events", cfg.job_events);
    cfg.faults = ScenarioFaults<decltype(cfg.faults)>(j);
    cfg.random_faults = f.value("random_faults", 0);
    return Adopt(Made<PromFleet>(cfg), cfg.start_s);
  }
  FleetSimConfig cfg;
  cfg.machines = f["machines"];
  cfg.hours = f["hours"];
  cfg.faults = f["faults"];
  cfg.seed = f["seed"];
  cfg.stages = f.value("stages", 1);
  cfg.light_first_stage = f.value("light_first_stage", false);
  if (f.contains("fault_types")) cfg.fault_types = f["fault_types"].get<std::vector<std::string>>();
  auto sim = std::make_shared<FleetSim>(cfg);
  out = Adopt(sim, cfg.start_s);
  out.groups = sim->Groups();
  return out;
}

TEST_P(Scenario, DetectorConcludesAsExpected) {
  std::ifstream in(GetParam());
  nlohmann::json j = nlohmann::json::parse(in);
  Fleet sim = MakeFleet(j);
  DetectorConfig dc;
  if (j.value("use_groups", false)) {
    for (const auto& [machine, group] : sim.groups) dc.groups[machine] = group;
  }
  for (const auto& [machine, components] : sim.topology) dc.components[machine] = components;
  Detector det(dc);
  Stream stream(&det, 1.0, 8.0);
  if (j.value("generator", "fleet-sim") == "elastic") {
    // Labelled series as an exporter names them: through the semantics of their names, as
    // `detect` reads them.
    sim.run([&](int m, int k, double t, double v) {
      stream.Add(
          Sample{t, sim.machines[static_cast<size_t>(m)], sim.metrics[static_cast<size_t>(k)], v});
    });
  } else {
    for (const auto& m : sim.machines) stream.registry().Machine(m);
    for (const auto& k : sim.metrics) stream.registry().Metric(k);
    sim.run([&](int m, int k, double t, double v) { stream.Add(m, k, t, v); });
  }
  stream.Flush();
  std::vector<Verdict> verdicts = stream.TakeVerdicts();
  Evaluation e = Evaluate(verdicts, sim.labels);
  const auto& want = j["expect"];
  std::string seen;
  for (const Verdict& v : verdicts) {
    seen += "\n  t+" +
            std::to_string(v.detected_at_ns / 1'000'000'000 - static_cast<int64_t>(sim.start_s)) +
            " " + std::string(Name(v.kind)) + " " + v.explanation;
  }
  for (const Label& l : sim.labels) {
    seen += "\n  label " + l.fault_type + " on " + l.machine + " t+" +
            std::to_string(static_cast<int64_t>(l.fault_start_s - sim.start_s)) + "..t+" +
            std::to_string(static_cast<int64_t>(l.fault_end_s - sim.start_s));
  }
  EXPECT_EQ(e.total.detected, want["detected"].get<int>()) << j["description"] << seen;
  EXPECT_EQ(e.total.false_positives, want["false_positives"].get<int>())
      << j["description"] << seen;
  if (want.contains("max_delay_s")) {
    for (double d : e.total.delays_s)
      EXPECT_LE(d, want["max_delay_s"].get<double>()) << j["description"];
  }
  // Alerts that blame no machine: as many as the scenario names (none unless it names them).
  std::map<std::string, int> alerts;
  for (const Verdict& v : verdicts) {
    if (v.kind != VerdictKind::kFaultyMachine) ++alerts[std::string(Name(v.kind))];
    EXPECT_LE(v.onset_at_ns, v.detected_at_ns);
    EXPECT_FALSE(v.evidence.empty());
  }
  for (const char* kind : {"monitoring_gap", "shared_component"}) {
    const std::string at_least = std::string(kind) + "s_at_least";
    if (want.contains(at_least)) {
      EXPECT_GE(alerts[kind], want[at_least].get<int>())
          << kind << ": " << j["description"] << seen;
    } else {
      EXPECT_EQ(alerts[kind], want.value(std::string(kind) + "s", 0))
          << kind << ": " << j["description"] << seen;
    }
  }
  if (want.contains("max_false_suspects")) {
    EXPECT_LE(e.suspects_false, want["max_false_suspects"].get<int>()) << j["description"] << seen;
  }
  // The score as `detect --score --json` prints it says the same.
  const auto score = nlohmann::json::parse(EvaluationToJson(e));
  EXPECT_EQ(score["format"], "megascope-detector-score");
  EXPECT_EQ(score["true_positives"], e.total.true_positives);
  EXPECT_EQ(score["false_positives"], e.total.false_positives);
  EXPECT_EQ(score["faults"], e.total.faults);
  EXPECT_EQ(score["by_type"].size(), e.by_type.size());
  for (const auto& [type, t] : e.by_type) EXPECT_EQ(score["by_type"][type]["detected"], t.detected);
  if (e.total.delays_s.empty()) {
    EXPECT_TRUE(score["median_delay_s"].is_null());
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
