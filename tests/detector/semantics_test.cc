// The metric semantics table (issue 73): what a DCGM field, a node_exporter counter or an
// InfiniBand counter means, from its owner -- its kind, entity, errors and old spellings -- and the
// detector reading series as exporters write them: labelled per GPU and port, a bitmask bit by
// bit, a renamed field as one series, counters without `_total`, healthy background errors.
#include "megascope/detector/semantics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <set>

#include "megascope/detector/detector.h"

namespace megascope::detector {
namespace {

TEST(SemanticsTest, TheTableKnowsFieldsByTheirOwnersNames) {
  const MetricSemantics* reasons = FindMetric("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS");
  ASSERT_NE(reasons, nullptr);
  EXPECT_STREQ(reasons->name, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS");  // renamed in DCGM 3.3
  EXPECT_EQ(reasons->kind, MetricKind::kBitmask);
  EXPECT_EQ(reasons->entity, MetricEntity::kGpu);
  EXPECT_EQ(MetricKindName(reasons->kind), "bitmask");  // docs/formats.md's spellings
  EXPECT_EQ(MetricEntityName(MetricEntity::kPort), "port");
  ASSERT_NE(FindMetric("DCGM_FI_DEV_XID_ERRORS"), nullptr);
  EXPECT_EQ(FindMetric("DCGM_FI_DEV_XID_ERRORS")->kind, MetricKind::kCode);
  EXPECT_TRUE(IsErrorCode("DCGM_FI_DEV_XID_ERRORS{gpu=\"2\"}"));
  // Counters whose names do not end in _total are counters all the same.
  EXPECT_TRUE(IsCumulativeCounter("node_vmstat_pswpin"));
  EXPECT_TRUE(IsCumulativeCounter("DCGM_FI_DEV_PCIE_REPLAY_COUNTER{gpu=\"0\"}"));
  EXPECT_FALSE(IsCumulativeCounter("DCGM_FI_DEV_GPU_UTIL"));
  EXPECT_TRUE(IsCumulativeCounter("some_exporter_requests_total"));  // Prometheus's rule
  // Errors: fatal ones are a fault at once, background ones only above the peers' rate.
  EXPECT_EQ(ErrorWeightOf("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"), ErrorWeight::kFatal);
  EXPECT_EQ(ErrorWeightOf("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"), ErrorWeight::kBackground);
  EXPECT_EQ(ErrorWeightOf("node_infiniband_symbol_error_total{device=\"mlx5_0\",port=\"1\"}"),
            ErrorWeight::kBackground);
  EXPECT_EQ(ErrorWeightOf("node_infiniband_link_downed_total"), ErrorWeight::kFatal);
  EXPECT_EQ(ErrorWeightOf("gpu_nvlink_crc_errors_per_second"), ErrorWeight::kBackground);
  EXPECT_EQ(ErrorWeightOf("gpu_xid_errors_total"), ErrorWeight::kFatal);
  EXPECT_EQ(ErrorWeightOf("DCGM_FI_DEV_GPU_TEMP"), ErrorWeight::kNone);
  // Families and sources from the table, not the words.
  EXPECT_EQ(ClassifyMetric("DCGM_FI_PROF_NVLINK_TX_BYTES{gpu=\"1\"}"), MetricFamily::kNvlink);
  EXPECT_EQ(ClassifySource("DCGM_FI_DEV_XID_ERRORS"), MetricSource::kGpu);
  EXPECT_EQ(ClassifySource("node_infiniband_rate_bytes_per_second"), MetricSource::kHost);
  // Every entry has a unit or kind, an owner and what bad means; no name appears twice.
  std::set<std::string> names;
  for (const MetricSemantics& m : KnownMetrics()) {
    EXPECT_TRUE(names.insert(m.name).second) << m.name;
    EXPECT_NE(std::string(m.bad), "") << m.name;
    EXPECT_EQ(m.kind == MetricKind::kBitmask, !m.bits.empty()) << m.name;
  }
}

TEST(SemanticsTest, SeriesKeepTheirEntityAndDropWhatTheExporterChanges) {
  SeriesName s = ParseSeries(
      "DCGM_FI_DEV_GPU_UTIL{gpu=\"3\",UUID=\"GPU-5f3a\",Hostname=\"n7\",modelName=\"H100 80GB\","
      "DCGM_FI_DRIVER_VERSION=\"570.86\"}");
  EXPECT_EQ(s.base, "DCGM_FI_DEV_GPU_UTIL");
  EXPECT_EQ(s.Key(), "DCGM_FI_DEV_GPU_UTIL{gpu=\"3\"}");
  // An old spelling reads as the current one; labels come out in name order.
  EXPECT_EQ(ParseSeries("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{gpu=\"1\",device=\"nvidia1\"}").Key(),
            "DCGM_FI_DEV_CLOCKS_EVENT_REASONS{device=\"nvidia1\",gpu=\"1\"}");
  // An XID's message label changes with every XID: not the series' identity.
  EXPECT_EQ(
      ParseSeries("DCGM_FI_DEV_XID_ERRORS{gpu=\"0\",err_code=\"79\",err_msg=\"fell off\"}").Key(),
      "DCGM_FI_DEV_XID_ERRORS{gpu=\"0\"}");
  // Escapes in values survive; a malformed label set stays part of an unknown name.
  EXPECT_EQ(*ParseSeries("x{a=\"q\\\"1\"}").Label("a"), "q\"1");
  EXPECT_EQ(ParseSeries("foo{gpu=3}").Key(), "foo{gpu=3}");
  EXPECT_EQ(BaseName("foo{gpu=\"3\"}"), "foo");
  EXPECT_EQ(BaseName("cpu_util"), "cpu_util");
}

TEST(SemanticsTest, ABitmaskFeedsOneSeriesPerMeaningfulBit) {
  SeriesPlan plan = PlanSeries("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{gpu=\"2\"}");
  ASSERT_EQ(plan.targets.size(), 6u);
  EXPECT_FALSE(plan.cumulative);
  bool thermal = false;
  for (const auto& t : plan.targets) {
    if (t.key == "DCGM_FI_DEV_CLOCKS_EVENT_REASONS{gpu=\"2\",reason=\"hw_thermal\"}") {
      thermal = true;
      EXPECT_EQ(t.mask, 0x40u);
      EXPECT_EQ(ClassifyMetric(t.key), MetricFamily::kErrors);  // harm: hard evidence
    }
  }
  EXPECT_TRUE(thermal);
  EXPECT_EQ(ClassifyMetric("DCGM_FI_DEV_CLOCKS_EVENT_REASONS{gpu=\"2\",reason=\"sw_power_cap\"}"),
            MetricFamily::kGpu);  // routine under load
  EXPECT_TRUE(PlanSeries("node_vmstat_pswpout").cumulative);
}

// A fleet of `machines` machines with `gpus` GPUs each, one sample a second; `value(m, gpu, t,
// metric)` gives each sample (NaN: none), `name(m, t, metric)` its series name.
struct GpuFleet {
  int machines = 16, gpus = 2, seconds = 900;
  std::string label = "gpu";  // the entity label: gpu, or port
  std::vector<std::string> metrics;
  std::function<std::string(int, int, int)> name = [this](int, int, int k) {
    return metrics[static_cast<size_t>(k)];
  };
  std::function<double(int, int, int, int, std::mt19937&)> value;
  std::vector<Verdict> Run() const {
    Detector det(DetectorConfig{});
    Stream stream(&det);
    std::mt19937 rng(5);
    for (int t = 0; t < seconds; ++t) {
      for (int m = 0; m < machines; ++m) {
        for (int g = 0; g < gpus; ++g) {
          for (int k = 0; k < static_cast<int>(metrics.size()); ++k) {
            const double v = value(m, g, t, k, rng);
            if (std::isnan(v)) continue;
            const std::string series = name(m, t, k) + "{" + label + "=\"" + std::to_string(g) +
                                       "\",UUID=\"GPU-" + std::to_string(m * 8 + g) + "\"}";
            stream.Add({static_cast<double>(t), "node" + std::to_string(m), series, v});
          }
        }
      }
    }
    stream.Flush();
    return stream.TakeVerdicts();
  }
};

std::vector<const Verdict*> Faulty(const std::vector<Verdict>& vs) {
  std::vector<const Verdict*> out;
  for (const Verdict& v : vs) {
    if (v.kind == VerdictKind::kFaultyMachine && v.level == VerdictLevel::kFaulty)
      out.push_back(&v);
  }
  return out;
}

std::string Describe(const std::vector<Verdict>& vs) {
  std::string out;
  for (const Verdict& v : vs) out += v.explanation + "\n";
  return out;
}

double Noisy(std::mt19937& rng, double level, double sd) {
  return level + std::normal_distribution<double>(0, sd)(rng);
}

TEST(SemanticsTest, AHarmfulThrottleBitOnOneGpuIsHardEvidenceARoutineOneIsNot) {
  // Every GPU runs at its power cap (bit 0x4, routine under load); from t=300 GPU 1 of node5 is
  // also slowed by heat (0x40). Read as a magnitude, 68 against 4 is one gauge off its peers --
  // at best a suspect after 90 s; read bit by bit, it is a harmful bit on one GPU alone.
  GpuFleet f;
  f.metrics = {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"};
  f.value = [](int m, int g, int t, int k, std::mt19937& rng) {
    if (k == 0) return Noisy(rng, 95, 1);
    return m == 5 && g == 1 && t >= 300 ? 4.0 + 64.0 : 4.0;
  };
  auto v = f.Run();
  auto faulty = Faulty(v);
  ASSERT_EQ(faulty.size(), 1u) << Describe(v);
  EXPECT_EQ(faulty[0]->root_nodes, std::vector<std::string>{"node5"});
  EXPECT_LE(static_cast<double>(faulty[0]->detected_at_ns) / 1e9, 300 + 40);
  EXPECT_NE(faulty[0]->explanation.find("hw_thermal"), std::string::npos) << faulty[0]->explanation;
}

TEST(SemanticsTest, ARollingExporterUpgradeThatRenamesAFieldCutsNoSeries) {
  // dcgm-exporter is upgraded machine by machine (t = 300 + 20 m): the throttle reasons are
  // written under their new name from then on. No machine is missing a metric its peers report,
  // and a harmful bit set on node3 after the upgrade is named as fast as on a fleet that never
  // changed names (its series has its history; it does not learn again from nothing).
  GpuFleet f;
  f.seconds = 1200;
  f.metrics = {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"};
  f.name = [](int m, int t, int k) -> std::string {
    if (k == 0) return "DCGM_FI_DEV_GPU_UTIL";
    return t >= 300 + 20 * m ? "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"
                             : "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS";
  };
  f.value = [](int m, int, int t, int k, std::mt19937& rng) {
    if (k == 0) return Noisy(rng, 95, 1);
    return m == 3 && t >= 1000 ? 4.0 + 8.0 : 4.0;  // HW slowdown
  };
  auto v = f.Run();
  ASSERT_EQ(v.size(), 1u) << Describe(v);
  EXPECT_EQ(v[0].root_nodes, std::vector<std::string>{"node3"});
  EXPECT_EQ(v[0].level, VerdictLevel::kFaulty);
  EXPECT_LE(static_cast<double>(v[0].detected_at_ns) / 1e9, 1000 + 40);
}

TEST(SemanticsTest, HealthyBackgroundErrorsAreNotAFaultARateFarAboveThemIs) {
  // Every GPU's NVLink corrects a CRC error now and then (a burst of 1-5 every ~25 s) and one
  // link at a time shows a 20-s spell of 50 a second; node9's link from t=600 corrects 15 a
  // second without pause. Counted as DCGM does: a cumulative counter.
  GpuFleet f;
  f.machines = 32;
  f.gpus = 1;
  f.seconds = 1200;
  f.metrics = {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"};
  std::vector<double> total(32, 0);
  f.value = [&total](int m, int, int t, int k, std::mt19937& rng) {
    if (k == 0) return Noisy(rng, 95, 1);
    double add = 0;
    if (std::uniform_real_distribution<double>(0, 1)(rng) < 0.04)
      add += std::uniform_int_distribution<int>(1, 5)(rng);
    if (t / 20 % 32 == m && t / 20 % 3 == 0) add += 50;  // a benign spell on one link
    if (m == 9 && t >= 600) add += 15;
    return total[static_cast<size_t>(m)] += add;
  };
  auto v = f.Run();
  auto faulty = Faulty(v);
  ASSERT_EQ(faulty.size(), 1u) << Describe(v);
  EXPECT_EQ(faulty[0]->root_nodes, std::vector<std::string>{"node9"});
  EXPECT_GE(static_cast<double>(faulty[0]->detected_at_ns) / 1e9, 600);
  EXPECT_LE(static_cast<double>(faulty[0]->detected_at_ns) / 1e9, 600 + 120);
}

TEST(SemanticsTest, ACounterWithoutTotalIsARateAndItsResetIsNoFault) {
  // node_vmstat_pswpin counts pages since boot (no `_total` in its name): machines booted at
  // different times hold very different totals. node3's node_exporter restarts at t=400 -- no,
  // the counter is the kernel's: its machine is rebooted into the job and counts from 0.
  GpuFleet f;
  f.gpus = 1;
  f.metrics = {"DCGM_FI_DEV_GPU_UTIL", "node_vmstat_pswpin"};
  std::vector<double> total(16);
  for (int m = 0; m < 16; ++m) total[static_cast<size_t>(m)] = 1e6 * m;
  f.value = [&total](int m, int, int t, int k, std::mt19937& rng) {
    if (k == 0) return Noisy(rng, 95, 1);
    if (m == 3 && t == 400) total[3] = 0;
    return total[static_cast<size_t>(m)] += Noisy(rng, 10, 1);
  };
  auto v = f.Run();
  EXPECT_TRUE(v.empty()) << Describe(v);
}

TEST(SemanticsTest, OnePortOffItsSiblingsAsWellAsItsPeersIsCorroborated) {
  // 16 machines, 8 InfiniBand ports each. From t=300 port 5 of node4 carries half its siblings'
  // traffic (a link trained at a lower rate). One metric of one family off its peers is at most a
  // suspect; off the machine's other ports as well, it is two comparisons agreeing, named faulty
  // once it outlasts the weak window.
  GpuFleet f;
  f.gpus = 8;
  f.label = "port";
  f.seconds = 900;
  f.metrics = {"node_infiniband_port_data_transmitted_bytes_total"};
  f.name = [](int, int, int) {
    return std::string("node_infiniband_port_data_transmitted_bytes_total");
  };
  std::vector<double> total(size_t{16} * 8, 0);
  f.value = [&total](int m, int g, int t, int, std::mt19937& rng) {
    double rate = Noisy(rng, 1.2e10, 2e8);
    if (t >= 300 && m == 4 && g == 5) rate /= 2;
    return total[static_cast<size_t>(m) * 8 + static_cast<size_t>(g)] += rate;
  };
  auto v = f.Run();
  auto faulty = Faulty(v);
  ASSERT_EQ(faulty.size(), 1u) << Describe(v);
  EXPECT_EQ(faulty[0]->root_nodes, std::vector<std::string>{"node4"});
  EXPECT_LE(static_cast<double>(faulty[0]->detected_at_ns) / 1e9, 300 + 120);
}

TEST(MembershipTest, IdleSparesAreNoPeersOfTheJobAndJoinWhenTheyTrain) {
  // 16 machines train (their trainer reports its step time); two hot spares sit idle beside them,
  // their GPUs at nothing and their trainers silent. spare1 joins the job at t=500 (a replacement)
  // and from then works as its peers do. node5's GPU stops working at t=700 and its steps with it.
  // Compared with the job's members, an idle spare is a GPU at nothing while its peers work -- hard
  // evidence; outside the job, it is no one's peer.
  Detector det(DetectorConfig{});
  Stream stream(&det);
  std::mt19937 rng(23);
  auto noisy = [&](double level, double sd) { return Noisy(rng, level, sd); };
  for (int t = 0; t < 1000; ++t) {
    for (int m = 0; m < 18; ++m) {
      const bool spare = m >= 16;
      const std::string name =
          spare ? "spare" + std::to_string(m - 16) : "node" + std::to_string(m);
      const bool works = !spare || (m == 17 && t >= 500);
      const bool broken = m == 5 && t >= 700;
      const double td = static_cast<double>(t);
      stream.Add({td, name, "DCGM_FI_DEV_GPU_UTIL{gpu=\"0\"}",
                  works && !broken ? noisy(95, 1) : noisy(0.5, 0.2)});
      stream.Add({td, name, "node_load1", works ? noisy(40, 1) : noisy(2, 0.5)});
      if (works && t % 2 == 0)
        stream.Add({td, name, "step_time_seconds", noisy(2.0, 0.02) * (broken ? 3 : 1)});
    }
  }
  stream.Flush();
  auto v = stream.TakeVerdicts();
  auto faulty = Faulty(v);
  ASSERT_EQ(faulty.size(), 1u) << Describe(v);
  EXPECT_EQ(faulty[0]->root_nodes, std::vector<std::string>{"node5"});
  for (const Verdict& x : v) {
    for (const std::string& n : x.root_nodes)
      EXPECT_EQ(n.rfind("spare", 0), std::string::npos) << x.explanation;
  }
}

// 16 machines train (GPU util, load, a step time every 2 s); `state(m, t)` says what machine m
// does at t: 0 trains, 1 idle (its processes gone), 2 spins in NCCL (a hung collective: GPU busy,
// no steps), 3 reports nothing.
std::vector<Verdict> RunJob(int seconds, const std::function<int(int, int)>& state) {
  Detector det(DetectorConfig{});
  Stream stream(&det);
  std::mt19937 rng(29);
  for (int t = 0; t < seconds; ++t) {
    for (int m = 0; m < 16; ++m) {
      const int st = state(m, t);
      if (st == 3) continue;
      const double td = static_cast<double>(t);
      const std::string name = "node" + std::to_string(m);
      const double util = st == 1 ? Noisy(rng, 0.5, 0.2) : Noisy(rng, 95, 1);
      stream.Add({td, name, "DCGM_FI_DEV_GPU_UTIL{gpu=\"0\"}", util});
      stream.Add({td, name, "node_load1", st == 0 ? Noisy(rng, 40, 1) : Noisy(rng, 2, 0.5)});
      if (st == 0 && t % 2 == 0) stream.Add({td, name, "step_time_seconds", Noisy(rng, 2.0, 0.02)});
    }
  }
  stream.Flush();
  return stream.TakeVerdicts();
}

TEST(MembershipTest, MachinesThatLeftAReformedJobAreNeitherSilentNorIdleOutliers) {
  // The job re-forms at t=800 (every process restarted: GPUs idle for 40 s) and resumes without
  // node3 (released: its exporters report an idle machine) and node4 (preempted: nothing more).
  // node9 stops at t=300 while the job goes on: the one fault.
  auto v = RunJob(1300, [](int m, int t) {
    if (m == 9 && t >= 300) return 3;
    if (m == 4 && t >= 800) return 3;
    if (m == 3 && t >= 800) return 1;
    return t >= 800 && t < 840 ? 1 : 0;
  });
  auto faulty = Faulty(v);
  ASSERT_EQ(faulty.size(), 1u) << Describe(v);
  EXPECT_EQ(faulty[0]->root_nodes, std::vector<std::string>{"node9"});
  for (const Verdict& x : v)
    EXPECT_TRUE(x.root_nodes.empty() || x.root_nodes[0] == "node9") << Describe(v);
}

TEST(MembershipTest, AMachineGoneAsTheJobHangsIsNamedItsPeersSpinning) {
  // node4 vanishes at t=800 and the job hangs on it: its peers' trainers stop, their GPUs busy
  // spinning in the collective that waits for it. That is no re-forming: node4 is named.
  auto v = RunJob(1100, [](int m, int t) {
    if (m == 4 && t >= 800) return 3;
    return t >= 803 ? 2 : 0;
  });
  auto faulty = Faulty(v);
  ASSERT_FALSE(faulty.empty()) << Describe(v);
  EXPECT_EQ(faulty[0]->root_nodes, std::vector<std::string>{"node4"});
  EXPECT_LE(static_cast<double>(faulty[0]->detected_at_ns) / 1e9, 800 + 60);
}

}  // namespace
}  // namespace megascope::detector
