// The controller's per-tick work at MegaScale's size (issue 44): 1,536 nodes of 8 ranks, each
// node's agent endpoints (/state, /metrics, /window) served over real HTTP from synthetic but
// consistent state, and the controller's own code paths asking them all at once:
//   tick:      every /state, parsed as the tick parses it (who moved, the oldest open op);
//   detector:  every /metrics page parsed into samples and fed to the detector (one round a
//              second of data time, ROUNDS of them), one node failing from round 70 (its GPUs
//              hot and idle, its steps longer);
//   window:    every node's /window part of an 8-step straggler window, parsed, merged and
//              analysed (analyzer::AnalyzeSlow), one node's ranks computing 1.5x longer;
//   query:     an SRE's `megascope query --from-agents stragglers --last 10m`: one node's part
//              computed by the agents' own code (analyzer::QueryServer) over a real trace.db
//              holding 10 minutes of 8 ranks (written through the real store), then every node's
//              part asked for over HTTP, parsed and merged (analyzer::MergeParts). On a cluster
//              each node computes its part on its own machine, side by side: the query takes one
//              node's part plus the fan-out and merge.
// The nodes run in a child process (one HTTP server, 8 threads) so that the parent's CPU time is
// the controller's alone; on this 2-core machine they still share the cores, which a real
// cluster's agents would not. What this does not run: the controller's loop itself (its tick
// calls exactly these paths; the scripted fleet in tests/controller proves its decisions).
//
// Usage: fleet_scale [NODES=1536] [RANKS_PER_NODE=8] [ROUNDS=120]
#include <CivetServer.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "bench_main.h"
#include "fleet_metrics.h"
#include "megascope/analyzer/node_query.h"
#include "megascope/analyzer/window.h"
#include "megascope/detector/detector.h"
#include "megascope/detector/prometheus_text.h"
#include "megascope/tracer/agent/agent_state.h"
#include "megascope/tracer/http_client.h"
#include "megascope/tracer/http_serve.h"
#include "megascope/tracer/parallel.h"
#include "megascope/tracer/trace_store.h"
#include "node_trace.h"

using namespace megascope;

namespace {

// The detector learns each machine's usual offset for its first 60 ticks: the GPUs run hot after.
constexpr int kWindowSteps = 8, kTpOps = 4, kHotFrom = 70;
constexpr size_t kPollWorkers = 64;  // as the controller's fleet asks its agents

struct Shape {
  int nodes = 1536, ranks_per_node = 8, rounds = 120;
  int World() const { return nodes * ranks_per_node; }
  int SlowNode() const { return nodes / 2 + 1; }  // its ranks compute 1.5x longer
  int HotNode() const { return nodes * 4 / 5; }   // its GPUs fail from round kHotFrom
};

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double CpuSeconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

std::string NodeName(int n) { return "node" + std::to_string(n); }

// Node n's ranks, steps 100..107: tp=RANKS_PER_NODE inside the node, dp across nodes; each step a
// rank computes 100 ms (1.5x on kSlowNode), runs kTpOps all-reduces with its node and one with its
// dp group, the last completing 5 ms after the slowest member arrives.
std::string WindowBody(const Shape& s, int n) {
  analyzer::WindowPart part;
  part.node = NodeName(n);
  part.has_rows = true;
  constexpr int64_t kMs = 1000000, kStep = 200 * kMs;
  for (int l = 0; l < s.ranks_per_node; ++l) {
    const int rank = n * s.ranks_per_node + l;
    part.through[rank] = 100 + kWindowSteps - 1;
    part.input.ranks[rank] = {part.node, n, 0, l, 0};
    for (int step = 100; step < 100 + kWindowSteps; ++step) {
      const int64_t t0 = step * kStep;
      const double compute = (n == s.SlowNode() ? 150.0 : 100.0) * kMs;
      const double comm = (n == s.SlowNode() ? 5.0 : 55.0) * kMs;
      part.input.steps.push_back({rank, 0, step, 200.0 * kMs, compute, comm, 0});
      for (int k = 0; k < kTpOps; ++k) {
        const int64_t enq = t0 + static_cast<int64_t>(compute) / kTpOps * (k + 1);
        part.input.ops.push_back({"tp." + std::to_string(n), (step - 100) * (kTpOps + 1) + k + 1,
                                  rank, enq, enq + kMs, 8 << 20, false});
      }
      const int64_t dp_enq = t0 + static_cast<int64_t>(compute) + kMs;
      part.input.ops.push_back({"dp." + std::to_string(l), (step - 100) + 1, rank, dp_enq,
                                t0 + 155 * kMs + 5 * kMs, 64 << 20, false});
    }
  }
  return analyzer::WindowPartJson(part);
}

std::string StateBody(const Shape& s, int n, int64_t step) {
  nlohmann::json ranks = nlohmann::json::array();
  for (int l = 0; l < s.ranks_per_node; ++l) {
    ranks.push_back({{"rank", n * s.ranks_per_node + l},
                     {"attempt", 0},
                     {"node", NodeName(n)},
                     {"alive", true},
                     {"heartbeat", {{"step", step}, {"phase", "compute"}}},
                     {"open_entries", nlohmann::json::array()}});
  }
  return nlohmann::json{{"node", NodeName(n)}, {"ranks", ranks}}.dump();
}

// RUN_DIR/nodes/node0/trace.db with the last 10 minutes of node 0's ranks (node_trace.h).
Result<size_t> WriteTenMinutes(const std::string& run_dir, const Shape& s, int64_t now_ns) {
  ASSIGN_OR_RETURN(auto store, tracer::TraceStore::Open(run_dir + "/nodes/node0/trace.db"));
  return bench::WriteTenMinutes(*store, "fleet", s.ranks_per_node, s.World(), now_ns,
                                /*heartbeats=*/false);
}

// Node n's part of the query: node 0's real part with node 0's ranks renamed node n's (dp = n); the
// slow node's ranks computed 1.5x as long.
std::string QueryBody(const Shape& s, const analyzer::QueryPart& node0, int n) {
  analyzer::QueryPart part = node0;
  part.node = NodeName(n);
  const auto& cols = part.table.columns;
  const auto col = [&](const char* name) {
    return static_cast<size_t>(std::find(cols.begin(), cols.end(), name) - cols.begin());
  };
  for (auto& row : part.table.rows) {
    row[col("rank")] = std::to_string(n * s.ranks_per_node + std::stoi(row[col("rank")]));
    row[col("node")] = part.node;
    row[col("dp")] = std::to_string(n);
    if (n == s.SlowNode())
      row[col("compute_sum")] = std::to_string(std::stoll(row[col("compute_sum")]) * 3 / 2);
  }
  return analyzer::QueryPartJson(part);
}

// Serves every node under /<node>/<endpoint>; /metrics pages follow the round in /round/<r>.
class Nodes : public CivetHandler {
 public:
  Nodes(const Shape& s, const analyzer::QueryPart& query) : shape_(s) {
    for (int n = 0; n < s.nodes; ++n) {
      window_.push_back(WindowBody(s, n));
      state_.push_back(StateBody(s, n, 107));
      query_.push_back(QueryBody(s, query, n));
    }
  }
  bool handleGet(CivetServer*, mg_connection* conn) override {
    const std::string uri = mg_get_request_info(conn)->local_uri;  // /nodeN/what
    const size_t slash = uri.find('/', 1);
    const int n = std::atoi(uri.c_str() + 5);
    const std::string what = slash == std::string::npos ? "" : uri.substr(slash + 1);
    if (n < 0 || n >= shape_.nodes) {
      tracer::HttpReply(conn, 404, "text/plain", "no such node\n");
    } else if (what == "state") {
      tracer::HttpReply(conn, 200, "application/json", state_[n]);
    } else if (what == "window") {
      tracer::HttpReply(conn, 200, "application/json", window_[n]);
    } else if (what == "query") {
      tracer::HttpReply(conn, 200, "application/json", query_[n]);
    } else if (what.starts_with("metrics/")) {
      const int round = std::atoi(what.c_str() + 8);
      tracer::HttpReply(conn, 200, "text/plain",
                        bench::FleetMetricsPage(NodeName(n), n, shape_.ranks_per_node, round,
                                                n == shape_.HotNode() && round >= kHotFrom));
    } else {
      tracer::HttpReply(conn, 404, "text/plain", "unknown endpoint\n");
    }
    return true;
  }
  size_t WindowBytes() const {
    size_t b = 0;
    for (const std::string& w : window_) b += w.size();
    return b;
  }

 private:
  Shape shape_;
  std::vector<std::string> window_, state_, query_;
};

// Every node's `what`, at once (kPollWorkers side by side, as the controller's fleet asks).
std::vector<Result<std::string>> AskAll(int port, const Shape& s, const std::string& what) {
  std::vector<Result<std::string>> out(s.nodes, Status(StatusCode::kInternal, "not asked"));
  const std::string base = "http://127.0.0.1:" + std::to_string(port) + "/";
  tracer::ParallelFor(static_cast<size_t>(s.nodes), kPollWorkers, [&](size_t i) {
    out[i] = tracer::HttpGet(base + NodeName(static_cast<int>(i)) + "/" + what, 5000);
  });
  return out;
}

struct Timed {
  double wall_s = 0, cpu_s = 0;
};

template <typename Fn>
Timed Time(Fn&& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  const double c0 = CpuSeconds();
  fn();
  return {Since(t0), CpuSeconds() - c0};
}

int Fail(const std::string& what) {
  std::fprintf(stderr, "fleet_scale: %s\n", what.c_str());
  return 1;
}

void MeasureTick(int port, const Shape& s) {
  // 1. tick: every /state, read as Controller::Impl::Stalled reads it
  // (tracer::agent::ReadAgentState).
  std::vector<double> tick_s, tick_cpu, parse_s;
  int answered = 0;
  for (int t = 0; t < 10; ++t) {
    std::vector<Result<std::string>> bodies;
    const Timed fetched = Time([&] { bodies = AskAll(port, s, "state"); });
    const Timed parsed = Time([&] {
      answered = 0;
      std::map<int, int64_t> steps;
      for (const auto& body : bodies) {
        if (!body.ok()) continue;
        ++answered;
        (void)tracer::agent::ReadAgentState(*body, [&](const tracer::agent::RankBeat& r) {
          if (r.attempt == 0) steps[r.rank] = r.step;
        });
      }
    });
    tick_s.push_back(fetched.wall_s + parsed.wall_s);
    tick_cpu.push_back(fetched.cpu_s + parsed.cpu_s);
    parse_s.push_back(parsed.wall_s);
  }
  std::sort(tick_s.begin(), tick_s.end());
  std::sort(tick_cpu.begin(), tick_cpu.end());
  std::sort(parse_s.begin(), parse_s.end());
  std::printf(
      "tick (/state of every node): median %.0f ms wall, %.0f ms CPU of the controller, of which "
      "parsing %.0f ms (%d of %d answered)\n",
      1e3 * tick_s[5], 1e3 * tick_cpu[5], 1e3 * parse_s[5], answered, s.nodes);
}

void MeasureDetector(int port, const Shape& s) {
  // 2. detector: a round of /metrics a second, parsed and fed.
  detector::DetectorConfig config;
  detector::Detector det(config);
  detector::Stream stream(&det, config.tick_s, 2 * config.tick_s);
  for (int n = 0; n < s.nodes; ++n) det.SetPeerGroup(NodeName(n), "pp=0");
  std::vector<double> feed_s, step_s;
  int first_verdict_round = -1;
  std::string named;
  for (int round = 0; round < s.rounds; ++round) {
    std::vector<Result<std::string>> pages;
    const Timed fetch = Time([&] { pages = AskAll(port, s, "metrics/" + std::to_string(round)); });
    std::vector<detector::Sample> samples;
    const Timed parse = Time([&] {
      for (int n = 0; n < s.nodes; ++n) {
        if (!pages[n].ok()) continue;
        auto got = detector::ParsePrometheusText(*pages[n], 1e6 + round);
        if (!got.ok()) continue;
        for (detector::Sample& x : *got) {
          x.machine = NodeName(n);
          samples.push_back(std::move(x));
        }
      }
    });
    std::vector<Verdict> verdicts;
    const Timed fed = Time([&] {
      for (const detector::Sample& x : samples) stream.Add(x);
      verdicts = stream.TakeVerdicts();
    });
    feed_s.push_back(fetch.wall_s + parse.wall_s);
    step_s.push_back(fed.wall_s);
    if (!verdicts.empty() && first_verdict_round < 0) {
      first_verdict_round = round;
      for (const Verdict& v : verdicts)
        named += (named.empty() ? "" : ", ") + v.cause + " on " +
                 (v.root_nodes.empty() ? std::string("?") : v.root_nodes.front());
    }
  }
  std::sort(feed_s.begin(), feed_s.end());
  std::sort(step_s.begin(), step_s.end());
  std::printf(
      "detector: /metrics of every node fetched and parsed, median %.0f ms; detector "
      "step (%zu samples a round), median %.1f ms, max %.1f ms\n",
      1e3 * feed_s[feed_s.size() / 2],
      static_cast<size_t>(s.nodes) * (6 * static_cast<size_t>(s.ranks_per_node) + 2),
      1e3 * step_s[step_s.size() / 2], 1e3 * step_s.back());
  if (first_verdict_round >= 0)
    std::printf("detector: first verdict at round %d, %d s of data after its GPUs failed: %s\n",
                first_verdict_round, first_verdict_round - kHotFrom, named.c_str());
  else
    std::printf("detector: no verdict in %d rounds (its GPUs failing from round %d)\n", s.rounds,
                kHotFrom);
}

int MeasureWindow(int port, const Shape& s) {
  // 3. straggler window: every node's part, parsed, merged and analysed.
  analyzer::SlowOptions o;
  o.attempt = 0;
  o.first_step = 100;
  o.last_step = 100 + kWindowSteps - 1;
  o.min_peers = 2;
  for (int t = 0; t < 3; ++t) {
    analyzer::SlowInput input;
    int parts = 0;
    Result<analyzer::SlowReport> rep = Status(StatusCode::kInternal, "not run");
    const Timed fetch = Time([&] {
      for (auto& body : AskAll(port, s, "window")) {
        if (!body.ok()) continue;
        auto part = analyzer::ParseWindowPart(*body);
        if (!part.ok()) continue;
        ++parts;
        input.Merge(std::move(part->input));
      }
    });
    const Timed analysed = Time([&] { rep = analyzer::AnalyzeSlow(input, o); });
    if (!rep.ok()) return Fail(rep.status().ToString());
    std::printf(
        "straggler window (%d steps, %zu ops): %d parts fetched, parsed and merged in "
        "%.2f s wall (%.2f s CPU), analysed in %.2f s; first verdict: %s %s\n",
        kWindowSteps, input.ops.size(), parts, fetch.wall_s, fetch.cpu_s, analysed.wall_s,
        rep->verdicts.front().cause.c_str(),
        rep->verdicts.front().root_nodes.empty()
            ? ""
            : rep->verdicts.front().root_nodes.front().c_str());
  }
  return 0;
}

// 4. an SRE query: one node's part over its real 10-minute trace.db, then every node's part asked
// for, parsed and merged.
struct NodePart {
  analyzer::QueryPart part;
  double seconds = 0;  // the node's own work, the median of three
  size_t rows = 0;     // in its trace.db
};

Result<NodePart> MeasureNodePart(const Shape& s, const analyzer::NodeQuery& q) {
  char tmpl[] = "/tmp/fleet_scale_XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return IoError("mkdtemp");
  const std::string dir = tmpl;
  NodePart out;
  ASSIGN_OR_RETURN(out.rows, WriteTenMinutes(dir, s, q.to_ns));
  std::vector<double> times;
  for (int t = 0; t < 3; ++t) {
    const auto t0 = std::chrono::steady_clock::now();
    ASSIGN_OR_RETURN(out.part, analyzer::QueryServer(dir, "node0").Part(q));
    times.push_back(Since(t0));
  }
  std::sort(times.begin(), times.end());
  out.seconds = times[1];
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return out;
}

int MeasureQuery(int port, const Shape& s, const analyzer::NodeQuery& q, const NodePart& node) {
  const std::string path = analyzer::NodeQueryPath(q).substr(1);
  for (int t = 0; t < 3; ++t) {
    std::vector<analyzer::QueryPart> parts;
    Result<analyzer::Table> merged = Status(StatusCode::kInternal, "not run");
    const Timed fetch = Time([&] {
      for (auto& body : AskAll(port, s, path)) {
        if (!body.ok()) continue;
        auto part = analyzer::ParseQueryPart(*body);
        if (part.ok()) parts.push_back(std::move(*part));
      }
    });
    const Timed merge = Time([&] { merged = analyzer::MergeParts(q, parts); });
    if (!merged.ok()) return Fail(merged.status().ToString());
    std::printf(
        "query (stragglers, last 10 min): one node's part over its trace.db (%zu rows) %.2f s; "
        "%zu parts fetched and parsed in %.2f s wall (%.2f s CPU), merged in %.2f s; in all "
        "%.2f s; slowest rank: %s on %s (ratio %s)\n",
        node.rows, node.seconds, parts.size(), fetch.wall_s, fetch.cpu_s, merge.wall_s,
        node.seconds + fetch.wall_s + merge.wall_s, merged->rows.front()[1].c_str(),
        merged->rows.front()[2].c_str(), merged->rows.front()[8].c_str());
  }
  return 0;
}

int Run(int argc, char** argv) {
  Shape s;
  if (argc > 1) s.nodes = std::atoi(argv[1]);
  if (argc > 2) s.ranks_per_node = std::atoi(argv[2]);
  if (argc > 3) s.rounds = std::atoi(argv[3]);
  // `tick`: the tick alone (bench/store_scale.sh measures it beside a store holding the fleet).
  const bool tick_only = argc > 4 && std::string_view(argv[4]) == "tick";
  if (s.nodes < 8 || s.ranks_per_node < 1 || s.rounds < 1)
    return Fail("usage: fleet_scale [NODES>=8] [RANKS_PER_NODE>=1] [ROUNDS>=1] [tick]");
  analyzer::NodeQuery query;
  query.question = analyzer::Question::kStragglers;
  query.to_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                    std::chrono::system_clock::now().time_since_epoch())
                    .count();
  query.from_ns = query.to_ns - 600 * 1000000000LL;
  auto node_part = MeasureNodePart(s, query);
  if (!node_part.ok()) return Fail(node_part.status().ToString());
  int ready[2];
  if (::pipe(ready) != 0) return Fail("pipe");
  const pid_t child = ::fork();
  if (child == 0) {  // the nodes
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    Nodes nodes(s, node_part->part);
    CivetServer server({"listening_ports", "127.0.0.1:0", "num_threads", "8"});
    server.addHandler("/", nodes);
    const int port = server.getListeningPorts().front();
    std::fprintf(stderr, "[fleet_scale] %d nodes serving on port %d (window parts: %.1f MB)\n",
                 s.nodes, port, static_cast<double>(nodes.WindowBytes()) / 1e6);
    (void)!::write(ready[1], &port, sizeof(port));
    ::pause();
    return 0;
  }
  int port = 0;
  if (::read(ready[0], &port, sizeof(port)) != sizeof(port)) return Fail("the nodes did not start");
  std::printf(
      "fleet_scale: %d nodes x %d ranks (%d ranks), real HTTP, the nodes in a child "
      "process on the same cores; %s slow from the window's start, %s failing from round %d\n",
      s.nodes, s.ranks_per_node, s.World(), NodeName(s.SlowNode()).c_str(),
      NodeName(s.HotNode()).c_str(), kHotFrom);

  MeasureTick(port, s);
  if (tick_only) {
    ::kill(child, SIGKILL);
    ::waitpid(child, nullptr, 0);
    return 0;
  }
  MeasureDetector(port, s);
  if (MeasureWindow(port, s) != 0) return 1;
  if (MeasureQuery(port, s, query, *node_part) != 0) return 1;
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  std::printf("controller-side peak memory (max RSS): %.0f MB\n",
              static_cast<double>(u.ru_maxrss) / 1024.0);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return megascope::bench::Main("fleet_scale", Run, argc, argv); }
