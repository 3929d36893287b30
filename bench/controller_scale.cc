// The real controller's loop at MegaScale's size (issue 44): controller::Controller -- its tick,
// incident handling, the real hang analyzer, policy, control.db, progress stream and control
// endpoint -- run against the scripted fleet of tests/controller/fake_fleet.h at 1,536 nodes x 8
// ranks under a fake clock, once healthy and once for each machine fault: a crash, a rank hung in
// compute (12,288 ranks' flight recorders analysed live), a rank frozen whole, a node gone silent
// (power lost: its agent answers nothing, its ranks stop, no exit status arrives), a node whose
// ranks compute 1.5x longer (the straggler watch merging every agent's /window part of a 4-step
// window, acting on the second window in a row), a node whose GPUs fail (hot and a third less busy,
// steps 1.5x longer: the detector scraping every agent's /metrics each second names it; its
// self-check's GEMM fails). For each run:
//   - the time the fault takes to be named, its node evicted and the job resumed, on the fake clock
//     (the controller's rules: its tick, hang threshold, analysis, restart), and
//   - the wall time the run took on this machine per tick of the loop (the controller's work per
//     tick, with the fake fleet's: it builds every agent's /state answer and, for a hang, every
//     rank's flight recorder, in this process).
// Each scenario runs twice: with the fleet's answers handed over in-process, then over real HTTP
// (tests/controller/http_fleet.h: one civetweb server in this process answers every agent
// endpoint from the same script, the controller asks it as it asks real agents -- a connection and
// a request per agent each tick, the hang analysis over the agents' binary dump stream). The
// second is the controller's tick as on a cluster, plus the agents' side on the same two cores.
// What it does not run: real processes (tests/controller/launch_test.cc, bench/recovery.sh).
//
// Usage: controller_scale [NODES=1536] [RANKS_PER_NODE=8] [direct|http|both (default)]
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "controller/fake_fleet.h"
#include "controller/http_fleet.h"
#include "fleet_metrics.h"
#include "megascope/controller/control_db.h"
#include "megascope/controller/controller.h"

using namespace megascope;
using controller::testing::FakeClock;
using controller::testing::FakeFault;
using controller::testing::FakeFleet;
using controller::testing::HttpFleet;

namespace {

constexpr int64_t kSteps = 16;
constexpr double kTickS = 0.25;

struct Scenario {
  const char* name;
  bool faulty;
  FakeFault::Kind kind;
  bool detector = false;  // no scripted fault: the victim's metrics go bad (the detector's case)
};

// The detector's case: every agent's /metrics page (bench/fleet_metrics.h), the victim's GPUs
// failing from kHotFromS on (after the detector's 60 s of learning); the controller scrapes each
// second. Its self-check then measures a fifth of the healthy GEMM (a failing GPU).
constexpr double kHotFromS = 70;
constexpr int64_t kDetectorSteps = 200;

struct Outcome {
  int code = 0;
  double wall_s = 0, fake_s = 0;
  double verdict_s = -1, eviction_s = -1, resumed_s = -1;  // after the fault, fake clock
  std::string verdict;
  int evictions = 0;
};

controller::ControllerOptions Options(const std::string& dir, int nodes, int ranks_per_node,
                                      int64_t steps) {
  controller::ControllerOptions o;
  o.supervisor.run_dir = dir + "/run";
  o.supervisor.shm_dir = dir + "/shm";
  o.supervisor.job = "scale";
  o.world = nodes * ranks_per_node;
  for (int n = 0; n < nodes; ++n) o.nodes.push_back("node" + std::to_string(n));
  o.spares = {"spare0", "spare1"};
  o.steps = steps;
  o.tick_s = kTickS;
  o.hang_after_s = 3;
  o.startup_grace_s = 10;
  o.detector_tick_s = 0;  // the detector and the straggler watch: bench/fleet_scale
  o.straggler_every = 0;
  o.min_free_bytes = 0;
  return o;
}

// The scenario's fault on `victim`, scripted into `fleet` (and the options it needs).
void Script(const Scenario& sc, const std::string& victim, int ranks_per_node,
            controller::ControllerOptions* options, FakeFleet* fleet) {
  controller::ControllerOptions& o = *options;
  if (sc.faulty && sc.kind == FakeFault::kSlow) {
    // Its ranks compute 1.5x longer from step 2 on; the straggler watch reads a window of 4 steps
    // from every agent's /window (made from the script: no trace.db at this size) and the policy
    // acts on the second window in a row that names it.
    o.straggler_every = 4;
    o.policy.straggler_windows = 2;
    fleet->SynthesizeWindows(0.1);
    FakeFault slow{FakeFault::kSlow, victim, 2};
    slow.factor = 1.5;
    fleet->Break(slow);
  } else if (sc.detector) {
    o.detector_tick_s = 1;
    fleet->ServeMetrics([victim, ranks_per_node](const std::string& node, double t) {
      return bench::FleetMetricsPage(node, std::atoi(node.c_str() + 4), ranks_per_node,
                                     static_cast<int>(t), node == victim && t >= kHotFromS);
    });
    controller::SelfCheckFigures failing;
    failing.ok = true;
    failing.gemm_gflops = 20;  // the healthy figure is 100
    failing.allreduce_gbps = 1;
    fleet->SetSelfCheck(victim, failing);
  } else if (sc.faulty) {
    fleet->Break({sc.kind, victim, 6});
  }
}

Outcome RunOne(const Scenario& sc, int nodes, int ranks_per_node, bool http) {
  char tmpl[] = "/tmp/controller_scale_XXXXXX";
  const std::string dir = ::mkdtemp(tmpl) != nullptr ? tmpl : "/tmp/controller_scale";
  FakeClock clock;
  const int64_t steps = sc.detector ? kDetectorSteps : kSteps;
  controller::ControllerOptions o = Options(dir, nodes, ranks_per_node, steps);
  auto owned = std::make_unique<FakeFleet>(o.supervisor.run_dir, &clock, steps);
  FakeFleet* fleet = owned.get();
  const std::string victim = "node" + std::to_string(nodes / 2 - 68);
  Script(sc, victim, ranks_per_node, &o, fleet);
  const int64_t start_ns = clock.WallNs();
  std::unique_ptr<controller::Fleet> as_run;
  if (http)
    as_run = std::make_unique<HttpFleet>(std::move(owned));
  else
    as_run = std::move(owned);
  controller::Controller c(o, std::move(as_run), &clock);
  // The controller's own lines (progress, verdicts) go to DIR/launch.log, not among the figures.
  std::fflush(stdout);
  const int saved = ::dup(STDOUT_FILENO);
  const int log = ::open((dir + "/launch.log").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ::dup2(log, STDOUT_FILENO);
  const auto t0 = std::chrono::steady_clock::now();
  Outcome out;
  out.code = c.Run();
  out.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fflush(stdout);
  ::dup2(saved, STDOUT_FILENO);
  ::close(saved);
  ::close(log);
  out.fake_s = static_cast<double>(clock.WallNs() - start_ns) / 1e9;
  const int64_t fault_ns = sc.detector ? start_ns + static_cast<int64_t>(kHotFromS * 1e9)
                           : sc.faulty ? fleet->faults().front().fired_at_ns
                                       : 0;
  auto db = controller::ControlDb::Open(o.supervisor.run_dir + "/control.db", true);
  if (db.ok()) {
    auto events = (*db)->Events();
    for (const controller::Event& e : events.value_or(std::vector<controller::Event>{})) {
      const double after = static_cast<double>(e.ts_ns - fault_ns) / 1e9;
      if (!sc.faulty || e.ts_ns < fault_ns) continue;
      if (e.kind_name == "verdict" && out.verdict_s < 0) {
        out.verdict_s = after;
        out.verdict = e.detail.value("cause", std::string()) + " on " + e.node;
      } else if (e.kind_name == "eviction") {
        if (out.eviction_s < 0) out.eviction_s = after;
        ++out.evictions;
      } else if (e.kind_name == "resumed" && out.resumed_s < 0) {
        out.resumed_s = after;
      }
    }
  }
  std::error_code ec;
  if (std::getenv("CONTROLLER_SCALE_KEEP") == nullptr)
    std::filesystem::remove_all(dir, ec);
  else
    std::fprintf(stderr, "kept %s\n", dir.c_str());
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const int nodes = argc > 1 ? std::atoi(argv[1]) : 1536;
  const int ranks_per_node = argc > 2 ? std::atoi(argv[2]) : 8;
  const std::string mode = argc > 3 ? argv[3] : "both";
  if (nodes < 140 || ranks_per_node < 1 || (mode != "direct" && mode != "http" && mode != "both")) {
    std::fprintf(stderr,
                 "usage: controller_scale [NODES>=140] [RANKS_PER_NODE>=1] [direct|http|both]\n");
    return 2;
  }
  std::printf(
      "controller_scale: the real controller over %d scripted nodes x %d ranks (%d ranks), "
      "%lld steps of 0.5 s, tick %.2f s, hang threshold 3 s (fake clock)\n",
      nodes, ranks_per_node, nodes * ranks_per_node, static_cast<long long>(kSteps), kTickS);
  const Scenario scenarios[] = {{"healthy", false, FakeFault::kCrash},
                                {"crash", true, FakeFault::kCrash},
                                {"hang", true, FakeFault::kHang},
                                {"frozen rank", true, FakeFault::kFreeze},
                                {"silent node", true, FakeFault::kPowerOff},
                                {"slow node", true, FakeFault::kSlow},
                                {"failing GPUs", true, FakeFault::kCrash, true}};
  for (const bool http : {false, true}) {
    if ((http && mode == "direct") || (!http && mode == "http")) continue;
    std::printf("%s\n", http
                            ? "over HTTP (every agent endpoint served by civetweb in this process):"
                            : "in-process (the fleet's answers handed over, no HTTP):");
    for (const Scenario& sc : scenarios) {
      const Outcome r = RunOne(sc, nodes, ranks_per_node, http);
      const double ticks = r.fake_s / kTickS;
      std::printf("  %-11s exit %d; %.1f s of job in %.1f s wall: %.1f ms wall a tick", sc.name,
                  r.code, r.fake_s, r.wall_s, 1e3 * r.wall_s / ticks);
      if (sc.faulty) {
        std::printf(
            "; after the fault: verdict (%s) %.2f s, eviction %.2f s, resumed %.2f s; %d evicted",
            r.verdict.c_str(), r.verdict_s, r.eviction_s, r.resumed_s, r.evictions);
      }
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  std::printf("peak memory (max RSS, controller, fake fleet and its server): %.0f MB\n",
              static_cast<double>(u.ru_maxrss) / 1024.0);
  return 0;
}
