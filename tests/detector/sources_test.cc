// The detector's sources, shared components and two levels (issue 41): an exporter that stops is a
// monitoring gap, not a faulty machine; machines that move together are one shared component; a
// machine is faulty only on hard evidence or on two families agreeing for longer than a benign
// excursion lasts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <random>
#include <set>

#include "megascope/detector/detector.h"

namespace megascope::detector {
namespace {

// `machines` machines report `metrics` every second around 100 with noise; `tweak(machine, t,
// metric, value)` may change a value or drop it (NaN).
std::vector<Verdict> RunFleet(int machines, int seconds, const std::vector<std::string>& metrics,
                              const std::function<double(int, int, int, double)>& tweak,
                              DetectorConfig cfg = {}) {
  Detector det(std::move(cfg));
  Stream stream(&det);
  std::mt19937 rng(11);
  std::normal_distribution<double> noise(0, 1);
  for (int t = 0; t < seconds; ++t) {
    for (int m = 0; m < machines; ++m) {
      for (int k = 0; k < static_cast<int>(metrics.size()); ++k) {
        const double v = tweak(m, t, k, 100 + noise(rng));
        if (!std::isnan(v))
          stream.Add({static_cast<double>(t), "node" + std::to_string(m), metrics[k], v});
      }
    }
  }
  stream.Flush();
  return stream.TakeVerdicts();
}

std::vector<const Verdict*> Of(const std::vector<Verdict>& vs, VerdictKind kind) {
  std::vector<const Verdict*> out;
  for (const Verdict& v : vs) {
    if (v.kind == kind) out.push_back(&v);
  }
  return out;
}

// Three exporters' metrics: the GPU exporter's (0-2), the node exporter's (3-4), the trainer's (5).
const std::vector<std::string> kMetrics = {"DCGM_FI_DEV_GPU_UTIL",   "DCGM_FI_DEV_POWER_USAGE",
                                           "DCGM_FI_DEV_GPU_TEMP",   "node_load1",
                                           "node_memory_used_bytes", "trainer_step_compute_ms"};

TEST(SourcesTest, MetricsBelongToTheirExporter) {
  EXPECT_EQ(ClassifySource("DCGM_FI_DEV_GPU_UTIL"), MetricSource::kGpu);
  EXPECT_EQ(ClassifySource("nvidia_smi_power_draw_watts"), MetricSource::kGpu);
  EXPECT_EQ(ClassifySource("gpu_xid_errors"), MetricSource::kGpu);
  EXPECT_EQ(ClassifySource("megascope_gpu_utilization_ratio"), MetricSource::kGpu);
  EXPECT_EQ(ClassifySource("node_network_carrier_changes_total"), MetricSource::kHost);
  EXPECT_EQ(ClassifySource("node_load1"), MetricSource::kHost);
  EXPECT_EQ(ClassifySource("cpu_util"), MetricSource::kHost);
  EXPECT_EQ(ClassifySource("step_time_s"), MetricSource::kTrainer);
  EXPECT_EQ(ClassifySource("trainer_allreduce_wait_ms"), MetricSource::kTrainer);
  EXPECT_EQ(ClassifySource("fan_speed_rpm"), MetricSource::kOther);
  // Names no earlier generator used.
  EXPECT_EQ(ClassifyMetric("node_load1"), MetricFamily::kCpu);
  EXPECT_EQ(ClassifyMetric("node_infiniband_port_data_transmitted_bytes_total"),
            MetricFamily::kNetwork);
  EXPECT_EQ(ClassifyMetric("node_infiniband_link_downed_total"), MetricFamily::kErrors);
  EXPECT_EQ(ClassifyMetric("trainer_allreduce_wait_ms"), MetricFamily::kTraining);
  EXPECT_EQ(ClassifyMetric("trainer_step_compute_ms"), MetricFamily::kTraining);
  // Work done, whose zero means the machine stopped: not temperatures, power or waits.
  EXPECT_TRUE(IsWorkMetric("DCGM_FI_PROF_SM_ACTIVE"));
  EXPECT_TRUE(IsWorkMetric("node_network_transmit_bytes_total"));
  EXPECT_FALSE(IsWorkMetric("node_infiniband_port_transmit_wait_total"));
  EXPECT_FALSE(IsWorkMetric("DCGM_FI_DEV_GPU_TEMP"));
  EXPECT_FALSE(IsWorkMetric("pfc_tx_pause_pps"));
}

TEST(SourcesTest, AnExporterThatRestartsIsAMonitoringGapNotAFaultyMachine) {
  // node3's GPU exporter is away for 90 s while its node exporter and trainer report as usual.
  auto v = RunFleet(12, 900, kMetrics, [](int m, int t, int k, double x) {
    return m == 3 && k <= 2 && t >= 400 && t < 490 ? std::nan("") : x;
  });
  EXPECT_TRUE(Of(v, VerdictKind::kFaultyMachine).empty());
  const auto gaps = Of(v, VerdictKind::kMonitoringGap);
  ASSERT_EQ(gaps.size(), 1u);
  EXPECT_EQ(gaps[0]->root_nodes, std::vector<std::string>{"node3"});
  EXPECT_EQ(gaps[0]->cause, "source_silent");
  EXPECT_EQ(gaps[0]->evidence, std::vector<std::string>{"gpu_exporter"});
  EXPECT_NEAR(gaps[0]->onset_at_ns / 1e9, 400, 12);
}

TEST(SourcesTest, AnExporterNeverDeployedIsAMonitoringGapOnce) {
  auto v = RunFleet(12, 900, kMetrics, [](int m, int, int k, double x) {
    return m == 5 && k <= 2 ? std::nan("") : x;
  });
  EXPECT_TRUE(Of(v, VerdictKind::kFaultyMachine).empty());
  const auto gaps = Of(v, VerdictKind::kMonitoringGap);
  ASSERT_EQ(gaps.size(), 1u);
  EXPECT_EQ(gaps[0]->root_nodes, std::vector<std::string>{"node5"});
}

TEST(SourcesTest, TwoSourcesThatStopTogetherAreTheMachinesFailure) {
  // node7's GPU falls off the bus: its GPU exporter and its trainer stop in the same second; its
  // node exporter goes on. Faulty, on the sources' stop alone.
  auto v = RunFleet(12, 900, kMetrics, [](int m, int t, int k, double x) {
    return m == 7 && (k <= 2 || k == 5) && t >= 400 ? std::nan("") : x;
  });
  const auto faulty = Of(v, VerdictKind::kFaultyMachine);
  ASSERT_FALSE(faulty.empty());
  EXPECT_EQ(faulty[0]->root_nodes, std::vector<std::string>{"node7"});
  EXPECT_EQ(faulty[0]->level, VerdictLevel::kFaulty);
  EXPECT_EQ(faulty[0]->evidence.front(), "sources_stopped");
  EXPECT_LE(faulty[0]->detected_at_ns / 1e9 - 400, 50);
  EXPECT_TRUE(Of(v, VerdictKind::kMonitoringGap).empty());
}

// The trainer reports once a 5 s step, each machine at its own phase; `job_stops` on, no one steps.
double Stepping(int m, int t, int k, double x, int job_stops) {
  if (k != 5) return x;
  return t % 5 != m % 5 || t >= job_stops ? std::nan("") : x;
}

TEST(SourcesTest, AGpuThatStopsAsTheWholeJobStopsIsTheMachinesFailure) {
  // node7's GPU falls off the bus at t=400: its GPU exporter stops, its host idles (no process
  // left to drive it) and the job stops at its next collective, 3 s later: every trainer stops.
  // node7's trainer never stopped alone (no peer reported a step after its last), so the two
  // sources are not seen stopping together; its GPU stopping alone as the job stopped is the fault.
  auto v = RunFleet(12, 900, kMetrics, [](int m, int t, int k, double x) {
    if (m == 7 && t >= 400 && (k <= 2 || k == 5)) return std::nan("");
    if (m == 7 && t >= 400 && k == 3) return x * 0.2;
    return Stepping(m, t, k, x, 403);
  });
  const auto faulty = Of(v, VerdictKind::kFaultyMachine);
  ASSERT_FALSE(faulty.empty());
  for (const Verdict* f : faulty) EXPECT_EQ(f->root_nodes, std::vector<std::string>{"node7"});
  const Verdict& last = *faulty.back();
  EXPECT_EQ(last.level, VerdictLevel::kFaulty);
  EXPECT_EQ(last.evidence.front(), "stopped_with_job") << last.explanation;
  EXPECT_LE(last.detected_at_ns / 1e9 - 400, 50);
}

TEST(SourcesTest, AnExporterRestartingAsACheckpointBeginsIsNotTheMachinesFailure) {
  // A checkpoint stops every trainer from t=400 to 460; node4's GPU exporter restarts at t=401
  // for 70 s. Its GPU stops alone as the job stops, but the machine is otherwise like its peers.
  auto v = RunFleet(12, 900, kMetrics, [](int m, int t, int k, double x) {
    if (m == 4 && k <= 2 && t >= 401 && t < 471) return std::nan("");
    return k == 5 && t >= 400 && t < 460 ? std::nan("") : Stepping(m, t, k, x, 900);
  });
  const auto faulty = Of(v, VerdictKind::kFaultyMachine);
  EXPECT_TRUE(faulty.empty()) << faulty.front()->explanation;
}
TEST(SourcesTest, AFaultOnAMachineWhoseExporterIsAwayIsStillNamed) {
  // node2's GPU exporter is away for good; from t=400 its trainer's compute time is 40 % up.
  auto v = RunFleet(12, 900, kMetrics, [](int m, int t, int k, double x) {
    if (m == 2 && k <= 2 && t >= 300) return std::nan("");
    return m == 2 && k == 5 && t >= 400 ? x * 1.4 : x;
  });
  const auto faulty = Of(v, VerdictKind::kFaultyMachine);
  ASSERT_EQ(faulty.size(), 1u);
  EXPECT_EQ(faulty[0]->root_nodes, std::vector<std::string>{"node2"});
  EXPECT_EQ(faulty[0]->level, VerdictLevel::kFaulty);
  EXPECT_GE(faulty[0]->detected_at_ns / 1e9, 400);
  EXPECT_EQ(Of(v, VerdictKind::kMonitoringGap).size(), 1u);  // the gap before the fault
}

// A rack of four whose switch congests from t=400 for `len` seconds: three network metrics (PFC
// pauses up, traffic down) on all four, each starting up to 3 s after the first; GPU power as
// usual, no XID errors.
double SwitchEvent(int m, int t, int k, double x, int len) {
  if (k == 4) return 0;  // node_xid_errors: none
  const bool in = m >= 4 && m < 8 && t >= 400 + (m % 4) && t < 400 + len;
  if (!in || k == 3) return x;
  return k == 0 ? x * 6 : x * 0.6;
}
const std::vector<std::string> kNet = {"pfc_tx_pause_pps", "net_tx_gbps", "net_rx_gbps",
                                       "gpu_power_w", "node_xid_errors"};

// A topology of 32 machines, four behind each leaf switch.
DetectorConfig LeafSwitches() {
  DetectorConfig cfg;
  for (int m = 0; m < 32; ++m)
    cfg.components["node" + std::to_string(m)] = {"switch:leaf" + std::to_string(m / 4)};
  return cfg;
}

TEST(SharedComponentTest, MachinesThatMoveTogetherAreOneComponentNotThreeFaults) {
  // Three machines of the rack congest (its fourth is idle): without a topology, their onsets
  // within seconds of each other make them one cohort.
  auto v = RunFleet(32, 900, kNet, [](int m, int t, int k, double x) {
    return m == 7 ? (k == 4 ? 0 : x) : SwitchEvent(m, t, k, x, 150);
  });
  EXPECT_TRUE(Of(v, VerdictKind::kFaultyMachine).empty());
  const auto shared = Of(v, VerdictKind::kSharedComponent);
  ASSERT_EQ(shared.size(), 1u);
  EXPECT_EQ(shared[0]->cause, "simultaneous_onset");
  EXPECT_EQ(shared[0]->root_nodes.size(), 3u);
  EXPECT_EQ(shared[0]->evidence.size(), 3u);  // the three network metrics
}

TEST(SharedComponentTest, FaultsThatOutlastACheckpointDoNotBeginAgainTogether) {
  // node3's GPU is off its peers from t=300, node8's from 560 and node10's from 570 (three GPU
  // metrics each). A checkpoint from 600 to 660 stops every trainer and idles every GPU: no one
  // stands out. When the job resumes the three stand out again in the same second; they are
  // still three machines whose faults began minutes apart, not one cohort.
  auto v = RunFleet(16, 1200, kMetrics, [](int m, int t, int k, double x) {
    const bool checkpoint = t >= 600 && t < 660;
    if (k == 5) return checkpoint ? std::nan("") : Stepping(m, t, k, x, 1200);
    if (k > 2) return x;
    if (checkpoint) return 5 + 0.05 * (x - 100);
    const int from = m == 3 ? 300 : m == 8 ? 560 : m == 10 ? 570 : 100000;
    return t >= from ? x * 0.6 : x;
  });
  EXPECT_TRUE(Of(v, VerdictKind::kSharedComponent).empty())
      << Of(v, VerdictKind::kSharedComponent).front()->explanation;
  std::set<std::string> named;
  for (const Verdict* f : Of(v, VerdictKind::kFaultyMachine)) {
    if (f->level == VerdictLevel::kFaulty) named.insert(f->root_nodes.front());
  }
  EXPECT_EQ(named, (std::set<std::string>{"node3", "node8", "node10"}));
}

// node4's faulty verdicts.
std::vector<const Verdict*> FaultyNode4(const std::vector<Verdict>& v) {
  std::vector<const Verdict*> out;
  for (const Verdict* f : Of(v, VerdictKind::kFaultyMachine)) {
    if (f->level == VerdictLevel::kFaulty && f->root_nodes.front() == "node4") out.push_back(f);
  }
  return out;
}

// node4's GPU is off its peers (three GPU metrics) from t=200 to `end` and again from `second`.
// A checkpoint from 1000 to 1060 stops every trainer and idles every GPU.
std::vector<Verdict> TwoFaults(int end, int second) {
  return RunFleet(16, 1500, kMetrics, [end, second](int m, int t, int k, double x) {
    const bool checkpoint = t >= 1000 && t < 1060;
    if (k == 5) return checkpoint ? std::nan("") : Stepping(m, t, k, x, 1500);
    if (k > 2) return x;
    if (checkpoint) return 5 + 0.05 * (x - 100);
    const bool off = m == 4 && ((t >= 200 && t < end) || t >= second);
    return off ? x * 0.6 : x;
  });
}

TEST(LevelsTest, AFaultSoonAfterTheMachinesLastIsNamedOnItsOwn) {
  // The second fault begins 100 s after the first ended (a card that fails once more). The
  // first's evidence still filled the long windows for up to 150 s, which kept the machine from
  // re-arming until the new fault's own evidence kept it from ever being quiet: it was named only
  // after the checkpoint's quiet minute, 210 s late (on a fleet without checkpoints, never).
  const auto faulty = FaultyNode4(TwoFaults(800, 900));
  ASSERT_EQ(faulty.size(), 2u);
  EXPECT_NEAR(faulty[0]->onset_at_ns / 1e9, 200, 30);
  EXPECT_NEAR(faulty[1]->onset_at_ns / 1e9, 900, 30);
  EXPECT_LE(faulty[1]->detected_at_ns / 1e9, 1000);
}

TEST(LevelsTest, AFaultThatOutlastsACheckpointIsNamedOnce) {
  // One fault from t=200 on, through the checkpoint: quiet while the job paused is not the fault
  // ending, so it is not named again as the job resumes.
  const auto faulty = FaultyNode4(TwoFaults(100000, 100000));
  ASSERT_EQ(faulty.size(), 1u);
  EXPECT_NEAR(faulty[0]->onset_at_ns / 1e9, 200, 30);
}

TEST(SharedComponentTest, AWholeRackMovingTogetherIsNeverFaulty) {
  // All four machines of the rack: a sub-population as far as peers can tell (no evidence), and
  // with a topology, the rack named.
  auto v = RunFleet(32, 900, kNet,
                    [](int m, int t, int k, double x) { return SwitchEvent(m, t, k, x, 150); });
  EXPECT_TRUE(v.empty());
  const DetectorConfig cfg = LeafSwitches();
  auto w = RunFleet(
      32, 900, kNet, [](int m, int t, int k, double x) { return SwitchEvent(m, t, k, x, 150); },
      cfg);
  EXPECT_TRUE(Of(w, VerdictKind::kFaultyMachine).empty());
  const auto shared = Of(w, VerdictKind::kSharedComponent);
  ASSERT_EQ(shared.size(), 1u);
  EXPECT_EQ(shared[0]->group, "switch:leaf1");
  EXPECT_EQ(shared[0]->root_nodes.size(), 4u);
}

TEST(SharedComponentTest, ATopologyNamesTheComponentEvenForTwoMachines) {
  DetectorConfig cfg;
  for (int m = 0; m < 32; ++m) {
    cfg.components["node" + std::to_string(m)] = {"rack:r" + std::to_string(m / 2),
                                                  "switch:leaf" + std::to_string(m / 2)};
  }
  // Two machines of one rack (node4, node5; racks of two) congest together.
  auto v = RunFleet(
      32, 900, kNet,
      [](int m, int t, int k, double x) { return m < 6 ? SwitchEvent(m, t, k, x, 200) : x; }, cfg);
  EXPECT_TRUE(Of(v, VerdictKind::kFaultyMachine).empty());
  const auto shared = Of(v, VerdictKind::kSharedComponent);
  ASSERT_FALSE(shared.empty());
  EXPECT_EQ(shared[0]->cause, "component_outlier");
  EXPECT_EQ(shared[0]->group, "rack:r2");
  EXPECT_EQ(shared[0]->root_nodes, (std::vector<std::string>{"node4", "node5"}));
}

TEST(SharedComponentTest, AFaultOnOneMachineOfTheRackIsStillNamed) {
  // During the switch event node6 also starts reporting XID errors (a hard signal): it alone is
  // named faulty; the switch still is a shared component.
  const DetectorConfig cfg = LeafSwitches();
  auto v = RunFleet(
      32, 900, kNet,
      [](int m, int t, int k, double x) {
        if (k == 4) return m == 6 && t >= 420 && t < 600 ? 13.0 : 0.0;
        return SwitchEvent(m, t, k, x, 150);
      },
      cfg);
  const auto faulty = Of(v, VerdictKind::kFaultyMachine);
  ASSERT_EQ(faulty.size(), 1u);
  EXPECT_EQ(faulty[0]->root_nodes, std::vector<std::string>{"node6"});
  EXPECT_EQ(faulty[0]->level, VerdictLevel::kFaulty);
  EXPECT_EQ(faulty[0]->evidence.front(), "node_xid_errors");
  EXPECT_EQ(Of(v, VerdictKind::kSharedComponent).size(), 1u);
}

TEST(SharedComponentTest, AMemberThatJoinsLateRenamesTheComponentOnce) {
  // node4 and node5 congest at t=400; the cohort is named once it held (24 s); node6 joins at
  // t=426, within the component window: the component is named again with three machines, once
  // (not every tick while node6's own cohort ticks are still few).
  const DetectorConfig cfg = LeafSwitches();
  auto v = RunFleet(
      32, 900, kNet,
      [](int m, int t, int k, double x) {
        if (k == 4) return 0.0;
        const bool in =
            ((m == 4 || m == 5) && t >= 400 && t < 600) || (m == 6 && t >= 426 && t < 600);
        if (!in || k == 3) return x;
        return k == 0 ? x * 6 : x * 0.6;
      },
      cfg);
  EXPECT_TRUE(Of(v, VerdictKind::kFaultyMachine).empty());
  const auto shared = Of(v, VerdictKind::kSharedComponent);
  ASSERT_EQ(shared.size(), 2u);
  EXPECT_EQ(shared[0]->root_nodes, (std::vector<std::string>{"node4", "node5"}));
  EXPECT_EQ(shared[1]->root_nodes, (std::vector<std::string>{"node4", "node5", "node6"}));
}

TEST(LevelsTest, OneFamilyForMinutesIsASuspectNeverFaulty) {
  // A backup job holds node9's CPU for ten minutes.
  auto v = RunFleet(12, 1200, kMetrics, [](int m, int t, int k, double x) {
    return m == 9 && k == 3 && t >= 300 && t < 900 ? x + 60 : x;
  });
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].kind, VerdictKind::kFaultyMachine);
  EXPECT_EQ(v[0].level, VerdictLevel::kSuspect);
  EXPECT_LT(v[0].confidence, 0.9);
}

TEST(LevelsTest, AHardSignalIsFaultyAtOnceWithHighConfidence) {
  // node1's trainer: compute time 30 % up (the job waits on it).
  auto v = RunFleet(12, 900, kMetrics, [](int m, int t, int k, double x) {
    return m == 1 && k == 5 && t >= 400 ? x * 1.3 : x;
  });
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].level, VerdictLevel::kFaulty);
  EXPECT_GE(v[0].confidence, 0.9);
  EXPECT_LE(v[0].detected_at_ns / 1e9 - 400, 45);
}

TEST(LevelsTest, ATrainingMetricHurtsTheJobOnlyInItsDirection) {
  EXPECT_EQ(HoldsJobBackSign("step_time_s"), 1);
  EXPECT_EQ(HoldsJobBackSign("trainer_step_compute_ms"), 1);
  EXPECT_EQ(HoldsJobBackSign("trainer_allreduce_wait_ms"), -1);
  EXPECT_EQ(HoldsJobBackSign("megascope_step_comm_wait_seconds"), -1);
  EXPECT_EQ(HoldsJobBackSign("tokens_per_second"), -1);
  EXPECT_EQ(HoldsJobBackSign("megascope_mfu"), -1);
}

// node1's all-reduce wait from t=400 times `factor`, its other metrics as its peers'.
std::vector<Verdict> WaitMoves(double factor) {
  std::vector<std::string> metrics = kMetrics;
  metrics[5] = "trainer_allreduce_wait_ms";
  return RunFleet(12, 900, metrics, [factor](int m, int t, int k, double x) {
    return m == 1 && k == 5 && t >= 400 ? x * factor : x;
  });
}

TEST(LevelsTest, AMachineThatWaitsLongerThanItsPeersIsHeldBackNotFaulty) {
  // Its peers arrive late at every all-reduce: they hold it back, it holds back no one.
  auto v = WaitMoves(1.3);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].level, VerdictLevel::kSuspect);
  EXPECT_LT(v[0].confidence, 0.9);
  EXPECT_NE(v[0].explanation.find("held back by them"), std::string::npos) << v[0].explanation;
  // The machine every peer waits on waits least: that one hurts the job.
  auto w = WaitMoves(0.7);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].level, VerdictLevel::kFaulty);
  EXPECT_GE(w[0].confidence, 0.9);
}

TEST(LevelsTest, ALinkThatKeepsGoingDownIsFaultyOnceARareErrorCounterIsNot) {
  // node3's link goes down for 10 s every 100 s from t=400 (its carrier changes twice, its traffic
  // stops): three link state changes within five minutes are a flapping link, hard evidence.
  // node8's ECC counter counts one correction every 100 s: a card that corrects now and then, not a
  // fault.
  const std::vector<std::string> metrics = {"node_network_carrier_changes_total",
                                            "gpu_ecc_corrected_errors_total", "net_tx_gbps"};
  auto v = RunFleet(16, 1200, metrics, [](int m, int t, int k, double x) {
    const int cycles = t >= 400 ? (t - 400) / 100 + 1 : 0;
    const bool down = m == 3 && t >= 400 && (t - 400) % 100 < 10;
    if (k == 0) return 2.0 + (m == 3 ? 2.0 * cycles - (down ? 1 : 0) : 0);
    if (k == 1) return m == 8 ? static_cast<double>(cycles) : 0.0;
    return down ? 0.0 : x;
  });
  EXPECT_TRUE(IsLinkStateCounter("node_infiniband_link_downed_total"));
  EXPECT_TRUE(IsLinkStateCounter(metrics[0]));
  EXPECT_FALSE(IsLinkStateCounter(metrics[1]));
  // Named at its first flap, and once more when its third makes it a flapping link -- not once
  // per flap (eight), as when each flap's quiet minute re-armed it.
  const auto faulty = Of(v, VerdictKind::kFaultyMachine);
  ASSERT_FALSE(faulty.empty());
  EXPECT_LE(faulty.size(), 2u);
  for (const Verdict* f : faulty) {
    EXPECT_EQ(f->root_nodes, std::vector<std::string>{"node3"});
    EXPECT_EQ(f->level, VerdictLevel::kFaulty);
    EXPECT_EQ(f->evidence.front(), "node_network_carrier_changes_total");
  }
  EXPECT_LE(faulty[0]->detected_at_ns / 1e9 - 400, 30);
}

TEST(LevelsTest, ALinkThatWentDownTwiceIsFlappingOneThatWentDownOnceIsNot) {
  EXPECT_EQ(CountsPerLinkFlap("node_network_carrier_changes_total"), 2);
  EXPECT_EQ(CountsPerLinkFlap("node_network_carrier_down_changes_total"), 1);
  EXPECT_EQ(CountsPerLinkFlap("node_infiniband_link_downed_total"), 1);
  EXPECT_EQ(CountsPerLinkFlap("node_infiniband_port_transmit_wait_total"), 0);
  // InfiniBand counts each time a port went down. node3's goes down for 10 s every 80 s from
  // t=400; node7's once, at t=400. Two downs are a flapping link: named faulty once it is down
  // the second time, not only at its third (t=560); one down is no verdict.
  const std::vector<std::string> metrics = {"node_infiniband_link_downed_total", "net_tx_gbps"};
  auto v = RunFleet(16, 1000, metrics, [](int m, int t, int k, double x) {
    const int downs = t < 400 ? 0 : m == 3 ? (t - 400) / 80 + 1 : m == 7 ? 1 : 0;
    const bool down = (m == 3 || (m == 7 && t < 480)) && t >= 400 && (t - 400) % 80 < 10;
    if (k == 0) return static_cast<double>(downs);
    return down ? 0.0 : x;
  });
  const auto faulty = Of(v, VerdictKind::kFaultyMachine);
  ASSERT_EQ(faulty.size(), 1u);
  EXPECT_EQ(faulty[0]->root_nodes, std::vector<std::string>{"node3"});
  EXPECT_EQ(faulty[0]->evidence.front(), "node_infiniband_link_downed_total");
  EXPECT_LT(faulty[0]->detected_at_ns / 1e9, 560);
}

// A NIC that flaps with no carrier counter to tell: its traffic at nothing for 8 s of every 24
// from t=400 to t=640 (node3). Each stop is hard evidence only while it lasts, far less than half
// of the long window; three stops within it make the link flapping, and the spells between count
// too; long after, its last stop (12 s late out of a stall of the whole job) is no flap. node7
// is 8 s late out of each of the whole job's stalls (15 s of every 40 from t=700): its peers were
// not at work when its stops began, so it is no flapping link.
TEST(LevelsTest, TrafficThatKeepsStoppingIsAFlappingLinkWithoutACounter) {
  const std::vector<std::string> metrics = {"net_tx_gbps", "net_rx_gbps", "DCGM_FI_DEV_GPU_UTIL"};
  auto v = RunFleet(16, 1300, metrics, [](int m, int t, int k, double x) {
    if (k == 2) return x;
    if (m == 3 && t >= 400 && t < 640 && (t - 400) % 24 >= 16) return 0.0;
    if (t >= 1190 && t < (m == 3 ? 1217 : 1205)) return 0.0;  // long after, late out of a stall
    const int phase = (t - 700) % 40;
    const bool stall = t >= 700 && t < 1100 && phase < 15;
    const bool node7_stalls = t >= 700 && t < 1108 && phase < 23;
    return (m == 7 ? node7_stalls : stall) ? 0.0 : x;
  });
  std::vector<const Verdict*> faulty;
  for (const Verdict* f : Of(v, VerdictKind::kFaultyMachine)) {
    if (f->level == VerdictLevel::kFaulty) faulty.push_back(f);
  }
  ASSERT_EQ(faulty.size(), 1u) << (faulty.empty() ? "" : faulty.back()->explanation);
  EXPECT_EQ(faulty[0]->root_nodes, std::vector<std::string>{"node3"});
  EXPECT_LT(faulty[0]->detected_at_ns / 1e9, 640);
}

// Two peer groups that work at different levels (a pipeline stage with a third of the traffic):
// node12's NIC, in the lighter group, flaps as node3's did. Its peers are at their own usual work,
// however far below the other group's that is, so its stops count.
TEST(LevelsTest, AFlappingLinkInALighterPeerGroupIsNamedToo) {
  const std::vector<std::string> metrics = {"net_tx_gbps", "net_rx_gbps"};
  DetectorConfig cfg;
  for (int m = 0; m < 16; ++m) cfg.groups["node" + std::to_string(m)] = m < 8 ? "heavy" : "light";
  auto v = RunFleet(
      16, 900, metrics,
      [](int m, int t, int, double x) {
        if (m == 12 && t >= 400 && t < 640 && (t - 400) % 24 >= 16) return 0.0;
        return m < 8 ? x : 0.3 * x;
      },
      cfg);
  std::vector<std::string> named;
  for (const Verdict* f : Of(v, VerdictKind::kFaultyMachine)) {
    if (f->level == VerdictLevel::kFaulty) named.push_back(f->root_nodes.at(0));
  }
  EXPECT_EQ(named, std::vector<std::string>{"node12"});
}

// node5's links alone stand out from t=500 (pause frames 8 times its peers', a NIC on a downgraded
// PCIe link) as the job's steps take 20 % longer: the machine the job waits on, but a link's
// deviation beginning as the job slows is named only once it held longer than a benign burst
// lasts (the weak window), not over the short one. node11's pause frames burst for 50 s from
// t=1000, as the job's steps take 20 % longer again for those 50 s: no verdict of faulty.
TEST(LevelsTest, LinksThatBeganToStandOutAsTheJobSlowedAreFaultyOverTheWeakWindow) {
  const std::vector<std::string> metrics = {"pfc_tx_pause_pps", "net_tx_gbps", "step_time_s"};
  auto v = RunFleet(16, 1300, metrics, [](int m, int t, int k, double x) {
    const bool burst = t >= 1000 && t < 1050;
    if (k == 2) return x * (t >= 500 ? 1.2 : 1.0) * (burst ? 1.2 : 1.0);
    if (k == 0 && ((m == 5 && t >= 500) || (m == 11 && burst))) return 8 * x;
    return x;
  });
  std::vector<const Verdict*> faulty;
  for (const Verdict* f : Of(v, VerdictKind::kFaultyMachine)) {
    if (f->level == VerdictLevel::kFaulty) faulty.push_back(f);
  }
  ASSERT_EQ(faulty.size(), 1u) << (faulty.empty() ? "" : faulty.back()->explanation);
  EXPECT_EQ(faulty[0]->root_nodes, std::vector<std::string>{"node5"});
  EXPECT_EQ(
      std::count(faulty[0]->evidence.begin(), faulty[0]->evidence.end(), "job_slowed_with_it"), 1)
      << faulty[0]->explanation;
  EXPECT_GE(faulty[0]->detected_at_ns / 1e9 - 500, 72);
  EXPECT_LE(faulty[0]->detected_at_ns / 1e9 - 500, 100);
}

// A second fault on a machine still named for its first: named again, on what is new.
// node3: XID 48 from t=300, then XID 74 from t=600 (a new error code: news at once).
// node6: its link goes down every 30 s from t=300 to t=600, then from t=650 its steps take 25 %
// longer (the job hurt once what it was named for is over). node9: XID 48 from t=300, and its steps
// take longer from t=450 while the XID holds -- the first fault's course, one verdict only.
TEST(LevelsTest, ASecondFaultOnAMachineStillNamedIsNamedOnWhatIsNew) {
  EXPECT_TRUE(IsErrorCode("DCGM_FI_DEV_XID_ERRORS"));
  EXPECT_TRUE(IsErrorCode("gpu_active_xid_code"));
  EXPECT_FALSE(IsErrorCode("gpu_xid_errors"));  // how many, not which
  EXPECT_FALSE(IsErrorCode("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"));
  const std::vector<std::string> metrics = {"DCGM_FI_DEV_XID_ERRORS",
                                            "node_infiniband_link_downed_total",
                                            "trainer_step_compute_ms", "DCGM_FI_DEV_GPU_UTIL"};
  auto v = RunFleet(16, 1000, metrics, [](int m, int t, int k, double x) {
    if (k == 0) {
      if ((m == 3 || m == 9) && t >= 300) return m == 3 && t >= 600 ? 74.0 : 48.0;
      return 0.0;
    }
    if (k == 1) return m == 6 && t >= 300 ? 1.0 + std::floor(std::min(t - 300, 300) / 30.0) : 0.0;
    if (k == 2) return (m == 6 && t >= 650) || (m == 9 && t >= 450) ? 1.25 * x : x;
    return x;
  });
  std::map<std::string, std::vector<const Verdict*>> faulty;
  for (const Verdict* f : Of(v, VerdictKind::kFaultyMachine)) {
    if (f->level == VerdictLevel::kFaulty) faulty[f->root_nodes.at(0)].push_back(f);
  }
  ASSERT_EQ(faulty.size(), 3u);
  ASSERT_EQ(faulty["node3"].size(), 2u);
  const Verdict& xid74 = *faulty["node3"][1];
  EXPECT_GE(xid74.detected_at_ns / 1e9, 600);
  EXPECT_LE(xid74.detected_at_ns / 1e9 - 600, 40);
  EXPECT_EQ(xid74.evidence.front(), "DCGM_FI_DEV_XID_ERRORS") << xid74.explanation;
  ASSERT_EQ(faulty["node6"].size(), 2u);
  const Verdict& slow = *faulty["node6"][1];
  EXPECT_GE(slow.detected_at_ns / 1e9, 650);
  EXPECT_LE(slow.detected_at_ns / 1e9 - 650, 150);
  EXPECT_EQ(
      std::count(slow.evidence.begin(), slow.evidence.end(), "node_infiniband_link_downed_total"),
      0)
      << slow.explanation;  // the verdict says what the second fault shows
  EXPECT_EQ(faulty["node9"].size(), 1u) << faulty["node9"].back()->explanation;
}

// node4's trainer waited 60 % longer than its peers in its first minutes (it joined while they
// were already stepping), then waits like them. Against the offset it learned it now waits far
// less -- the sign of the machine everyone waits on -- but its waits sit among its peers': no
// machine holds the job back, and no verdict names it. node9, whose compute is 25 % longer from
// t=400 (its waits shorter than every peer's), is still named faulty.
TEST(LevelsTest, AMachineBackInThePackAfterAnOffsetLearnedAtItsStartIsNoCulprit) {
  const std::vector<std::string> metrics = {"trainer_allreduce_wait_ms", "trainer_step_compute_ms"};
  auto v = RunFleet(16, 900, metrics, [](int m, int t, int k, double x) {
    if (k == 0 && m == 4 && t < 90) return 1.6 * x;
    if (m == 9 && t >= 400) return k == 0 ? 0.75 * x : 1.25 * x;
    return x;
  });
  std::vector<std::string> named;
  for (const Verdict* f : Of(v, VerdictKind::kFaultyMachine)) {
    if (f->level == VerdictLevel::kFaulty) named.push_back(f->root_nodes.at(0));
  }
  EXPECT_EQ(named, std::vector<std::string>{"node9"});
}

// Two GPU sensors of node5 move from t=500 (utilisation and temperature up: one family, two
// metrics, a suspect at most on their own). When the job's step time grows by 15 % as they move,
// node5 is the machine the job waits on: faulty. The same deviation while the job keeps its pace
// (a hot but working GPU), or two machines that begin to deviate with the job's slowdown (no one
// machine to blame), stays a suspect.
enum class Pace { kJobSlowsWithIt, kJobKeepsItsPace, kTwoMachinesWithIt };
class PaceTest : public ::testing::TestWithParam<Pace> {};

TEST_P(PaceTest, AMachineWhoseDeviationBeganAsTheJobSlowedIsFaulty) {
  const Pace pace = GetParam();
  const std::vector<std::string> metrics = {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_TEMP",
                                            "step_time_s"};
  auto v = RunFleet(16, 1200, metrics, [pace](int m, int t, int k, double x) {
    const bool fault = t >= 500 && (m == 5 || (m == 9 && pace == Pace::kTwoMachinesWithIt));
    if (k == 2) return pace != Pace::kJobKeepsItsPace && t >= 500 ? 1.15 * x : x;
    return fault ? x + 15 : x;
  });
  const auto named = Of(v, VerdictKind::kFaultyMachine);
  ASSERT_FALSE(named.empty());
  const Verdict* faulty = nullptr;
  for (const Verdict* n : named) {
    EXPECT_NE(n->root_nodes, std::vector<std::string>{"node0"}) << n->explanation;
    if (n->level == VerdictLevel::kFaulty && faulty == nullptr) faulty = n;
  }
  if (pace != Pace::kJobSlowsWithIt) {
    EXPECT_EQ(faulty, nullptr) << faulty->explanation;
    return;
  }
  ASSERT_NE(faulty, nullptr);
  EXPECT_EQ(faulty->root_nodes, std::vector<std::string>{"node5"});
  EXPECT_EQ(faulty->evidence.front(), "job_slowed_with_it") << faulty->explanation;
  EXPECT_LE(faulty->detected_at_ns / 1e9 - 500, 60);  // the short window, not the weak one
}

INSTANTIATE_TEST_SUITE_P(Levels, PaceTest,
                         ::testing::Values(Pace::kJobSlowsWithIt, Pace::kJobKeepsItsPace,
                                           Pace::kTwoMachinesWithIt));

TEST(LevelsTest, AFaultOverLeavesNoShadowOnTheMachinesUsualPlace) {
  // node1 reports XID errors from t=300 to t=1800 (named faulty at once); meanwhile, in a noisy
  // phase of the whole job, the slow machine waits less in the all-reduce than its peers, by less
  // than the threshold. The job restarts (no trainer metrics for 400 s) and node1, repaired, waits
  // like everyone: it must not have learned the fault's level as its usual place while it was
  // named, or its healthy level would stand out for good and name it again with no fault at all.
  const std::vector<std::string> metrics = {"DCGM_FI_DEV_XID_ERRORS", "trainer_allreduce_wait_ms",
                                            "DCGM_FI_DEV_POWER_USAGE"};
  auto v = RunFleet(12, 3000, metrics, [](int m, int t, int k, double x) {
    const bool fault = m == 1 && t >= 300 && t < 1800;
    if (k == 0) return fault ? 79.0 : 0.0;
    if (k == 1 && t >= 1800 && t < 2200) return std::nan("");  // the job restarts without it
    if (k != 1 || t >= 1800) return x;
    const double noisy = 100 + (x - 100) * 12;  // the job's noisy phase
    return fault ? noisy - 20 : noisy;
  });
  const auto faulty = Of(v, VerdictKind::kFaultyMachine);
  ASSERT_EQ(faulty.size(), 1u);
  EXPECT_EQ(faulty[0]->root_nodes, std::vector<std::string>{"node1"});
  EXPECT_LT(faulty[0]->detected_at_ns / 1e9, 360);
}

}  // namespace
}  // namespace megascope::detector
