// The node agent against real rings, a real SQLite file, real HTTP and real processes.
#include "agent_fixture.h"

namespace megascope::tracer::agent {
namespace {

TEST_F(AgentTest, WritesEveryRecordExactlyOnceWithTheSchema) {
  auto t0 = Tracer::Create(Ring(0)), t1 = Tracer::Create(Ring(1)),
       other = Tracer::Create(Ring(2, "n1"));
  ASSERT_TRUE(t0.ok() && t1.ok() && other.ok());
  const GroupId g = *(*t0)->RegisterGroup("tp.0.0", "tp", std::vector<int32_t>{0, 1});
  const NameId fwd = *(*t0)->InternName("forward");
  for (int i = 0; i < 1000; ++i) {
    if (i == 400) (*t0)->SetPhase(7, Phase::kForward);  // ops from here on finish in step 7
    const int64_t start = (*t0)->Ticks();
    (*t0)->RecordSpan(SpanKind::kForward, fwd, i, 0, start, (*t0)->Ticks());
    OpHandle h = (*t0)->Enqueue(g, OpType::kAllreduce, 64, DType::kF32);
    (*t0)->Start(h);
    (*t0)->Complete(h);
  }
  (*t1)->SetPhase(3, Phase::kBackward);
  (*other)->SetPhase(1, Phase::kForward);  // another node's ring: not ours
  auto agent = Agent::Create(Options());
  ASSERT_TRUE(agent.ok()) << agent.status().ToString();
  auto n = (*agent)->Poll(true);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, 2002u);
  EXPECT_EQ((*agent)->Poll(false).value(), 0u);  // nothing twice
  EXPECT_EQ(
      Count(Db(),
            "SELECT COUNT(*) FROM spans WHERE rank = 0 AND kind = 'forward' AND name = 'forward'"),
      1000);
  EXPECT_EQ(Count(Db(),
                  "SELECT COUNT(DISTINCT seq) FROM collectives WHERE grp = 'tp.0.0' AND state = "
                  "'completed'"),
            1000);
  EXPECT_EQ(
      Count(Db(),
            "SELECT COUNT(*) FROM heartbeats WHERE rank = 1 AND step = 3 AND phase = 'backward'"),
      1);
  EXPECT_EQ(Count(Db(), "SELECT COUNT(*) FROM heartbeats WHERE rank = 2"), 0);
  EXPECT_EQ(Count(Db(), "SELECT COUNT(*) FROM ranks WHERE node = 'n0'"), 2);
  EXPECT_EQ(
      Count(Db(),
            "SELECT COUNT(*) FROM metrics WHERE name = 'node_memory_used_bytes' AND value > 0"),
      1);
  // Every docs/formats.md column of a collective, spelled as documented, from the compact rows.
  EXPECT_EQ(
      Count(Db(),
            "SELECT COUNT(*) FROM collectives WHERE rank = 0 AND attempt = 0 AND op = "
            "'allreduce' AND dtype = 'f32' AND bytes = 64 AND peer IS NULL AND started_ns >= "
            "enqueued_ns AND completed_ns >= started_ns AND enqueued_ns > 1600000000000000000"),
      1000);
  EXPECT_EQ(Count(Db(), "SELECT COUNT(*) FROM collectives WHERE step = 7"), 600);
  // A completed collective is its own comm span, over the same interval.
  EXPECT_EQ(Count(Db(),
                  "SELECT COUNT(*) FROM spans s JOIN collectives c ON c.rank = s.rank AND "
                  "c.started_ns = s.start_ns AND c.completed_ns = s.end_ns AND c.step = s.step "
                  "WHERE s.kind = 'comm' AND s.name = 'allreduce'"),
            1000);
  EXPECT_EQ(Count(Db(), "PRAGMA user_version"), megascope::tracer::kTraceSchemaVersion);
  EXPECT_EQ(
      Count(Db(),
            "SELECT COUNT(*) FROM spans WHERE end_ns < start_ns OR start_ns < 1600000000000000000"),
      0);
}

// The detector's per-rank training inputs: compute and comm wait of the rank's last finished step,
// as gauges (the step's spans come before its "step" metric in the ring).
TEST_F(AgentTest, ExportsTheComputeAndCommWaitOfTheLastStepAsGauges) {
  auto t = Tracer::Create(Ring(1),
                          std::make_shared<megascope::tracer::MonotonicClock>());  // 1 tick = 1 ns
  ASSERT_TRUE(t.ok());
  const NameId fwd = *(*t)->InternName("forward"), sync = *(*t)->InternName("grad_sync");
  const NameId step = *(*t)->InternName("step"), secs = *(*t)->InternName("step_seconds");
  const int64_t ms = 1'000'000;
  const int64_t base = (*t)->Ticks();
  for (int s = 0; s < 2; ++s) {  // step 0: 30 ms compute, 10 ms comm; step 1: 50 ms, 20 ms
    (*t)->RecordSpan(SpanKind::kForward, fwd, s, 0, base, base + (30 + 20 * s) * ms);
    (*t)->RecordSpan(SpanKind::kComm, sync, s, 0, base, base + (10 + 10 * s) * ms);
    (*t)->RecordMetric(secs, 0.1);
    (*t)->RecordMetric(step, s + 1);
  }
  auto agent = Agent::Create(Options());
  ASSERT_TRUE(agent.ok());
  ASSERT_TRUE((*agent)->Poll(true).ok());
  const std::string metrics = HttpGet((*agent)->port(), "/metrics");
  const std::string labels =
      "{dp=\"0\",job=\"agenttest\",node=\"n0\",pp=\"0\",rank=\"1\",tp=\"1\"} ";
  auto value = [&](const std::string& name) {
    const auto at = metrics.find(name + labels);
    return at == std::string::npos ? -1.0
                                   : std::atof(metrics.c_str() + at + name.size() + labels.size());
  };
  EXPECT_NEAR(value("megascope_step_compute_seconds"), 0.050, 1e-4) << metrics;
  EXPECT_NEAR(value("megascope_step_comm_wait_seconds"), 0.020, 1e-4);
  EXPECT_NEAR(value("megascope_step_seconds"), 0.1, 1e-9);
  EXPECT_NEAR(value("megascope_compute_seconds_total"), 0.080, 1e-4);  // both steps
}

// An agent that listens beyond loopback serves nothing without the run's token.
TEST_F(AgentTest, WithATokenEveryEndpointNeedsIt) {
  auto t = Tracer::Create(Ring(1));
  ASSERT_TRUE(t.ok());
  AgentOptions o = Options();
  o.token = "s3cret";
  auto agent = Agent::Create(o);
  ASSERT_TRUE(agent.ok());
  ASSERT_TRUE((*agent)->Poll(true).ok());
  const std::string base = "http://127.0.0.1:" + std::to_string((*agent)->port());
  for (const char* path : {"/metrics", "/state", "/dump/1", "/dumps"}) {
    auto open = megascope::tracer::HttpGet(base + path, 5000);
    EXPECT_EQ(open.status().code(), megascope::StatusCode::kPermissionDenied) << path;
    auto wrong = megascope::tracer::HttpGet(base + path, 5000, "guess");
    EXPECT_EQ(wrong.status().code(), megascope::StatusCode::kPermissionDenied) << path;
    auto right = megascope::tracer::HttpGet(base + path, 5000, "s3cret");
    EXPECT_TRUE(right.ok()) << path << ": " << right.status().ToString();
  }
}

TEST_F(AgentTest, ServesMetricsStateAndDumpsOverHttp) {
  auto t = Tracer::Create(Ring(1));
  ASSERT_TRUE(t.ok());
  const GroupId g = *(*t)->RegisterGroup("dp.0.1", "dp", std::vector<int32_t>{1, 3});
  (*t)->RecordMetric(*(*t)->InternName("step"), 7);
  (*t)->RecordMetric(*(*t)->InternName("step_seconds"), 0.25);
  OpHandle open = (*t)->Enqueue(g, OpType::kAllreduce, 4096, DType::kF32);
  (*t)->Start(open);
  auto agent = Agent::Create(Options());
  ASSERT_TRUE(agent.ok());
  ASSERT_TRUE((*agent)->Poll(true).ok());
  const int port = (*agent)->port();
  ASSERT_GT(port, 0);
  const std::string metrics = HttpGet(port, "/metrics");
  EXPECT_NE(
      metrics.find(
          "megascope_step{dp=\"0\",job=\"agenttest\",node=\"n0\",pp=\"0\",rank=\"1\",tp=\"1\"} 7"),
      std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("megascope_step_duration_seconds_count"), std::string::npos);
  EXPECT_NE(metrics.find("megascope_node_cpu_utilization_ratio"), std::string::npos);
  auto state = nlohmann::json::parse(HttpGet(port, "/state"));
  ASSERT_EQ(state["ranks"].size(), 1u);
  EXPECT_EQ(state["ranks"][0]["alive"], true);
  EXPECT_EQ(state["ranks"][0]["open_entries"][0]["group"], "dp.0.1");
  EXPECT_EQ(state["ranks"][0]["open_entries"][0]["state"], "started");
  // What a controller reads of it every tick (ReadAgentState), from the agent's own answer.
  std::vector<RankBeat> beats;
  ASSERT_TRUE(
      ReadAgentState(HttpGet(port, "/state"), [&](const RankBeat& b) { beats.push_back(b); }));
  ASSERT_EQ(beats.size(), 1u);
  EXPECT_EQ(beats[0].rank, 1);
  EXPECT_EQ(beats[0].attempt, 0);
  EXPECT_EQ(beats[0].step, state["ranks"][0]["heartbeat"]["step"].get<int64_t>());
  EXPECT_EQ(beats[0].oldest_enqueued_ns,
            state["ranks"][0]["open_entries"][0]["enqueued_at_ns"].get<int64_t>());
  EXPECT_GT(beats[0].oldest_enqueued_ns, 0);
  EXPECT_FALSE(ReadAgentState("{\"ranks\": 3}", [](const auto&) {}));
  EXPECT_FALSE(ReadAgentState("not json", [](const auto&) {}));
  auto dump = nlohmann::json::parse(HttpGet(port, "/dump/1"));
  EXPECT_EQ(dump["format"], "megascope-flight-recorder");
  EXPECT_EQ(dump["alive"], true);
  EXPECT_NE(HttpGet(port, "/dump/9").find("not on node n0"), std::string::npos);
  // promtool (Prometheus' own checker) accepts the live page.
  const std::string file = run_.path() + "/metrics.txt";
  std::ofstream(file) << metrics;
  auto check = megascope::testing::RunCommand("promtool check metrics < " + file);
  EXPECT_EQ(check.code, 0) << check.out;
}

// Live hang analysis asks each node once: every rank's dump in one answer, one a line, each
// rank's latest attempt unless one is named.
TEST_F(AgentTest, ServesEveryRanksDumpInOneAnswerOneALine) {
  std::vector<std::unique_ptr<Tracer>> tracers;
  for (auto [rank, attempt] : {std::pair{1, 0}, {3, 0}, {1, 1}}) {
    RingOptions o = Ring(rank);
    o.attempt = attempt;
    auto t = Tracer::Create(o);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    const GroupId g = *(*t)->RegisterGroup("dp.0.1", "dp", std::vector<int32_t>{1, 3});
    (*t)->Start((*t)->Enqueue(g, OpType::kAllreduce, uint64_t{64} * (attempt + 1), DType::kF32));
    tracers.push_back(std::move(*t));
  }
  auto agent = Agent::Create(Options());
  ASSERT_TRUE(agent.ok());
  ASSERT_TRUE((*agent)->Poll(true).ok());
  const int port = (*agent)->port();
  auto read = [&](const std::string& path) {
    std::vector<Dump> dumps;
    std::istringstream in(HttpGet(port, path));
    for (std::string line; std::getline(in, line);) {
      auto d = ParseDump(line, path);
      EXPECT_TRUE(d.ok()) << d.status().ToString() << "\n" << line;
      if (d.ok()) dumps.push_back(std::move(*d));
    }
    return dumps;
  };
  const std::vector<Dump> latest = read("/dumps");
  ASSERT_EQ(latest.size(), 2u);
  EXPECT_EQ(latest[0].snapshot.info.rank, 1);
  EXPECT_EQ(latest[0].snapshot.info.attempt, 1);
  EXPECT_EQ(latest[0].snapshot.entries.at(0).bytes, 128u);
  EXPECT_EQ(latest[1].snapshot.info.rank, 3);
  EXPECT_TRUE(latest[1].alive);
  EXPECT_EQ(latest[1].snapshot.entries.at(0).state, OpState::kStarted);
  const std::vector<Dump> first = read("/dumps?attempt=0");
  ASSERT_EQ(first.size(), 2u);
  for (const Dump& d : first) EXPECT_EQ(d.snapshot.info.attempt, 0);
  EXPECT_TRUE(read("/dumps?attempt=7").empty());
  // The binary stream (what live analysis reads): the same dumps, in the same order.
  for (const std::string query : {"", "attempt=0", "attempt=7"}) {
    const std::string path = "/dumps?form=binary" + (query.empty() ? "" : "&" + query);
    const std::string body = HttpGet(port, path);
    DumpStreamReader reader(path);
    std::vector<Dump> binary;
    ASSERT_TRUE(reader
                    .Feed(body,
                          [&](Dump d) {
                            binary.push_back(std::move(d));
                            return Status::Ok();
                          })
                    .ok());
    EXPECT_TRUE(reader.Finish().ok()) << path;
    const std::vector<Dump> json = read(query.empty() ? "/dumps" : "/dumps?" + query);
    ASSERT_EQ(binary.size(), json.size()) << path;
    for (size_t i = 0; i < json.size(); ++i) {
      binary[i].dumped_at_ns = json[i].dumped_at_ns;  // the two answers' own times
      EXPECT_EQ(DumpToJson(binary[i]), DumpToJson(json[i])) << path;
    }
  }
  for (const char* bad : {"/dumps?attempt=x", "/dumps?form=xml", "/dumps?attempt=1&x=2"})
    EXPECT_NE(HttpGet(port, bad).find("use /dumps[?attempt=<attempt>][&form=json|binary]"),
              std::string::npos)
        << bad;
}

TEST_F(AgentTest, ExportsTheControllersRestartsEvictionsAndVerdicts) {
  auto agent = Agent::Create(Options());
  ASSERT_TRUE(agent.ok());
  EXPECT_EQ((*agent)->MetricsText().find("megascope_restarts_total"),
            std::string::npos);  // no control.db: no family
  {
    auto h = megascope::tracer::sql::Database::Open(
        run_.path() + "/control.db", megascope::tracer::sql::Database::Mode::kReadWrite);
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    ASSERT_TRUE(
        h->Exec("CREATE TABLE events(ts_ns INTEGER, attempt INTEGER, kind TEXT, node TEXT, rank "
                "INTEGER, detail_json TEXT);"
                "INSERT INTO events VALUES(1, 0, 'restart', NULL, NULL, '{\"cause\":\"start\"}');"
                "INSERT INTO events VALUES(2, 0, 'eviction', 'n1', NULL, "
                "'{\"reason\":\"rank_dead\"}');"
                "INSERT INTO events VALUES(3, 1, 'restart', NULL, NULL, "
                "'{\"cause\":\"rank_dead\"}');"
                "INSERT INTO events VALUES(4, 1, 'restart', NULL, NULL, "
                "'{\"cause\":\"link_stall\"}');"
                "INSERT INTO events VALUES(5, 1, 'verdict', 'n1', 3, "
                "'{\"kind\":\"hang\",\"cause\":\"rank_dead\"}');"
                "INSERT INTO events VALUES(6, 1, 'verdict', 'n1', 3, "
                "'{\"kind\":\"hang\",\"cause\":\"rank_dead\"}');")
            .ok());
  }
  const std::string m = (*agent)->MetricsText();
  EXPECT_NE(m.find("megascope_restarts_total{job=\"agenttest\",node=\"n0\",cause=\"rank_dead\"} 1"),
            std::string::npos)
      << m;
  EXPECT_NE(
      m.find("megascope_restarts_total{job=\"agenttest\",node=\"n0\",cause=\"link_stall\"} 1"),
      std::string::npos);
  EXPECT_EQ(m.find("cause=\"start\""),
            std::string::npos);  // the job's first start is not a restart
  EXPECT_NE(
      m.find("megascope_evictions_total{job=\"agenttest\",node=\"n0\",reason=\"rank_dead\"} 1"),
      std::string::npos);
  EXPECT_NE(m.find("megascope_verdicts_total{job=\"agenttest\",node=\"n0\",kind=\"hang\","
                   "cause=\"rank_dead\"} 2"),
            std::string::npos)
      << m;
  const std::string file = run_.path() + "/metrics.txt";
  std::ofstream(file) << m;
  auto check = megascope::testing::RunCommand("promtool check metrics < " + file);
  EXPECT_EQ(check.code, 0) << check.out;
}

TEST_F(AgentTest, ADeadRankIsMarkedAndDumped) {
  auto rank = Process::Fork([&] {
    auto t = Tracer::Create(Ring(3));
    if (!t.ok()) return 1;
    GroupId g = *(*t)->RegisterGroup("pp.1.1", "pp", std::vector<int32_t>{3, 1});
    OpHandle h = (*t)->Enqueue(g, OpType::kSend, 1024, DType::kF32, 1);
    (*t)->Start(h);
    ::_exit(0);  // dies mid-send, without closing its ring
    return 0;
  });
  ASSERT_TRUE(rank.ok());
  ASSERT_TRUE((*rank)->Wait().success());
  auto agent = Agent::Create(Options());
  ASSERT_TRUE(agent.ok());
  ASSERT_TRUE((*agent)->Poll(false).ok());
  auto state = nlohmann::json::parse((*agent)->StateJson());
  ASSERT_EQ(state["ranks"].size(), 1u);
  EXPECT_EQ(state["ranks"][0]["alive"], false);
  const std::string path = run_.path() + "/dumps/attempt_0/rank_3.json";
  ASSERT_TRUE(fs::exists(path));
  std::ifstream in(path);
  auto dump = nlohmann::json::parse(in);
  EXPECT_EQ(dump["alive"], false);
  EXPECT_EQ(dump["entries"].back()["op"], "send");
  EXPECT_EQ(dump["entries"].back()["state"], "started");
}

// A rank that dumped its own flight recorder and then went on beating its heartbeat while it hung
// (an incident collects every rank's dump, then stops them): once it is gone, its own dump stays,
// alive -- unless its recorder moved after it dumped, when the ring's newer state is written.
// `more_ops`: the rank issues one more op after its dump.
std::string DumpLeftByAGoneRank(const std::string& run, const RingOptions& ring, bool more_ops,
                                const AgentOptions& options) {
  const std::string path = run + "/dumps/attempt_0/rank_3.json";
  fs::create_directories(fs::path(path).parent_path());
  auto rank = Process::Fork([&] {
    auto clock = std::make_shared<FakeClock>(WallNowNs());
    auto t = Tracer::Create(ring, clock);
    if (!t.ok()) return 1;
    GroupId g = *(*t)->RegisterGroup("pp.1.1", "pp", std::vector<int32_t>{3, 1});
    (*t)->Start((*t)->Enqueue(g, OpType::kSend, 1024, DType::kF32, 1));
    (*t)->Touch();
    if (!(*t)->WriteDump(path).ok()) return 1;
    clock->Advance(30'000'000'000);  // hung: 30 s of heartbeats after the dump
    if (more_ops) (*t)->Enqueue(g, OpType::kRecv, 1024, DType::kF32, 1);
    (*t)->Touch();
    ::_exit(0);
    return 0;
  });
  if (!rank.ok() || !(*rank)->Wait().success()) return "the rank did not run";
  auto agent = Agent::Create(options);
  if (!agent.ok() || !(*agent)->Poll(false).ok()) return "the agent did not poll";
  std::ifstream in(path);
  return nlohmann::json::parse(in).dump();
}

TEST_F(AgentTest, AGoneRanksOwnDumpStaysWhenItsRecorderHasNotMovedSince) {
  const auto kept =
      nlohmann::json::parse(DumpLeftByAGoneRank(run_.path(), Ring(3), false, Options()));
  EXPECT_EQ(kept["alive"], true) << "the rank's own dump, not the reader's";
  EXPECT_EQ(kept["entries"].back()["op"], "send");
}

TEST_F(AgentTest, AGoneRanksOwnDumpIsReplacedWhenItsRecorderMovedSince) {
  const auto dump =
      nlohmann::json::parse(DumpLeftByAGoneRank(run_.path(), Ring(3), true, Options()));
  EXPECT_EQ(dump["alive"], false) << "the reader's dump of the ring's newer state";
  EXPECT_EQ(dump["entries"].back()["op"], "recv");
}

// A restart: rank 3 of attempt 1 runs while the agent retires rank 3 of attempt 0 (gone, drained).
// Both carry the same labels, so they share their series: retiring the old one must leave the
// new one's series in place (removing them freed what the new one still wrote to: the agent died
// of a segfault in prometheus-cpp during a restart on the testbed).
TEST_F(AgentTest, RetiringAnEarlierAttemptKeepsTheSeriesTheNextAttemptShares) {
  auto old = Process::Fork([&] {
    auto t = Tracer::Create(Ring(3));
    if (!t.ok()) return 1;
    (*t)->RecordMetric(*(*t)->InternName("step"), 4);
    ::_exit(0);  // gone without closing its ring
    return 0;
  });
  ASSERT_TRUE(old.ok());
  ASSERT_TRUE((*old)->Wait().success());
  RingOptions next = Ring(3);
  next.attempt = 1;
  auto t = Tracer::Create(next);
  ASSERT_TRUE(t.ok());
  const NameId step = *(*t)->InternName("step");
  (*t)->RecordMetric(step, 5);
  auto agent = Agent::Create(Options());
  ASSERT_TRUE(agent.ok());
  ASSERT_TRUE((*agent)->Poll(true).ok());  // both found and drained
  ASSERT_TRUE((*agent)->Poll(true).ok());  // attempt 0: gone and drained, retired
  (*t)->RecordMetric(step, 6);
  ASSERT_TRUE((*agent)->Poll(true).ok());
  const std::string metrics = (*agent)->MetricsText();
  EXPECT_NE(metrics.find("megascope_step{dp=\"1\",job=\"agenttest\",node=\"n0\",pp=\"0\","
                         "rank=\"3\",tp=\"1\"} 6"),
            std::string::npos)
      << metrics;
}

TEST_F(AgentTest, SurvivesSigkillWithoutLosingOrDuplicatingRows) {
  auto t = Tracer::Create(Ring(0));
  ASSERT_TRUE(t.ok());
  const NameId name = *(*t)->InternName("forward");
  const std::string cmd = std::string(MEGASCOPE_BIN) +
                          " agent --node n0 --job agenttest --run-dir " + run_.path() +
                          " --shm-dir " + shm_.path();
  // The agent dies by SIGKILL exactly where the store's fault seam says (MEGASCOPE_AGENT_CRASH).
  auto start_agent = [&](const std::string& crash) {
    launch::ProcessSpec spec({"/bin/sh", "-c", "exec " + cmd}, "/dev/null");
    if (!crash.empty()) spec.env = {{"MEGASCOPE_AGENT_CRASH", crash}};
    return std::move(Process::Spawn(spec)).value();
  };
  constexpr int kTotal = 300000;
  int emitted = 0;
  // Recorded now: each agent's first pass prunes what is older than its retention window, and a
  // tick near 0 is the host's boot, more than a day ago on a host that has been up that long.
  const int64_t now = (*t)->Ticks();
  auto emit = [&](int n) {
    for (int i = 0; i < n; ++i, ++emitted)
      (*t)->RecordSpan(SpanKind::kForward, name, emitted, 0, now, now + 1);
  };
  emit(16384);  // one full lane
  // 1. Killed inside its first transaction, every row inserted, before COMMIT: nothing is kept.
  auto agent = start_agent("before-commit:1");
  launch::ExitStatus e = agent->Wait();
  ASSERT_TRUE(e.signaled() && e.signal() == SIGKILL) << e.Describe();
  EXPECT_EQ(Count(Db(), "SELECT COUNT(*) FROM spans"), 0) << "the transaction was rolled back";
  // 2. Killed right after a COMMIT, before it advanced the ring: the rows are in, the ring still
  // holds them (and stays full, so what comes next is dropped and counted).
  agent = start_agent("after-commit:1");
  e = agent->Wait();
  ASSERT_TRUE(e.signaled() && e.signal() == SIGKILL) << e.Describe();
  EXPECT_EQ(Count(Db(), "SELECT COUNT(*) FROM spans"), 16384);
  emit(100000);
  // 3. A healthy agent drains what is left, then is stopped cleanly (it drains before exiting).
  agent = start_agent("");
  emit(kTotal - 116384);
  // Until the database accounts for every record (rows written plus drops recorded).
  for (int i = 0; i < 200; ++i) {
    const int64_t rows = Count(Db(), "SELECT COUNT(*) FROM spans");
    const int64_t drops =
        Count(Db(), "SELECT COALESCE(MAX(dropped_records), 0) FROM drops WHERE rank = 0");
    if (rows >= 0 && drops >= 0 && rows + drops >= kTotal) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  agent->Stop(std::chrono::seconds(30));
  const int64_t rows = Count(Db(), "SELECT COUNT(*) FROM spans");
  const int64_t distinct = Count(Db(), "SELECT COUNT(DISTINCT step) FROM spans");
  const uint64_t dropped = (*t)->Snapshot().dropped_total;
  EXPECT_EQ(rows, distinct);  // nothing written twice
  EXPECT_EQ(static_cast<uint64_t>(rows) + dropped, static_cast<uint64_t>(kTotal));  // nothing lost
  EXPECT_GT(dropped, 0u);
  EXPECT_EQ(Count(Db(), "SELECT MAX(dropped_records) FROM drops WHERE rank = 0"),
            static_cast<int64_t>(dropped));
}

TEST_F(AgentTest, ABadCrashSeamIsRefusedClearly) {
  launch::ProcessSpec spec({"/bin/sh", "-c",
                            "exec " + std::string(MEGASCOPE_BIN) + " agent --node n0 --run-dir " +
                                run_.path() + " --shm-dir " + shm_.path() + " 2>&1"},
                           run_.path() + "/bad.log");
  spec.env = {{"MEGASCOPE_AGENT_CRASH", "sometime"}};
  auto p = Process::Spawn(spec);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ((*p)->Wait().code(), 2);
  EXPECT_NE((*p)->LogTail(5).find("expected before-commit:N or after-commit:N"), std::string::npos);
}

// The counters /state serves are written by the agent thread while HTTP threads read them (the
// tsan preset runs this test).
TEST_F(AgentTest, StateIsServedWhileTheAgentDrains) {
  auto t = Tracer::Create(Ring(0));
  ASSERT_TRUE(t.ok());
  const NameId name = *(*t)->InternName("forward");
  auto agent = Agent::Create(Options());
  ASSERT_TRUE(agent.ok());
  std::thread runner([&] { (*agent)->Run(); });
  constexpr int kTotal = 10000;  // fits the ring: no drops
  for (int i = 0; i < kTotal; ++i) (*t)->RecordSpan(SpanKind::kForward, name, i, 0, 1, 2);
  uint64_t last = 0, reads = 0;
  bool monotonic = true;
  for (; reads < 100000 && last < kTotal; ++reads) {
    const uint64_t now = nlohmann::json::parse(HttpGet((*agent)->port(), "/state"))["rows_written"];
    monotonic &= now >= last;
    last = now;
  }
  (*agent)->Stop();
  runner.join();
  EXPECT_TRUE(monotonic);
  EXPECT_GE(last, static_cast<uint64_t>(kTotal)) << "after " << reads << " reads";
  EXPECT_EQ((*agent)->rows_written(),
            static_cast<uint64_t>(Count(Db(), "SELECT COUNT(*) FROM spans")));
}

// Stop() ends the wait between passes at once, however long the drain interval, and the final
// drain still writes what came in during the wait (without the wake-up, Run() would sleep out
// the hour and the test would time out).
TEST_F(AgentTest, StopEndsTheWaitBetweenPassesAndTheFinalDrainWritesWhatCameIn) {
  auto t = Tracer::Create(Ring(0));
  ASSERT_TRUE(t.ok());
  const NameId name = *(*t)->InternName("forward");
  for (int i = 0; i < 100; ++i) (*t)->RecordSpan(SpanKind::kForward, name, i, 0, 1, 2);
  AgentOptions o = Options();
  o.drain_interval_s = 3600;
  auto agent = Agent::Create(o);
  ASSERT_TRUE(agent.ok());
  std::thread runner([&] { (*agent)->Run(); });
  while ((*agent)->rows_written() < 100) std::this_thread::yield();  // the first pass: at once
  for (int i = 100; i < 250; ++i) (*t)->RecordSpan(SpanKind::kForward, name, i, 0, 1, 2);
  EXPECT_EQ((*agent)->rows_written(), 100u);  // waiting out the interval
  (*agent)->Stop();
  runner.join();
  EXPECT_EQ((*agent)->rows_written(), 250u);
  EXPECT_EQ(Count(Db(), "SELECT COUNT(*) FROM spans"), 250);
}

// The scheduling policy (sched(7)) of every thread of this process but `except`, from
// /proc/self/task/<tid>/stat's 41st field.
std::map<pid_t, int> PoliciesOfOtherThreads(pid_t except) {
  std::map<pid_t, int> out;
  for (const auto& task : fs::directory_iterator("/proc/self/task")) {
    const pid_t tid = std::stoi(task.path().filename().string());
    if (tid == except) continue;
    std::ifstream in(task.path() / "stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::istringstream fields(stat.substr(stat.rfind(')') + 2));  // field 3 onwards
    std::string f;
    for (int i = 3; i <= 41 && fields >> f; ++i) {
    }
    out[tid] = std::stoi(f);
  }
  return out;
}

// The drain runs at its own scheduling policy, the HTTP threads at the normal one, and an idle
// drain still writes everything.
TEST_F(AgentTest, TheDrainRunsAtItsOwnPriorityAndHttpAtTheNormalOne) {
  for (const auto& [priority, policy] :
       {std::pair{DrainPriority::kIdle, SCHED_IDLE}, std::pair{DrainPriority::kBatch, SCHED_BATCH},
        std::pair{DrainPriority::kNormal, SCHED_OTHER}}) {
    SCOPED_TRACE(std::string(Name(priority)));
    EXPECT_EQ(ParseDrainPriority(Name(priority)), priority);
    for (const auto& dir : {shm_.path(), run_.path()})
      for (const auto& e : fs::directory_iterator(dir)) fs::remove_all(e);
    auto t = Tracer::Create(Ring(0));
    ASSERT_TRUE(t.ok());
    const NameId name = *(*t)->InternName("forward");
    for (int i = 0; i < 100; ++i) (*t)->RecordSpan(SpanKind::kForward, name, i, 0, 1, 2);
    AgentOptions o = Options();
    o.drain_priority = priority;
    auto agent = Agent::Create(o);
    ASSERT_TRUE(agent.ok());
    std::atomic<pid_t> drain_tid{0};
    int drain_policy = -1;
    std::thread runner([&] {
      drain_tid = ::gettid();
      (*agent)->Run();
      drain_policy = ::sched_getscheduler(0);
    });
    while ((*agent)->rows_written() < 100) std::this_thread::yield();
    const auto state = nlohmann::json::parse(HttpGet((*agent)->port(), "/state"));
    EXPECT_EQ(state["rows_written"], 100);
    for (const auto& [tid, p] : PoliciesOfOtherThreads(drain_tid))
      EXPECT_EQ(p, SCHED_OTHER) << "thread " << tid;
    (*agent)->Stop();
    runner.join();
    EXPECT_EQ(drain_policy, policy);
  }
  EXPECT_FALSE(ParseDrainPriority("fast").has_value());
}

TEST_F(AgentTest, AFullDatabaseIsCountedAndLosesNothingAlreadyInTheRing) {
  auto t = Tracer::Create(Ring(0));
  ASSERT_TRUE(t.ok());
  const NameId name =
      *(*t)->InternName("a-span-name-long-enough-to-fill-pages-quickly-" + std::string(10, 'x'));
  for (int i = 0; i < 16000; ++i) (*t)->RecordSpan(SpanKind::kForward, name, i, 0, 1, 2);
  AgentOptions o = Options();
  o.max_db_mb = 1;  // a full disk, as far as SQLite can tell
  auto agent = Agent::Create(o);
  ASSERT_TRUE(agent.ok()) << agent.status().ToString();
  auto n = (*agent)->Poll(false);
  ASSERT_FALSE(n.ok());
  EXPECT_NE(n.status().message().find("full"), std::string::npos) << n.status().ToString();
  EXPECT_EQ((*agent)->db_errors(), 1u);
  EXPECT_NE((*agent)->MetricsText().find(
                "megascope_agent_db_errors_total{job=\"agenttest\",node=\"n0\"} 1"),
            std::string::npos);
  EXPECT_EQ(Count(Db(), "SELECT COUNT(*) FROM spans"),
            0);  // the failed transaction left nothing half-written
  agent->reset();
  // With room again, a new agent writes every record the ring kept.
  auto again = Agent::Create(Options());
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE((*again)->Poll(false).ok());
  EXPECT_EQ(Count(Db(), "SELECT COUNT(*) FROM spans"), 16000);
}

TEST_F(AgentTest, ARerunThatReusesRingNamesStartsFromItsOwnBeginning) {
  // A rank process that records `count` spans and exits, leaving its ring behind.
  auto run_rank = [&](int count, int first_step) {
    auto rank = Process::Fork([&] {
      auto t = Tracer::Create(Ring(0));
      if (!t.ok()) return 1;
      const NameId n = *(*t)->InternName("forward");
      const int64_t now = (*t)->Ticks();  // not near 0: the host's boot is past retention
      for (int i = 0; i < count; ++i)
        (*t)->RecordSpan(SpanKind::kForward, n, first_step + i, 0, now, now + 1);
      ::_exit(0);
      return 0;
    });
    return rank.ok() && (*rank)->Wait().success();
  };
  ASSERT_TRUE(run_rank(1000, 0));
  {
    auto agent = Agent::Create(Options());
    ASSERT_TRUE(agent.ok());
    ASSERT_EQ((*agent)->Poll(false).value(), 1000u);
  }
  // Same job, attempt and rank in the same run directory: the ring file name comes back, with
  // fewer records than the database's cursor for the old ring.
  ASSERT_TRUE(run_rank(10, 5000));
  auto agent = Agent::Create(Options());
  ASSERT_TRUE(agent.ok());
  size_t total = 0;
  for (int i = 0; i < 5; ++i) total += (*agent)->Poll(false).value();
  EXPECT_EQ(total, 10u);
  EXPECT_EQ(Count(Db(), "SELECT COUNT(*) FROM spans"), 1010);
}

TEST(HostSamplerTest, ReadsAFakeProcTree) {
  TempDir root;
  fs::create_directories(root.path() + "/net");
  auto write_stat = [&](uint64_t user, uint64_t idle) {
    std::ofstream(root.path() + "/stat")
        << "cpu  " << user << " 0 0 " << idle << " 0 0 0 0 0 0\ncpu0 1 2 3 4\n";
  };
  write_stat(100, 900);
  std::ofstream(root.path() + "/meminfo")
      << "MemTotal:       1000 kB\nMemFree:         100 kB\nMemAvailable:    400 kB\n";
  std::ofstream(root.path() + "/net/dev")
      << "Inter-|   Receive                                                |  Transmit\n"
         " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs "
         "drop fifo colls carrier compressed\n"
         "    lo: 5000 10 0 0 0 0 0 0 5000 10 0 0 0 0 0 0\n"
         "  eth0: 1000 10 0 0 0 0 0 0 2000 20 0 0 0 0 0 0\n"
         "  eth1: 10 1 0 0 0 0 0 0 20 2 0 0 0 0 0 0\n";
  std::ofstream(root.path() + "/diskstats") << "   8       0 sda 10 0 100 0 20 0 200 0 0 0 0\n"
                                               "   8       1 sda1 10 0 100 0 20 0 200 0 0 0 0\n"
                                               " 259       0 nvme0n1 1 0 8 0 2 0 16 0 0 0 0\n";
  HostSampler s(root.path());
  auto first = s.Sample();
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->cpu_utilization, 0);  // no previous sample yet
  EXPECT_EQ(first->memory_used_bytes, 600 * 1024);
  EXPECT_EQ(first->network_receive_bytes, 1010);
  EXPECT_EQ(first->network_transmit_bytes, 2020);
  EXPECT_EQ(first->disk_read_bytes, (100 + 8) * 512);  // partitions are not counted twice
  EXPECT_EQ(first->disk_write_bytes, (200 + 16) * 512);
  write_stat(400, 1600);  // +300 busy, +700 idle
  EXPECT_DOUBLE_EQ(s.Sample()->cpu_utilization, 0.3);
  EXPECT_FALSE(HostSampler(root.path() + "/missing").Sample().ok());
}

}  // namespace
}  // namespace megascope::tracer::agent
