// Agent ingest: rows per second from rank rings into trace.db on one core (target >= 1 M rows/s).
// 8 rings of 1 M records each (spans, with a collective every 8th record), drained by Agent::Poll;
// then retention (TraceStore::Prune) drops the older half of the spans, its cost per row beside
// ingest's.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "bench_main.h"
#include "megascope/tracer/agent/agent.h"
#include "megascope/tracer/sqlite.h"
#include "megascope/tracer/trace_store.h"
#include "megascope/tracer/tracer.h"

using namespace megascope::tracer;

namespace {

// `rings` rings of `per_ring` records each (spans, a collective every 8th), in `shm`.
megascope::Result<std::vector<std::unique_ptr<Tracer>>> FillRings(const std::string& shm, int rings,
                                                                  int per_ring) {
  std::vector<std::unique_ptr<Tracer>> tracers;
  for (int r = 0; r < rings; ++r) {
    RingOptions o;
    o.dir = shm;
    o.job = "bench";
    o.rank = r;
    o.world_size = rings;
    o.lanes = 1;
    o.lane_capacity = 1u << 20;
    ASSIGN_OR_RETURN(std::unique_ptr<Tracer> t, Tracer::Create(o));
    const GroupId g = *t->RegisterGroup("tp.0.0", "tp", std::vector<int32_t>{r});
    const NameId n = *t->InternName("forward");
    for (int i = 0; i < per_ring; ++i) {
      if (i % 8 == 7) {
        OpHandle h = t->Enqueue(g, OpType::kAllreduce, 4096, DType::kF32);
        t->Start(h);
        t->Complete(h);
      } else {
        t->RecordSpan(SpanKind::kForward, n, i / 8, 0, 1000 + i, 2000 + i);
      }
    }
    tracers.push_back(std::move(t));
  }
  return tracers;
}

// Retention over the ingested file: drops the older half of the spans (rolled up per step first)
// and prints its cost per row beside ingest's (`ingest_cpu_per_row`, measured in the same run).
megascope::Status Retention(const std::string& db_path, double ingest_cpu_per_row) {
  ASSIGN_OR_RETURN(auto store, TraceStore::Open(db_path));
  int64_t cutoff = 0;  // the start of the middle span row: half the spans are older
  {
    ASSIGN_OR_RETURN(auto db, sql::Database::Open(db_path, sql::Database::Mode::kReadOnly));
    ASSIGN_OR_RETURN(cutoff, db.QueryInt("SELECT start_ns FROM span_rows ORDER BY rowid LIMIT 1 "
                                         "OFFSET (SELECT COUNT(*) / 2 FROM span_rows)"));
  }
  const auto p0 = std::chrono::steady_clock::now();
  const clock_t pc0 = std::clock();
  ASSIGN_OR_RETURN(const int64_t dropped, store->Prune(cutoff));
  const double pwall = std::chrono::duration<double>(std::chrono::steady_clock::now() - p0).count();
  const double pcpu = static_cast<double>(std::clock() - pc0) / CLOCKS_PER_SEC;
  std::printf(
      "retention: %lld rows dropped (rolled up per step first) in %.2f s wall (%.2f s CPU): "
      "%.2f M rows/s per CPU second, %.2f x ingest's CPU cost per row\n",
      static_cast<long long>(dropped), pwall, pcpu, static_cast<double>(dropped) / pcpu / 1e6,
      (pcpu / static_cast<double>(dropped)) / ingest_cpu_per_row);
  return megascope::Status::Ok();
}

int Run(int argc, char** argv) {
  const int rings = 8, per_ring = argc > 1 ? std::atoi(argv[1]) : 1 << 20;
  const std::string shm = "/dev/shm/megascope-bench-" + std::to_string(::getpid());
  const std::string run = "/tmp/megascope-bench-" + std::to_string(::getpid());
  std::filesystem::create_directories(shm);
  auto tracers = FillRings(shm, rings, per_ring);
  if (!tracers.ok()) {
    std::fprintf(stderr, "%s\n", tracers.status().ToString().c_str());
    return 1;
  }
  agent::AgentOptions ao;
  ao.node = "node0";
  ao.run_dir = run;
  ao.job = "bench";
  ao.shm_dir = shm;
  auto a = agent::Agent::Create(ao);
  if (!a.ok()) {
    std::fprintf(stderr, "%s\n", a.status().ToString().c_str());
    return 1;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const clock_t c0 = std::clock();
  size_t rows = 0;
  for (;;) {
    auto n = (*a)->Poll(false);
    if (!n.ok() || *n == 0) break;
    rows += *n;
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double cpu = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
  std::printf(
      "agent ingest: %zu rows from %d rings in %.2f s wall (%.2f s CPU): %.2f M rows/s wall, %.2f "
      "M rows/s per CPU second (target >= 1 M rows/s)\n",
      rows, rings, wall, cpu, static_cast<double>(rows) / wall / 1e6,
      static_cast<double>(rows) / cpu / 1e6);
  a->reset();
  if (auto st = Retention(run + "/nodes/node0/trace.db", cpu / static_cast<double>(rows));
      !st.ok()) {
    std::fprintf(stderr, "%s\n", st.ToString().c_str());
    return 1;
  }
  tracers->clear();
  std::filesystem::remove_all(shm);
  std::filesystem::remove_all(run);
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return megascope::bench::Main("agent_ingest", Run, argc, argv); }
