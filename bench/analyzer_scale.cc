// Hang analysis at scale: synthetic dumps of 12,288 and 100,000 ranks (each rank's recent
// flight-recorder entries; one rank never joined its data-parallel all-reduce), analysed in memory,
// and 12,288 dump files analysed end to end from disk.
// Targets: 12,288 ranks <= 1 s and 100,000 ranks <= 10 s in memory (issue 5); 12,288 files loaded
// and analysed <= 2 s (issue 10).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "megascope/analyzer/hang.h"
#include "megascope/analyzer/timeline.h"
#include "megascope/tracer/file_util.h"
#include "megascope/tracer/trace_store.h"
#include "scale_layout.h"

using namespace megascope;
using namespace megascope::analyzer;
using tracer::FlightEntry;

namespace {

// Every rank's dump: its groups and `history` completed entries of the benchmark job
// (scale_layout.h), then the open data-parallel all-reduce that `stuck` never joined.
std::vector<std::pair<std::string, tracer::Dump>> Dumps(int dp, int tp, int pp, int stuck,
                                                        int history) {
  const bench::ScaleLayout job{dp, tp, pp};
  const int world = job.world();
  const int64_t t0 = 1763700000'000000000LL, now = t0 + 120'000'000'000LL;
  std::vector<std::pair<std::string, tracer::Dump>> dumps;
  dumps.reserve(world);
  for (int r = 0; r < world; ++r) {
    tracer::Dump dump;
    auto& s = dump.snapshot;
    s.info = {
        "scale", "node" + std::to_string(r / 8), r, world, r % 8, 0, 1000 + r, job.CoordsOf(r), 0};
    s.heartbeat = {7, tracer::Phase::kBackward, 0, now - 100'000'000};
    s.groups = job.Groups(r);
    const int steps = (history + job.kPerStep - 1) / job.kPerStep;
    std::vector<uint64_t> coll_seq(s.groups.size()), send_seq(1), recv_seq(1);
    int64_t at = t0;
    for (int k = 0; k < steps * job.kPerStep; ++k) {
      const bench::ScaleLayout::Op op = job.OpAt(r, k);
      FlightEntry e;
      e.state = tracer::OpState::kCompleted;
      e.enqueued_at_ns = at;
      e.started_at_ns = at + 2'000;
      e.completed_at_ns = at + 500'000;
      at += 1'000'000;
      e.group = op.group;
      e.op = op.op;
      e.peer = op.peer;
      e.bytes = op.bytes;
      if (op.op == tracer::OpType::kSend) {
        e.seq = send_seq[0]++;
        e.bytes_sent = static_cast<int64_t>(e.bytes);
        e.bytes_received = 0;
      } else if (op.op == tracer::OpType::kRecv) {
        e.seq = recv_seq[0]++;
        e.bytes_sent = 0;
        e.bytes_received = static_cast<int64_t>(e.bytes);
      } else {
        e.seq = coll_seq[op.group]++;
      }
      if (steps * job.kPerStep - k <= history) s.entries.push_back(e);
    }
    if (r != stuck) {
      FlightEntry e;
      e.group = job.kDp;
      e.seq = coll_seq[job.kDp];
      e.bytes = 1 << 20;
      e.state = tracer::OpState::kStarted;
      e.enqueued_at_ns = e.started_at_ns = now - 60'000'000'000LL;
      s.entries.push_back(e);
    } else {
      s.heartbeat.phase = tracer::Phase::kForward;
    }
    for (size_t i = 0; i < s.entries.size(); ++i) s.entries[i].id = i + 1;
    dump.alive = true;
    dump.dumped_at_ns = now;
    dumps.emplace_back("rank_" + std::to_string(r) + ".json", std::move(dump));
  }
  return dumps;
}

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string Describe(const std::vector<Verdict>& v, int stuck) {
  const bool right = v.size() == 1 && v[0].root_ranks == std::vector<int32_t>{stuck};
  return "verdict " + std::string(Name(v[0].kind)) + " " + v[0].cause + " rank " +
         std::to_string(v[0].root_ranks.empty() ? -1 : v[0].root_ranks[0]) + ": " +
         (right ? "right" : "WRONG");
}

void Run(int dp, int tp, int pp, double target_s) {
  const int world = dp * tp * pp, stuck = world / 3;
  auto dumps = Dumps(dp, tp, pp, stuck, 9);
  const auto t0 = std::chrono::steady_clock::now();
  HangInput in = std::move(MakeHangInput(std::move(dumps))).value();  // each rank indexed
  const double indexed = Since(t0);
  auto verdicts = AnalyzeHang(in);
  const double total = Since(t0);
  std::printf(
      "%6d ranks (dp=%d tp=%d pp=%d) in memory: index %.3f s + analysis %.3f s = %.3f s (target "
      "<= %.0f s), %s\n",
      world, dp, tp, pp, indexed, total - indexed, total, target_s,
      Describe(verdicts, stuck).c_str());
}

// End to end from a directory of dump files as ranks write them (each `history` entries deep):
// read, parse, check membership across ranks, analyse.
void OnDisk(int dp, int tp, int pp, int history, double target_s) {
  const int world = dp * tp * pp, stuck = world / 3;
  const std::string dir = "/tmp/megascope-dumps-bench-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  size_t bytes = 0;
  for (auto& [name, d] : Dumps(dp, tp, pp, stuck, history)) {
    const std::string text = tracer::DumpToJson(d);
    bytes += text.size();
    if (Status st = tracer::WriteFileAtomic(dir + "/" + name, text); !st.ok()) {
      std::fprintf(stderr, "%s\n", st.ToString().c_str());
      std::exit(1);
    }
  }
  auto t0 = std::chrono::steady_clock::now();
  auto in = LoadDumpDirectory(dir);
  const double load_s = Since(t0);
  if (!in.ok()) {
    std::fprintf(stderr, "%s\n", in.status().ToString().c_str());
    std::exit(1);
  }
  t0 = std::chrono::steady_clock::now();
  auto verdicts = AnalyzeHang(*in);
  const double analyse_s = Since(t0);
  std::printf(
      "%6d dump files of %d entries (%.0f MB, %.1f KB each) on disk: load %.2f s + analysis %.2f "
      "s = %.2f s (target <= %.0f s), %s\n",
      world, history + 1, static_cast<double>(bytes) / 1e6,
      static_cast<double>(bytes) / 1e3 / world, load_s, analyse_s, load_s + analyse_s, target_s,
      Describe(verdicts, stuck).c_str());
  std::filesystem::remove_all(dir);
}

}  // namespace

// Timeline export of 1 M spans (64 ranks x 1000 steps x ~16 spans) from a run directory.
void Timeline() {
  const std::string dir = "/tmp/megascope-timeline-bench-" + std::to_string(::getpid());
  constexpr int kRanks = 64, kSteps = 1000, kPerStep = 16;
  {
    auto store = tracer::TraceStore::Open(dir + "/nodes/node0/trace.db");
    // Per step and rank: forward and backward spans and completed all-reduces (a third each).
    std::vector<std::string> names = {"forward", "backward"};
    std::vector<tracer::GroupInfo> groups = {tracer::GroupInfo{"dp.0", "dp", {0, 1}}};
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
          const int64_t start = 1'763'700'000'000'000'000LL + (s * kPerStep + k) * 1'000'000LL;
          if (k % 3 == 2) {
            rec.collective.type = tracer::RecordType::kCollective;
            rec.collective.op = tracer::OpType::kAllreduce;
            rec.collective.state = tracer::OpState::kCompleted;
            rec.collective.peer = -1;
            rec.collective.seq = static_cast<uint64_t>(s) * kPerStep + static_cast<uint64_t>(k);
            rec.collective.entry_id = rec.collective.seq + 1;
            rec.collective.bytes = 1 << 20;
            rec.collective.enqueued_ticks = start;
            rec.collective.started_ticks = start;
            rec.collective.completed_ticks = start + 900'000;
            rec.collective.step = s;
          } else {
            rec.span.type = tracer::RecordType::kSpan;
            rec.span.kind = static_cast<tracer::SpanKind>(k % 2);
            rec.span.name = static_cast<uint16_t>(k % 2);
            rec.span.step = s;
            rec.span.microbatch = k / 4;
            rec.span.start_ticks = start;
            rec.span.end_ticks = start + 900'000;
          }
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
      json.ok() ? static_cast<double>(json->size()) / 1e6 : 0.0, s);
  std::filesystem::remove_all(dir);
}

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "timeline") {  // only the export
    Timeline();
    return 0;
  }
  Run(96, 8, 16, 1.0);          // 12,288 ranks
  Run(625, 8, 20, 10.0);        // 100,000 ranks
  OnDisk(96, 8, 16, 255, 2.0);  // docs/formats.md's least history: 256 entries a rank
  Timeline();
  return 0;
}
