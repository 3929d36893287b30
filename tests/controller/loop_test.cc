// The controller's loop against a scripted fleet (fake_fleet.h) and a fake clock: crashes, hangs,
// links, spares, pauses, relaunches; every decision deterministic, no process or sleep.
#include "loop_fixture.h"

namespace megascope::controller {
namespace {

TEST_F(LoopTest, AHealthyJobFinishesWithNothingOpened) {
  Fleet();
  EXPECT_EQ(Run(), kLaunchFinished);
  EXPECT_TRUE(Events("trigger").empty());
  ASSERT_EQ(Events("job_finished").size(), 1u);
  EXPECT_EQ(Events("job_finished")[0].detail["status"], "finished");
  EXPECT_EQ(Events("job_finished")[0].detail["steps"], 20);
  ASSERT_EQ(fleet_->checked_pairs().size(), 1u);  // the baseline
  EXPECT_EQ(fleet_->checked_pairs()[0], std::make_pair(std::string("node0"), std::string("node1")));
}

TEST_F(LoopTest, ACrashedRanksNodeIsEvictedAndASelfCheckedSpareTakesItsSlot) {
  options_.run_json = R"({"job_field": "kept", "attempt": 0, "layout": {"world": 4, "nodes": 2},)"
                      R"( "ranks": [{"rank": 0}, {"rank": 1}, {"rank": 2}, {"rank": 3}]})";
  Fleet().Break({FakeFault::kCrash, "node1", 5});
  EXPECT_EQ(Run(), kLaunchFinished);
  const auto verdicts = Events("verdict");
  ASSERT_EQ(verdicts.size(), 1u);
  EXPECT_EQ(verdicts[0].detail["cause"], "rank_dead");
  EXPECT_EQ(verdicts[0].detail["root_ranks"], nlohmann::json::array({2}));
  EXPECT_NE(verdicts[0].detail["explanation"].get<std::string>().find("signal 9"),
            std::string::npos);
  EXPECT_EQ(Nodes(Events("eviction")), std::vector<std::string>{"node1"});
  const auto checks = Events("self_check");
  ASSERT_EQ(checks.size(), 2u);  // the baseline, then the spare
  EXPECT_EQ(checks[1].node, "spare0");
  EXPECT_TRUE(checks[1].detail["passed"].get<bool>());
  ASSERT_EQ(fleet_->attempts().size(), 2u);
  EXPECT_EQ(fleet_->attempts()[1], (std::vector<std::string>{"node0", "spare0"}));
  EXPECT_EQ(fleet_->plans().back().attempt, 1);
  // The attempt's run.json: the job's, with the attempt's part set (what the restarted ranks read).
  const auto run = nlohmann::json::parse(
      tracer::ReadFile(RunLayout(options_.supervisor.run_dir).run_json()).value_or("{}"));
  EXPECT_EQ(run.value("attempt", -1), 1);
  EXPECT_EQ(run["layout"]["node_names"], nlohmann::json::array({"node0", "spare0"}));
  EXPECT_EQ(run["ranks"][1]["node"], "node0");
  EXPECT_EQ(run["ranks"][2]["node"], "spare0");
  EXPECT_EQ(run.value("job_field", ""), "kept") << "the job's part stays as the launcher wrote it";
  EXPECT_EQ(Events("resumed").size(), 1u);
}

TEST_F(LoopTest, TheJobsOwnBadInputStopsItWithNothingEvicted) {
  Fleet().Break({FakeFault::kJobError, "node0", 0, true, 0, "data file x.bin is not a token file"});
  EXPECT_EQ(Run(), kLaunchPaused);
  EXPECT_TRUE(Events("eviction").empty());
  const auto verdicts = Events("verdict");
  ASSERT_EQ(verdicts.size(), 1u);
  EXPECT_EQ(verdicts[0].detail["kind"], "job_error");
  EXPECT_EQ(verdicts[0].detail["cause"], "bad_input");
  ASSERT_EQ(Events("paused").size(), 1u);
  EXPECT_NE(Events("paused")[0].detail["reason"].get<std::string>().find("x.bin"),
            std::string::npos);
  EXPECT_EQ(fleet_->checked_pairs().size(), 1u);  // no spare was even checked
}

TEST_F(LoopTest, TheSameFailureAtTheSameStepOnAFreshNodeIsTheJobsAndEvictsNoMore) {
  Fleet().Break({FakeFault::kCrash, "node1", 5, false, 1 << 8, "assertion failed: rank 2"});
  fleet_->Break({FakeFault::kCrash, "spare0", 5, false, 1 << 8, "assertion failed: rank 3"});
  options_.spares = {"spare0", "spare1"};
  EXPECT_EQ(Run(), kLaunchPaused);
  EXPECT_EQ(Nodes(Events("eviction")), std::vector<std::string>{"node1"});
  const auto verdicts = Events("verdict");
  ASSERT_EQ(verdicts.size(), 2u);
  EXPECT_EQ(verdicts[1].detail["kind"], "job_error");
  EXPECT_EQ(verdicts[1].detail["cause"], "repeated_failure");
}

// Every rank of every node fails at start-up in the same words (here the directory for the ranks'
// snapshots cannot be made): no machine causes that. Nothing is evicted, not even first: the job
// stops at once, saying what failed.
TEST_F(LoopTest, AFailureEveryNodeMeetsAtOnceIsTheJobsAndEvictsNothing) {
  Fleet().Break({FakeFault::kEveryRank, "node0", 0, true, launch::kExitSetup << 8,
                 "cannot create /run/megascope-shm/job.r0: No such file or directory"});
  options_.spares = {"spare0", "spare1"};
  EXPECT_EQ(Run(), kLaunchPaused);
  EXPECT_TRUE(Events("eviction").empty());
  const auto verdicts = Events("verdict");
  ASSERT_EQ(verdicts.size(), 1u);
  EXPECT_EQ(verdicts[0].detail["kind"], "job_error");
  EXPECT_EQ(verdicts[0].detail["cause"], "same_failure_everywhere");
  ASSERT_EQ(Events("paused").size(), 1u);
  EXPECT_NE(Events("paused")[0].detail["reason"].get<std::string>().find("/run/megascope-shm"),
            std::string::npos)
      << Events("paused")[0].detail;
  EXPECT_EQ(fleet_->attempts().size(), 1u);  // no spare was tried
}

// The same words on one node only are that node's: it is evicted and the job goes on.
TEST_F(LoopTest, AFailureOfOneNodesRanksIsThatMachines) {
  Fleet().Break({FakeFault::kCrash, "node1", 3, false, launch::kExitSetup << 8,
                 "cannot create /run/megascope-shm/job.r2: No space left on device"});
  options_.spares = {"spare0"};
  EXPECT_EQ(Run(), kLaunchFinished);
  EXPECT_EQ(Nodes(Events("eviction")), std::vector<std::string>{"node1"});
}

TEST_F(LoopTest, ADifferentFailureOnTheFreshNodeIsAnotherMachinesAndEvictsIt) {
  Fleet().Break({FakeFault::kCrash, "node1", 5, false, 1 << 8, "assertion failed"});
  fleet_->Break({FakeFault::kCrash, "spare0", 5, false, 9, "Segmentation fault"});
  options_.spares = {"spare0", "spare1"};
  EXPECT_EQ(Run(), kLaunchFinished);
  EXPECT_EQ(Nodes(Events("eviction")), (std::vector<std::string>{"node1", "spare0"}));
}

TEST_F(LoopTest, AHangInComputeIsNamedFromTheLiveStateAndItsNodeEvicted) {
  Fleet().Break({FakeFault::kHang, "node1", 6});
  EXPECT_EQ(Run(), kLaunchFinished);
  const auto triggers = Events("trigger");
  ASSERT_EQ(triggers.size(), 1u);
  EXPECT_EQ(triggers[0].detail["cause"], "hang");
  const auto verdicts = Events("verdict");
  ASSERT_EQ(verdicts.size(), 1u);
  EXPECT_EQ(verdicts[0].detail["cause"], "rank_not_joined") << verdicts[0].detail;
  EXPECT_EQ(verdicts[0].detail["root_ranks"], nlohmann::json::array({2}));
  EXPECT_EQ(Nodes(Events("eviction")), std::vector<std::string>{"node1"});
}

// The spare that replaces a crashed node hangs in the restart's first step: once the ranks are
// ready, the job's usual threshold applies (8 steps of 0.5 s here) with a first step's allowance
// (hang_after, 3 s), not the start-up grace (60 s by default, 10 s here; the fault matrix saw 61 s
// to such a verdict).
TEST_F(LoopTest, AHangInTheFirstStepAfterARestartIsNamedAtTheUsualPace) {
  Fleet().Break({FakeFault::kCrash, "node1", 6});
  fleet_->Break({FakeFault::kHang, "spare0", 0});  // before its first step there
  options_.spares = {"spare0", "spare1"};
  EXPECT_EQ(Run(), kLaunchFinished);
  const auto triggers = Events("trigger");
  ASSERT_EQ(triggers.size(), 2u);
  EXPECT_EQ(triggers[1].detail["cause"], "hang");
  EXPECT_NE(triggers[1].detail["detail"].get<std::string>().find("(threshold 7.0 s)"),
            std::string::npos)
      << triggers[1].detail;
  const auto restarts = Events("restart");
  ASSERT_GE(restarts.size(), 2u);
  EXPECT_LT(triggers[1].ts_ns - restarts[1].ts_ns, 10'000'000'000) << "named within 10 s";
  EXPECT_EQ(Nodes(Events("eviction")), (std::vector<std::string>{"node1", "spare0"}));
}

TEST_F(LoopTest, AFrozenRankIsItsOwnRootAndItsNodeEvicted) {
  Fleet().Break({FakeFault::kFreeze, "node0", 4});
  EXPECT_EQ(Run(), kLaunchFinished);
  const auto verdicts = Events("verdict");
  ASSERT_EQ(verdicts.size(), 1u);
  EXPECT_EQ(verdicts[0].detail["cause"], "rank_dead") << verdicts[0].detail;
  EXPECT_EQ(verdicts[0].detail["root_ranks"], nlohmann::json::array({0}));
  EXPECT_NE(verdicts[0].detail["explanation"].get<std::string>().find("frozen"), std::string::npos);
  EXPECT_EQ(Nodes(Events("eviction")), std::vector<std::string>{"node0"});
}

// A node that loses power answers nothing: its agent is silent, its ranks leave no flight recorder
// and no exit status. The hang analysis names its ranks dead without a node; the controller names
// the node from where the attempt placed them, and evicts it (it restarted on it before).
TEST_F(LoopTest, ANodeThatGoesSilentIsNamedFromWhereItsRanksRanAndEvicted) {
  Fleet().Break({FakeFault::kPowerOff, "node1", 4});
  EXPECT_EQ(Run(), kLaunchFinished);
  const auto verdicts = Events("verdict");
  ASSERT_FALSE(verdicts.empty());
  EXPECT_EQ(verdicts[0].detail["cause"], "rank_dead") << verdicts[0].detail;
  EXPECT_EQ(verdicts[0].detail["root_nodes"], nlohmann::json::array({"node1"}))
      << verdicts[0].detail;
  EXPECT_NE(verdicts[0].detail["explanation"].get<std::string>().find("answers nothing"),
            std::string::npos);
  EXPECT_EQ(Nodes(Events("eviction")), std::vector<std::string>{"node1"});
  ASSERT_EQ(fleet_->attempts().size(), 2u);
  EXPECT_EQ(fleet_->attempts()[1], (std::vector<std::string>{"node0", "spare0"}));
}

// A send that stops moving between node0 and node1 with both ends posted is a stalled link: both
// ends are self-checked at once, both pass, and the job restarts in place with nothing evicted.
TEST_F(LoopTest, AStalledLinkSelfChecksBothEndsAndRestartsInPlaceWhenBothPass) {
  StallLinkAtStep6();
  EXPECT_EQ(Run(), kLaunchFinished);
  const auto verdicts = Events("verdict");
  ASSERT_EQ(verdicts.size(), 1u);
  EXPECT_EQ(verdicts[0].detail["cause"], "link_stall") << verdicts[0].detail;
  EXPECT_EQ(verdicts[0].detail["root_ranks"], nlohmann::json::array({0, 2}));
  std::set<std::string> kept;
  for (const Event& e : Events("decision")) {
    if (e.detail.value("action", "") == "keep") kept.insert(e.node);
  }
  EXPECT_EQ(kept, (std::set<std::string>{"node0", "node1"}));
  // The baseline, then both ends in one round, and the spare that would have replaced one.
  EXPECT_EQ(fleet_->checked_pairs().size(), 4u);
  // The baseline accepts any bandwidth; the suspects' round is held to what Judge accepts (the
  // healthy figure, 1 GB/s here, times the ratio), so a crawling link ends its check at once.
  ASSERT_GE(fleet_->check_floors().size(), 2u);
  EXPECT_EQ(fleet_->check_floors()[0], 0);
  EXPECT_GT(options_.min_bandwidth_ratio, 0);
  for (size_t i = 1; i < fleet_->check_floors().size(); ++i)
    EXPECT_DOUBLE_EQ(fleet_->check_floors()[i], options_.min_bandwidth_ratio * 1.0);
  EXPECT_TRUE(Events("eviction").empty());
  ASSERT_EQ(fleet_->attempts().size(), 2u);
  EXPECT_EQ(fleet_->attempts()[1], (std::vector<std::string>{"node0", "node1"}));
}

// The same stall where one end's self-check cannot finish (its link is dead): that end is evicted
// and a spare takes its slot; the other end stays.
TEST_F(LoopTest, AStalledLinkEvictsTheEndThatFailsItsSelfCheck) {
  StallLinkAtStep6();
  SelfCheckFigures dead;
  dead.error = "self-check did not finish in 30 s";
  fleet_->SetSelfCheck("node1", dead);
  EXPECT_EQ(Run(), kLaunchFinished);
  EXPECT_EQ(Nodes(Events("eviction")), std::vector<std::string>{"node1"});
  ASSERT_EQ(fleet_->attempts().size(), 2u);
  EXPECT_EQ(fleet_->attempts()[1], (std::vector<std::string>{"node0", "spare0"}));
}

// Nobody reaches node2 as the job starts (a NIC that drops what it is sent): every rank fails to
// connect, those of the other nodes naming node2 as the peer they could not reach. The failed
// connections meet at node2: it alone is self-checked, fails and is evicted; the nodes left waiting
// for it are not blamed (the testbed saw two healthy nodes evicted, one per attempt, when a
// rank's connect timeout read as its own failure).
TEST_F(LoopTest, RanksThatCannotReachANodeAtTheStartBlameItNotThemselves) {
  options_.world = 8;
  options_.nodes = {"node0", "node1", "node2", "node3"};
  Fleet().Break({FakeFault::kUnreachable, "node2", 0, true});
  SelfCheckFigures dead;
  dead.error = "the all-reduce moved no byte in 2 s";
  fleet_->SetSelfCheck("node2", dead);
  EXPECT_EQ(Run(), kLaunchFinished);
  EXPECT_EQ(Nodes(Events("eviction")), std::vector<std::string>{"node2"});
  const auto verdicts = Events("verdict");
  ASSERT_EQ(verdicts.size(), 1u);
  EXPECT_EQ(verdicts[0].detail["cause"], "connect_failed") << verdicts[0].detail;
  EXPECT_EQ(verdicts[0].detail["root_nodes"], nlohmann::json::array({"node2"}));
  EXPECT_EQ(verdicts[0].detail["root_ranks"], nlohmann::json::array({4, 5}));
  std::vector<std::string> checked;  // after the launch's baseline (the first), spares aside
  for (size_t i = 1; i < fleet_->checked_pairs().size(); ++i) {
    const std::string& node = fleet_->checked_pairs()[i].first;
    if (!node.starts_with("spare")) checked.push_back(node);
  }
  EXPECT_EQ(checked, std::vector<std::string>{"node2"});
  ASSERT_EQ(fleet_->attempts().size(), 2u);
  EXPECT_EQ(fleet_->attempts()[1], (std::vector<std::string>{"node0", "node1", "spare0", "node3"}));
}

// The same failure once, with node2 passing its self-check (a start-up slowed past the connect
// timeout, a link that came back): nothing is evicted and the job restarts on the same nodes.
TEST_F(LoopTest, ANodeUnreachableOnceThatPassesItsCheckStays) {
  options_.world = 8;
  options_.nodes = {"node0", "node1", "node2", "node3"};
  Fleet().Break({FakeFault::kUnreachable, "node2", 0, false});
  EXPECT_EQ(Run(), kLaunchFinished);
  EXPECT_TRUE(Events("eviction").empty());
  ASSERT_EQ(Events("verdict").size(), 1u);
  ASSERT_EQ(fleet_->attempts().size(), 2u);
  EXPECT_EQ(fleet_->attempts()[1], fleet_->attempts()[0]);
}

// The same hang with every agent asked over real HTTP, as the real fleet asks (http_fleet.h): the
// tick's /state round side by side within its deadline, the live analysis over each agent's binary
// dump stream. The verdict and the eviction are the in-process run's.
TEST_F(LoopTest, OverRealHttpAHangIsNamedFromTheAgentsDumpStreams) {
  Fleet().Break({FakeFault::kHang, "node1", 6});
  over_http_ = true;
  EXPECT_EQ(Run(), kLaunchFinished);
  const auto verdicts = Events("verdict");
  ASSERT_EQ(verdicts.size(), 1u);
  EXPECT_EQ(verdicts[0].detail["cause"], "rank_not_joined") << verdicts[0].detail;
  EXPECT_EQ(verdicts[0].detail["root_ranks"], nlohmann::json::array({2}));
  EXPECT_EQ(Nodes(Events("eviction")), std::vector<std::string>{"node1"});
}

// The spare that replaces the failed end is self-checked in the same round as the suspects, its
// error counters watched in the same 2 s: the eviction waits for no check of its own, and the
// restart comes one watch after the stop, not two (a dead link resumed 3.9-6.1 s after its verdict
// on the namespace hosts while the spare's check ran after the suspects').
TEST_F(LoopTest, TheSpareIsCheckedBesideTheSuspectsAndTheEvictionWaitsForNoCheckOfItsOwn) {
  StallLinkAtStep6();
  SelfCheckFigures dead;
  dead.error = "the all-reduce moved no byte in 2 s";
  fleet_->SetSelfCheck("node1", dead);
  fleet_->ServeMetrics([](const std::string&, double) {
    return std::string("node_network_receive_errors_total{device=\"eth0\"} 0\n");
  });
  EXPECT_EQ(Run(), kLaunchFinished);
  EXPECT_EQ(Nodes(Events("eviction")), std::vector<std::string>{"node1"});
  std::vector<std::string> checked;
  for (const Event& e : Events("self_check")) {
    checked.push_back(e.node);
    if (e.node == "spare0") {
      EXPECT_TRUE(e.detail["why"].get<std::string>().starts_with("spare, ")) << e.detail;
    }
  }
  // The baseline, then both ends and the spare in one round: no check of the spare after it.
  EXPECT_EQ(checked, (std::vector<std::string>{"node0", "node0", "node1", "spare0"}));
  int64_t stopped_ns = 0, restarted_ns = 0;
  for (const Event& e : Events()) {
    if (e.kind_name == "stopped") stopped_ns = e.ts_ns;
    if (e.kind_name == "restart") restarted_ns = e.ts_ns;
  }
  const double watch_s = 2.2;  // Judge's watch of the error counters (two agent samples)
  EXPECT_LT(static_cast<double>(restarted_ns - stopped_ns) / 1e9, 2 * watch_s);
}

// Both ends of a stalled link checked at once on a loaded machine, each measuring a third of the
// launch's GEMM figure: with no healthy node left to pair with, each is judged against the other
// end measured at the same time, and neither is evicted for the load.
TEST_F(LoopTest, AStalledLinksEndsSlowedAlikeByALoadBothPass) {
  StallLinkAtStep6();
  clock_.OnSleep([this] {
    if (fleet_->done() != 6) return;  // after the baseline: the machine is loaded from here on
    SelfCheckFigures loaded;
    loaded.ok = true;
    loaded.allreduce_gbps = 1;
    loaded.gemm_gflops = 30;  // the launch's healthy figure is 100; --min-gemm-ratio 0.5
    fleet_->SetSelfCheck("node0", loaded);
    loaded.gemm_gflops = 40;
    fleet_->SetSelfCheck("node1", loaded);
  });
  EXPECT_EQ(Run(), kLaunchFinished);
  EXPECT_TRUE(Events("eviction").empty());
  ASSERT_EQ(fleet_->attempts().size(), 2u);
  EXPECT_EQ(fleet_->attempts()[1], (std::vector<std::string>{"node0", "node1"}));
}

// Ctrl-C while the launch is still starting (during its baseline self-check): it says it was
// interrupted and where, stops what it started, starts no rank, and ends as stopped; the next run
// in the same process (this binary's next test) is not interrupted by it.
TEST_F(LoopTest, AnInterruptDuringStartUpIsSaidAndStopsWhatItStarted) {
  Fleet().OnSelfCheck([] { std::raise(SIGINT); });  // caught by the controller's handler
  ::testing::internal::CaptureStdout();
  const int rc = Run();
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(rc, kLaunchStopped);
  EXPECT_NE(out.find("interrupted during start-up (the baseline self-check)"), std::string::npos)
      << out;
  EXPECT_TRUE(fleet_->attempts().empty());
  EXPECT_EQ(fleet_->agents_running(), 0);
}

TEST_F(LoopTest, ASpareThatFailsItsSelfCheckIsSkippedForTheNextOne) {
  options_.spares = {"spare0", "spare1"};
  Fleet().Break({FakeFault::kCrash, "node1", 5});
  SelfCheckFigures slow;
  slow.ok = true;
  slow.gemm_gflops = 10;  // a tenth of its partner's
  slow.allreduce_gbps = 1;
  fleet_->SetSelfCheck("spare0", slow);
  EXPECT_EQ(Run(), kLaunchFinished);
  const auto checks = Events("self_check");
  ASSERT_EQ(checks.size(), 3u);
  EXPECT_EQ(checks[1].node, "spare0");
  EXPECT_FALSE(checks[1].detail["passed"].get<bool>());
  EXPECT_EQ(checks[2].node, "spare1");
  EXPECT_TRUE(checks[2].detail["passed"].get<bool>());
  EXPECT_EQ(fleet_->attempts().back(), (std::vector<std::string>{"node0", "spare1"}));
}

TEST_F(LoopTest, NoSpareLeftPausesWithAClearMessageInsteadOfLooping) {
  options_.spares = {};
  Fleet().Break({FakeFault::kCrash, "node1", 5});
  EXPECT_EQ(Run(), kLaunchPaused);
  ASSERT_EQ(Events("paused").size(), 1u);
  EXPECT_NE(Events("paused")[0].detail["reason"].get<std::string>().find("no spare node left"),
            std::string::npos);
  EXPECT_EQ(fleet_->attempts().size(), 1u);
  EXPECT_EQ(Events("trigger").size(), 1u);
  EXPECT_EQ(Events("restart").size(), 1u);  // the start only
}

TEST_F(LoopTest, TwoFaultsInARowEvictTwiceThenTheSafetyValvePauses) {
  options_.spares = {"spare0", "spare1", "spare2"};
  options_.max_evictions = 2;
  Fleet().Break({FakeFault::kCrash, "node1", 3});
  fleet_->Break({FakeFault::kCrash, "node0", 6});
  fleet_->Break({FakeFault::kCrash, "spare0", 9});
  EXPECT_EQ(Run(), kLaunchPaused);
  EXPECT_EQ(Nodes(Events("eviction")), (std::vector<std::string>{"node1", "node0"}));
  EXPECT_EQ(Events("trigger").size(), 3u);
  ASSERT_EQ(Events("paused").size(), 1u);
  EXPECT_NE(Events("paused")[0].detail["reason"].get<std::string>().find("--max-evictions 2"),
            std::string::npos);
}

// A crash on node1 and a hang on node2 at the same step: the crash ends its peers' collective,
// not the hung rank, which stays out of it. The crash's verdict names node1, a second verdict in
// the same incident names node2 from the live state, and the policy evicts both.
TEST_F(LoopTest, ACrashAndAHangAtTheSameStepAreBothNamedInOneIncident) {
  EXPECT_EQ(CrashOnNode1AndHangOnNode2At(5), kLaunchFinished);
  ASSERT_EQ(Events("trigger").size(), 1u);
  EXPECT_EQ(Events("trigger")[0].detail["cause"], "crash");
  const auto verdicts = Events("verdict");
  ASSERT_EQ(verdicts.size(), 2u);
  EXPECT_EQ(verdicts[0].detail["cause"], "rank_dead");
  EXPECT_EQ(verdicts[0].node, "node1");
  EXPECT_EQ(verdicts[1].detail["cause"], "rank_not_joined") << verdicts[1].detail;
  EXPECT_EQ(verdicts[1].detail["root_ranks"], nlohmann::json::array({2}));
  EXPECT_EQ(verdicts[1].detail["root_nodes"], nlohmann::json::array({"node2"}));
  EXPECT_EQ(Nodes(Events("eviction")), (std::vector<std::string>{"node1", "node2"}));
  EXPECT_EQ(fleet_->attempts().back(), (std::vector<std::string>{"node0", "spare0", "spare1"}));
}

// Before the attempt's first step a rank not yet in a collective is meeting its peers or loading,
// not stuck: a crash then is not held for the start-up grace to look for a second fault.
TEST_F(LoopTest, ACrashBeforeTheFirstStepLooksForNoSecondFault) {
  EXPECT_EQ(CrashOnNode1AndHangOnNode2At(0), kLaunchFinished);
  ASSERT_EQ(Events("verdict").size(), 1u);
  EXPECT_EQ(Events("verdict")[0].detail["cause"], "rank_dead");
  const auto restarts = Events("restart");
  ASSERT_GE(restarts.size(), 2u);
  EXPECT_LT(restarts[1].ts_ns - Events("trigger").at(0).ts_ns, 5'000'000'000)
      << "restarted within 5 s, not after the 10-s start-up grace";
}

// A crash alone: every other rank fails its collective and exits, nobody is still running, and
// the crash's verdict is the only one.
TEST_F(LoopTest, ACrashWhoseEveryPeerExitedHasOneVerdict) {
  options_.nodes = {"node0", "node1", "node2"};
  options_.world = 3;
  Fleet().Break({FakeFault::kCrash, "node1", 5});
  EXPECT_EQ(Run(), kLaunchFinished);
  ASSERT_EQ(Events("verdict").size(), 1u);
  EXPECT_EQ(Nodes(Events("eviction")), std::vector<std::string>{"node1"});
}

TEST_F(LoopTest, TwoPersistentFaultsAtTheSameStepEvictBothNodesInOneIncident) {
  options_.spares = {"spare0", "spare1"};
  Fleet().Break({FakeFault::kCrash, "node0", 5, true});
  fleet_->Break({FakeFault::kCrash, "node1", 5, true, 1 << 8, "illegal memory access"});
  EXPECT_EQ(Run(), kLaunchFinished);
  EXPECT_EQ(Events("trigger").size(), 1u);
  EXPECT_EQ(Nodes(Events("eviction")), (std::vector<std::string>{"node0", "node1"}));
  EXPECT_EQ(fleet_->attempts().back(), (std::vector<std::string>{"spare0", "spare1"}));
}

TEST_F(LoopTest, ADeadAgentIsRestartedWithoutEviction) {
  Fleet().Break({FakeFault::kKillAgent, "node1", 4});
  EXPECT_EQ(Run(), kLaunchFinished);
  ASSERT_EQ(Events("agent_restarted").size(), 1u);
  EXPECT_EQ(Events("agent_restarted")[0].node, "node1");
  EXPECT_EQ(fleet_->agent_starts("node1"), 2);
  EXPECT_TRUE(Events("eviction").empty());
  EXPECT_TRUE(Events("trigger").empty());
}

// The control endpoint is real (HTTP with the run's token); the fake clock calls it mid-run.
TEST_F(LoopTest, AManualEvictThroughTheEndpointEvictsThatNodeThenAStopEndsTheRun) {
  Fleet();
  bool evicted = false, stopped = false;
  const std::string run = options_.supervisor.run_dir;
  clock_.OnSleep([&] {
    if (!evicted && fleet_->done() >= 4) {
      evicted = true;
      EXPECT_EQ(SendControlCommand(run, "evict", "node99").code(), StatusCode::kNotFound);
      ASSERT_TRUE(SendControlCommand(run, "evict", "node1").ok());
    } else if (evicted && !stopped && fleet_->attempts().size() == 2 && fleet_->done() >= 3) {
      stopped = true;
      ASSERT_TRUE(SendControlCommand(run, "stop", "").ok());
    }
  });
  EXPECT_EQ(Run(), kLaunchStopped);
  const auto evictions = Events("eviction");
  ASSERT_EQ(evictions.size(), 1u);
  EXPECT_EQ(evictions[0].node, "node1");
  EXPECT_EQ(evictions[0].detail["reason"], "manual");
  EXPECT_EQ(Events("job_finished").at(0).detail["status"], "stopped");
}

// A full disk (the free-space seam): the ranks stop, nothing is judged or evicted, and training
// resumes in place once space is back.
TEST_F(LoopTest, AFullDiskPausesUntilSpaceIsBackAndEvictsNothing) {
  Fleet();
  options_.min_free_bytes = 64 << 20;
  int full_ticks = 0;
  options_.free_space = [&](const std::string&) -> Result<uint64_t> {
    if (fleet_->done() >= 5 && full_ticks < 40) {
      ++full_ticks;
      return uint64_t{1} << 20;
    }
    return uint64_t{1} << 34;
  };
  EXPECT_EQ(Run(), kLaunchFinished);
  ASSERT_EQ(Events("paused").size(), 1u);
  EXPECT_EQ(Events("paused")[0].detail["cause"], "disk_full");
  EXPECT_TRUE(Events("eviction").empty());
  EXPECT_TRUE(Events("trigger").empty());
  EXPECT_EQ(fleet_->attempts().size(), 2u);
  EXPECT_EQ(fleet_->attempts()[1], (std::vector<std::string>{"node0", "node1"}));
}

// A second launch on the directory of a stopped one adopts it: attempt numbers go on, its eviction
// stands.
TEST_F(LoopTest, ARelaunchAdoptsTheUnfinishedRunAndItsEvictions) {
  Fleet().Break({FakeFault::kCrash, "node1", 3});
  bool stopped = false;
  clock_.OnSleep([&] {
    if (!stopped && fleet_->attempts().size() == 2 && fleet_->done() >= 2) {
      stopped = true;
      ASSERT_TRUE(SendControlCommand(options_.supervisor.run_dir, "stop", "").ok());
    }
  });
  ASSERT_EQ(Run(), kLaunchStopped);
  EXPECT_EQ(Relaunch(), kLaunchFinished);
  FakeFleet* f = fleet_;
  ASSERT_EQ(f->attempts().size(), 1u);
  EXPECT_EQ(f->attempts()[0], (std::vector<std::string>{"node0", "spare0"}));
  const auto restarts = Events("restart");
  ASSERT_GE(restarts.size(), 3u);
  EXPECT_EQ(restarts.back().detail["cause"], "adopted");
  EXPECT_EQ(restarts.back().attempt, 2);
}

// Attempts that fail before their first step, three in a row, are a loop, not bad luck: the
// controller pauses (each failed differently, on a different node, so none is the job's own).
TEST_F(LoopTest, ThreeAttemptsInARowThatNeverStepPauseInsteadOfLooping) {
  options_.spares = {"spare0", "spare1", "spare2"};
  options_.max_evictions = 5;
  Fleet().Break({FakeFault::kCrash, "node1", 0, true, 9, "killed"});
  fleet_->Break({FakeFault::kCrash, "spare0", 0, true, 6, "aborted"});
  fleet_->Break({FakeFault::kCrash, "spare1", 0, true, 11, "segfault"});
  EXPECT_EQ(Run(), kLaunchPaused);
  EXPECT_EQ(Nodes(Events("eviction")), (std::vector<std::string>{"node1", "spare0", "spare1"}));
  ASSERT_EQ(Events("paused").size(), 1u);
  EXPECT_NE(Events("paused")[0].detail["reason"].get<std::string>().find(
                "3 attempts in a row failed before completing a step"),
            std::string::npos)
      << Events("paused")[0].detail;
}

// A launch in the directory of a finished run (a script run twice, a scheduler's retry) says the
// run is finished and trains nothing: no attempt, no event, not a line more in the progress stream.
TEST_F(LoopTest, ARelaunchOfAFinishedRunSaysSoAndTrainsNothing) {
  Fleet().Break({FakeFault::kCrash, "node1", 3});
  ASSERT_EQ(Run(), kLaunchFinished);
  const size_t events = Events().size();
  const std::string progress =
      tracer::ReadFile(options_.supervisor.run_dir + "/progress.jsonl").value_or("");
  ASSERT_FALSE(progress.empty());
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(Relaunch(), kLaunchFinished);
  const std::string said = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(said.find("is finished (20 steps, attempt 1): nothing to train"), std::string::npos)
      << said;
  EXPECT_NE(said.find("--new-run"), std::string::npos) << said;
  EXPECT_TRUE(fleet_->attempts().empty());
  EXPECT_EQ(fleet_->agents_running(), 0);
  EXPECT_EQ(Events().size(), events);
  EXPECT_EQ(tracer::ReadFile(options_.supervisor.run_dir + "/progress.jsonl").value_or(""),
            progress);
}

// Asked for a new run (--new-run), a launch in the directory of a finished run starts after it
// (attempt numbers stay apart) from scratch, on the nodes it is given.
TEST_F(LoopTest, ANewRunInTheDirectoryOfAFinishedRunStartsAfterIt) {
  Fleet().Break({FakeFault::kCrash, "node1", 3});
  ASSERT_EQ(Run(), kLaunchFinished);
  options_.new_run = true;
  EXPECT_EQ(Relaunch(), kLaunchFinished);
  FakeFleet* f = fleet_;
  ASSERT_EQ(f->attempts().size(), 1u);
  EXPECT_EQ(f->attempts()[0], (std::vector<std::string>{"node0", "node1"}));
  const auto restarts = Events("restart");
  EXPECT_EQ(restarts.back().detail["cause"], "start");
  EXPECT_EQ(restarts.back().attempt, 2);
  EXPECT_EQ(Events("job_finished").size(), 2u);
}

}  // namespace
}  // namespace megascope::controller
