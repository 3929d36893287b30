// run.json as the workers read it: what disagrees with itself or lacks a field is refused with the
// file named, never indexed into (the fuzz_run_json findings, kept as regressions).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "megascope/kernels/kernels.h"
#include "megascope/launch/attempt_plan.h"
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
  c->trace_alternate = 3;  // written only by bench runs; an older run.json has no such field
  auto alternate = TrainConfig::FromJson(c->ToJson(), "alternate");
  ASSERT_TRUE(alternate.ok()) << alternate.status().ToString();
  EXPECT_EQ(alternate->trace_alternate, 3);
  EXPECT_EQ(again->trace_alternate, 0);
}

// An attempt's run.json, as the controller writes it (launch::RunJsonForAttempt over the job's
// run.json), is the one the launcher's configuration gives with the attempt's part in it: the same
// document, and read back, the same configuration.
TEST(RunJsonTest, AnAttemptsRunJsonIsTheJobsWithTheAttemptsPart) {
  auto job = TrainConfig::FromJson(Seed("demo_222.json"), "demo_222.json");
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  job->nodes = 2;  // node0 and node1, four ranks each
  job->node_names.clear();
  for (const bool resume : {true, false}) {
    launch::AttemptPlan plan;
    plan.attempt = 3;
    plan.nodes = job->NodeNames();
    plan.nodes.back() = "spare0";
    plan.resume_set = resume;
    plan.resume = {41, "memory", std::vector<std::string>(8, "/dev/shm/x/rank.bin"), ""};
    plan.faults = {{launch::WorkerFaultKind::kSlow, 2, 40, 0.5, 1.5},
                   {launch::WorkerFaultKind::kCrash, 5, 44, 0, 0}};
    plan.agent_ports = {{plan.nodes[0], 9100}, {"spare0", 9101}};
    plan.agent_addrs = {{"spare0", "10.0.0.7"}};
    TrainConfig expected = *job;
    expected.resume_set = true;  // the job's own run.json resumes: the attempt's part replaces it
    expected.resume = {7, "disk", std::vector<std::string>(8, "/ckpt/rank.bin"), ""};
    const std::string base = expected.ToJson();
    expected.attempt = plan.attempt;
    expected.node_names = plan.nodes;
    expected.resume_set = plan.resume_set;
    expected.resume = plan.resume;
    expected.faults = plan.faults;
    expected.agent_ports = plan.agent_ports;
    expected.agent_addrs = plan.agent_addrs;
    auto written = launch::RunJsonForAttempt(base, plan);
    ASSERT_TRUE(written.ok()) << written.status().ToString();
    EXPECT_EQ(nlohmann::json::parse(*written), nlohmann::json::parse(expected.ToJson()))
        << "resume " << resume;
    auto read = TrainConfig::FromJson(*written, "attempt");
    ASSERT_TRUE(read.ok()) << read.status().ToString();
    EXPECT_EQ(read->ToJson(), expected.ToJson());
  }
  EXPECT_FALSE(launch::RunJsonForAttempt("{\"ranks\": 3}", {}).ok());
  launch::AttemptPlan short_of_nodes;
  short_of_nodes.nodes = {"node0"};
  EXPECT_FALSE(launch::RunJsonForAttempt(job->ToJson(), short_of_nodes).ok());
}

// The compute backend: written and read back; a run.json from before it computes on the CPU; a
// device nobody knows is refused by name; CUDA on a build without it is refused before any worker
// starts, saying how to build it.
TEST(RunJsonTest, TheDeviceIsKeptAndCheckedBeforeAnyWorkerStarts) {
  auto c = TrainConfig::FromJson(Seed("demo_222.json"), "demo_222.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->device, "cpu");  // the seed predates the field
  c->device = "cuda";
  c->cuda_device = 1;
  auto again = TrainConfig::FromJson(c->ToJson(), "again");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->device, "cuda");
  EXPECT_EQ(again->cuda_device, 1);
  std::string text = c->ToJson();
  text.replace(text.find("\"cuda\""), 6, "\"tpu\"");
  auto refused = TrainConfig::FromJson(text, "run.json");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("run.json: train.device: 'tpu'"), std::string::npos)
      << refused.status().message();
  if (!kernels::CudaCompiledIn()) {
    const std::string why = c->Validate();
    EXPECT_NE(why.find("built without CUDA"), std::string::npos) << why;
    EXPECT_NE(why.find("cuda preset"), std::string::npos) << why;
  }
  c->device = "gpu";
  EXPECT_NE(c->Validate().find("--device must be cpu or cuda"), std::string::npos);
}

TEST(RunJsonTest, TheTransportIsKeptAndNcclNeedsTheDevice) {
  auto c = TrainConfig::FromJson(Seed("demo_222.json"), "demo_222.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->comm, "gloo");  // the seed predates the field
  c->device = "cuda";
  c->comm = "nccl";
  auto again = TrainConfig::FromJson(c->ToJson(), "again");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->comm, "nccl");
  std::string text = c->ToJson();
  text.replace(text.find("\"nccl\""), 6, "\"mpi\"");
  auto refused = TrainConfig::FromJson(text, "run.json");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("run.json: train.comm: 'mpi'"), std::string::npos)
      << refused.status().message();
  c->device = "cpu";
  EXPECT_NE(c->Validate().find("--comm nccl needs --device cuda"), std::string::npos);
  c->comm = "ucx";
  EXPECT_NE(c->Validate().find("--comm must be gloo or nccl"), std::string::npos);
}

// Agents on hosts of their own (--hosts, --slurm) are written and read at their own address.
TEST(RunJsonTest, AnAgentOnItsOwnHostIsListedAtItsAddress) {
  auto c = TrainConfig::FromJson(Seed("demo_222.json"), "demo_222.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  c->agent_ports = {{"node0", 9100}, {"node1", 9101}};
  c->agent_addrs = {{"node1", "10.78.0.12"}};
  const std::string text = c->ToJson();
  EXPECT_NE(text.find("http://10.78.0.12:9101"), std::string::npos) << text;
  EXPECT_NE(text.find("http://127.0.0.1:9100"), std::string::npos) << text;
  auto again = TrainConfig::FromJson(text, "again");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->agent_addrs, c->agent_addrs);
  std::string bad = text;
  bad.replace(bad.find("http://10.78.0.12:9101"), 22, "10.78.0.12");
  auto refused = TrainConfig::FromJson(bad, "run.json");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("agents[1].url"), std::string::npos)
      << refused.status().message();
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

// Found by fuzz_run_json: a number too large for the integer field it sits in was converted anyway
// (undefined behaviour), as was microbatches = 0 divided by. Both are refused, naming the field.
TEST(RunJsonTest, ANumberThatDoesNotFitItsFieldIsRefusedByName) {
  std::string text = Seed("demo_222.json");
  const size_t steps = text.find("\"steps\": ");
  ASSERT_NE(steps, std::string::npos);
  std::string big = text;
  big.replace(steps + 9, text.find(',', steps) - (steps + 9), "1.66667e+41");
  auto c = TrainConfig::FromJson(big, "run.json");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("run.json: train: field 'steps' should be an integer"),
            std::string::npos)
      << c.status().message();
  auto zero = TrainConfig::FromJson(Seed("regression_zero_microbatches.json"), "run.json");
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.status().message().find("microbatches"), std::string::npos)
      << zero.status().message();
}

// Found by fuzz_run_json: a "format" that is a number (or an array, or missing) threw from the JSON
// library instead of being refused as "not a megascope run.json".
TEST(RunJsonTest, AFormatOrVersionOfTheWrongTypeIsRefusedNotThrown) {
  auto c = TrainConfig::FromJson(Seed("regression_format_not_a_string.json"), "run.json");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("run.json is not a megascope run.json"), std::string::npos)
      << c.status().message();
  for (const char* text : {"[]", "{\"format\": [1]}", "{\"format\": \"megascope-run\"}",
                           "{\"format\": \"megascope-run\", \"version\": \"1\"}"}) {
    auto r = TrainConfig::FromJson(text, "run.json");
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.status().message().rfind("run.json ", 0), 0u) << r.status().message();
  }
}

}  // namespace
}  // namespace megascope::runtime
