#include "megascope/detector/samples.h"

#include <gtest/gtest.h>

#include <fstream>

#include "test_util.h"

namespace megascope::detector {
namespace {

std::string Write(const megascope::testing::TempDir& dir, const std::string& name,
                  const std::string& text) {
  std::string path = dir.path() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(SamplesTest, StreamsMetricsInAnyOrderWithBlankLines) {
  megascope::testing::TempDir dir;
  auto r = MetricsCsvReader::Open(Write(dir, "m.csv",
                                        "timestamp_s,machine,metric,value\n1763700001,node0,cpu_"
                                        "util,0.41\n\n1763700000.5,node1,gpu_power_w,512.5\r\n"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  Sample s;
  ASSERT_TRUE((*r)->Next(&s));
  EXPECT_EQ(s.machine, "node0");
  EXPECT_DOUBLE_EQ(s.value, 0.41);
  ASSERT_TRUE((*r)->Next(&s));
  EXPECT_DOUBLE_EQ(s.time_s, 1763700000.5);
  EXPECT_EQ(s.metric, "gpu_power_w");
  EXPECT_FALSE((*r)->Next(&s));
  EXPECT_TRUE((*r)->status().ok());
}

TEST(SamplesTest, ALabelledSeriesNameIsQuotedAsRfc4180QuotesIt) {
  // dcgm-exporter's series carry commas in their labels: a CSV quotes such a field, "" inside.
  Sample s;
  ASSERT_TRUE(
      ParseMetricsLine(
          "1763700000,node3,\"DCGM_FI_DEV_GPU_UTIL{gpu=\"\"3\"\",UUID=\"\"GPU-1\"\"}\",87", &s)
          .ok());
  EXPECT_EQ(s.metric, "DCGM_FI_DEV_GPU_UTIL{gpu=\"3\",UUID=\"GPU-1\"}");
  EXPECT_EQ(s.machine, "node3");
  EXPECT_DOUBLE_EQ(s.value, 87);
  // And the writer quotes it back, so what it writes reads the same.
  megascope::testing::TempDir dir;
  const std::string path = dir.path() + "/q.csv";
  {
    auto w = MetricsCsvWriter::Open(path, 0, 6);
    ASSERT_TRUE(w.ok());
    (*w)->Row(1763700000, "node3", s.metric, 87);
    ASSERT_TRUE((*w)->Close().ok());
  }
  auto r = MetricsCsvReader::Open(path);
  ASSERT_TRUE(r.ok());
  Sample back;
  ASSERT_TRUE((*r)->Next(&back));
  EXPECT_EQ(back.metric, s.metric);
}

TEST(SamplesTest, MalformedRowsNameFileAndLine) {
  megascope::testing::TempDir dir;
  auto r = MetricsCsvReader::Open(Write(
      dir, "bad.csv", "timestamp_s,machine,metric,value\n1,node0,cpu,0.1\n2,node0,cpu,abc\n"));
  ASSERT_TRUE(r.ok());
  Sample s;
  EXPECT_TRUE((*r)->Next(&s));
  EXPECT_FALSE((*r)->Next(&s));
  EXPECT_NE((*r)->status().message().find("bad.csv:3: value 'abc' is not a number"),
            std::string::npos)
      << (*r)->status().message();

  auto h = MetricsCsvReader::Open(Write(dir, "hdr.csv", "time,machine,metric,value\n"));
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.status().message().find("hdr.csv:1: header should be"), std::string::npos);
  auto e = MetricsCsvReader::Open(Write(dir, "empty.csv", ""));
  EXPECT_FALSE(e.ok());
  auto missing = MetricsCsvReader::Open(dir.path() + "/none.csv");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  Sample x;
  EXPECT_NE(ParseMetricsLine("1,a,b", &x).message().find("expected 4 fields"), std::string::npos);
  // Times are seconds since the epoch or the run's start.
  EXPECT_NE(ParseMetricsLine("-17,a,b,1", &x).message().find("timestamp_s -17 is negative"),
            std::string::npos);
  EXPECT_NE(ParseMetricsLine("1763700000000,a,b,1", &x).message().find("milliseconds?"),
            std::string::npos);
  EXPECT_TRUE(ParseMetricsLine("1763700000.5,a,b,1", &x).ok());
}

TEST(SamplesTest, LabelsAndGroups) {
  megascope::testing::TempDir dir;
  auto l = ReadLabelsCsv(
      Write(dir, "l.csv",
            "machine,fault_start_s,fault_end_s,fault_type\nnode7,100,900,pcie_downgrade\n"));
  ASSERT_TRUE(l.ok());
  ASSERT_EQ(l->size(), 1u);
  EXPECT_EQ((*l)[0].fault_type, "pcie_downgrade");
  auto bad = ReadLabelsCsv(
      Write(dir, "l2.csv", "machine,fault_start_s,fault_end_s,fault_type\nnode7,900,100,x\n"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("l2.csv:2: fault ends before it starts"),
            std::string::npos);
  auto g = ReadGroupsCsv(Write(dir, "g.csv", "machine,group\nnode0,stage0\nnode1,stage1\n"));
  ASSERT_TRUE(g.ok());
  EXPECT_EQ((*g)[1].second, "stage1");
  auto g2 = ReadGroupsCsv(Write(dir, "g2.csv", "machine,group\nnode0\n"));
  ASSERT_FALSE(g2.ok());
  EXPECT_NE(g2.status().message().find("g2.csv:2: expected 2 fields"), std::string::npos);
}

TEST(SamplesTest, TopologyRoundTripsAndABadComponentNamesItsLine) {
  const std::string path = ::testing::TempDir() + "/topology.csv";
  ASSERT_TRUE(WriteTopologyCsv(path, {{"node7", {"rack:r03", "switch:leaf03"}}}).ok());
  auto t = ReadTopologyCsv(path);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_EQ(t->size(), 2u);
  EXPECT_EQ((*t)[1], (std::pair<std::string, std::string>{"node7", "switch:leaf03"}));
  {
    std::ofstream out(path);
    out << "machine,component\nnode7,rack:r03\nnode8,rack\n";
  }
  auto bad = ReadTopologyCsv(path);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(":3"), std::string::npos) << bad.status().message();
  EXPECT_NE(bad.status().message().find("kind:name"), std::string::npos);
}

}  // namespace
}  // namespace megascope::detector
