// A metrics CSV in any row order (issue 73): a file dumped series by series, as promtool tsdb dump
// and remote-read exports write it, is read in time order in bounded memory and yields the same
// verdicts as the same samples written in time order.
#include "megascope/detector/time_order.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <tuple>

#include "megascope/detector/detector.h"
#include "test_util.h"

namespace megascope::detector {
namespace {

struct Row {
  double t;
  std::string machine, metric;
  double v;
};

std::string WriteCsv(const std::string& path, const std::vector<Row>& rows) {
  auto w = MetricsCsvWriter::Open(path, 3, 12);
  EXPECT_TRUE(w.ok());
  for (const Row& r : rows) (*w)->Row(r.t, r.machine, r.metric, r.v);
  EXPECT_TRUE((*w)->Close().ok());
  return path;
}

// 16 machines, two metrics, 20 minutes; node7's GPU power and CPU leave their peers at t=400.
std::vector<Row> Fleet() {
  std::vector<Row> rows;
  std::mt19937 rng(17);
  std::normal_distribution<double> noise(0, 1);
  for (int t = 0; t < 1200; ++t) {
    for (int m = 0; m < 16; ++m) {
      for (const char* metric : {"gpu_power_w", "cpu_util"}) {
        const double shift = m == 7 && t >= 400 ? 40 : 0;
        rows.push_back(
            {t + 0.001 * m, "node" + std::to_string(m), metric, 100 + shift + noise(rng)});
      }
    }
  }
  return rows;
}

std::vector<std::tuple<std::string, int64_t, VerdictLevel>> Verdicts(
    const std::function<bool(Sample*)>& next, double lateness_s = 60) {
  Detector det(DetectorConfig{});
  Stream stream(&det, 1.0, lateness_s);
  Sample s;
  while (next(&s)) stream.Add(s);
  stream.Flush();
  std::vector<std::tuple<std::string, int64_t, VerdictLevel>> out;
  for (const Verdict& v : stream.TakeVerdicts())
    out.emplace_back(v.root_nodes.empty() ? "" : v.root_nodes[0], v.detected_at_ns, v.level);
  return out;
}

TEST(TimeOrderTest, RowsComeBackInTimeOrderAcrossSpilledRunsEqualTimesInFileOrder) {
  megascope::testing::TempDir dir;
  std::vector<Row> rows;
  for (int series = 0; series < 5; ++series) {  // series by series, each in time order
    for (int t = 0; t < 40; ++t)
      rows.push_back({t / 2.0, "m", "s" + std::to_string(series), 1.0 * t});
  }
  const std::string path = WriteCsv(dir.path() + "/by_series.csv", rows);
  TimeOrderedReader::Options opts;
  opts.run_rows = 7;  // 29 runs
  opts.tmp_dir = dir.path();
  auto r = TimeOrderedReader::Open(path, opts);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)->rows(), 200);
  EXPECT_GT((*r)->runs(), 20);
  Sample s;
  double last_t = -1;
  std::string last_metric;
  int n = 0;
  while ((*r)->Next(&s)) {
    ASSERT_GE(s.time_s, last_t);
    if (s.time_s == last_t) {
      EXPECT_GT(s.metric, last_metric);  // file order among equal times
    }
    last_t = s.time_s;
    last_metric = s.metric;
    ++n;
  }
  EXPECT_TRUE((*r)->status().ok());
  EXPECT_EQ(n, 200);
  // The spill files are unlinked as they are made: nothing is left in the folder but the CSV.
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path()))
    files += e.is_regular_file();
  EXPECT_EQ(files, 1);
}

TEST(TimeOrderTest, AFileDumpedSeriesBySeriesGivesTheVerdictsOfOneInTimeOrder) {
  megascope::testing::TempDir dir;
  std::vector<Row> rows = Fleet();
  const std::string in_time = WriteCsv(dir.path() + "/time.csv", rows);
  std::stable_sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
    return std::tie(a.machine, a.metric) < std::tie(b.machine, b.metric);
  });
  const std::string by_series = WriteCsv(dir.path() + "/series.csv", rows);

  auto plain = MetricsCsvReader::Open(in_time);
  ASSERT_TRUE(plain.ok());
  const auto want = Verdicts([&](Sample* s) { return (*plain)->Next(s); });
  ASSERT_FALSE(want.empty());
  EXPECT_EQ(std::get<0>(want[0]), "node7");

  TimeOrderedReader::Options opts;
  opts.run_rows = 5000;  // spilled in 8 runs
  opts.tmp_dir = dir.path();
  auto sorted = TimeOrderedReader::Open(by_series, opts);
  ASSERT_TRUE(sorted.ok());
  EXPECT_GT((*sorted)->runs(), 1);
  EXPECT_EQ(Verdicts([&](Sample* s) { return (*sorted)->Next(s); }), want);

  // Read as a live stream instead, the same file loses most of its samples to the lateness bound
  // and names nobody: what `detect --presorted` would do with it.
  auto stream = MetricsCsvReader::Open(by_series);
  ASSERT_TRUE(stream.ok());
  EXPECT_TRUE(Verdicts([&](Sample* s) { return (*stream)->Next(s); }).empty());
}

TEST(TimeOrderTest, ABadRowNamesItsLine) {
  megascope::testing::TempDir dir;
  const std::string path = dir.path() + "/bad.csv";
  std::ofstream(path) << "timestamp_s,machine,metric,value\n1,a,b,2\n2,a,b,x\n";
  auto r = TimeOrderedReader::Open(path, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("bad.csv:3"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace megascope::detector
