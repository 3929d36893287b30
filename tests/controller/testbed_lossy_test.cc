// A host link dropping 30 % of its packets, on the testbed. Labelled slow, not e2e: in about one
// run in three the first incident's hang analysis reads the crawling collectives as an
// order_mismatch, the job restarts in place on the lossy host, and a rank of a healthy host whose
// rendezvous with it then fails is blamed as rank_dead. Until that is fixed this test is not part
// of the default run.
#include "testbed_fixture.h"

namespace megascope::controller {
namespace {

TEST_F(TestbedTest, ALinkDroppingAThirdOfItsPacketsIsNamed) {
  CommandResult r = RunCommand(
      HostsCmd("--straggler-every 8 --inject link:node=mst2,kind=loss,loss=30,at=6", 40));
  ASSERT_EQ(r.code, 0) << r.out;
  const auto ev = Events();
  bool named = false;
  for (const Event& e : Of(ev, "verdict")) {
    for (const auto& n : e.detail["root_nodes"]) named |= n == "mst2";
  }
  EXPECT_TRUE(named) << r.out;
  ASSERT_EQ(Of(ev, "eviction").size(), 1u) << r.out;
  EXPECT_EQ(Of(ev, "eviction")[0].node, "mst2");
}

}  // namespace
}  // namespace megascope::controller
