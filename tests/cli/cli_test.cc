// Runs the real megascope binary and checks exit codes and messages.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <regex>
#include <sstream>
#include <string>

#include "test_util.h"

namespace {

using CliRun = megascope::testing::CommandResult;

CliRun Megascope(const std::string& args) {
  return megascope::testing::RunCommand(std::string(MEGASCOPE_BIN) + " " + args);
}

TEST(CliTest, HelpListsCommands) {
  CliRun r = Megascope("--help");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("trace-demo"), std::string::npos);
  EXPECT_NE(r.out.find("version"), std::string::npos);
  CliRun sub = Megascope("trace-demo --help");
  EXPECT_EQ(sub.code, 0);
  EXPECT_NE(sub.out.find("--ranks"), std::string::npos);
}

TEST(CliTest, VersionPrintsTheProjectVersion) {
  CliRun r = Megascope("version");
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(r.out.rfind("megascope ", 0), 0u) << r.out;
}

TEST(CliTest, UsageErrorsExitWithTwo) {
  CliRun none = Megascope("");
  EXPECT_EQ(none.code, 2);
  CliRun unknown = Megascope("frobnicate");
  EXPECT_EQ(unknown.code, 2);
  EXPECT_NE(unknown.out.find("unknown command 'frobnicate'"), std::string::npos);
  CliRun flag = Megascope("trace-demo --bogus");
  EXPECT_EQ(flag.code, 2);
  EXPECT_NE(flag.out.find("--bogus"), std::string::npos);
  EXPECT_NE(flag.out.find("megascope trace-demo --help"), std::string::npos);
  CliRun value = Megascope("trace-demo --ranks three");
  EXPECT_EQ(value.code, 2);
  CliRun range = Megascope("trace-demo --ranks 3");
  EXPECT_EQ(range.code, 2);
  EXPECT_NE(range.out.find("--ranks must be"), std::string::npos);
  CliRun priority = Megascope("agent --node n0 --run-dir /nonexistent --drain-priority fast");
  EXPECT_EQ(priority.code, 2);
  EXPECT_NE(priority.out.find("--drain-priority 'fast': expected idle, batch or normal"),
            std::string::npos)
      << priority.out;
  for (const char* interval : {"0", "-1", "61"}) {
    CliRun drain = Megascope(
        std::string("agent --node n0 --run-dir /nonexistent --drain-interval ") + interval);
    EXPECT_EQ(drain.code, 2) << interval;
    EXPECT_NE(drain.out.find("--drain-interval must be above 0 and at most 60 seconds"),
              std::string::npos)
        << drain.out;
  }
}

// --steps A:B, parsed in one place for every command that takes it.
TEST(CliTest, AStepRangeIsTwoWholeNumbersInOrderForEveryCommand) {
  for (const std::string command :
       {"timeline /nonexistent -o /dev/null --steps ", "analyze slow /nonexistent --steps "}) {
    for (const auto& [spec, says] :
         std::vector<std::pair<std::string, std::string>>{{"5:3", "--steps 5:3: A:B needs A <= B"},
                                                          {"3x:5", "--steps must be A:B"},
                                                          {"3:", "--steps must be A:B"},
                                                          {"a", "not 'a'"}}) {
      const CliRun r = Megascope(command + spec);
      EXPECT_EQ(r.code, 2) << command << spec << ": " << r.out;
      EXPECT_NE(r.out.find(says), std::string::npos) << command << spec << ": " << r.out;
    }
  }
}

TEST(CliTest, TraceDemoAccountsForEveryRecordAndDumpsTheStuckRank) {
  megascope::testing::TempDir dir;
  CliRun r = Megascope("trace-demo --ranks 2 --steps 30 --shm-dir " + dir.path() + " --dump-dir " +
                       dir.path() + "/dumps");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("every record emitted was drained or counted as dropped"),
            std::string::npos);
  EXPECT_NE(r.out.find("\"state\":\"started\""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(alive=false)"), std::string::npos);
}

TEST(CliTest, TraceDemoWithTinyRingsCountsDrops) {
  megascope::testing::TempDir dir;
  CliRun r = Megascope("trace-demo --ranks 2 --steps 400 --lane-capacity 2 --shm-dir " +
                       dir.path() + " --dump-dir " + dir.path() + "/dumps");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("every record emitted was drained or counted as dropped"),
            std::string::npos);
  // Its table: rank pid records spans collectives heartbeats metrics dropped accounted.
  std::istringstream table(r.out.substr(r.out.find("rank  pid")));
  std::string line;
  std::getline(table, line);
  int ranks = 0;
  while (std::getline(table, line) && !line.empty() &&
         std::isdigit(static_cast<unsigned char>(line[0]))) {
    std::istringstream f(line);
    std::vector<std::string> c{std::istream_iterator<std::string>(f),
                               std::istream_iterator<std::string>()};
    ASSERT_EQ(c.size(), 9u) << line;
    EXPECT_GT(std::stoll(c[7]), 0) << "two-record lanes must drop: " << line;
    EXPECT_EQ(c[8], "yes") << line;
    ++ranks;
  }
  EXPECT_EQ(ranks, 2) << r.out;
}

}  // namespace

namespace {

TEST(CliTest, FleetSimThenDetectScoresAgainstLabels) {
  megascope::testing::TempDir dir;
  CliRun sim = Megascope(
      "fleet-sim --machines 12 --hours 0.5 --faults 2 --seed 21 --fault-types "
      "thermal_throttle,cuda_error -o " +
      dir.path() + "/fleet");
  ASSERT_EQ(sim.code, 0) << sim.out;
  EXPECT_NE(sim.out.find("2 faults"), std::string::npos) << sim.out;
  CliRun det = Megascope("detect --metrics " + dir.path() + "/fleet/metrics.csv --labels " +
                         dir.path() + "/fleet/labels.csv --json");
  ASSERT_EQ(det.code, 0) << det.out;
  EXPECT_NE(det.out.find("\"format\":\"megascope-verdict\""), std::string::npos) << det.out;
  EXPECT_NE(det.out.find("\"kind\":\"faulty_machine\""), std::string::npos);
  EXPECT_NE(det.out.find("\"format\":\"megascope-detector-score\""), std::string::npos);
  EXPECT_NE(det.out.find("\"recall\":1.0"), std::string::npos) << det.out;
  EXPECT_NE(det.out.find("\"false_positives\":0"), std::string::npos) << det.out;
}

// fleet-sim's CSV keeps what a rate needs: a cumulative counter near 1e13 bytes written to 6
// significant digits moves in steps of 1e7, and its rate turns into noise (every value to 12
// digits); a run too short for its faults is an error, not a fleet with none.
TEST(CliTest, FleetSimKeepsCountersPreciseAndRefusesFaultsThatDoNotFit) {
  megascope::testing::TempDir dir;
  CliRun sim = Megascope("fleet-sim --family incident --machines 8 --hours 0.25 --faults 0 -o " +
                         dir.path());
  ASSERT_EQ(sim.code, 0) << sim.out;
  std::ifstream in(dir.path() + "/metrics.csv");
  std::string line, last;
  while (std::getline(in, line)) {
    if (line.find(",h100-000-0,node_infiniband_port_data_transmitted_bytes_total,") !=
        std::string::npos)
      last = line;
  }
  const std::string value = last.substr(last.rfind(',') + 1);
  ASSERT_GT(std::stod(value), 1e13) << last;
  int digits = 0;
  for (char c : value.substr(0, value.find('e'))) digits += std::isdigit(c) != 0;
  EXPECT_GE(digits, 10) << last;
  CliRun tight = Megascope("fleet-sim --family incident --machines 8 --hours 0.25 --faults 3 -o " +
                           dir.path() + "/tight");
  EXPECT_NE(tight.code, 0);
  EXPECT_NE(tight.out.find("3 random faults need at least 25 minutes"), std::string::npos)
      << tight.out;
}

// What a person reads: a missing argument named as the usage names it (not the internal
// '--what'), help for one command, and defaults as written (0.3, not 0.29999999999999999).
TEST(CliTest, ErrorsAndHelpSpeakTheUsersWords) {
  CliRun missing = Megascope("analyze");
  EXPECT_EQ(missing.code, 2);
  EXPECT_NE(missing.out.find("the analysis (hang or slow) is missing"), std::string::npos)
      << missing.out;
  EXPECT_NE(missing.out.find("usage: megascope analyze hang"), std::string::npos) << missing.out;
  EXPECT_EQ(missing.out.find("--what"), std::string::npos) << missing.out;
  // One line that names everything missing, with the usage and where to read more.
  CliRun evict = Megascope("evict");
  EXPECT_EQ(evict.code, 2);
  EXPECT_EQ(evict.out,
            "megascope evict: the node to evict and --run-dir are missing (usage: megascope evict "
            "NODE --run-dir DIR; more: megascope evict --help)\n");
  CliRun no_node = Megascope("evict --run-dir /nonexistent");
  EXPECT_EQ(no_node.code, 2);
  EXPECT_EQ(std::count(no_node.out.begin(), no_node.out.end(), '\n'), 1) << no_node.out;
  EXPECT_NE(no_node.out.find("the node to evict is missing"), std::string::npos) << no_node.out;
  CliRun help = Megascope("help query");
  EXPECT_EQ(help.code, 0);
  EXPECT_NE(help.out.find("Usage: megascope query RUN_DIR"), std::string::npos) << help.out;
  EXPECT_EQ(Megascope("help nosuchcommand").code, 2);
  CliRun launch = Megascope("launch --help");
  EXPECT_NE(launch.out.find("--min-bandwidth-ratio arg (=0.3)"), std::string::npos) << launch.out;
  EXPECT_NE(launch.out.find("--lr arg (=0.001)"), std::string::npos) << launch.out;
  EXPECT_FALSE(std::regex_search(launch.out, std::regex(R"(=\d*\.\d{6,})")))
      << "a default printed to the last bit:\n"
      << launch.out;
}

TEST(CliTest, DetectRejectsBadInputClearly) {
  megascope::testing::TempDir dir;
  std::string csv = dir.path() + "/m.csv";
  std::FILE* f = std::fopen(csv.c_str(), "w");
  std::fputs("timestamp_s,machine,metric,value\n1,node0,cpu,0.5\n2,node0,cpu\n", f);
  std::fclose(f);
  CliRun bad = Megascope("detect --metrics " + csv);
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.out.find("m.csv:3: expected 4 fields"), std::string::npos) << bad.out;
  CliRun missing = Megascope("detect --metrics " + dir.path() + "/nope.csv");
  EXPECT_EQ(missing.code, 1);
  EXPECT_NE(missing.out.find("cannot open metrics file"), std::string::npos);
  CliRun noflag = Megascope("detect");
  EXPECT_EQ(noflag.code, 2);
  const std::string header_only = dir.path() + "/header.csv";
  std::ofstream(header_only) << "timestamp_s,machine,metric,value\n";
  CliRun empty = Megascope("detect --metrics " + header_only);
  EXPECT_EQ(empty.code, 1) << "nothing to judge is not a success";
  EXPECT_NE(empty.out.find("header.csv has a header but no sample"), std::string::npos)
      << empty.out;
  CliRun directory = Megascope("detect --metrics " + dir.path());
  EXPECT_EQ(directory.code, 1);
  EXPECT_NE(directory.out.find(dir.path() + " is a directory, not a metrics CSV"),
            std::string::npos)
      << directory.out;
  CliRun badtype = Megascope("fleet-sim --fault-types meteor -o " + dir.path());
  EXPECT_EQ(badtype.code, 2);
  EXPECT_NE(badtype.out.find("unknown fault type 'meteor'"), std::string::npos);
}

}  // namespace
