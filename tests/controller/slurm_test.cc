// End to end under a real Slurm (scripts/slurm-local.sh: munged, slurmctld, one slurmd in each
// testbed host): `megascope launch --slurm` inside `salloc` takes the allocation's nodes, starts
// every agent and rank as a step of the job on its node (srun), and after an eviction runs the
// next attempt on the allocation without the evicted node. Skips with the reason where network
// namespaces or Slurm's daemons cannot run.
#include "testbed_fixture.h"

namespace megascope::controller {
namespace {

inline const std::string kSlurmScript =
    std::string(MEGASCOPE_TEST_DATA) + "/../../scripts/slurm-local.sh";

class SlurmTest : public TestbedTest {
 public:
  static void SetUpTestSuite() {
    TestbedTest::SetUpTestSuite();
    if (!skip_.empty()) return;
    CommandResult check = RunCommand(kEnv + kSlurmScript + " check");
    if (check.code != 0) {
      skip_ = "no Slurm here: " + check.out;
      return;
    }
    CommandResult up = RunCommand(kEnv + kSlurmScript + " up");
    ASSERT_EQ(up.code, 0) << up.out;
  }
  static void TearDownTestSuite() {
    if (skip_.empty()) RunCommand(kEnv + kSlurmScript + " down");
    TestbedTest::TearDownTestSuite();
  }

  // `megascope launch --slurm` inside an allocation of `nodes` nodes (given up on when Slurm
  // cannot grant it in 30 s rather than queued for ever).
  CommandResult Salloc(int nodes, const std::string& extra) const {
    const std::string cmd = LaunchCmd(k222, "--slurm --iface eth0 " + extra);
    return RunCommand("SLURM_CONF=/run/megascope-slurm/mst/slurm.conf salloc --immediate=30 -N" +
                      std::to_string(nodes) + " " + cmd);
  }
  // The steps of the job that ran `attempt` (role@node -> JOB.STEP).
  std::map<std::string, std::string> StepsOf(const std::vector<Event>& ev, int attempt) const {
    for (const Event& e : Of(ev, "slurm_steps")) {
      if (e.attempt == attempt) return e.detail["steps"];
    }
    return {};
  }
};

TEST_F(SlurmTest, ALaunchInsideAnAllocationRunsEachProcessAsAStepOnItsNode) {
  std::map<std::string, int64_t> before;
  for (const char* h : {"mst2", "mst3"}) before[h] = BackendTxBytes(h);
  CommandResult r = Salloc(4, "");
  ASSERT_EQ(r.code, 0) << r.out;
  ExpectLossesContinue(k222);
  const auto ev = Events();
  const auto steps = StepsOf(ev, 0);
  ASSERT_EQ(steps.size(), 12u) << r.out;  // 8 ranks and 4 agents, each a step of the job
  const std::string job = Of(ev, "slurm_steps").at(0).detail["job_id"];
  for (int rank = 0; rank < 8; ++rank) {
    const std::string name = "rank" + std::to_string(rank) + "@mst" + std::to_string(rank / 2);
    ASSERT_TRUE(steps.count(name)) << name << " is not a step of the job\n" << r.out;
    EXPECT_EQ(steps.at(name).rfind(job + ".", 0), 0u) << steps.at(name);
  }
  // The agents listen on their node's NodeAddr, and run.json says so (Prometheus' targets).
  const std::string run_json = ReadLog(Run() + "/run.json");
  for (int k = 0; k < 4; ++k) {
    EXPECT_NE(run_json.find("http://10.78.201." + std::to_string(11 + k) + ":"), std::string::npos)
        << run_json;
  }
  // --iface eth0: the ranks' traffic crossed the hosts' backend links.
  for (const char* h : {"mst2", "mst3"})
    EXPECT_GT(BackendTxBytes(h) - before[h], 100000) << h << ": no training traffic on eth0";
}

TEST_F(SlurmTest, ACrashIsRecoveredOnTheAllocationWithoutTheEvictedNode) {
  CommandResult r = Salloc(5, "--spares 1 --inject crash:node=mst1,at=5");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto ev = Events();
  ASSERT_EQ(Of(ev, "eviction").size(), 1u) << r.out;
  EXPECT_EQ(Of(ev, "eviction")[0].node, "mst1");
  const auto first = StepsOf(ev, 0), second = StepsOf(ev, 1);
  EXPECT_TRUE(first.count("rank2@mst1")) << r.out;
  ASSERT_FALSE(second.empty()) << r.out;
  for (const auto& [name, id] : second)
    EXPECT_EQ(name.find("@mst1"), std::string::npos) << name << " runs on the evicted node";
  EXPECT_TRUE(second.count("rank2@mst4") && second.count("agent@mst4")) << r.out;
  EXPECT_EQ(Of(ev, "job_finished").at(0).detail["steps"], kSteps);
  ExpectLossesContinue(k222);
}

}  // namespace
}  // namespace megascope::controller
