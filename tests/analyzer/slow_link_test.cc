// Slow-link localisation (`link_slow`) on traces written through the real store with exact
// timings, independent of any training run: four hosts of one rank each, every step an
// all-reduce in a dp group ({0,1}, {2,3}) and one in an mp group ({0,2}, {1,3}). Once its members
// have arrived an all-reduce takes 1 ms -- longer where it crosses a slow link.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>

#include "store_run.h"
#include "test_util.h"

namespace megascope::analyzer {
namespace {

constexpr int kRanks = 4, kSteps = 20;
constexpr int64_t kMs = 1000000;

// A collective of every step: its group and size.
struct Collective {
  std::string group;
  uint64_t bytes = 65536;
};
// `transfer_ms(group name, step, bytes)`: how long that all-reduce takes once all have arrived.
// `extra`: groups beyond dp and mp. `per_step`: the all-reduces of every step, in order (by
// default one of 64 KB in each group).
std::string WriteRun(const std::string& dir,
                     const std::function<double(const std::string&, int, uint64_t)>& transfer_ms,
                     const std::vector<tracer::GroupInfo>& extra = {},
                     std::vector<Collective> per_step = {}) {
  const std::vector<std::string> names = {"forward"};
  std::vector<tracer::GroupInfo> all = {{"dp.0", "dp", {0, 1}},
                                        {"dp.1", "dp", {2, 3}},
                                        {"mp.0", "mp", {0, 2}},
                                        {"mp.1", "mp", {1, 3}}};
  all.insert(all.end(), extra.begin(), extra.end());
  if (per_step.empty()) {
    for (const tracer::GroupInfo& g : all) per_step.push_back({g.name});
  }
  auto groups_of = [&](int r) {  // indices into `all`, in order: a rank's local group ids
    std::vector<size_t> mine;
    for (size_t g = 0; g < all.size(); ++g) {
      if (std::find(all[g].ranks.begin(), all[g].ranks.end(), r) != all[g].ranks.end())
        mine.push_back(g);
    }
    return mine;
  };
  std::vector<std::vector<tracer::Record>> recs(kRanks);
  std::vector<int64_t> free_at(kRanks, 1000 * kMs);
  std::vector<uint64_t> entries(kRanks, 0), seq(all.size(), 0);
  for (int s = 0; s < kSteps; ++s) {
    for (int r = 0; r < kRanks; ++r) {
      tracer::Record rec{};
      rec.span = {tracer::RecordType::kSpan,
                  tracer::SpanKind::kForward,
                  0,
                  -1,
                  s,
                  free_at[r],
                  free_at[r] + 10 * kMs,
                  0,
                  0,
                  0,
                  0,
                  0,
                  {}};
      recs[r].push_back(rec);
      free_at[r] += 10 * kMs;
    }
    for (const Collective& c : per_step) {
      const size_t g = static_cast<size_t>(
          std::find_if(all.begin(), all.end(), [&](auto& x) { return x.name == c.group; }) -
          all.begin());
      const tracer::RankList& members = all.at(g).ranks;
      int64_t last = 0;
      for (int r : members) last = std::max(last, free_at[r]);
      const int64_t done =
          last + static_cast<int64_t>(transfer_ms(c.group, s, c.bytes) * static_cast<double>(kMs));
      ++seq[g];
      for (int r : members) {
        const auto mine = groups_of(r);
        const tracer::Record rec = CompletedAllreduce(
            static_cast<uint16_t>(std::find(mine.begin(), mine.end(), g) - mine.begin()), seq[g],
            ++entries[r], s, free_at[r], done, c.bytes);
        recs[r].push_back(rec);
        free_at[r] = done;
      }
    }
  }
  for (int r = 0; r < kRanks; ++r) {
    tracer::RankInfo info;
    info.job = "links";
    info.node = "host" + std::to_string(r);
    info.rank = r;
    info.world_size = kRanks;
    info.coords.dp = r / 2;
    info.coords.tp = r % 2;
    std::vector<tracer::GroupInfo> groups;
    for (size_t g : groups_of(r)) groups.push_back(all[g]);
    WriteRankRecords(dir, info, names, groups, recs[r]);
  }
  return dir;
}

std::vector<Verdict> SlowLinks(const std::string& run) { return SlowVerdicts(run, "link_slow"); }

// Every step: a 64-KB all-reduce in each group, and 4-byte ones beside them (two in each dp group,
// one in mp.1), as a training step's loss and norm reductions sit beside its gradients'.
std::vector<Collective> WithTinyAllReduces() {
  return {{"dp.0"},    {"dp.0", 4}, {"dp.0", 4}, {"dp.1"},   {"dp.1", 4},
          {"dp.1", 4}, {"mp.0"},    {"mp.1"},    {"mp.1", 4}};
}

TEST(SlowLinkTest, TheHostCommonToEverySlowGroupIsNamed) {
  megascope::testing::TempDir dir;
  // host3's link: dp.1 {2,3} and mp.1 {1,3} take 8 ms, the others 1 ms.
  const auto v = SlowLinks(WriteRun(dir.path(), [](const std::string& g, int, uint64_t) {
    return g == "dp.1" || g == "mp.1" ? 8.0 : 1.0;
  }));
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].root_nodes, std::vector<std::string>{"host3"});
  EXPECT_EQ(v[0].root_ranks, std::vector<int32_t>{3});
  EXPECT_NE(v[0].evidence[1].find("dp.1 (8.0x)"), std::string::npos) << v[0].evidence[1];
  // 7 ms more in each of two all-reduces per step.
  const std::string& cost = v[0].evidence[0];
  EXPECT_NEAR(std::stod(cost.substr(cost.find('=') + 1)), 0.007, 0.0005) << cost;
}

// On a busy machine a healthy group's 1-ms transfer can stretch several times over (a member
// preempted before it records the completion): slower than its kind by the ratio, but a few ms
// of a step that the slow link costs tens of ms. It must not hide the link (CI saw this).
TEST(SlowLinkTest, AStretchedHealthyTransferDoesNotHideTheSlowLink) {
  // A third kind of group, over healthy hosts only: x.0 {host0, host1}, x.1 {0, 2}, x.2 {1, 2}.
  const std::vector<tracer::GroupInfo> x = {
      {"x.0", "x", {0, 1}}, {"x.1", "x", {0, 2}}, {"x.2", "x", {1, 2}}};
  auto host3_and_x0 = [](double x0_ms) {
    return [x0_ms](const std::string& g, int, uint64_t) {
      if (g == "dp.1" || g == "mp.1") return 40.0;  // host3's link
      return g == "x.0" ? x0_ms : 1.0;
    };
  };
  megascope::testing::TempDir dir, two;
  // x.0 stretched to 7 ms: 6 ms of a step of about 95 ms, under the 10 % a slow link costs.
  const auto v = SlowLinks(WriteRun(dir.path(), host3_and_x0(7.0), x));
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].root_nodes, std::vector<std::string>{"host3"});
  EXPECT_EQ(v[0].evidence[1].find("x.0"), std::string::npos) << v[0].evidence[1];
  // x.0 at 40 ms too: a second slow link that no single host explains with host3's.
  EXPECT_TRUE(SlowLinks(WriteRun(two.path(), host3_and_x0(40.0), x)).empty());
}

// A link short of bandwidth (the testbed's tc rate limit) stretches 64 KB eightfold and 4 bytes
// not at all. The tiny all-reduces over host3 (two a step in each dp group, beside its 64-KB one)
// are compared with tiny ones: they neither make dp.1 look healthy nor clear host3 (CI saw both).
TEST(SlowLinkTest, ALinkShortOfBandwidthIsNamedThoughItsTinyCollectivesAreFast) {
  megascope::testing::TempDir dir;
  const auto v = SlowLinks(WriteRun(
      dir.path(),
      [](const std::string& g, int, uint64_t bytes) {
        return bytes > 4 && (g == "dp.1" || g == "mp.1") ? 8.0 : 1.0;
      },
      {}, WithTinyAllReduces()));
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].root_nodes, std::vector<std::string>{"host3"});
  EXPECT_NE(v[0].evidence[1].find("dp.1 (8.0x)"), std::string::npos) << v[0].evidence[1];
  EXPECT_NE(v[0].evidence[1].find("mp.1 (8.0x)"), std::string::npos) << v[0].evidence[1];
}

// On a loaded machine a preempted rank may stretch another group's tiny transfers every step:
// dp.0's 4-byte all-reduces at 4 ms (6 ms a step, a jitter beside host3's 78). In that size class
// host3's tiny transfers are fast, as a link short of bandwidth leaves them: they say nothing of
// host3's link and must not clear it.
TEST(SlowLinkTest, JitterInAnotherSizeClassDoesNotClearTheSlowLink) {
  megascope::testing::TempDir dir;
  const auto v = SlowLinks(WriteRun(
      dir.path(),
      [](const std::string& g, int, uint64_t bytes) {
        if (bytes > 4) return g == "dp.1" || g == "mp.1" ? 40.0 : 1.0;
        return g == "dp.0" ? 4.0 : 1.0;
      },
      {}, WithTinyAllReduces()));
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].root_nodes, std::vector<std::string>{"host3"});
  EXPECT_EQ(v[0].evidence[1].find("dp.0"), std::string::npos) << v[0].evidence[1];
}

TEST(SlowLinkTest, ASlowPathBetweenTwoHostsNamesBothEnds) {
  megascope::testing::TempDir dir;
  const auto v = SlowLinks(WriteRun(
      dir.path(), [](const std::string& g, int, uint64_t) { return g == "dp.1" ? 6.0 : 1.0; }));
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].root_nodes, (std::vector<std::string>{"host2", "host3"}));
}

TEST(SlowLinkTest, EvenTransfersAndJitterNameNoLink) {
  megascope::testing::TempDir even, jitter, passing;
  EXPECT_TRUE(SlowLinks(WriteRun(even.path(), [](const std::string&, int, uint64_t) {
                return 1.0;
              })).empty());
  // Every group is now and then slow: no group's median moves.
  EXPECT_TRUE(SlowLinks(WriteRun(jitter.path(), [](const std::string& g, int s, uint64_t) {
                return (s + static_cast<int>(g.back())) % 5 == 0 ? 9.0 : 1.0;
              })).empty());
  // host3's link slow in 8 of 20 steps: a passing episode, not a slow link.
  EXPECT_TRUE(SlowLinks(WriteRun(passing.path(), [](const std::string& g, int s, uint64_t) {
                return (g == "dp.1" || g == "mp.1") && s % 5 < 2 ? 8.0 : 1.0;
              })).empty());
}

TEST(SlowLinkTest, ASlowdownTooSmallToMatterIsNotReported) {
  megascope::testing::TempDir dir;
  // host3's transfers 3x slower, but 0.1 -> 0.3 ms costs 0.4 ms of a 10-ms step (under 5 %).
  const auto v = SlowLinks(WriteRun(dir.path(), [](const std::string& g, int, uint64_t) {
    return g == "dp.1" || g == "mp.1" ? 0.3 : 0.1;
  }));
  EXPECT_TRUE(v.empty()) << v.front().explanation;
}

TEST(SlowWindowTest, AWindowIsStoredOnceEveryRanksEndOfItIs) {
  // Four ranks stored through the last step, and a fifth whose agent stores steps 0..10, then
  // 11..15 after the watcher has looked once: each look reads what was stored since the last.
  megascope::testing::TempDir dir;
  StoredSteps stored(dir.path());
  ASSERT_TRUE(stored.Refresh().ok());  // no nodes yet
  EXPECT_EQ(stored.RanksThrough(-1, 0), 0);
  WriteRun(dir.path(), [](const std::string&, int, uint64_t) { return 1.0; });
  tracer::RankInfo late;
  late.job = "links";
  late.node = "host4";
  late.rank = 4;
  late.world_size = kRanks + 1;
  auto store_late = [&](int from, int to) {
    std::vector<tracer::Record> recs;
    for (int s = from; s <= to; ++s) {
      tracer::Record rec{};
      rec.span = {tracer::RecordType::kSpan,
                  tracer::SpanKind::kForward,
                  0,
                  -1,
                  s,
                  s * kMs,
                  (s + 1) * kMs,
                  0,
                  0,
                  0,
                  0,
                  0,
                  {}};
      recs.push_back(rec);
    }
    WriteRankRecords(dir.path(), late, {"forward"}, {}, recs);
  };
  store_late(0, 10);
  auto through = [&](int attempt, int64_t step) {
    const Status st = stored.Refresh();
    EXPECT_TRUE(st.ok()) << st.ToString();
    return stored.RanksThrough(attempt, step);
  };
  EXPECT_EQ(through(-1, 10), kRanks + 1);
  EXPECT_EQ(through(-1, 11), kRanks);
  EXPECT_EQ(through(-1, kSteps - 1), kRanks);
  EXPECT_EQ(through(-1, kSteps), 0);
  EXPECT_EQ(through(0, 10), kRanks + 1);  // every rank here is of attempt 0
  EXPECT_EQ(through(1, 0), 0);
  store_late(11, 15);
  EXPECT_EQ(through(-1, 15), kRanks + 1);
  EXPECT_EQ(through(-1, 16), kRanks);
  // The same answers as a reader of the whole run (the `spans` view: spans and completed
  // collectives) gives.
  auto db = RunDatabase::Open(dir.path());
  ASSERT_TRUE(db.ok()) << db.status().ToString();
  for (int64_t step : {0, 10, 15, 16, kSteps - 1, kSteps}) {
    auto t = (*db)->Query("SELECT COUNT(DISTINCT rank) FROM spans WHERE step >= " +
                          std::to_string(step));
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    EXPECT_EQ(std::to_string(stored.RanksThrough(-1, step)), t->rows.at(0).at(0)) << step;
  }
}

}  // namespace
}  // namespace megascope::analyzer
