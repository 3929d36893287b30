// The controller's loop on evidence that does not stop the job -- stragglers over the straggler
// windows, slow links and the bandwidth check, the detector's metrics -- over a scripted fleet.
#include "loop_fixture.h"

namespace megascope::controller {
namespace {

// The straggler path, over real trace databases: node1's ranks compute 2.5 times their peers'
// time from step 4 on. The straggler watch names them in every window of 4 steps; the second
// window in a row is the policy's bar, and node1 is evicted; the job resumes on the spare and its
// windows then name no one.
TEST_F(LoopTest, ASlowNodeIsNamedByTheStragglerPathInTwoWindowsInARowAndEvicted) {
  SlowFromStep4(24, "node1");
  EXPECT_EQ(Run(), kLaunchFinished);
  std::set<std::string> named;
  for (const Event& e : Events("verdict"))
    if (e.detail["cause"] == "compute_straggler") named.insert(e.node);
  EXPECT_EQ(named, std::set<std::string>{"node1"});
  const auto evictions = Events("eviction");
  ASSERT_EQ(evictions.size(), 1u);
  EXPECT_EQ(evictions[0].node, "node1");
  EXPECT_EQ(evictions[0].detail["reason"], "compute_straggler");
  EXPECT_EQ(fleet_->attempts().back(), (std::vector<std::string>{"node0", "spare0"}));
  EXPECT_EQ(fleet_->done(), 24);
}

// On a cluster without a shared run directory the nodes' databases are on their own disks: the
// straggler watch merges what each node's agent computes over its own (GET /window), and evicts
// the same straggler without reading a database.
TEST_F(LoopTest, AStragglerIsNamedFromTheAgentsWindowsWhenTheDatabasesStayOnTheirNodes) {
  SlowFromStep4(24, "node1");
  megascope::testing::TempDir node_disks;
  fleet_->KeepTracesOnNodes(node_disks.path());
  EXPECT_EQ(Run(), kLaunchFinished);
  EXPECT_TRUE(fs::exists(node_disks.path() + "/nodes/node1/trace.db"));
  EXPECT_FALSE(fs::exists(options_.supervisor.run_dir + "/nodes/node1/trace.db"));
  const auto evictions = Events("eviction");
  ASSERT_EQ(evictions.size(), 1u);
  EXPECT_EQ(evictions[0].node, "node1");
  EXPECT_EQ(evictions[0].detail["reason"], "compute_straggler");
}

// A node whose network is slow computes as fast as its peers but reaches every all-reduce 0.2 s
// late from step 4 on: named a comm straggler (never a compute one) in two windows in a row, it
// fails the bandwidth self-check that decides a comm straggler and is evicted; the job finishes on
// the spare.
TEST_F(LoopTest, ANodeWithASlowNetworkIsACommStragglerFailsItsBandwidthCheckAndIsEvicted) {
  SlowNetworkOfNode1(/*under_floor=*/false);
  EXPECT_EQ(Run(), kLaunchFinished);
  bool named = false;
  for (const Event& e : Events("verdict")) {
    named |= e.detail["cause"] == "comm_straggler" && e.node == "node1";
    EXPECT_NE(e.detail["cause"], "compute_straggler") << e.detail.dump();
  }
  EXPECT_TRUE(named);
  bool failed_bandwidth = false;
  for (const Event& e : Events("self_check"))
    failed_bandwidth |= e.node == "node1" && !e.detail["passed"].get<bool>();
  EXPECT_TRUE(failed_bandwidth);
  const auto evictions = Events("eviction");
  ASSERT_EQ(evictions.size(), 1u);
  EXPECT_EQ(evictions[0].node, "node1");
  EXPECT_EQ(evictions[0].detail["reason"], "comm_straggler");
  EXPECT_EQ(fleet_->attempts().back(), (std::vector<std::string>{"node0", "spare0"}));
  EXPECT_EQ(fleet_->done(), 24);
}

// The same node whose check ends at once under the bandwidth floor: its GEMM held, so the failure
// is its network's -- a comm straggler, not a compute one (CI evicted a slow-network node as a
// compute straggler when a check that ended early read as a failed GEMM).
TEST_F(LoopTest, ACheckThatEndsUnderTheFloorStillSaysItsComputeHeld) {
  SlowNetworkOfNode1(/*under_floor=*/true);
  EXPECT_EQ(Run(), kLaunchFinished);
  const auto evictions = Events("eviction");
  ASSERT_EQ(evictions.size(), 1u);
  EXPECT_EQ(evictions[0].node, "node1");
  EXPECT_EQ(evictions[0].detail["reason"], "comm_straggler");
}

// Under a load that slows every process, the slow-network node's check is stopped because its
// partner's end failed first on the link between them: both ends measured their GEMM beside each
// other at a third of the launch's figure. The partner's GEMM is the reference even though its
// check failed (a real run beside a busy test suite evicted such a node as a compute straggler).
TEST_F(LoopTest, ALoadThatSlowsBothEndsOfACheckStoppedOnItsLinkLeavesItsComputeHeld) {
  SlowNetworkOfNode1(/*under_floor=*/true);
  clock_.OnSleep([this] {
    if (fleet_->done() != 4) return;
    SelfCheckFigures stopped;  // node1's end: stopped once its partner's end failed
    stopped.gemm_gflops = 30;  // the launch's healthy figure is 100
    stopped.error =
        "stopped: its partner's self-check failed (self-check exited with code 1: the "
        "all-reduces with its neighbour moved under half of the 0.300 GB/s floor)";
    fleet_->SetSelfCheck("node1", stopped);
    SelfCheckFigures partner;  // node0's end: noticed the crawling link first
    partner.gemm_gflops = 35;
    partner.error =
        "self-check exited with code 1: the all-reduces with its neighbour moved "
        "under half of the 0.300 GB/s floor";
    fleet_->SetSelfCheck("node0", partner);
  });
  EXPECT_EQ(Run(), kLaunchFinished);
  const auto evictions = Events("eviction");
  ASSERT_EQ(evictions.size(), 1u);
  EXPECT_EQ(evictions[0].node, "node1");
  EXPECT_EQ(evictions[0].detail["reason"], "comm_straggler");
}

// A streak named both ways: node1 computes 2.5 times its peers' time from step 4 on, then from
// step 8 on computes as fast as they do but reaches every all-reduce 0.2 s late, then from step 12
// on computes slowly again. The first window names it by its compute, the second by its lateness:
// the self-check runs and names the cause -- a failed bandwidth test, a comm straggler, evicted;
// passed, it stays until the third window's strong compute verdict (the second of the streak)
// convicts it as a compute straggler.
class MixedStreakTest : public LoopTest, public ::testing::WithParamInterface<bool> {};

TEST_P(MixedStreakTest, TheBandwidthCheckNamesTheCauseOfAStreakNamedBothWays) {
  const bool slow_link = GetParam();
  SlowFromStep4(24, "node1");
  FakeFault healed{FakeFault::kSlow, "node1", 8};  // the later fault wins: factor 1 again
  FakeFault late{FakeFault::kSlowNet, "node1", 8};
  late.late_s = 0.2;
  FakeFault slow_again{FakeFault::kSlow, "node1", 12};
  slow_again.factor = 2.5;
  FakeFault on_time{FakeFault::kSlowNet, "node1", 12};
  fleet_->Break(healed);
  fleet_->Break(late);
  fleet_->Break(slow_again);
  fleet_->Break(on_time);
  fleet_->TraceSteps(0.1, 1, /*collectives=*/true);
  if (slow_link) SlowLinkOnItsChecks("node1");
  EXPECT_EQ(Run(), kLaunchFinished);
  std::vector<std::string> causes;  // node1's straggler verdicts, in order
  for (const Event& e : Events("verdict"))
    if (e.node == "node1") causes.push_back(e.detail["cause"]);
  ASSERT_GE(causes.size(), 2u);
  EXPECT_EQ(causes[0], "compute_straggler");
  EXPECT_EQ(causes[1], "comm_straggler");
  int checks = 0;
  for (const Event& e : Events("self_check")) {
    if (e.node != "node1") continue;
    ++checks;
    EXPECT_EQ(e.detail["passed"].get<bool>(), !slow_link);
  }
  EXPECT_EQ(checks, 1);  // checked once, in both cases: a strong compute record needs no check
  const auto evictions = Events("eviction");
  ASSERT_EQ(evictions.size(), 1u);
  EXPECT_EQ(evictions[0].node, "node1");
  EXPECT_EQ(evictions[0].detail["reason"], slow_link ? "comm_straggler" : "compute_straggler");
  // Passed, it stayed (the restart in place replays the scripted faults) until its compute
  // convicted it.
  if (!slow_link) {
    EXPECT_EQ(causes.back(), "compute_straggler");
  }
  EXPECT_EQ(fleet_->attempts().back(), (std::vector<std::string>{"node0", "spare0"}));
  EXPECT_EQ(fleet_->done(), 24);
}

INSTANTIATE_TEST_SUITE_P(SlowLinkOrNot, MixedStreakTest, ::testing::Bool());

// What a loaded machine's shared cores did to a healthy node (CI, issue 45): named a compute
// straggler in window after window, slow in 5 of 8 steps each time. Too weak for its compute to
// convict it: it is self-checked once, passes, and stays for the rest of the run.
TEST_F(LoopTest, AComputeStragglerSlowInTooFewStepsIsCheckedAndStaysWhenItPasses) {
  options_ = Options(32, {"spare0"});
  options_.straggler_every = 8;
  options_.policy.straggler_windows = 2;
  Fleet();
  for (const int64_t from : {7, 15, 23}) {  // slow in steps from+1 .. from+5 of each window
    FakeFault slow{FakeFault::kSlow, "node1", from};
    slow.factor = 2.5;
    fleet_->Break(slow);
    fleet_->Break({FakeFault::kSlow, "node1", from + 5});  // factor 1 again
  }
  fleet_->TraceSteps(0.1, 1);
  EXPECT_EQ(Run(), kLaunchFinished);
  int weak = 0;
  for (const Event& e : Events("verdict")) {
    if (e.detail["cause"] != "compute_straggler") continue;
    EXPECT_EQ(e.node, "node1");
    EXPECT_DOUBLE_EQ(e.detail["confidence"].get<double>(), 5.0 / 8) << e.detail.dump();
    ++weak;
  }
  EXPECT_GE(weak, 2);  // persistent: acted on
  int checks = 0;
  for (const Event& e : Events("self_check")) {
    checks += e.node == "node1";
    EXPECT_TRUE(e.detail["passed"].get<bool>());
  }
  EXPECT_EQ(checks, 1);  // passing once clears it of the same evidence
  EXPECT_TRUE(Events("eviction").empty());
  EXPECT_EQ(fleet_->attempts().size(), 2u);  // the check's stop, then a restart in place
  EXPECT_EQ(fleet_->attempts().back(), (std::vector<std::string>{"node0", "node1"}));
  EXPECT_EQ(fleet_->done(), 32);
}

// A slow window alone is no straggler to act on: the same machine slow for one window only
// (it recovers) is named once, alerted, and kept.
TEST_F(LoopTest, AStragglerNamedInOneWindowOnlyIsAlertedNotEvicted) {
  SlowFromStep4(16, "node1");
  fleet_->Break({FakeFault::kSlow, "node1", 8});  // the later fault wins: factor 1 again
  EXPECT_EQ(Run(), kLaunchFinished);
  int named = 0;
  for (const Event& e : Events("verdict")) named += e.detail["cause"] == "compute_straggler";
  EXPECT_EQ(named, 1);
  EXPECT_TRUE(Events("eviction").empty());
  EXPECT_EQ(fleet_->attempts().size(), 1u);
}

// A stage slow on every replica: two stages, node0 holding stage 0 of both replicas, and node0
// slow. No rank is slower than its peers at the same (pp, tp) -- they all are -- so no straggler is
// named: the stage is reported as imbalance, an alert, and nothing is evicted.
TEST_F(LoopTest, AStageSlowOnEveryReplicaIsImbalanceAndNothingIsEvicted) {
  SlowFromStep4(16, "node0", /*stages=*/2);
  options_.stage_of_rank = {0, 0, 1, 1};
  EXPECT_EQ(Run(), kLaunchFinished);
  int imbalance = 0;
  for (const Event& e : Events("verdict")) {
    EXPECT_NE(e.detail["cause"], "compute_straggler") << e.detail;
    imbalance += e.detail["cause"] == "stage_imbalance";
  }
  EXPECT_EQ(imbalance, 1);  // named in every window from the fault on, alerted once
  EXPECT_TRUE(Events("eviction").empty());
  EXPECT_EQ(fleet_->attempts().size(), 1u);
}

// --- The detector online: every agent's /metrics, as a real agent serves it ----------------------

// What a node's agent serves at `t` s: per rank its step and its last step's times, per node its
// CPU, memory and network, each with a few per cent of noise (deterministic: a hash of the node,
// the series and the second). `memory_factor` scales its memory; `nic_errors_per_s` adds receive
// errors.
std::string MetricsPage(const std::string& node, int first_rank, double t, double memory_factor,
                        double nic_errors_per_s) {
  const auto noise = [&](const std::string& series) {
    const size_t h = std::hash<std::string>()(node + "|" + series + "|" +
                                              std::to_string(static_cast<int64_t>(t)));
    return 1 + 0.03 * (static_cast<double>(h % 2001) / 1000.0 - 1);  // 1 +- 3 %
  };
  std::string page;
  char line[512];
  for (int r = first_rank; r < first_rank + 2; ++r) {
    const std::string labels = "{job=\"loop\",node=\"" + node + "\",rank=\"" + std::to_string(r) +
                               "\",dp=\"" + std::to_string(r) + "\",pp=\"0\",tp=\"0\"}";
    std::snprintf(
        line, sizeof(line),
        "megascope_step%s %lld\nmegascope_step_seconds%s %.4f\n"
        "megascope_step_compute_seconds%s %.4f\nmegascope_step_comm_wait_seconds%s %.4f\n",
        labels.c_str(), static_cast<long long>(t / 0.5), labels.c_str(),
        0.5 * noise("step" + std::to_string(r)), labels.c_str(),
        0.4 * noise("compute" + std::to_string(r)), labels.c_str(),
        0.1 * noise("comm" + std::to_string(r)));
    page += line;
  }
  const std::string labels = "{job=\"loop\",node=\"" + node + "\"}";
  std::snprintf(
      line, sizeof(line),
      "megascope_node_cpu_utilization_ratio%s %.4f\n"
      "megascope_node_memory_used_bytes%s %.0f\n"
      "megascope_node_network_receive_bytes_total%s %.0f\n"
      "megascope_node_network_transmit_bytes_total%s %.0f\n"
      "megascope_node_network_receive_errors_total%s %.0f\n",
      labels.c_str(), 0.6 * noise("cpu"), labels.c_str(), 32e9 * memory_factor * noise("memory"),
      labels.c_str(), 1e8 * t * (1 + 0.001 * noise("rx")), labels.c_str(),
      1e8 * t * (1 + 0.001 * noise("tx")), labels.c_str(), std::floor(nic_errors_per_s * t));
  page += line;
  return page;
}

class DetectorLoopTest : public LoopTest {
 protected:
  // Four nodes doing the same work (the detector's least peers), 2 ranks each; a spare; the
  // detector on, learning each node for its first 60 s.
  void SetUp() override {
    options_ = Options(400, {"spare0"});  // 200 s
    options_.world = 8;
    options_.nodes = {"node0", "node1", "node2", "node3"};
    options_.detector_tick_s = 1;
  }
  // Whether the detector named `node` (its verdict is recorded whatever the policy did with it).
  bool DetectorNamed(const std::string& node) const {
    for (const Event& e : Events("verdict")) {
      if (e.detail["kind"] == "faulty_machine" && e.node == node) return true;
    }
    return false;
  }
  // Every node healthy but `node` from `from` s to `until` s.
  void Serve(const std::string& node, double from, double until, double memory_factor,
             double nic_errors_per_s) {
    Fleet().ServeMetrics([=, this](const std::string& n, double t) {
      int first = 0;
      for (int r = 0; r < options_.world; ++r) {
        if (fleet_->NodeOfRank(r) == n) {
          first = r;
          break;
        }
      }
      const bool odd = n == node && t >= from && t < until;
      return MetricsPage(n, first, t, odd ? memory_factor : 1,
                         odd ? nic_errors_per_s * (t - from) / t : 0);
    });
  }
};

// A node whose NIC starts counting receive errors: the detector names it, its self-check sees the
// errors rise while it runs, and it is evicted.
TEST_F(DetectorLoopTest, AFailingMetricIsNamedByTheDetectorSelfCheckedAndEvicted) {
  Serve("node1", 70, 1e9, 1, 50);
  EXPECT_EQ(Run(), kLaunchFinished);
  EXPECT_TRUE(DetectorNamed("node1"));
  bool failed_check = false;
  for (const Event& e : Events("self_check")) {
    if (e.node != "node1") continue;
    failed_check = e.detail["passed"] == false;
    EXPECT_NE(e.detail["errors_rose"].get<std::string>().find("node_network_receive_errors"),
              std::string::npos)
        << e.detail;
  }
  EXPECT_TRUE(failed_check);
  EXPECT_EQ(Nodes(Events("eviction")), std::vector<std::string>{"node1"});
  EXPECT_FALSE(Events("resumed").empty());
}

// Memory 40 % up on one node for 20 s once the detector knows the nodes: a benign excursion shorter
// than the weak-evidence window is no verdict, let alone an eviction.
TEST_F(DetectorLoopTest, ATwentySecondMetricExcursionEvictsNothing) {
  Serve("node1", 70, 90, 1.4, 0);
  EXPECT_EQ(Run(), kLaunchFinished);
  EXPECT_TRUE(Events("eviction").empty());
  for (const Event& e : Events("verdict"))
    EXPECT_NE(e.detail["kind"], "faulty_machine") << e.detail;
}

// The same excursion held for the rest of the run is a machine that changed: named.
TEST_F(DetectorLoopTest, TheSameExcursionHeldIsNamed) {
  Serve("node1", 70, 1e9, 1.4, 0);
  EXPECT_EQ(Run(), kLaunchFinished);
  EXPECT_TRUE(DetectorNamed("node1"));
}

}  // namespace
}  // namespace megascope::controller
