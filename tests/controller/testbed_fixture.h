// The fixture of the testbed end-to-end tests (testbed_test.cc, testbed_lossy_test.cc): a testbed
// of 5 hosts (scripts/testbed.sh, prefix mst, frontend 10.78.201.0/24) brought up for the suite,
// its links healed before each test, and skipped with the reason where namespaces cannot be made.
#pragma once

#include "launch_fixture.h"

namespace megascope::controller {

inline const std::string kScript = std::string(MEGASCOPE_TEST_DATA) + "/../../scripts/testbed.sh";
inline constexpr const char* kEnv = "MEGASCOPE_TESTBED=mst MEGASCOPE_TESTBED_SUBNET=201 ";
inline constexpr const char* kHostsFile = "/run/megascope-testbed/mst.hosts";
inline const char* k222 = "--dp 2 --tp 2 --pp 2";

class TestbedTest : public LaunchTest {
 public:
  static void SetUpTestSuite() {
    LaunchTest::SetUpTestSuite();
    CommandResult check = RunCommand(kEnv + kScript + " check");
    if (check.code != 0) {
      skip_ = "no testbed here: " + check.out;
      return;
    }
    CommandResult up = RunCommand(kEnv + kScript + " up 5");
    ASSERT_EQ(up.code, 0) << up.out;
  }
  static void TearDownTestSuite() {
    if (skip_.empty()) RunCommand(kEnv + kScript + " down");
    LaunchTest::TearDownTestSuite();
  }
  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
    // Every test starts from healthy links, whatever the previous one left.
    ASSERT_EQ(RunCommand(kEnv + kScript + " up 5").code, 0);
  }

  std::string HostsCmd(const std::string& extra, int steps = kSteps) const {
    return LaunchCmd(std::string(k222) + " --nodes 4 --spares 1",
                     std::string("--hosts ") + kHostsFile + " " + extra, steps);
  }
  // Bytes that left `host` over its backend link (its own /proc/net/dev).
  static int64_t BackendTxBytes(const std::string& host) {
    CommandResult r = RunCommand("ip netns exec " + host + " cat /proc/net/dev");
    std::istringstream in(r.out);
    for (std::string line; std::getline(in, line);) {
      if (line.find("eth0:") == std::string::npos) continue;
      std::istringstream f(line.substr(line.find(':') + 1));
      int64_t v = 0;
      for (int i = 0; i < 9 && (f >> v); ++i) {
      }
      return v;  // the 9th field: transmitted bytes
    }
    return -1;
  }
  static std::string PidsIn(const std::string& host) {
    return RunCommand("ip netns pids " + host).out;
  }
  // The verdicts of control.db with `cause`, as their root nodes.
  std::vector<std::vector<std::string>> VerdictNodes(const std::vector<Event>& ev,
                                                     const std::string& cause) const {
    std::vector<std::vector<std::string>> out;
    for (const Event& e : Of(ev, "verdict")) {
      if (e.detail["cause"] == cause) out.push_back(e.detail["root_nodes"]);
    }
    return out;
  }

  static inline std::string skip_;
};

}  // namespace megascope::controller
