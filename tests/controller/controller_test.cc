// Unit tests: fault-injection specs, the launch plan, control.db, the disk guard and the real
// fleet's self-check pairs.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>

#include "megascope/controller/control_db.h"
#include "megascope/controller/disk_guard.h"
#include "megascope/controller/fleet.h"
#include "megascope/controller/inject.h"
#include "megascope/controller/launch_plan.h"
#include "test_util.h"

namespace megascope::controller {
namespace {

// A self-check pair whose one side fails at once (its link is dead: the connect is refused) ends
// then: the other side, which would wait out its timeout for a partner that is gone (15 s of a
// link fault's recovery on the testbed), is stopped and says why. The "self-check" here is a
// script in the binary's place: one side fails as a dead link does, after its GEMM's figure (which
// the fleet keeps: its compute held), the other waits a minute after its own.
TEST(SupervisorFleetTest, APairEndsWhenOneSideFailsInsteadOfWaitingForTheOther) {
  megascope::testing::TempDir dir;
  const std::string exe = dir.path() + "/self-check.sh";
  // Rank 1 fails only once rank 0 has written its GEMM (a marker file, not a sleep): under load
  // rank 0 could otherwise be stopped before it measured anything, and have nothing to keep.
  const std::string measured = dir.path() + "/rank0-measured";
  std::ofstream(exe) << "#!/bin/sh\n"  // argv: self-check --dir D --rank R --timeout T
                        "if [ \"$5\" = 1 ]; then\n"
                        "  while [ ! -e '"
                     << measured
                     << "' ]; do sleep 0.01; done\n"
                        "  echo '{\"rank\": 1, \"gemm_gflops\": 12.500}'\n"
                        "  echo 'rendezvous failed: connect: Network is unreachable' >&2; exit 1\n"
                        "fi\n"
                        "echo '{\"rank\": 0, \"gemm_gflops\": 30.000}'\n"
                        "touch '"
                     << measured
                     << "'\n"
                        "exec sleep 60\n";
  ASSERT_EQ(::chmod(exe.c_str(), 0755), 0);
  launch::SupervisorOptions o;
  o.self_exe = exe;
  o.run_dir = dir.path() + "/run";
  auto fleet = MakeSupervisorFleet(o);
  const auto figures = fleet->SelfCheckPairs({{"node0", "node1"}}, 0);
  ASSERT_EQ(figures.size(), 1u);
  EXPECT_FALSE(figures[0].second.ok);
  EXPECT_NE(figures[0].second.error.find("Network is unreachable"), std::string::npos)
      << figures[0].second.error;
  EXPECT_EQ(figures[0].second.error.find("gemm_gflops"), std::string::npos)
      << figures[0].second.error;
  EXPECT_DOUBLE_EQ(figures[0].second.gemm_gflops, 12.5);
  // The side stopped for its partner's failure keeps the GEMM it measured (which end of a
  // crawling link notices first is the load's doing), and says what its partner's failure was.
  EXPECT_FALSE(figures[0].first.ok);
  EXPECT_EQ(figures[0].first.error.rfind("stopped: its partner's self-check failed (", 0), 0u)
      << figures[0].first.error;
  EXPECT_NE(figures[0].first.error.find("Network is unreachable"), std::string::npos)
      << figures[0].first.error;
  EXPECT_DOUBLE_EQ(figures[0].first.gemm_gflops, 30);
}

// Agents asked in turn keep the tick's one deadline: each is given what is left of it, and those
// not reached in time are errors, not waits (a tick costs one timeout however many nodes).
TEST(SupervisorFleetTest, AgentsAskedInTurnShareOneDeadline) {
  struct Clock final : tracer::LoopClock {
    TimePoint now{};
    TimePoint Now() override { return now; }
    int64_t WallNs() override { return (now - TimePoint{}).count(); }
    void Sleep(std::chrono::duration<double> d) override {
      now += std::chrono::duration_cast<std::chrono::steady_clock::duration>(d);
    }
  } clock;
  std::vector<int> given;
  const auto answers = AskInTurn({"a", "b", "c", "d"}, 1000, clock,
                                 [&](const std::string& node, int ms) -> Result<std::string> {
                                   given.push_back(ms);
                                   clock.Sleep(std::chrono::milliseconds(400));  // its answer
                                   return node;
                                 });
  EXPECT_EQ(given, (std::vector<int>{1000, 600, 200}));
  ASSERT_EQ(answers.size(), 4u);
  EXPECT_EQ(*answers[2], "c");
  ASSERT_FALSE(answers[3].ok());
  EXPECT_EQ(answers[3].status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(answers[3].status().message().find("the agent of d was not asked"), std::string::npos);
}

TEST(InjectTest, ParsesEveryKindWithItsTarget) {
  auto c = ParseInjection("crash:node=node1,at=12");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->kind, FaultKind::kCrash);
  EXPECT_EQ(c->node, "node1");
  EXPECT_EQ(c->at_step, 12);
  auto k = ParseInjection("kill-agent:node=node0,at=30s");
  ASSERT_TRUE(k.ok());
  EXPECT_EQ(k->at_seconds, 30);
  EXPECT_EQ(k->at_step, -1);
  auto s = ParseInjection("slow:rank=3,at=2,seconds=0.5");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->rank, 3);
  EXPECT_DOUBLE_EQ(s->seconds, 0.5);
  EXPECT_TRUE(ParseInjection("corrupt-checkpoint").ok());
  EXPECT_DOUBLE_EQ(ParseInjection("degrade:node=node2,factor=4")->factor, 4);
  auto l = ParseInjection("link:node=node2,kind=slow,rate=5,at=10s,seconds=20");
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->kind, FaultKind::kLink);
  EXPECT_EQ(l->link, LinkFaultKind::kSlow);
  EXPECT_DOUBLE_EQ(l->rate_mbps, 5);
  EXPECT_DOUBLE_EQ(l->at_seconds, 10);
  EXPECT_DOUBLE_EQ(l->seconds, 20);
  EXPECT_DOUBLE_EQ(ParseInjection("link:node=node2,at=3")->rate_mbps, 10) << "the default rate";
  auto loss = ParseInjection("link:node=node1,kind=loss,at=4");
  ASSERT_TRUE(loss.ok()) << loss.status().ToString();
  EXPECT_EQ(loss->link, LinkFaultKind::kLoss);
  EXPECT_DOUBLE_EQ(loss->loss_pct, 30) << "the default share";
  EXPECT_DOUBLE_EQ(ParseInjection("link:node=node1,kind=loss,loss=100,at=4")->loss_pct, 100);
  EXPECT_EQ(ParseInjection("link:node=node1,kind=down,at=2s")->link, LinkFaultKind::kDown);
  EXPECT_EQ(Name(LinkFaultKind::kDown), "down");
}

// A soak crashes each rank in turn, so one rank carries several crashes: the first one's firing
// must not use up the others (bench/recovery.sh's soak fired 4 of its 10 planned crashes so).
TEST(InjectTest, AFiringUsesUpOnlyItsOwnInjection) {
  std::vector<Injection> in;
  for (const char* spec : {"crash:rank=0,at=40", "crash:rank=0,at=10", "crash:rank=1,at=20",
                           "slow:rank=0,at=5,factor=1.5", "kill-agent:node=node0,at=3"}) {
    auto one = ParseInjection(spec);
    ASSERT_TRUE(one.ok()) << spec;
    in.push_back(*one);
  }
  for (Injection& i : in) i.planned_rank = i.rank;  // as an attempt plans them
  Injection* fired = FiredInjection(in, launch::WorkerFaultKind::kCrash, 0, 10);
  ASSERT_EQ(fired, &in[1]);
  fired->fired = true;
  EXPECT_FALSE(in[0].fired);
  EXPECT_EQ(FiredInjection(in, launch::WorkerFaultKind::kCrash, 0, 39), nullptr)
      << "no crash of rank 0 was due by 39";
  EXPECT_EQ(FiredInjection(in, launch::WorkerFaultKind::kCrash, 0, 40), &in[0]);
  EXPECT_EQ(FiredInjection(in, launch::WorkerFaultKind::kCrash, 1, 40), &in[2]);
  // A slow fault fires at the first step it reaches: later than its own after a resume.
  EXPECT_EQ(FiredInjection(in, launch::WorkerFaultKind::kSlow, 0, 12), &in[3]);
  EXPECT_FALSE(WorkerFaultOf(FaultKind::kKillAgent).has_value()) << "not a worker's fault";
  EXPECT_EQ(FiredInjection(in, launch::WorkerFaultKind::kHang, 0, 40), nullptr);
}

TEST(InjectTest, APersistentFaultIsAMachineThatStaysBroken) {
  auto once = ParseInjection("hang:node=node1,at=3");
  auto stays = ParseInjection("hang:node=node1,at=3,persist");
  ASSERT_TRUE(once.ok() && stays.ok()) << stays.status().ToString();
  EXPECT_FALSE(once->persist);
  EXPECT_TRUE(stays->persist);
  EXPECT_EQ(stays->node, "node1");
  EXPECT_EQ(stays->at_step, 3);
  EXPECT_NE(ParseInjection("crash:rank=1,at=3,persist").status().message().find("node=N"),
            std::string::npos);
}

TEST(InjectTest, RefusesWhatCannotBeCarriedOut) {
  for (const char* bad : {"boom:node=n",
                          "crash:at=3",
                          "crash:node=n",
                          "slow:rank=1,at=2",
                          "kill-agent:at=4",
                          "crash:node=n,at=x",
                          "crash:node=n,at=3,color=red",
                          "degrade:node=n,factor=0.5",
                          "crash:rank=1x,at=3",
                          "link:kind=slow,at=3",
                          "link:node=n,kind=slow",
                          "link:node=n,rate=-1,at=3",
                          "crash:node=n,at=3,rate=5",
                          "link:node=n,what=memory,at=3",
                          "link:node=n,kind=loss,loss=120,at=3",
                          "link:node=n,kind=down,rate=5,at=3",
                          "link:node=n,kind=slow,loss=5,at=3",
                          "crash:node=n,at=3,loss=5",
                          "crash:rank=1,at=3,persist",
                          "link:node=n,kind=down,at=3,persist",
                          "crash:node=n,at=3,persist=no"}) {
    EXPECT_FALSE(ParseInjection(bad).ok()) << bad;
  }
  EXPECT_NE(ParseInjection("boom").status().message().find("one of crash, hang"),
            std::string::npos);
  EXPECT_NE(ParseInjection("link:node=n,kind=flaky,at=3").status().message().find("kind='flaky'"),
            std::string::npos);
}

TEST(ControlDbTest, RecordsEventsInOrderAndIsPrivate) {
  megascope::testing::TempDir dir;
  const std::string path = dir.path() + "/control.db";
  {
    auto db = ControlDb::Open(path);
    ASSERT_TRUE(db.ok()) << db.status().ToString();
    ASSERT_TRUE(
        (*db)
            ->Record({200, 1, EventKind::kEviction, "", "node2", -1, {{"reason", "rank_dead"}}})
            .ok());
    ASSERT_TRUE((*db)->Record({100, 0, EventKind::kTrigger, "", "", 3, {{"cause", "crash"}}}).ok());
    ASSERT_TRUE(
        (*db)->Record({300, 1, EventKind::kRestart, "", "", -1, {{"cause", "rank_dead"}}}).ok());
  }
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto db = ControlDb::Open(path, true);
  ASSERT_TRUE(db.ok());
  auto ev = (*db)->Events();
  ASSERT_TRUE(ev.ok());
  ASSERT_EQ(ev->size(), 3u);
  EXPECT_EQ((*ev)[0].kind_name, "trigger");
  EXPECT_EQ((*ev)[0].rank, 3);
  EXPECT_EQ((*ev)[1].node, "node2");
  EXPECT_EQ((*ev)[1].detail["reason"], "rank_dead");
  auto by = (*db)->CountBy(EventKind::kRestart, "cause");
  ASSERT_TRUE(by.ok());
  ASSERT_EQ(by->size(), 1u);
  EXPECT_EQ((*by)[0], std::make_pair(std::string("rank_dead"), int64_t{1}));
  EXPECT_FALSE(ControlDb::Open(dir.path() + "/missing.db", true).ok());
}

TEST(ControlDbTest, AFileThatIsNotAControlDatabaseIsSaidAsSuch) {
  megascope::testing::TempDir dir;
  const std::string path = dir.path() + "/control.db";
  std::ofstream(path) << "garbage garbage garbage";
  auto db = ControlDb::Open(path, /*read_only=*/true);
  ASSERT_FALSE(db.ok());
  EXPECT_EQ(db.status().message(),
            path + " is not a readable megascope control database (file is not a database)");
}

TEST(ControlDbTest, EventKindsRoundTripTheirSpellings) {
  for (EventKind k :
       {EventKind::kFaultInjected, EventKind::kTrigger, EventKind::kVerdict, EventKind::kStopped,
        EventKind::kEviction, EventKind::kSelfCheck, EventKind::kRestart,
        EventKind::kCheckpointSaved, EventKind::kCheckpointLoaded, EventKind::kResumed,
        EventKind::kAgentRestarted, EventKind::kPaused, EventKind::kJobFinished}) {
    EXPECT_EQ(ParseEventKind(Name(k)), k) << Name(k);
  }
  EXPECT_EQ(Name(EventKind::kFaultInjected), "fault_injected");
  EXPECT_FALSE(ParseEventKind("meltdown").has_value());
}

// The disk guard over a scripted probe: the free space it is told, in order.
struct ScriptedSpace {
  std::vector<Result<uint64_t>> free;
  size_t next = 0;
  Result<uint64_t> operator()(const std::string&) {
    return free.at(std::min(next++, free.size() - 1));
  }
};

TEST(DiskGuardTest, ShortUnderTheFloorAndSaysWhereHowMuchAndWhatIsNeeded) {
  auto space = std::make_shared<ScriptedSpace>();
  space->free = {uint64_t{50'000'000}, uint64_t{11'500'000}, uint64_t{12'000'000}};
  DiskGuard g("/runs/a", 12'000'000, [space](const std::string& p) { return (*space)(p); });
  std::string why;
  EXPECT_FALSE(g.Short(&why)) << why;
  EXPECT_TRUE(g.Short(&why));
  EXPECT_EQ(why,
            "the run directory's filesystem (/runs/a) has 11.5 MB free, 12.0 MB needed "
            "(--min-free-mb)");
  EXPECT_FALSE(g.Short(&why)) << "the floor is free again: " << why;
}

TEST(DiskGuardTest, AFailedWriteIsShortUntilSpaceIsBackEvenWithoutAFloor) {
  auto space = std::make_shared<ScriptedSpace>();
  space->free = {uint64_t{4096}, uint64_t{4096}, uint64_t{0}, uint64_t{2'000'000}};
  DiskGuard g("/runs/b", 0, [space](const std::string& p) { return (*space)(p); });
  std::string why;
  EXPECT_FALSE(g.Short(&why)) << "no floor, not full, no failed write";
  g.NoteFailedWrite("a write failed on /runs/b/control.db: database or disk is full");
  EXPECT_TRUE(g.Short(&why)) << "one free block is not space back after a failed write";
  EXPECT_NE(why.find("control.db: database or disk is full"), std::string::npos) << why;
  EXPECT_TRUE(g.Short(&why));
  EXPECT_NE(why.find("(/runs/b) is full"), std::string::npos) << why;
  EXPECT_FALSE(g.Short(&why)) << why;
  EXPECT_FALSE(g.Short(&why)) << "the failed write is forgotten once space was back";
}

TEST(DiskGuardTest, AProbeThatFailsNeverStopsTheJob) {
  DiskGuard g("/runs/c", 12'000'000,
              [](const std::string&) -> Result<uint64_t> { return IoError("statvfs: EIO"); });
  std::string why;
  EXPECT_FALSE(g.Short(&why));
  EXPECT_EQ(why, "statvfs: EIO");
}

TEST(DiskGuardTest, ReadsTheRealFreeSpace) {
  auto free = FreeBytes("/");
  ASSERT_TRUE(free.ok()) << free.status().ToString();
  auto missing = FreeBytes("/nonexistent-dir");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent-dir"), std::string::npos);
}

// --- The launch plan: nodes, hosts and injections decided before anything starts -------------

TEST(LaunchPlanTest, NodesOnThisMachineAreNamedInOrderWithTheSparesAfter) {
  ControllerOptions o;
  ASSERT_TRUE(
      PlanLaunch({2, 1, 4, {}, {"crash:node=node2,at=3", "slow:rank=3,at=2,factor=2"}}, &o).ok());
  EXPECT_EQ(o.nodes, (std::vector<std::string>{"node0", "node1"}));
  EXPECT_EQ(o.spares, std::vector<std::string>{"node2"});
  EXPECT_TRUE(o.supervisor.hosts.empty());
  ASSERT_EQ(o.injections.size(), 2u);
  EXPECT_EQ(o.injections[0].node, "node2");  // a spare may be aimed at: it fails once it joins
}

TEST(LaunchPlanTest, HostsNameTheNodesAndTooFewAreRefusedSayingWhere) {
  megascope::testing::TempDir dir;
  const std::string file = dir.path() + "/hosts";
  std::ofstream(file) << "# a testbed\nh0 ns0 10.0.0.1 10.1.0.1\nh1 ns1 10.0.0.2 10.1.0.2\n"
                         "h2 - 10.0.0.3 10.1.0.3\n";
  auto hosts = ResolveHosts({false, file, "ib0"});
  ASSERT_TRUE(hosts.ok()) << hosts.status().ToString();
  ASSERT_EQ(hosts->hosts.size(), 3u);
  EXPECT_EQ(hosts->hosts[1].bind_iface, "ib0");
  ControllerOptions o;
  ASSERT_TRUE(PlanLaunch({2, 1, 4, *hosts, {"link:node=h1,kind=down,at=3"}}, &o).ok());
  EXPECT_EQ(o.nodes, (std::vector<std::string>{"h0", "h1"}));
  EXPECT_EQ(o.spares, std::vector<std::string>{"h2"});
  EXPECT_EQ(o.supervisor.hosts.at("h1").netns, "ns1");
  ControllerOptions too_many;
  Status st = PlanLaunch({3, 1, 6, *hosts, {}}, &too_many);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "--nodes 3 and --spares 1 need 4 hosts; " + file + " lists 3");
}

TEST(LaunchPlanTest, WhatCannotBeCarriedOutIsRefusedNamingTheFlag) {
  struct Case {
    HostSource source;
    std::vector<std::string> injections;
    std::string says;
  };
  megascope::testing::TempDir dir;
  const std::string file = dir.path() + "/hosts";
  std::ofstream(file) << "h0 - 10.0.0.1 10.1.0.1\nh1 - 10.0.0.2 10.1.0.2\n";
  const Case cases[] = {
      {{true, "hosts.txt", ""}, {}, "--slurm and --hosts both say where the nodes are"},
      {{false, "", "eth0"}, {}, "--iface needs --hosts or --slurm"},
      {{false, dir.path() + "/none", ""}, {}, "cannot read the hosts file"},
      {{}, {"crash:node=node9,at=2"}, "no node node9 (nodes are node0..node1)"},
      {{}, {"crash:rank=7,at=2"}, "rank outside the world"},
      {{}, {"link:node=node1,kind=loss,loss=30,at=2"}, "needs a real link"},
      {{false, file, ""}, {"link:node=h1,kind=down,at=2"}, "needs a real link"},  // no namespace
      {{}, {"melt:node=node0"}, "unknown kind 'melt'"},
  };
  for (const Case& c : cases) {
    auto hosts = ResolveHosts(c.source);
    Status st = hosts.status();
    if (hosts.ok()) {
      ControllerOptions o;
      st = PlanLaunch({2, 0, 4, *hosts, c.injections}, &o);
    }
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << c.says;
    EXPECT_NE(st.message().find(c.says), std::string::npos) << st.message();
  }
  ControllerOptions o;  // a slow link needs no real one: the link seam slows it
  EXPECT_TRUE(PlanLaunch({2, 0, 4, {}, {"link:node=node1,kind=slow,rate=5,at=2"}}, &o).ok());
}

// A self-check's log as `megascope self-check` writes it: the whole check's figures; a check that
// failed on its link, or was stopped because its partner's end failed first (which end notices a
// crawling link first is up to the load), still says the GEMM it measured; one that ended before
// its GEMM says none.
TEST(SelfCheckLogTest, AnEndStoppedAfterItsPartnerFailedKeepsTheGemmItMeasured) {
  const SelfCheckFigures done = ReadSelfCheckLog(
      "{\"rank\": 0, \"gemm_gflops\": 12.500}\n"
      "{\"rank\": 0, \"gemm_gflops\": 12.500, \"allreduce_gbps\": 0.3000}\n",
      "");
  EXPECT_TRUE(done.ok);
  EXPECT_DOUBLE_EQ(done.gemm_gflops, 12.5);
  EXPECT_DOUBLE_EQ(done.allreduce_gbps, 0.3);
  const std::string why = "stopped: its partner's self-check failed (under half of the floor)";
  const SelfCheckFigures stopped =
      ReadSelfCheckLog("{\"rank\": 1, \"gemm_gflops\": 40.000}\n", why);
  EXPECT_FALSE(stopped.ok);
  EXPECT_DOUBLE_EQ(stopped.gemm_gflops, 40);
  EXPECT_EQ(stopped.error, why);
  const SelfCheckFigures failed = ReadSelfCheckLog(
      "{\"rank\": 0, \"gemm_gflops\": 9.000}\nthe all-reduces moved under half of the floor\n",
      "self-check exited with code 1");
  EXPECT_FALSE(failed.ok);
  EXPECT_DOUBLE_EQ(failed.gemm_gflops, 9);
  EXPECT_EQ(failed.error,
            "self-check exited with code 1: the all-reduces moved under half of the floor");
  const SelfCheckFigures early = ReadSelfCheckLog("", "self-check exited with code 4");
  EXPECT_FALSE(early.ok);
  EXPECT_EQ(early.gemm_gflops, 0);
}

}  // namespace
}  // namespace megascope::controller
