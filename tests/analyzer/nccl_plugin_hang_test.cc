// The hang analysis over rings the NCCL profiler plugin wrote in four real processes, one of which
// never issued the all-reduce the others hang in (tests/tracer/nccl_drivers.h): the rank is named.
#include "megascope/analyzer/hang.h"
#include "tracer/nccl_drivers.h"

namespace megascope::nccl_test {
namespace {

TEST_P(NcclPluginTest, TheRankThatNeverIssuedTheHungAllReduceIsNamed) {
  constexpr int kWorld = 4, kOps = 4, kHung = 2;
  auto dumps = Run(kWorld, kOps, kHung);
  ASSERT_EQ(dumps.size(), static_cast<size_t>(kWorld));
  auto in = analyzer::MakeHangInput(std::move(dumps));
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  analyzer::HangOptions opt;
  opt.min_wait_s = 0;
  const auto verdicts = analyzer::AnalyzeHang(*in, opt);
  ASSERT_EQ(verdicts.size(), 1u) << verdicts[0].explanation;
  EXPECT_EQ(Name(verdicts[0].kind), "hang");
  EXPECT_EQ(verdicts[0].cause, "rank_not_joined") << verdicts[0].explanation;
  EXPECT_EQ(verdicts[0].root_ranks, std::vector<int32_t>{kHung}) << verdicts[0].explanation;
  EXPECT_EQ(verdicts[0].op, "allreduce");
  EXPECT_EQ(verdicts[0].seq, kOps);
  // The waiting ranks' proxy steps say their data waits on the network side.
  int network = 0;
  for (const std::string& e : verdicts[0].evidence)
    network += e.find("waits on the network side") != std::string::npos;
  EXPECT_EQ(network, kWorld - 1) << verdicts[0].evidence[0];
}

INSTANTIATE_TEST_SUITE_P(Api, NcclPluginTest, ::testing::Values(5, 6),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return "v" + std::to_string(i.param);
                         });

}  // namespace
}  // namespace megascope::nccl_test
