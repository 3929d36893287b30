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
// Usage: store_scale URL [NODES=200]
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "megascope/analyzer/slow.h"
#include "megascope/analyzer/store_views.h"
#include "megascope/tracer/agent/store_sink.h"
#include "megascope/tracer/clickhouse.h"
#include "megascope/tracer/trace_store.h"

using namespace megascope;

namespace {

constexpr int kRanks = 8, kTpOps = 4;
constexpr int64_t kMs = 1000000, kStep = 200 * kMs, kSteps = 600 * 1000 / 200;

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// One node's 10 minutes as the agent writes them: each rank's records in one drain pass.
Result<size_t> WriteNode(tracer::TraceStore& store, int64_t now_ns) {
  const std::vector<std::string> names = {"forward"};
  size_t rows = 0;
  for (int l = 0; l < kRanks; ++l) {
    tracer::RankInfo info;
    info.job = "store";
    info.node = "node0";
    info.rank = l;
    info.world_size = kRanks;
    info.local_rank = l;
    info.coords = {0, 0, l};
    RETURN_IF_ERROR(store.UpsertRank(info));
    const std::vector<tracer::GroupInfo> groups = {{"tp.0", "tp", {}},
                                                   {"dp." + std::to_string(l), "dp", {}}};
    std::vector<tracer::Record> recs;
    for (int64_t step = 0; step < kSteps; ++step) {
      const int64_t t0 = now_ns - kSteps * kStep + step * kStep, compute = 100 * kMs;
      tracer::Record span{};
      span.span = {tracer::RecordType::kSpan,
                   tracer::SpanKind::kForward,
                   0,
                   -1,
                   step,
                   t0,
                   t0 + compute,
                   0,
                   0,
                   0,
                   0,
                   0,
                   {}};
      recs.push_back(span);
      tracer::Record hb{};
      hb.heartbeat.type = tracer::RecordType::kHeartbeat;
      hb.heartbeat.phase = tracer::Phase::kForward;
      hb.heartbeat.step = step;
      hb.heartbeat.ticks = t0;
      recs.push_back(hb);
      for (int k = 0; k <= kTpOps; ++k) {
        tracer::Record op{};
        auto& c = op.collective;
        c.type = tracer::RecordType::kCollective;
        c.op = tracer::OpType::kAllreduce;
        c.state = tracer::OpState::kCompleted;
        c.group = k < kTpOps ? 0 : 1;
        c.peer = -1;
        c.seq = static_cast<uint64_t>(step * (k < kTpOps ? kTpOps : 1) + (k % kTpOps) + 1);
        c.bytes = 8 << 20;
        c.enqueued_ticks = t0 + compute + k * kMs;
        c.started_ticks = c.enqueued_ticks;
        c.completed_ticks = c.enqueued_ticks + kMs;
        c.step = static_cast<int32_t>(step);
        recs.push_back(op);
      }
    }
    tracer::RingRows batch;
    batch.info = &info;
    batch.names = &names;
    batch.groups = &groups;
    batch.records = recs;
    batch.ring = "rank" + std::to_string(l);
    batch.lane_tails = {recs.size()};
    RETURN_IF_ERROR(store.Write({&batch, 1}, {}, {}));
    rows += recs.size();
  }
  return rows;
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

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: store_scale clickhouse://HOST:PORT/DB [NODES=200]\n");
    return 2;
  }
  auto url = tracer::StoreUrl::Parse(argv[1]);
  if (!url.ok()) return Fail(url.status());
  const int nodes = argc > 2 ? std::atoi(argv[2]) : 200;
  tracer::ClickHouse ch(*url, 600000);
  if (Status st = ch.Exec("DROP DATABASE IF EXISTS " + url->database, false); !st.ok())
    return Fail(st);
  if (Status st = tracer::EnsureStoreSchema(ch); !st.ok()) return Fail(st);

  char tmpl[] = "/tmp/store_scale_XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return 1;
  const std::string db_path = std::string(tmpl) + "/trace.db";
  const int64_t now = NowNs();

  // 1. ingest: trace.db, then the sink, one after the other on the same rows.
  auto store = tracer::TraceStore::Open(db_path);
  if (!store.ok()) return Fail(store.status());
  auto t0 = std::chrono::steady_clock::now();
  auto rows = WriteNode(**store, now);
  if (!rows.ok()) return Fail(rows.status());
  const double write_s = Since(t0);
  tracer::agent::StoreSinkOptions so;
  so.url = *url;
  so.job = "store";
  so.node = "node0";
  so.db_path = db_path;
  so.batch_rows = 20000;
  so.batches_per_table = 1 << 20;
  so.timeout_ms = 600000;
  auto sink = tracer::agent::StoreSink::Open(so);
  if (!sink.ok()) return Fail(sink.status());
  t0 = std::chrono::steady_clock::now();
  auto shipped = (*sink)->Pass(/*last=*/true);
  if (!shipped.ok()) return Fail(shipped.status());
  const double ship_s = Since(t0);
  const double rank_steps = kRanks * static_cast<double>(kSteps);
  for (const char* t : {"spans", "collectives", "heartbeats", "ranks", "open_ops"})
    (void)ch.Exec(std::string("OPTIMIZE TABLE ") + t + " FINAL");
  auto ch_bytes = ch.Scalar("SELECT sum(bytes_on_disk) FROM system.parts WHERE database = '" +
                            url->database + "' AND active");
  if (!ch_bytes.ok()) return Fail(ch_bytes.status());
  std::printf(
      "ingest, one node (8 ranks x 3000 steps, %zu records): trace.db %.0f rows/s (%.2f s), the "
      "sink to ClickHouse %.0f rows/s (%.2f s, %zu rows); ratio sink/trace.db time %.2f\n",
      *rows, static_cast<double>(*rows) / write_s, write_s, static_cast<double>(*shipped) / ship_s,
      ship_s, *shipped, ship_s / write_s);
  std::printf("bytes on disk per rank-step: trace.db %.1f, ClickHouse %.1f (parts merged)\n",
              FileBytes(db_path) / rank_steps, std::stod(*ch_bytes) / rank_steps);

  // 2. the node copied to `nodes` nodes inside ClickHouse; node nodes/2 computes 1.5x longer.
  t0 = std::chrono::steady_clock::now();
  const std::string slow = std::to_string(nodes / 2);
  for (const char* table : {"spans", "collectives", "ranks", "heartbeats", "rank_steps"}) {
    const std::string cols = tracer::StoreColumnNames(*tracer::FindStoreTable(table));
    std::string select = cols;
    auto swap = [&](const std::string& col, const std::string& expr) {
      const size_t at = select.find(col);
      select.replace(at, col.size(), expr);
    };
    swap(", src,", ", concat(src, toString(n)) AS src,");
    swap(", node,", ", concat('node', toString(n)) AS node,");
    swap(", rank,", ", rank + n * 8 AS rank,");
    if (std::string(table) == "spans")
      swap(", end_ns", ", if(n = " + std::to_string(nodes / 2) +
                           ", start_ns + intDiv((end_ns - start_ns) * 3, 2), end_ns) AS end_ns");
    if (std::string(table) == "ranks") swap(", dp,", ", n AS dp,");
    if (std::string(table) == "rank_steps") {  // its steps as its spans: compute 1.5x longer
      swap(", wall,", ", if(n = " + slow + ", wall + intDiv(compute, 2), wall) AS wall,");
      swap(", compute,", ", if(n = " + slow + ", intDiv(compute * 3, 2), compute) AS compute,");
    }
    Status st = ch.Exec("INSERT INTO " + std::string(table) + " (" + cols + ") SELECT " + select +
                        " FROM " + table + " ARRAY JOIN range(" + std::to_string(nodes) +
                        ") AS n WHERE n > 0");  // (the table holds node 0's rows only)
    if (!st.ok()) return Fail(st);
  }
  auto total = ch.Scalar(
      "SELECT (SELECT count() FROM spans) + (SELECT count() FROM collectives) + (SELECT count() "
      "FROM heartbeats)");
  std::printf("store filled: %d nodes x 8 ranks x 10 minutes, %s rows, in %.1f s\n", nodes,
              total.ok() ? total->c_str() : "?", Since(t0));

  // 3. the controller's straggler window (8 steps) from the store, analysed; and what a tick
  // would ask of it: each rank's newest heartbeat.
  for (int i = 0; i < 3; ++i) {
    analyzer::SlowOptions window;
    window.attempt = 0;
    window.first_step = kSteps - 10;
    window.last_step = kSteps - 3;
    window.min_peers = 2;
    t0 = std::chrono::steady_clock::now();
    auto in = analyzer::LoadSlowInputFromStore(ch, "store", window, nodes * kRanks, false);
    if (!in.ok()) return Fail(in.status());
    if (!in->has_value()) return Fail(Internal("the window is not complete in the store"));
    const double load_s = Since(t0);
    t0 = std::chrono::steady_clock::now();
    auto rep = analyzer::AnalyzeSlow(**in, window);
    if (!rep.ok()) return Fail(rep.status());
    const std::string verdict =
        rep->verdicts.empty()
            ? "none"
            : rep->verdicts[0].cause + " " +
                  (rep->verdicts[0].root_nodes.empty() ? "" : rep->verdicts[0].root_nodes[0]);
    std::printf(
        "straggler window (8 steps, %zu ops) from the store: read in %.2f s, analysed in %.2f s; "
        "first verdict: %s\n",
        (*in)->ops.size(), load_s, Since(t0), verdict.c_str());
  }
  for (int i = 0; i < 3; ++i) {
    const std::string since = std::to_string(now - 10 * 1000000000LL);
    t0 = std::chrono::steady_clock::now();
    auto tick = ch.Select(
        "SELECT rank, argMax(step, ts_ns), argMax(phase, ts_ns), max(ts_ns) FROM heartbeats WHERE "
        "job = 'store' AND day >= toDate(toDateTime(intDiv(" +
        since + ", 1000000000), 'UTC')) AND ts_ns >= " + since + " GROUP BY rank");
    if (!tick.ok()) return Fail(tick.status());
    std::printf(
        "tick's question (each rank's newest heartbeat of the last 10 s): %zu ranks in %.3f s\n",
        tick->rows.size(), Since(t0));
  }

  analyzer::StoreScope scope;
  scope.job = "store";
  scope.since_ns = now - 600 * 1000000000LL - kStep;
  const int reps = nodes <= 200 ? 3 : 1;
  for (const analyzer::StoreView v :
       {analyzer::StoreView::kStragglers, analyzer::StoreView::kSteps}) {
    std::vector<double> times;
    std::string first;
    for (int i = 0; i < reps; ++i) {
      t0 = std::chrono::steady_clock::now();
      auto t = analyzer::QueryStore(ch, v, scope);
      if (!t.ok()) return Fail(t.status());
      times.push_back(Since(t0));
      if (!t->rows.empty())
        first = t->columns[0] + "=" + t->rows[0][0] + " " + t->columns[1] + "=" + t->rows[0][1] +
                (v == analyzer::StoreView::kStragglers
                     ? " node=" + t->rows[0][2] + " ratio=" + t->rows[0][8]
                     : "");
    }
    std::sort(times.begin(), times.end());
    std::printf(
        "view %s over the store (--since 10m): median %.2f s of %d (%.2f..%.2f); first "
        "row: %s\n",
        std::string(analyzer::Name(v)).c_str(), times[times.size() / 2], reps, times.front(),
        times.back(), first.c_str());
  }
  std::error_code ec;
  std::filesystem::remove_all(tmpl, ec);
  return 0;
}
