// run.json as the workers read it: what disagrees with itself or lacks a field is refused with the
// file named, never indexed into (the fuzz_run_json findings, kept as regressions).
#include <gtest/gtest.h>

#include <string>

#include "megascope/runtime/train.h"
#include "megascope/tracer/file_util.h"

namespace megascope::runtime {
namespace {

std::string Seed(const std::string& name) {
  auto text = tracer::ReadFile(std::string(MEGASCOPE_TEST_DATA) + "/fuzz/fuzz_run_json/" + name);
  EXPECT_TRUE(text.ok()) << text.status().ToString();
  return text.ok() ? *text : "";
}

TEST(RunJsonTest, AWrittenRunJsonReadsBackToTheSameText) {
  auto c = TrainConfig::FromJson(Seed("demo_222.json"), "demo_222.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->layout.world(), 8);
  auto again = TrainConfig::FromJson(c->ToJson(), "again");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->ToJson(), c->ToJson());
}

// Found by fuzz_run_json: two nodes but one node name (and a world that is not dp x tp x pp)
// made ToJson() read past node_names.
TEST(RunJsonTest, NodeNamesThatDoNotMatchTheNodesAreRefused) {
  auto c = TrainConfig::FromJson(Seed("regression_node_names_short.json"), "run.json");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("run.json: node_names"), std::string::npos)
      << c.status().message();
}

TEST(RunJsonTest, AMissingFieldOrAnUnreadableNumberIsRefusedNotGuessed) {
  std::string text = Seed("demo_222.json");
  const std::string without_model = text.substr(0, text.find("\"model\"")) + "\"modell\"" +
                                    text.substr(text.find("\"model\"") + 7);
  auto missing = TrainConfig::FromJson(without_model, "run.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("model"), std::string::npos)
      << missing.status().message();
  const size_t lr = text.find("\"lr\": ");
  ASSERT_NE(lr, std::string::npos);
  std::string huge = text;
  huge.replace(lr + 6, text.find(',', lr) - (lr + 6), "1e300");
  auto inf = TrainConfig::FromJson(huge, "run.json");
  EXPECT_FALSE(inf.ok()) << "1e300 is no float learning rate";
}

}  // namespace
}  // namespace megascope::runtime
