#include "megascope/detector/detector.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "megascope/detector/evaluate.h"
#include "megascope/detector/prometheus_text.h"

namespace megascope::detector {
namespace {

// A hand-made fleet: `machines` machines report `metric` every second around 100 with noise;
// `tweak(machine, t, value)` may change a value or drop it (return NaN).
std::vector<Verdict> RunFleet(int machines, int seconds,
                              const std::function<double(int, int, double)>& tweak,
                              DetectorConfig cfg = {}) {
  Detector det(std::move(cfg));
  Stream stream(&det);
  std::mt19937 rng(3);
  std::normal_distribution<double> noise(0, 1);
  for (int t = 0; t < seconds; ++t) {
    for (int m = 0; m < machines; ++m) {
      for (const char* metric : {"gpu_power_w", "cpu_util"}) {
        double v = tweak(m, t, 100 + noise(rng));
        if (!std::isnan(v))
          stream.Add({static_cast<double>(t), "node" + std::to_string(m), metric, v});
      }
    }
  }
  stream.Flush();
  return stream.TakeVerdicts();
}

TEST(DetectorTest, HealthyFleetRaisesNothing) {
  auto v = RunFleet(12, 900, [](int, int, double x) { return x; });
  EXPECT_TRUE(v.empty());
}

TEST(DetectorTest, NamesTheMachineThatShiftsAndWhen) {
  // Two families (GPU power and CPU) off their peers, no hard signal: a suspect once the short
  // window fills, faulty once the agreement outlasts any benign excursion (48 of 60 s).
  auto v =
      RunFleet(12, 600, [](int m, int t, double x) { return m == 5 && t >= 300 ? x + 40 : x; });
  ASSERT_EQ(v.size(), 2u);
  for (const Verdict& x : v) {
    EXPECT_EQ(x.root_nodes, std::vector<std::string>{"node5"});
    EXPECT_EQ(x.cause, "metric_outlier");
    const double onset = static_cast<double>(x.onset_at_ns) / 1e9;
    EXPECT_GE(onset, 300);
    EXPECT_LE(onset, 310);
    EXPECT_NE(x.explanation.find("node5"), std::string::npos);
  }
  auto after = [](const Verdict& x) { return static_cast<double>(x.detected_at_ns) / 1e9 - 300; };
  EXPECT_EQ(v[0].level, VerdictLevel::kSuspect);
  EXPECT_GE(after(v[0]), 24);  // the continuity window had to fill
  EXPECT_LE(after(v[0]), 45);
  EXPECT_EQ(v[1].level, VerdictLevel::kFaulty);
  EXPECT_GE(after(v[1]), 48);  // 80 % of the 60-s corroborated window
  EXPECT_LE(after(v[1]), 70);
}

TEST(DetectorTest, ShortJitterDoesNotAlarm) {
  auto v = RunFleet(
      12, 600, [](int m, int t, double x) { return m == 2 && t >= 100 && t < 115 ? x + 80 : x; });
  EXPECT_TRUE(v.empty());
}

TEST(DetectorTest, JobWideEventsDoNotAlarm) {
  // Every machine drops to idle for a minute (a checkpoint), entering up to 2 s apart.
  auto v = RunFleet(16, 900, [](int m, int t, double x) {
    return t >= 300 + m % 3 && t < 360 + m % 3 ? x * 0.1 : x;
  });
  EXPECT_TRUE(v.empty());
}

TEST(DetectorTest, HealthyHeterogeneityIsLearnedNotFlagged) {
  // node4 always runs a little warmer than its peers.
  auto v = RunFleet(12, 900, [](int m, int, double x) { return m == 4 ? x + 12 : x; });
  EXPECT_TRUE(v.empty());
}

TEST(DetectorTest, AMachineThatGoesSilentIsNamed) {
  auto v = RunFleet(10, 600,
                    [](int m, int t, double x) { return m == 3 && t >= 200 ? std::nan("") : x; });
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].root_nodes[0], "node3");
  EXPECT_EQ(v[0].cause, "machine_silent");
  EXPECT_EQ(v[0].evidence.front(), "no_samples");
}

TEST(DetectorTest, LateJoinersAndMissingSamplesAreFine) {
  auto v = RunFleet(10, 900, [](int m, int t, double x) {
    if (m == 9 && t < 300) return std::nan("");      // joins late
    if ((m * 7 + t) % 13 == 0) return std::nan("");  // sporadic gaps
    return x;
  });
  EXPECT_TRUE(v.empty());
}

TEST(DetectorTest, ConstantMetricsNeitherCrashNorAlarm) {
  auto v = RunFleet(8, 300, [](int, int, double) { return 42.0; });
  EXPECT_TRUE(v.empty());
}

TEST(DetectorTest, NoJudgementWithTooFewPeers) {
  auto v = RunFleet(3, 300, [](int m, int, double x) { return m == 0 ? x + 50 : x; });
  EXPECT_TRUE(v.empty());
}

TEST(DetectorTest, OutOfOrderSamplesWithinLatenessAreUsedLaterOnesCounted) {
  Detector det{DetectorConfig{}};
  Stream stream(&det, 1.0, 10.0);
  stream.Add({100, "a", "m", 1});
  stream.Add({95, "b", "m", 1});  // 5 s late: fine
  stream.Add({200, "a", "m", 1});
  stream.Add({150, "b", "m", 1});  // the stream has moved past 190
  EXPECT_EQ(stream.late_samples(), 1);
}

TEST(EvaluateTest, ScoresAsFormatsDefines) {
  std::vector<Label> labels = {{"n1", 100, 200, "ecc_error"}, {"n2", 300, 400, "xid_error"}};
  auto verdict = [](const char* machine, double t) {
    Verdict v;
    v.kind = VerdictKind::kFaultyMachine;
    v.root_nodes = {machine};
    v.detected_at_ns = static_cast<int64_t>(t * 1e9);
    return v;
  };
  std::vector<Verdict> vs = {verdict("n1", 130), verdict("n1", 150), verdict("n3", 160),
                             verdict("n2", 450)};
  Evaluation e = Evaluate(vs, labels);
  EXPECT_EQ(e.total.true_positives, 1);
  EXPECT_EQ(e.total.duplicates, 1);
  EXPECT_EQ(e.total.false_positives, 2);  // wrong machine; n2 after its fault ended
  EXPECT_DOUBLE_EQ(e.total.precision(), 1.0 / 3);
  EXPECT_DOUBLE_EQ(e.total.recall(), 0.5);
  EXPECT_DOUBLE_EQ(e.total.median_delay_s(), 30);
  EXPECT_EQ(e.by_type["ecc_error"].detected, 1);
  EXPECT_EQ(e.by_type["xid_error"].detected, 0);
  ASSERT_EQ(e.calibration.size(), 3u);  // the duplicate left out
  EXPECT_EQ(e.suspects_true + e.suspects_false + e.alerts, 0);

  // A suspect (even on a labelled fault) and alerts that blame no machine are tallied apart.
  Verdict suspect = verdict("n2", 350), gap = verdict("n3", 360), rack = verdict("n2", 370);
  suspect.level = VerdictLevel::kSuspect;
  gap.kind = VerdictKind::kMonitoringGap;
  rack.kind = VerdictKind::kSharedComponent;
  vs.insert(vs.end(), {suspect, gap, rack, verdict("n3", 500)});
  vs.back().level = VerdictLevel::kSuspect;
  Evaluation f = Evaluate(vs, labels);
  EXPECT_EQ(f.total.false_positives, 2);
  EXPECT_EQ(f.by_type["xid_error"].detected, 0);
  EXPECT_EQ(f.suspects_true, 1);
  EXPECT_EQ(f.suspects_false, 1);
  EXPECT_EQ(f.alerts, 2);
  EXPECT_NE(FormatEvaluation(f).find("2 suspects (1 on a labelled fault, 1 not), 2 alerts"),
            std::string::npos);
}

// A fleet of `machines` reporting the given metrics every second around 100 with noise;
// `tweak(machine, t, metric, value)` may change a value or drop it (NaN).
// Times run from `origin` (seconds).
std::vector<Verdict> RunMetrics(int machines, int seconds, const std::vector<std::string>& metrics,
                                const std::function<double(int, int, int, double)>& tweak,
                                double origin = 0) {
  Detector det{DetectorConfig{}};
  Stream stream(&det);
  std::mt19937 rng(5);
  std::normal_distribution<double> noise(0, 1);
  for (int t = 0; t < seconds; ++t) {
    for (int m = 0; m < machines; ++m) {
      for (int k = 0; k < static_cast<int>(metrics.size()); ++k) {
        const double v = tweak(m, t, k, 100 + noise(rng));
        if (!std::isnan(v)) stream.Add({origin + t, "node" + std::to_string(m), metrics[k], v});
      }
    }
  }
  stream.Flush();
  return stream.TakeVerdicts();
}

TEST(MetricFamilyTest, ExporterNamesFallIntoFamilies) {
  EXPECT_EQ(ClassifyMetric("gpu_xid_errors"), MetricFamily::kErrors);
  EXPECT_EQ(ClassifyMetric("DCGM_FI_DEV_XID_ERRORS"), MetricFamily::kErrors);
  EXPECT_EQ(ClassifyMetric("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"), MetricFamily::kErrors);
  EXPECT_EQ(ClassifyMetric("node_network_carrier_changes_total"), MetricFamily::kErrors);
  EXPECT_EQ(ClassifyMetric("step_time_s"), MetricFamily::kTraining);
  EXPECT_EQ(ClassifyMetric("megascope_step_duration_seconds"), MetricFamily::kTraining);
  EXPECT_EQ(ClassifyMetric("train_step_compute_seconds"), MetricFamily::kTraining);
  EXPECT_EQ(ClassifyMetric("DCGM_FI_PROF_NVLINK_TX_BYTES"), MetricFamily::kNvlink);
  EXPECT_EQ(ClassifyMetric("pfc_tx_pause_pps"), MetricFamily::kNetwork);
  EXPECT_EQ(ClassifyMetric("node_network_receive_bytes_total"), MetricFamily::kNetwork);
  EXPECT_EQ(ClassifyMetric("DCGM_FI_DEV_POWER_USAGE"), MetricFamily::kGpu);
  EXPECT_EQ(ClassifyMetric("gpu_mem_used_gb"), MetricFamily::kGpu);
  EXPECT_EQ(ClassifyMetric("node_cpu_utilization_ratio"), MetricFamily::kCpu);
  EXPECT_EQ(ClassifyMetric("node_memory_used_bytes"), MetricFamily::kMemory);
  EXPECT_EQ(ClassifyMetric("fan_speed_rpm"), MetricFamily::kOther);
  EXPECT_TRUE(IsCumulativeCounter("node_network_transmit_bytes_total"));
  EXPECT_TRUE(IsCumulativeCounter("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"));
  EXPECT_FALSE(IsCumulativeCounter("total_power"));
}

TEST(DetectorTest, CountersAreComparedAsRatesNotTotals) {
  // Every machine started at another time (totals far apart) and one restarts its exporter (a
  // reset to zero); only machine 4, whose NIC stops sending at t=400, is named.
  std::vector<double> total(12);
  for (int m = 0; m < 12; ++m) total[m] = 1e12 * (m + 1);
  auto v =
      RunMetrics(12, 700, {"node_network_transmit_bytes_total"}, [&](int m, int t, int, double x) {
        if (m == 7 && t == 200) total[m] = 0;
        if (m != 4 || t < 400) total[m] += 1e6 * x;
        return total[m];
      });
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].root_nodes, std::vector<std::string>{"node4"});
  EXPECT_GE(v[0].detected_at_ns / 1e9, 400);
}

TEST(DetectorTest, TimesBeforeZeroAreJustEarlierTicks) {
  // The same fleet and fault with the clock started 1,000 s before 0: the same verdict 1,000 s
  // earlier. (A negative tick once indexed the rings at -1, and a counter's first sample was told
  // from the others by a negative time, so no rate was ever taken.)
  auto run = [](double origin) {
    std::vector<double> total(12);
    for (int m = 0; m < 12; ++m) total[m] = 1e12 * (m + 1);
    return RunMetrics(
        12, 700, {"node_network_transmit_bytes_total", "gpu_power_w"},
        [&](int m, int t, int k, double x) {
          if (k == 1) return x;
          if (m != 4 || t < 400) total[m] += 1e6 * x;
          return total[m];
        },
        origin);
  };
  const auto at0 = run(0), before0 = run(-1000);
  ASSERT_EQ(at0.size(), 1u);
  ASSERT_EQ(before0.size(), 1u);
  EXPECT_EQ(before0[0].root_nodes, std::vector<std::string>{"node4"});
  EXPECT_EQ(before0[0].detected_at_ns, at0[0].detected_at_ns - int64_t{1000} * 1000000000);
  EXPECT_EQ(before0[0].onset_at_ns, at0[0].onset_at_ns - int64_t{1000} * 1000000000);
}

TEST(DetectorTest, OneMetricForAMinuteIsNotEnoughTwoFamiliesAre) {
  // Machine 2: a 60-s excursion on CPU alone (a cron job): nothing. Machine 6: a 60-s excursion on
  // CPU and GPU power at once: a suspect within the short continuity window, faulty once the two
  // families held 48 of 60 s.
  auto v = RunMetrics(12, 900, {"cpu_util", "gpu_power_w"}, [](int m, int t, int k, double x) {
    if (m == 2 && k == 0 && t >= 200 && t < 260) return x + 60;
    if (m == 6 && t >= 500 && t < 560) return x + 60;
    return x;
  });
  ASSERT_EQ(v.size(), 2u);
  for (const Verdict& x : v) EXPECT_EQ(x.root_nodes, std::vector<std::string>{"node6"});
  EXPECT_EQ(v[0].level, VerdictLevel::kSuspect);
  EXPECT_LE(v[0].detected_at_ns / 1e9 - 500, 45);
  EXPECT_EQ(v[1].level, VerdictLevel::kFaulty);
  EXPECT_GE(v[1].detected_at_ns / 1e9 - 500, 48);
}

TEST(DetectorTest, WeakEvidenceThatLastsIsNamedWithLowConfidence) {
  auto v = RunMetrics(12, 900, {"cpu_util", "gpu_power_w"}, [](int m, int t, int k, double x) {
    return m == 3 && k == 0 && t >= 300 ? x + 60 : x;
  });
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].root_nodes, std::vector<std::string>{"node3"});
  EXPECT_GE(v[0].detected_at_ns / 1e9 - 300, 60);  // longer than any benign excursion
  EXPECT_LE(v[0].confidence, 0.5);
}

TEST(DetectorTest, AnIdleJobWithNoSpreadRaisesNothing) {
  // A normal start, then ten minutes where every machine reports the same value (a stalled job)
  // and one differs by a hair.
  auto v = RunMetrics(12, 1200, {"cpu_util", "gpu_power_w"}, [](int m, int t, int, double x) {
    if (t < 300) return x;
    return m == 5 ? 10.001 : 10.0;
  });
  EXPECT_TRUE(v.empty()) << v[0].explanation;
}

TEST(DetectorTest, AFalseVerdictDoesNotBlindTheDetectorToTheNextFault) {
  // Machine 8: a long single-metric excursion (a weak verdict), clean for two minutes, then a
  // real fault on two families: named again. Machine 1 is noisy but healthy (a 20-s CPU spike
  // every 50 s) and then develops a fault: named.
  auto v = RunMetrics(12, 1500, {"cpu_util", "gpu_power_w"}, [](int m, int t, int k, double x) {
    if (m == 8 && k == 0 && t >= 200 && t < 400) return x + 60;
    if (m == 8 && t >= 520) return x + 60;
    if (m == 1 && k == 0 && t % 50 < 20) return x + 60;
    if (m == 1 && t >= 1100) return x - 60;
    return x;
  });
  auto count = [&](const std::string& node, double from, double to, VerdictLevel level) {
    int n = 0;
    for (const Verdict& x : v) {
      const double at = static_cast<double>(x.detected_at_ns) / 1e9;
      n += x.root_nodes[0] == node && at >= from && at <= to && x.level == level ? 1 : 0;
    }
    return n;
  };
  // One family alone, however long: a suspect, never faulty.
  EXPECT_EQ(count("node8", 200, 400, VerdictLevel::kSuspect), 1);
  EXPECT_EQ(count("node8", 0, 519, VerdictLevel::kFaulty), 0);
  EXPECT_EQ(count("node8", 520, 640, VerdictLevel::kFaulty), 1);
  EXPECT_EQ(count("node1", 1100, 1200, VerdictLevel::kFaulty), 1);
  EXPECT_EQ(count("node1", 0, 1099, VerdictLevel::kFaulty), 0);
}

TEST(DetectorTest, ConfidenceIsMonotoneInTheEvidence) {
  using Item = Detector::EvidenceItem;
  const Item weak{MetricFamily::kCpu, false, 30}, gpu{MetricFamily::kGpu, false, 30};
  const Item errors{MetricFamily::kErrors, false, 30}, silent{MetricFamily::kOther, true, 30};
  const double one = Detector::Confidence({weak}, 30);
  const double two = Detector::Confidence({weak, gpu}, 30);
  const double three = Detector::Confidence({weak, gpu, errors}, 30);
  EXPECT_LT(one, two);
  EXPECT_LT(two, three);
  EXPECT_LE(one, 0.5);
  EXPECT_GE(Detector::Confidence({errors}, 30), 0.9);
  EXPECT_GE(Detector::Confidence({silent}, 30), 0.9);
  // Longer evidence never lowers it; a second metric of the same family never lowers it.
  double last = 0;
  for (int ticks = 1; ticks <= 90; ++ticks) {
    const double c = Detector::Confidence({{MetricFamily::kGpu, false, ticks}, weak}, 30);
    EXPECT_GE(c, last);
    last = c;
  }
  EXPECT_GE(Detector::Confidence({weak, {MetricFamily::kCpu, false, 5}}, 30), one);
  EXPECT_LE(three, 0.99);
}

TEST(PrometheusTextTest, AgentMetricsBecomeSamplesPerNode) {
  const char* text =
      "# HELP megascope_step_duration_seconds step time\n"
      "# TYPE megascope_step_duration_seconds histogram\n"
      "megascope_step_duration_seconds_bucket{job=\"j\",node=\"node0\",rank=\"0\",le=\"1\"} 3\n"
      "megascope_step_duration_seconds_sum{job=\"j\",node=\"node0\",rank=\"0\"} 2.5\n"
      "megascope_tokens_per_second{job=\"j\",node=\"node0\",rank=\"0\"} 100\n"
      "megascope_tokens_per_second{job=\"j\",node=\"node0\",rank=\"1\"} 300\n"
      "megascope_node_cpu_utilization_ratio{job=\"j\",node=\"node1\"} 0.5 1763700000000\n"
      "process_open_fds 12\n";
  auto s = ParsePrometheusText(text, 42);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_EQ(s->size(), 2u);
  EXPECT_EQ((*s)[0].machine, "node0");
  EXPECT_EQ((*s)[0].metric, "tokens_per_second");
  EXPECT_DOUBLE_EQ((*s)[0].value, 200);  // ranks of a node averaged
  EXPECT_EQ((*s)[1].metric, "node_cpu_utilization_ratio");
  EXPECT_DOUBLE_EQ((*s)[1].time_s, 42);
  auto bad = ParsePrometheusText("a{node=\"x\"} 1\nb{node=\"x\"} zzz\n", 0);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("line 2"), std::string::npos);
}

}  // namespace
}  // namespace megascope::detector
