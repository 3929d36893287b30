// The metric-name registry: one declaration per name, the spellings of one signal agree, and every
// `megascope_` name the dashboards and docs use is declared (a renamed metric fails here, not on a
// dashboard at 3 a.m.).
#include "megascope/tracer/metric_names.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

namespace megascope::tracer::metrics {
namespace {

TEST(MetricNamesTest, EachNameIsDeclaredOnceWithPrometheusSuffixes) {
  std::set<std::string_view> seen;
  std::set<int> priorities;
  for (const Def& d : All()) {
    EXPECT_TRUE(seen.insert(d.name).second) << d.name;
    const bool total = d.name.ends_with("_total");
    EXPECT_EQ(total, d.type == Type::kCounter)
        << d.name << ": counters, and only they, end in _total";
    EXPECT_FALSE(d.help.empty()) << d.name;
    if (d.detector_priority >= 0) {
      EXPECT_TRUE(priorities.insert(d.detector_priority).second) << d.name;
    }
  }
}

TEST(MetricNamesTest, OneSignalsSpellingsFindTheSameDeclaration) {
  EXPECT_EQ(Find("node_network_transmit_bytes_total"), &All()[16]);
  EXPECT_EQ(Find("megascope_node_network_transmit_bytes_total"),
            Find("node_network_transmit_bytes_per_second"));
  EXPECT_EQ(Find("gpu3.gpu_power_watts")->name, "gpu_power_watts");
  EXPECT_EQ(Find("cpu_util"), nullptr);
  EXPECT_EQ(ExportName("node_network_receive_errors_total"),
            "node_network_receive_errors_per_second");
  EXPECT_EQ(ExportName("node_cpu_utilization_ratio"), "node_cpu_utilization_ratio");
  EXPECT_EQ(SignalName("megascope_compute_seconds_total"),
            SignalName("compute_seconds_per_second"));
  EXPECT_EQ(PrometheusName(kStepCompute), "megascope_step_compute_seconds");
}

TEST(MetricNamesTest, EveryNameTheDashboardsAndDocsUseIsDeclared) {
  namespace fs = std::filesystem;
  const std::regex name(R"(megascope_[a-z_]+[a-z])");
  int checked = 0;
  std::vector<fs::path> files = {fs::path(MEGASCOPE_SOURCE_DIR) / "README.md"};
  for (const auto& e :
       fs::recursive_directory_iterator(fs::path(MEGASCOPE_SOURCE_DIR) / "dashboards")) {
    if (e.is_regular_file()) files.push_back(e.path());
  }
  for (const fs::path& f : files) {
    std::ifstream in(f);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    for (std::sregex_iterator it(text.begin(), text.end(), name), end; it != end; ++it) {
      std::string n = it->str();
      for (const char* suffix : {"_bucket", "_sum", "_count"}) {  // a histogram's series
        if (n.ends_with(suffix) && Find(n.substr(0, n.size() - std::strlen(suffix))))
          n.resize(n.size() - std::strlen(suffix));
      }
      // Not metrics: the library targets and the job name the docs use.
      if (n.rfind("megascope_tracer", 0) == 0 || n == "megascope_job" ||
          n.rfind("megascope_test", 0) == 0)
        continue;
      EXPECT_NE(Find(n), nullptr) << n << " in " << f << " is not declared in metric_names.h";
      ++checked;
    }
  }
  EXPECT_GT(checked, 20);  // the dashboards do use the names
}

}  // namespace
}  // namespace megascope::tracer::metrics
