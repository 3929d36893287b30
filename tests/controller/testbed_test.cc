// End to end on a testbed of real hosts (scripts/testbed.sh: network namespaces, veth links, a
// switch): `megascope launch --hosts` runs each node's agent and ranks inside its host, Gloo
// traffic crosses the links, and link faults are real (tc, nft, link down). Skips with the reason
// where network namespaces cannot be made.
#include "testbed_fixture.h"

namespace megascope::controller {
namespace {

TEST_F(TestbedTest, AJobAcrossFourHostsTrainsAsOnOneHostOverItsLinks) {
  std::map<std::string, int64_t> before;
  for (const char* h : {"mst0", "mst1", "mst2", "mst3", "mst4"}) before[h] = BackendTxBytes(h);
  CommandResult r =
      Launch(std::string(k222) + " --nodes 4 --spares 1", std::string("--hosts ") + kHostsFile);
  ASSERT_EQ(r.code, 0) << r.out;
  ExpectLossesContinue(k222);
  ExpectNoDuplicateRows();
  // The baseline self-check ran on mst0 and mst1 only: mst2 and mst3 sent their training traffic.
  for (const char* h : {"mst2", "mst3"})
    EXPECT_GT(BackendTxBytes(h) - before[h], 100000) << h << ": no training traffic on its link";
  for (int k = 0; k < 4; ++k) {
    const std::string log = ReadLog(Run() + "/nodes/mst" + std::to_string(k) + "/agent.log");
    EXPECT_NE(log.find("http://10.78.201." + std::to_string(11 + k) + ":"), std::string::npos)
        << "the agent listens on its host's own address\n"
        << log;
    EXPECT_NE(log.find("with the run's token"), std::string::npos) << log;
  }
}

TEST_F(TestbedTest, ALinkThatDropsEveryPacketIsNamedEvictedForGoodAndTheJobRecovers) {
  const std::string log = dir_->path() + "/dead_link.log";
  auto launch = launch::Process::Spawn(
      {{"/bin/sh", "-c", "exec " + HostsCmd("--inject link:node=mst1,kind=loss,loss=100,at=5")},
       log});
  ASSERT_TRUE(launch.ok());
  // Once mst1 is evicted, nothing of the job runs on it any more (its agent drains and exits).
  bool evicted = false, emptied = false;
  for (int i = 0; i < 1500 && !(*launch)->Poll(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (!evicted && fs::exists(Run() + "/control.db")) evicted = !Of(Events(), "eviction").empty();
    if (evicted && !emptied) emptied = PidsIn("mst1").empty();
  }
  auto end = (*launch)->WaitFor(std::chrono::seconds(1));
  ASSERT_TRUE(end && end->success()) << ReadLog(log);
  EXPECT_TRUE(emptied) << "processes left on the evicted host: " << PidsIn("mst1");
  const auto ev = Events();
  const auto stalls = VerdictNodes(ev, "link_stall");
  ASSERT_FALSE(stalls.empty()) << ReadLog(log);
  for (const auto& nodes : stalls) {  // the host, or both ends of one of its links
    EXPECT_NE(std::find(nodes.begin(), nodes.end(), "mst1"), nodes.end()) << nodes[0];
    EXPECT_LE(nodes.size(), 2u);
  }
  ASSERT_EQ(Of(ev, "eviction").size(), 1u) << ReadLog(log);
  EXPECT_EQ(Of(ev, "eviction")[0].node, "mst1");
  EXPECT_FALSE(Of(ev, "resumed").empty());
  ExpectLossesContinue(k222);
}

TEST_F(TestbedTest, ASlowLinkIsNamedAsItsHostsLinkAndTheHostFailsItsBandwidthCheck) {
  CommandResult r = RunCommand(
      HostsCmd("--straggler-every 8 --inject link:node=mst3,kind=slow,rate=0.5,at=6", 40));
  ASSERT_EQ(r.code, 0) << r.out;
  const auto ev = Events();
  const auto slow = VerdictNodes(ev, "link_slow");
  ASSERT_FALSE(slow.empty()) << r.out;
  EXPECT_EQ(slow[0], std::vector<std::string>{"mst3"}) << r.out;
  bool failed_check = false;
  for (const Event& e : Of(ev, "self_check"))
    failed_check |= e.node == "mst3" && e.detail["passed"] == false;
  EXPECT_TRUE(failed_check) << r.out;
  ASSERT_EQ(Of(ev, "eviction").size(), 1u) << r.out;
  EXPECT_EQ(Of(ev, "eviction")[0].node, "mst3");
  EXPECT_EQ(Of(ev, "job_finished").at(0).detail["steps"], 40);
}

TEST_F(TestbedTest, RealLinkFaultsNeedHostsOfTheirOwn) {
  CommandResult r =
      RunCommand(LaunchCmd("--dp 2 --nodes 2", "--inject link:node=node1,kind=down,at=3"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("needs a real link"), std::string::npos) << r.out;
  CommandResult few =
      RunCommand(LaunchCmd("--dp 8 --nodes 8", std::string("--hosts ") + kHostsFile));
  EXPECT_EQ(few.code, 2);
  EXPECT_NE(few.out.find("need 8 hosts"), std::string::npos) << few.out;
}

}  // namespace
}  // namespace megascope::controller
