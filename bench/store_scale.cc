// The fleet's ClickHouse store against trace.db (issue 70), side by side in one run, on a
// ClickHouse server already running (bench/store_scale.sh starts one on loopback):
//   ingest:  one node's 8 ranks, 10 minutes of 200-ms steps (fleet_scale's shape: a forward span,
//            4 tensor-parallel and 1 data-parallel all-reduce a rank a step), written to trace.db
//            through the real store (the agent's drain), then shipped by the agent's sink:
//            rows/s of each, and the bytes on disk per rank-step in each (ClickHouse's after
//            its parts merged);
//   window:  that node copied to NODES nodes inside ClickHouse (INSERT ... SELECT, each copy its
//            own src, node and ranks, one node's ranks computing 1.5x longer), then the
//            controller's 8-step straggler window read from the store and analysed, and the
//            question a tick would ask it (each rank's newest heartbeat): against
//            bench/results/fleet_scale.txt's fan-out over 1,536 agents;
//   views:   `query --store stragglers --job J --since 10m` and `steps` timed (median of three at
//            200 nodes or fewer, one run above), against fleet_scale's `query --from-agents`.
//   hour:    (with `hour`) the 50 minutes before made in rank_steps, and the views over the last
//            10 minutes and over the hour.
// Usage: store_scale URL [NODES=200] [hour]
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "bench_main.h"
#include "megascope/analyzer/slow.h"
#include "megascope/analyzer/store_views.h"
#include "megascope/tracer/agent/store_sink.h"
#include "megascope/tracer/clickhouse.h"
#include "megascope/tracer/trace_store.h"
#include "node_trace.h"

using namespace megascope;

namespace {

constexpr int kRanks = 8;
constexpr int64_t kStep = bench::kNodeStepNs, kSteps = bench::kNodeSteps;

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

double FileBytes(const std::string& path) {
  double total = 0;
  for (const char* suffix : {"", "-wal"}) {
    struct stat st {};
    if (::stat((path + suffix).c_str(), &st) == 0) total += static_cast<double>(st.st_size);
  }
  return total;
}

int Fail(const Status& st) {
  std::fprintf(stderr, "store_scale: %s\n", st.ToString().c_str());
  return 1;
}

// 1. ingest: trace.db, then the sink, one after the other on the same rows.
Status MeasureIngest(tracer::ClickHouse& ch, const std::string& db_path, int64_t now) {
  ASSIGN_OR_RETURN(auto store, tracer::TraceStore::Open(db_path));
  auto t0 = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(const size_t rows, bench::WriteTenMinutes(*store, "store", kRanks, kRanks, now,
                                                             /*heartbeats=*/true));
  const double write_s = Since(t0);
  tracer::agent::StoreSinkOptions so;
  so.url = ch.url();
  so.job = "store";
  so.node = "node0";
  so.db_path = db_path;
  so.batch_rows = 20000;
  so.batches_per_table = 1 << 20;
  so.timeout_ms = 600000;
  ASSIGN_OR_RETURN(auto sink, tracer::agent::StoreSink::Open(so));
  t0 = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(const size_t shipped, sink->Pass(/*last=*/true));
  const double ship_s = Since(t0);
  const double rank_steps = kRanks * static_cast<double>(kSteps);
  for (const char* t : {"spans", "collectives", "heartbeats", "ranks", "open_ops", "rank_steps"})
    (void)ch.Exec(std::string("OPTIMIZE TABLE ") + t + " FINAL");
  ASSIGN_OR_RETURN(const std::string ch_bytes,
                   ch.Scalar("SELECT sum(bytes_on_disk) FROM system.parts WHERE database = '" +
                             ch.url().database + "' AND active"));
  std::printf(
      "ingest, one node (8 ranks x 3000 steps, %zu records): trace.db %.0f rows/s (%.2f s), the "
      "sink to ClickHouse %.0f rows/s (%.2f s, %zu rows); ratio sink/trace.db time %.2f\n",
      rows, static_cast<double>(rows) / write_s, write_s, static_cast<double>(shipped) / ship_s,
      ship_s, shipped, ship_s / write_s);
  std::printf("bytes on disk per rank-step: trace.db %.1f, ClickHouse %.1f (parts merged)\n",
              FileBytes(db_path) / rank_steps, std::stod(ch_bytes) / rank_steps);
  return Status::Ok();
}

// 2. node 0 copied to `nodes` nodes inside ClickHouse; node nodes/2 computes 1.5x longer.
Status FillFleet(tracer::ClickHouse& ch, int nodes) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string slow = std::to_string(nodes / 2);
  for (const std::string table : {"spans", "collectives", "ranks", "heartbeats", "rank_steps"}) {
    const std::string cols = tracer::StoreColumnNames(*tracer::FindStoreTable(table));
    std::string select = cols;
    auto swap = [&](const std::string& col, const std::string& expr) {
      const size_t at = select.find(col);
      select.replace(at, col.size(), expr);
    };
    swap(", src,", ", concat(src, toString(n)) AS src,");
    swap(", node,", ", concat('node', toString(n)) AS node,");
    swap(", rank,", ", rank + n * 8 AS rank,");
    if (table == "spans")
      swap(", end_ns", ", if(n = " + slow +
                           ", start_ns + intDiv((end_ns - start_ns) * 3, 2), end_ns) AS end_ns");
    if (table == "ranks") swap(", dp,", ", n AS dp,");
    if (table == "rank_steps") {  // its steps as its spans: compute 1.5x longer
      swap(", wall,", ", if(n = " + slow + ", wall + intDiv(compute, 2), wall) AS wall,");
      swap(", compute,", ", if(n = " + slow + ", intDiv(compute * 3, 2), compute) AS compute,");
    }
    RETURN_IF_ERROR(ch.Exec("INSERT INTO " + table + " (" + cols + ") SELECT " + select + " FROM " +
                            table + " ARRAY JOIN range(" + std::to_string(nodes) +
                            ") AS n WHERE n > 0"));  // (the table holds node 0's rows only)
  }
  auto total = ch.Scalar(
      "SELECT (SELECT count() FROM spans) + (SELECT count() FROM collectives) + (SELECT count() "
      "FROM heartbeats)");
  std::printf("store filled: %d nodes x 8 ranks x 10 minutes, %s rows, in %.1f s\n", nodes,
              total.ok() ? total->c_str() : "?", Since(t0));
  return Status::Ok();
}

// 3. the controller's straggler window (8 steps) from the store, analysed; and what a tick would
// ask of it: each rank's newest heartbeat.
Status MeasureWindowAndTick(tracer::ClickHouse& ch, int nodes, int64_t now) {
  for (int i = 0; i < 3; ++i) {
    analyzer::SlowOptions window;
    window.attempt = 0;
    window.first_step = kSteps - 10;
    window.last_step = kSteps - 3;
    window.min_peers = 2;
    auto t0 = std::chrono::steady_clock::now();
    ASSIGN_OR_RETURN(auto in,
                     analyzer::LoadSlowInputFromStore(ch, "store", window, nodes * kRanks, false));
    if (!in) return Internal("the window is not complete in the store");
    const double load_s = Since(t0);
    t0 = std::chrono::steady_clock::now();
    ASSIGN_OR_RETURN(const analyzer::SlowReport rep, analyzer::AnalyzeSlow(*in, window));
    const std::string verdict =
        rep.verdicts.empty()
            ? "none"
            : rep.verdicts[0].cause + " " +
                  (rep.verdicts[0].root_nodes.empty() ? "" : rep.verdicts[0].root_nodes[0]);
    std::printf(
        "straggler window (8 steps, %zu ops) from the store: read in %.2f s, analysed in %.2f s; "
        "first verdict: %s\n",
        in->ops.size(), load_s, Since(t0), verdict.c_str());
  }
  const std::string since = std::to_string(now - 10 * 1000000000LL);
  for (int i = 0; i < 3; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    ASSIGN_OR_RETURN(
        const tracer::StoreRows tick,
        ch.Select("SELECT rank, argMax(step, ts_ns), argMax(phase, ts_ns), max(ts_ns) FROM "
                  "heartbeats WHERE job = 'store' AND day >= toDate(toDateTime(intDiv(" +
                  since + ", 1000000000), 'UTC')) AND ts_ns >= " + since + " GROUP BY rank"));
    std::printf(
        "tick's question (each rank's newest heartbeat of the last 10 s): %zu ranks in %.3f s\n",
        tick.rows.size(), Since(t0));
  }
  return Status::Ok();
}

// 4. the SRE views over the last `minutes`.
Status MeasureViews(tracer::ClickHouse& ch, int nodes, int64_t now, int minutes) {
  analyzer::StoreScope scope;
  scope.job = "store";
  scope.since_ns = now - int64_t{minutes} * 60 * 1000000000LL - kStep;
  const int reps = nodes <= 200 ? 3 : 1;
  for (const analyzer::StoreView v :
       {analyzer::StoreView::kStragglers, analyzer::StoreView::kSteps}) {
    std::vector<double> times;
    std::string first;
    for (int i = 0; i < reps; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      ASSIGN_OR_RETURN(const analyzer::Table t, analyzer::QueryStore(ch, v, scope));
      times.push_back(Since(t0));
      if (!t.rows.empty())
        first = t.columns[0] + "=" + t.rows[0][0] + " " + t.columns[1] + "=" + t.rows[0][1] +
                (v == analyzer::StoreView::kStragglers
                     ? " node=" + t.rows[0][2] + " ratio=" + t.rows[0][8]
                     : "");
    }
    std::sort(times.begin(), times.end());
    std::printf(
        "view %s over the store (--since %dm): median %.2f s of %d (%.2f..%.2f); first "
        "row: %s\n",
        std::string(analyzer::Name(v)).c_str(), minutes, times[times.size() / 2], reps,
        times.front(), times.back(), first.c_str());
  }
  return Status::Ok();
}

// 5. the hour: each rank's steps of the 50 minutes before the ten (rank_steps only: what the
// per-step views read), made inside ClickHouse; the views over the last 10 minutes and the hour.
Status MeasureHour(tracer::ClickHouse& ch, int nodes, int64_t now) {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t ranks = int64_t{nodes} * kRanks, earlier = int64_t{50} * 60 * 1000000000LL / kStep;
  const std::string slow = std::to_string(nodes / 2), r = std::to_string(ranks);
  const std::string ts = "(" + std::to_string(now - kSteps * kStep - earlier * kStep) +
                         " + intDiv(number, " + r + ") * " + std::to_string(kStep) + ")";
  const std::string n = "intDiv(number % " + r + ", 8)";
  RETURN_IF_ERROR(ch.Exec(
      "INSERT INTO rank_steps (" + tracer::StoreColumnNames(*tracer::FindStoreTable("rank_steps")) +
      ") SELECT toDate(toDateTime(intDiv(" + ts +
      ", 1000000000), 'UTC')), 'store', "
      "concat('hour', toString(" +
      n + ")), number, concat('node', toString(" + n + ")), toInt32(number % " + r +
      "), 0, toInt64(intDiv(number, " + r + ")) - " + std::to_string(earlier) + ", " + ts +
      ", if(" + n + " = " + slow + ", 250000000, 200000000), if(" + n + " = " + slow +
      ", 150000000, 100000000), 5000000, 0 FROM numbers(" + std::to_string(ranks * earlier) + ")"));
  std::printf("the hour: %lld more rank-steps (the 50 minutes before) in %.1f s\n",
              static_cast<long long>(ranks) * earlier, Since(t0));
  RETURN_IF_ERROR(MeasureViews(ch, nodes, now, 10));
  return MeasureViews(ch, nodes, now, 60);
}

int Run(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: store_scale clickhouse://HOST:PORT/DB [NODES=200] [hour]\n");
    return 2;
  }
  auto url = tracer::StoreUrl::Parse(argv[1]);
  if (!url.ok()) return Fail(url.status());
  const int nodes = argc > 2 ? std::atoi(argv[2]) : 200;
  const bool hour = argc > 3 && std::string(argv[3]) == "hour";
  tracer::ClickHouse ch(*url, 600000);
  if (Status st = ch.Exec("DROP DATABASE IF EXISTS " + url->database, false); !st.ok())
    return Fail(st);
  if (Status st = tracer::EnsureStoreSchema(ch); !st.ok()) return Fail(st);
  char tmpl[] = "/tmp/store_scale_XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return 1;
  const int64_t now = NowNs();
  Status st = MeasureIngest(ch, std::string(tmpl) + "/trace.db", now);
  if (st.ok()) st = FillFleet(ch, nodes);
  if (st.ok()) st = MeasureWindowAndTick(ch, nodes, now);
  if (st.ok()) st = MeasureViews(ch, nodes, now, 10);
  if (st.ok() && hour) st = MeasureHour(ch, nodes, now);
  std::error_code ec;
  std::filesystem::remove_all(tmpl, ec);
  return st.ok() ? 0 : Fail(st);
}

}  // namespace

int main(int argc, char** argv) { return megascope::bench::Main("store_scale", Run, argc, argv); }
