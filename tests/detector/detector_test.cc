#include "megascope/detector/detector.h"

#include <cmath>
#include <random>

#include <gtest/gtest.h>

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
        if (!std::isnan(v)) stream.Add({static_cast<double>(t), "node" + std::to_string(m), metric, v});
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
  auto v = RunFleet(12, 600, [](int m, int t, double x) { return m == 5 && t >= 300 ? x + 40 : x; });
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].root_nodes, std::vector<std::string>{"node5"});
  EXPECT_EQ(v[0].cause, "metric_outlier");
  const double onset = v[0].onset_at_ns / 1e9, detected = v[0].detected_at_ns / 1e9;
  EXPECT_GE(onset, 300);
  EXPECT_LE(onset, 310);
  EXPECT_GE(detected - 300, 24);  // the continuity window had to fill
  EXPECT_LE(detected - 300, 45);
  EXPECT_NE(v[0].explanation.find("node5"), std::string::npos);
}

TEST(DetectorTest, ShortJitterDoesNotAlarm) {
  auto v = RunFleet(12, 600, [](int m, int t, double x) { return m == 2 && t >= 100 && t < 115 ? x + 80 : x; });
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
  auto v = RunFleet(10, 600, [](int m, int t, double x) { return m == 3 && t >= 200 ? std::nan("") : x; });
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].root_nodes[0], "node3");
  EXPECT_EQ(v[0].cause, "machine_silent");
  EXPECT_EQ(v[0].evidence.front(), "no_samples");
}

TEST(DetectorTest, LateJoinersAndMissingSamplesAreFine) {
  auto v = RunFleet(10, 900, [](int m, int t, double x) {
    if (m == 9 && t < 300) return std::nan("");  // joins late
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
    v.root_nodes = {machine};
    v.detected_at_ns = static_cast<int64_t>(t * 1e9);
    return v;
  };
  std::vector<Verdict> vs = {verdict("n1", 130), verdict("n1", 150), verdict("n3", 160), verdict("n2", 450)};
  Evaluation e = Evaluate(vs, labels);
  EXPECT_EQ(e.total.true_positives, 1);
  EXPECT_EQ(e.total.duplicates, 1);
  EXPECT_EQ(e.total.false_positives, 2);  // wrong machine; n2 after its fault ended
  EXPECT_DOUBLE_EQ(e.total.precision(), 1.0 / 3);
  EXPECT_DOUBLE_EQ(e.total.recall(), 0.5);
  EXPECT_DOUBLE_EQ(e.total.median_delay_s(), 30);
  EXPECT_EQ(e.by_type["ecc_error"].detected, 1);
  EXPECT_EQ(e.by_type["xid_error"].detected, 0);
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
