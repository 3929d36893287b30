// Hang analysis at scale: synthetic snapshots of 12,288 and 100,000 ranks (each rank's recent
// flight-recorder entries; one rank never joined its data-parallel all-reduce), analysed in memory.
// Targets (issue 5): 12,288 ranks <= 1 s, 100,000 ranks <= 10 s.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "megascope/analyzer/hang.h"
#include "megascope/analyzer/timeline.h"
#include "megascope/tracer/trace_store.h"

using namespace megascope;
using namespace megascope::analyzer;
using tracer::FlightEntry;

namespace {

HangInput Snapshot(int dp, int tp, int pp, int stuck) {
  const int world = dp * tp * pp;
  const int64_t t0 = 1763700000'000000000LL, now = t0 + 120'000'000'000LL;
  std::vector<std::pair<std::string, tracer::Dump>> dumps;
  dumps.reserve(world);
  for (int r = 0; r < world; ++r) {
    const int t = r % tp, d = (r / tp) % dp, p = r / (tp * dp);
    auto rank = [&](int dd, int pp_, int tt) { return tt + tp * (dd + dp * pp_); };
    tracer::Dump dump;
    auto& s = dump.snapshot;
    s.info = {"scale", "node" + std::to_string(r / 8), r, world, r % 8, 0, 1000 + r, {d, p, t}, 0};
    s.heartbeat = {7, tracer::Phase::kBackward, 0, now - 100'000'000};
    tracer::GroupInfo tpg{"tp." + std::to_string(p) + "." + std::to_string(d), "tp", {}};
    for (int i = 0; i < tp; ++i) tpg.ranks.push_back(rank(d, p, i));
    tracer::GroupInfo dpg{"dp." + std::to_string(p) + "." + std::to_string(t), "dp", {}};
    for (int i = 0; i < dp; ++i) dpg.ranks.push_back(rank(i, p, t));
    tracer::GroupInfo ppg{"pp." + std::to_string(d) + "." + std::to_string(t), "pp", {}};
    for (int i = 0; i < pp; ++i) ppg.ranks.push_back(rank(d, i, t));
    s.groups = {tpg, dpg, ppg};
    // Recent history: 8 tensor-parallel all-reduces, then the data-parallel one (open, 60 s).
    for (int k = 0; k < 8; ++k) {
      FlightEntry e;
      e.id = k + 1;
      e.group = 0;
      e.seq = 100 + k;
      e.state = tracer::OpState::kCompleted;
      e.bytes = 65536;
      e.enqueued_at_ns = e.started_at_ns = t0 + k * 1'000'000;
      e.completed_at_ns = e.started_at_ns + 500'000;
      s.entries.push_back(e);
    }
    if (r != stuck) {
      FlightEntry e;
      e.id = 9;
      e.group = 1;
      e.seq = 7;
      e.bytes = 1 << 20;
      e.state = tracer::OpState::kStarted;
      e.enqueued_at_ns = e.started_at_ns = now - 60'000'000'000LL;
      s.entries.push_back(e);
    } else {
      s.heartbeat.phase = tracer::Phase::kForward;
    }
    // dp seq 6 completed everywhere: the stuck rank issued it, then stopped.
    FlightEntry prev;
    prev.id = 10;
    prev.group = 1;
    prev.seq = 6;
    prev.bytes = 1 << 20;
    prev.state = tracer::OpState::kCompleted;
    prev.enqueued_at_ns = prev.started_at_ns = t0;
    prev.completed_at_ns = t0 + 1;
    s.entries.insert(s.entries.begin(), prev);
    dump.alive = true;
    dump.dumped_at_ns = now;
    dumps.emplace_back("rank_" + std::to_string(r) + ".json", std::move(dump));
  }
  return std::move(MakeHangInput(std::move(dumps))).value();
}

void Run(int dp, int tp, int pp, double target_s) {
  const int world = dp * tp * pp, stuck = world / 3;
  HangInput in = Snapshot(dp, tp, pp, stuck);
  const auto t0 = std::chrono::steady_clock::now();
  auto verdicts = AnalyzeHang(in);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const bool right = verdicts.size() == 1 && verdicts[0].root_ranks == std::vector<int32_t>{stuck};
  std::printf(
      "%6d ranks (dp=%d tp=%d pp=%d): analysis %.3f s (target <= %.0f s), verdict %s %s rank %d: "
      "%s\n",
      world, dp, tp, pp, s, target_s, verdicts[0].kind.c_str(), verdicts[0].cause.c_str(),
      verdicts[0].root_ranks.empty() ? -1 : verdicts[0].root_ranks[0], right ? "right" : "WRONG");
}

}  // namespace

// Timeline export of 1 M spans (64 ranks x 1000 steps x ~16 spans) from a run directory.
void Timeline() {
  const std::string dir = "/tmp/megascope-timeline-bench-" + std::to_string(::getpid());
  constexpr int kRanks = 64, kSteps = 1000, kPerStep = 16;
  {
    auto store = tracer::TraceStore::Open(dir + "/nodes/node0/trace.db");
    std::vector<std::string> names = {"forward", "backward", "allreduce"};
    std::vector<tracer::GroupInfo> groups;
    std::vector<tracer::Record> recs;
    for (int r = 0; r < kRanks; ++r) {
      tracer::RankInfo info;
      info.rank = r;
      info.node = "node0";
      info.coords = {r % 4, r / 16, (r / 4) % 4};
      (void)(*store)->UpsertRank(info);
      recs.clear();
      for (int s = 0; s < kSteps; ++s) {
        for (int k = 0; k < kPerStep; ++k) {
          tracer::Record rec{};
          rec.span.type = tracer::RecordType::kSpan;
          rec.span.kind = static_cast<tracer::SpanKind>(k % 3 == 2 ? 5 : k % 2);
          rec.span.name = static_cast<uint16_t>(k % 3);
          rec.span.step = s;
          rec.span.microbatch = k / 4;
          rec.span.start_ticks = 1'763'700'000'000'000'000LL + (s * kPerStep + k) * 1'000'000LL;
          rec.span.end_ticks = rec.span.start_ticks + 900'000;
          recs.push_back(rec);
        }
      }
      const std::string ring = std::to_string(r);
      tracer::RingRows rows{&info, {}, &names, &groups, recs, ring, {}};
      (void)(*store)->Write(std::span<const tracer::RingRows>(&rows, 1), {}, {});
    }
  }
  auto db = RunDatabase::Open(dir);
  const auto t0 = std::chrono::steady_clock::now();
  TimelineStats stats;
  auto json = TimelineJson(**db, TimelineOptions{}, &stats);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "timeline export: %lld spans of %lld ranks -> %.1f MB of JSON in %.2f s (target <= 3 s)\n",
      static_cast<long long>(stats.spans), static_cast<long long>(stats.ranks),
      json.ok() ? json->size() / 1e6 : 0.0, s);
  std::filesystem::remove_all(dir);
}

int main() {
  Run(96, 8, 16, 1.0);    // 12,288 ranks
  Run(625, 8, 20, 10.0);  // 100,000 ranks
  Timeline();
  return 0;
}
