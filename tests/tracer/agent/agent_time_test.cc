// The agent's decisions over time -- retention and how stale a rank is -- under its own clock.
#include "agent_fixture.h"

namespace megascope::tracer::agent {
namespace {

// An always-on agent keeps a window of rows: one older than --retain-hours goes (summed into
// step_rollups first), a newer one stays.
TEST_F(AgentTest, AnAlwaysOnAgentKeepsItsRetentionWindow) {
  ASSERT_TRUE(TraceStore::Open(Db()).ok());
  const int64_t now = WallNowNs(), hour = int64_t{3600} * 1000000000;
  {
    auto db = sql::Database::Open(Db(), sql::Database::Mode::kReadWrite);
    ASSERT_TRUE(db.ok());
    const std::string fwd = std::to_string(static_cast<int>(SpanKind::kForward));
    ASSERT_TRUE(db->Exec("INSERT INTO span_rows VALUES(0, 0, 1, NULL, " + fwd + ", 'forward', " +
                         std::to_string(now - 3 * hour) + ", 1000), (0, 0, 2, NULL, " + fwd +
                         ", 'forward', " + std::to_string(now - 60000000000) + ", 1000)")
                    .ok());
  }
  AgentOptions o = Options();
  o.retain_hours = 1;
  auto agent = Agent::Create(o);
  ASSERT_TRUE(agent.ok()) << agent.status().ToString();
  ASSERT_TRUE((*agent)->Poll(false).ok());
  EXPECT_EQ(Count(Db(), "SELECT COUNT(*) FROM spans WHERE kind = 'forward'"), 1);
  EXPECT_EQ(Count(Db(), "SELECT step FROM spans WHERE kind = 'forward'"), 2) << "the newer stays";
  EXPECT_EQ(Count(Db(), "SELECT SUM(count) FROM step_rollups WHERE step = 1 AND what = 'forward'"),
            1);
}

// The agent's time, moved by the test: monotonic and wall time advance together.
class FakeAgentClock final : public LoopClock {
 public:
  explicit FakeAgentClock(int64_t wall_ns) : wall_ns_(wall_ns) {}
  TimePoint Now() override { return now_; }
  int64_t WallNs() override { return wall_ns_ + (now_ - TimePoint{}).count(); }
  void Sleep(std::chrono::duration<double> d) override {
    now_ += std::chrono::duration_cast<std::chrono::steady_clock::duration>(d);
  }

 private:
  TimePoint now_{};
  int64_t wall_ns_;
};

// Retention under the agent's clock: it runs at once, then only every retain_every_s, and cuts at
// retain_hours before the clock's wall time -- a row older than the window stays until a pass is
// due.
TEST_F(AgentTest, RetentionRunsWhenDueAndCutsAtTheWindowByTheAgentsClock) {
  ASSERT_TRUE(TraceStore::Open(Db()).ok());
  const int64_t wall = 1'790'000'000'000'000'000, minute = int64_t{60} * 1000000000;
  {
    auto db = sql::Database::Open(Db(), sql::Database::Mode::kReadWrite);
    ASSERT_TRUE(db.ok());
    const std::string fwd = std::to_string(static_cast<int>(SpanKind::kForward));
    std::string rows;
    for (const auto& [step, at] :
         {std::pair{1, wall - 30 * minute}, std::pair{2, wall - 10 * minute},
          std::pair{3, wall + 50 * minute}})
      rows += std::string(rows.empty() ? "" : ", ") + "(0, 0, " + std::to_string(step) +
              ", NULL, " + fwd + ", 'forward', " + std::to_string(at) + ", 1000)";
    ASSERT_TRUE(db->Exec("INSERT INTO span_rows VALUES " + rows).ok());
  }
  FakeAgentClock clock(wall);
  AgentOptions o = Options();
  o.clock = &clock;
  o.retain_hours = 1;
  o.retain_every_s = 3600;
  auto agent = Agent::Create(o);
  ASSERT_TRUE(agent.ok()) << agent.status().ToString();
  const std::string steps = "SELECT COUNT(*) FROM span_rows";
  ASSERT_TRUE((*agent)->Poll(false).ok());  // the first pass prunes at once: nothing is an hour old
  EXPECT_EQ(Count(Db(), steps), 3);
  clock.Sleep(std::chrono::minutes(40));  // step 1 is 70 minutes old, but no pass is due yet
  ASSERT_TRUE((*agent)->Poll(false).ok());
  EXPECT_EQ(Count(Db(), steps), 3);
  clock.Sleep(std::chrono::minutes(21));  // due: the window ends a minute past the start
  ASSERT_TRUE((*agent)->Poll(false).ok());
  EXPECT_EQ(Count(Db(), "SELECT MIN(step) FROM span_rows"), 3);
  EXPECT_EQ(Count(Db(), steps), 1);
  EXPECT_EQ(Count(Db(), "SELECT SUM(count) FROM step_rollups WHERE what = 'forward'"), 2);
}

// How stale a rank is, by the agent's clock: the heartbeat's age in /metrics and /state is the
// agent's wall time less the rank's last heartbeat, pass after pass.
TEST_F(AgentTest, AHeartbeatsAgeIsTheAgentsWallTimeLessTheRanksLastBeat) {
  const int64_t beat = 1'790'000'000'000'000'000;
  auto t = Tracer::Create(Ring(1), std::make_shared<megascope::tracer::FakeClock>(beat));
  ASSERT_TRUE(t.ok());
  (*t)->SetPhase(4, Phase::kForward);
  FakeAgentClock clock(beat + 7'000'000'000);
  AgentOptions o = Options();
  o.clock = &clock;
  auto agent = Agent::Create(o);
  ASSERT_TRUE(agent.ok()) << agent.status().ToString();
  const std::string series =
      "megascope_heartbeat_age_seconds{dp=\"0\",job=\"agenttest\",node=\"n0\",pp=\"0\",rank="
      "\"1\",tp=\"1\"} ";
  for (const double age : {7.0, 12.0}) {
    ASSERT_TRUE((*agent)->Poll(true).ok());
    const std::string metrics = (*agent)->MetricsText();
    const auto at = metrics.find(series);
    ASSERT_NE(at, std::string::npos) << metrics;
    EXPECT_DOUBLE_EQ(std::atof(metrics.c_str() + at + series.size()), age);
    const auto state = nlohmann::json::parse((*agent)->StateJson());
    EXPECT_DOUBLE_EQ(state["ranks"][0]["heartbeat"]["age_s"].get<double>(), age);
    EXPECT_EQ(state["ranks"][0]["heartbeat"]["step"], 4);
    clock.Sleep(std::chrono::seconds(5));
  }
}

}  // namespace
}  // namespace megascope::tracer::agent
