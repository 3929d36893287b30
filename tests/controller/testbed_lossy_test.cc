// A host link dropping 30 % of its packets, on the testbed. Its transfers crawl rather than stop,
// and every rank ends up waiting somewhere: the hang analysis must follow the waits to the joined
// collective that stalls over the lossy link (tests/data/hang/lossy_link_*: real dumps of the
// readings that once went wrong), and the controller must evict the host that fails its check.
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
