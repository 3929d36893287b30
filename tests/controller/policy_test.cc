// The eviction policy table (controller/policy.h): each kind and cause, confidence and persistence.
#include "megascope/controller/policy.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>
#include <string_view>

#include "megascope/controller/control_db.h"

namespace megascope::controller {
namespace {

Verdict V(const std::string& kind, const std::string& cause, double confidence = 0.9,
          std::vector<std::string> nodes = {"node1"}) {
  Verdict v;
  v.kind = ParseVerdictKind(kind);
  v.cause = cause;
  v.confidence = confidence;
  v.root_nodes = std::move(nodes);
  return v;
}

TEST(PolicyTest, TheTable) {
  struct Row {
    const char* kind;
    const char* cause;
    double confidence;
    int repeats;
    Action want;
  };
  const Row rows[] = {
      {"hang", "rank_dead", 0.2, 1, Action::kEvict},  // a gone process needs no confidence
      {"hang", "rank_not_joined", 1.0, 1, Action::kEvict},
      {"hang", "link_stall", 0.9, 1, Action::kSelfCheck},
      {"hang", "op_mismatch", 1.0, 1, Action::kRestartInPlace},
      {"hang", "order_mismatch", 1.0, 1, Action::kRestartInPlace},
      {"hang", "unknown", 0.0, 1, Action::kRestartInPlace},
      {"slow", "compute_straggler", 0.9, 1, Action::kAlert},        // not persistent yet
      {"slow", "compute_straggler", 0.9, 2, Action::kEvict},        // its compute convicts it
      {"slow", "compute_straggler", 0.625, 2, Action::kSelfCheck},  // too weak to convict
      {"slow", "compute_straggler", 0.3, 5, Action::kAlert},        // persistent but not confident
      {"slow", "comm_straggler", 0.7, 2, Action::kSelfCheck},
      {"slow", "link_slow", 0.7, 3, Action::kSelfCheck},
      {"slow", "stage_imbalance", 1.0, 10, Action::kAlert},  // never evicts
      {"slow", "a_cause_from_2030", 1.0, 10, Action::kAlert},
      {"faulty_machine", "node_network_receive_errors_total", 0.95, 1, Action::kSelfCheck},
      {"faulty_machine", "node_memory_used_bytes", 0.5, 1, Action::kAlert},
      {"monitoring_gap", "source_silent", 0.9, 5, Action::kAlert},  // an exporter, not a machine
      {"shared_component", "component_outlier", 0.9, 5, Action::kAlert},  // evicts none of them
      {"shared_component", "simultaneous_onset", 0.7, 5, Action::kAlert},
      {"job_error", "bad_input", 1.0, 1, Action::kStop},  // no machine would do better
      {"job_error", "repeated_failure", 0.1, 1, Action::kStop},
      {"healthy", "", 1.0, 1, Action::kAlert},
      {"gremlins", "x", 1.0, 9, Action::kAlert},
  };
  for (const Row& r : rows) {
    Streak streak{r.repeats};
    if (std::string_view(r.cause) == "compute_straggler") {
      streak.by_compute = r.repeats;
      streak.compute_confidence.assign(r.repeats, r.confidence);
    }
    const Decision d = Decide(V(r.kind, r.cause, r.confidence), streak);
    EXPECT_EQ(d.action, r.want) << r.kind << "/" << r.cause << " conf " << r.confidence << " x"
                                << r.repeats << ": got " << Name(d.action) << " (" << d.reason
                                << ")";
    EXPECT_FALSE(d.reason.empty());
  }
}

// The detector's suspects are reported, never acted on, however confident: only `faulty` acts.
TEST(PolicyTest, OnlyAFaultyMachineIsActedOnNotASuspect) {
  Verdict v = V("faulty_machine", "metric_outlier", 0.95, {"node4"});
  EXPECT_EQ(Decide(v, {1}).action, Action::kSelfCheck);
  v.level = VerdictLevel::kSuspect;
  const Decision d = Decide(v, {1});
  EXPECT_EQ(d.action, Action::kAlert);
  EXPECT_NE(d.reason.find("only suspects"), std::string::npos);
  // The level survives the verdict's JSON.
  EXPECT_NE(VerdictToJson(v).find("\"level\":\"suspect\""), std::string::npos);
  EXPECT_EQ(ParseVerdictLevel("suspect"), VerdictLevel::kSuspect);
  EXPECT_EQ(ParseVerdictLevel("faulty"), VerdictLevel::kFaulty);
}

// The reason a person reads says what the evidence is: a slow link is not a straggling rank.
TEST(PolicyTest, TheReasonNamesASlowLinkAsALink) {
  EXPECT_NE(Decide(V("slow", "link_slow", 0.7), {2}).reason.find("slow link"), std::string::npos);
  EXPECT_NE(Decide(V("slow", "comm_straggler", 0.7), {2}).reason.find("communication straggler"),
            std::string::npos);
}

TEST(PolicyTest, ActsOnTheNamedMachineNeverItsGroup) {
  Verdict v = V("slow", "compute_straggler", 0.9, {"node3"});
  v.root_ranks = {6};
  const Decision d = Decide(v, {2, 2, 0, {0.9, 0.9}});
  EXPECT_EQ(d.action, Action::kEvict);
  EXPECT_EQ(d.nodes, std::vector<std::string>{"node3"});
  EXPECT_TRUE(Decide(V("hang", "op_mismatch"), {1}).nodes.empty());
}

TEST(PolicyTest, ASuspectThatPassedItsSelfCheckStaysForTheSameEvidence) {
  EXPECT_EQ(Decide(V("slow", "comm_straggler"), {3}, {}, /*passed_before=*/true).action,
            Action::kAlert);
  EXPECT_EQ(Decide(V("faulty_machine", "x", 0.9), {1}, {}, true).action, Action::kAlert);
  // A hang is a new fault whatever happened before; a compute straggler whose compute convicts it
  // is evicted though it passed before, a weak one stays.
  EXPECT_EQ(Decide(V("hang", "link_stall"), {1}, {}, true).action, Action::kSelfCheck);
  EXPECT_EQ(Decide(V("slow", "compute_straggler"), {2, 2, 0, {0.9, 0.9}}, {}, true).action,
            Action::kEvict);
  EXPECT_EQ(
      Decide(V("slow", "compute_straggler", 0.625), {2, 2, 0, {0.625, 0.625}}, {}, true).action,
      Action::kAlert);
}

// A rank that computes longer also arrives last: a window in which its compute excess fell short
// names it a comm straggler, and the streak goes on; a rank whose network is slow may be named by
// its compute where noise pushes it over the bar. Its compute convicts it only when strong (the
// conviction bar, in straggler_windows of its compute verdicts in a row, comm verdicts between
// them skipped); otherwise the self-check decides, and a node that passes stays.
TEST(PolicyTest, ComputeAndCommStragglersOfOneNodeMakeOneStreak) {
  StragglerStreaks streaks;
  std::vector<Streak> s = streaks.Next({V("slow", "compute_straggler", 0.9, {"node2"}),
                                        V("slow", "comm_straggler", 0.7, {"node0"})});
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].repeats, 1);
  EXPECT_EQ(s[0].by_compute, 1);
  EXPECT_EQ(s[0].by_comm, 0);
  EXPECT_EQ(s[0].compute_confidence, std::vector<double>{0.9});
  EXPECT_EQ(s[1].by_compute, 0);
  EXPECT_EQ(s[1].by_comm, 1);
  const Verdict comm2 = V("slow", "comm_straggler", 0.7, {"node2"});
  const Verdict compute2 = V("slow", "compute_straggler", 0.9, {"node2"});
  s = streaks.Next({comm2, V("slow", "link_slow", 0.7, {"node0"})});
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].repeats, 2);
  EXPECT_EQ(s[0].by_compute, 1);
  EXPECT_EQ(s[0].by_comm, 1);
  const Decision d = Decide(comm2, s[0]);
  EXPECT_EQ(d.action, Action::kSelfCheck) << d.reason;
  EXPECT_NE(d.reason.find("1 of them by its compute, 1 by its lateness"), std::string::npos)
      << d.reason;
  EXPECT_EQ(Decide(compute2, s[0]).action, Action::kSelfCheck);  // the mirror: comm, then compute
  EXPECT_EQ(s[1].repeats, 1);  // node0's slow link is not its comm straggling
  // A second strong compute verdict, the comm one between them skipped: its compute convicts it,
  // passed check or not, as a compute straggler whatever named it last.
  s = streaks.Next({compute2});
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(StrongComputeRun(s[0], 0.75), 2);
  for (bool passed_before : {false, true}) {
    const Decision convicted = Decide(comm2, s[0], {}, passed_before);
    EXPECT_EQ(convicted.action, Action::kEvict) << convicted.reason;
    EXPECT_EQ(convicted.evict_as, "compute_straggler");
  }
  EXPECT_EQ(Decide(compute2, s[0]).action, Action::kEvict);
  EXPECT_TRUE(Decide(compute2, s[0]).evict_as.empty());  // the verdict's own cause
  // A weak compute verdict breaks the run: the node is self-checked again, not evicted.
  const Verdict weak2 = V("slow", "compute_straggler", 0.625, {"node2"});
  s = streaks.Next({weak2});
  EXPECT_EQ(s[0].repeats, 4);
  EXPECT_EQ(StrongComputeRun(s[0], 0.75), 0);
  EXPECT_EQ(Decide(weak2, s[0]).action, Action::kSelfCheck);
  EXPECT_EQ(Decide(weak2, s[0], {}, /*passed_before=*/true).action, Action::kAlert);
  // Named by its compute only, strongly: its own measurements convict it, no self-check.
  EXPECT_EQ(Decide(compute2, {2, 2, 0, {0.9, 0.9}}).action, Action::kEvict);
  // A weak first window breaks the run too: CI saw a healthy spare on loaded cores named at 0.625,
  // then 0.75 twice. It is checked, not convicted.
  EXPECT_EQ(StrongComputeRun({3, 3, 0, {0.625, 0.75, 0.75}}, 0.75), 2);
  PolicyOptions three;
  three.straggler_windows = 3;
  EXPECT_EQ(Decide(compute2, {3, 3, 0, {0.625, 0.75, 0.75}}, three).action, Action::kSelfCheck);
  EXPECT_EQ(Decide(compute2, {3, 3, 0, {0.75, 0.75, 0.75}}, three).action, Action::kEvict);

  s = streaks.Next({comm2});  // node2 a fifth time, by comm
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].repeats, 5);
  streaks.Next({});  // a window that names nobody ends every streak
  s = streaks.Next({comm2});
  EXPECT_EQ(s[0].repeats, 1);
  EXPECT_EQ(s[0].by_compute, 0);
  EXPECT_TRUE(s[0].compute_confidence.empty());
  s = streaks.Next({comm2});
  EXPECT_EQ(Decide(comm2, s[0]).action, Action::kSelfCheck);  // comm only: the bandwidth decides
  streaks.Reset();
  EXPECT_EQ(streaks.Next({comm2})[0].repeats, 1);
  // Two ranks of node2 in one analysis, one late and one slow: one more analysis, by compute,
  // with the stronger of its compute verdicts.
  s = streaks.Next({comm2, weak2, compute2});
  ASSERT_EQ(s.size(), 3u);
  for (const Streak& one : s) {
    EXPECT_EQ(one.repeats, 2);
    EXPECT_EQ(one.by_compute, 1);
    EXPECT_EQ(one.by_comm, 2);
    EXPECT_EQ(one.compute_confidence, std::vector<double>{0.9});
  }
}

TEST(PolicyTest, OptionsMoveTheThresholds) {
  PolicyOptions o;
  o.check_confidence = 0.95;
  o.straggler_windows = 3;
  EXPECT_EQ(Decide(V("faulty_machine", "x", 0.9), {1}, o).action, Action::kAlert);
  const Streak three{3, 3, 0, {0.99, 0.99, 0.99}};
  EXPECT_EQ(Decide(V("slow", "compute_straggler", 0.99), {2, 2, 0, {0.99, 0.99}}, o).action,
            Action::kAlert);
  EXPECT_EQ(Decide(V("slow", "compute_straggler", 0.99), three, o).action, Action::kEvict);
  o.convict_confidence = 1.0;  // nothing short of every step slow convicts without a check
  EXPECT_EQ(Decide(V("slow", "compute_straggler", 0.99), three, o).action, Action::kSelfCheck);
}

TEST(PolicyTest, SpellingsRoundTrip) {
  EXPECT_EQ(ParseCause("stage_imbalance"), Cause::kStageImbalance);
  EXPECT_EQ(ParseCause("Rank_Dead"), Cause::kOther);  // spellings are exact
  EXPECT_EQ(ParseVerdictKind("faulty_machine"), VerdictKind::kFaultyMachine);
  EXPECT_EQ(ParseVerdictKind("a_kind_from_2030"), VerdictKind::kOther);
  EXPECT_EQ(Name(Action::kRestartInPlace), "restart_in_place");
  EXPECT_EQ(Name(TriggerCause::kStraggler), "straggler");
  // Every kind and cause this build knows reads back from its spelling, and no two share one.
  std::set<std::string_view> spellings;
  for (int k = 0; k < static_cast<int>(VerdictKind::kOther); ++k) {
    const auto kind = static_cast<VerdictKind>(k);
    EXPECT_EQ(ParseVerdictKind(Name(kind)), kind) << Name(kind);
    EXPECT_TRUE(spellings.insert(Name(kind)).second) << Name(kind);
  }
  for (int c = 0; c < static_cast<int>(Cause::kOther); ++c) {
    const auto cause = static_cast<Cause>(c);
    EXPECT_EQ(ParseCause(Name(cause)), cause) << Name(cause);
    EXPECT_TRUE(spellings.insert(Name(cause)).second) << Name(cause);
  }
  // A verdict is written with its kind's spelling.
  Verdict v = V("job_error", "bad_input");
  EXPECT_EQ(VerdictToJsonValue(v)["kind"], "job_error");
}

}  // namespace
}  // namespace megascope::controller
