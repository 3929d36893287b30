// `megascope launch` (the self-healing driver), `megascope report`, `megascope evict`, `megascope
// stop`.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>

#include "command.h"
#include "megascope/controller/controller.h"
#include "megascope/controller/launch_plan.h"
#include "megascope/controller/report.h"
#include "megascope/launch/process.h"
#include "megascope/tracer/agent/store_sink.h"
#include "megascope/tracer/clickhouse.h"
#include "megascope/tracer/dump.h"
#include "megascope/tracer/file_util.h"
#include "training_options.h"

namespace megascope::cli {

namespace {

// What `launch` was asked: the training, the loop around it, and where it runs.
struct LaunchArgs {
  runtime::TrainConfig c;
  controller::ControllerOptions co;
  int spares = 0;
  std::string hosts_arg, iface;
  std::vector<std::string> injects;
  std::string store;
};

// The loop's own options: timeouts, evictions and self-checks, disk space.
po::options_description LoopOptions(LaunchArgs& a) {
  controller::ControllerOptions& co = a.co;
  po::options_description loop("Self-healing");
  loop.add_options()("spares", po::value(&a.spares)->default_value(0),
                     "spare nodes standing by (self-checked before they join)")(
      "new-run", po::bool_switch(&co.new_run),
      "the run directory's last launch finished: train it again as a new run (a new attempt, "
      "from its newest disk checkpoint if one is kept, else from step 0). Without it such a "
      "launch says the run is finished and exits 0; an unfinished run is adopted either way")(
      "timeout", po::value(&a.c.timeout_ms)->default_value(120000),
      "collective timeout in milliseconds (above --hang-after: the controller acts first)")(
      "tick", Decimal(&co.tick_s, co.tick_s), "seconds between controller ticks")(
      "hang-after", Decimal(&co.hang_after_s, co.hang_after_s),
      "a hang: no rank's step advances for this many seconds (or --hang-factor median step times, "
      "if longer)")("hang-factor", Decimal(&co.hang_factor, co.hang_factor), "see --hang-after")(
      "startup-grace", Decimal(&co.startup_grace_s, co.startup_grace_s),
      "seconds an attempt's ranks may take to meet and load their state (a first attempt's: to its "
      "first step; a restart's ready ranks get the hang threshold plus max(--hang-after, 3 load "
      "times))")("op-timeout", Decimal(&co.op_timeout_s, co.op_timeout_s),
                 "an op open this many seconds is a hang")(
      "max-evictions", po::value(&co.max_evictions)->default_value(co.max_evictions),
      "evictions allowed per --eviction-window before pausing for a person")(
      "eviction-window", Decimal(&co.eviction_window_s, co.eviction_window_s), "seconds")(
      "readmit-after", Decimal(&co.readmit_after_s, co.readmit_after_s),
      "seconds after which an evicted node may stand by again (it must pass the "
      "self-check); 0: never")(
      "min-gemm-ratio", Decimal(&co.min_gemm_ratio, co.min_gemm_ratio),
      "self-check: GEMM throughput needed, as a share of a healthy node's")(
      "min-bandwidth-ratio", Decimal(&co.min_bandwidth_ratio, co.min_bandwidth_ratio),
      "self-check: all-reduce bandwidth needed, as a share of a healthy pair's")(
      "min-free-mb", po::value<double>(),
      "megabytes the run directory's filesystem must keep free: under it the job pauses (the ranks "
      "stop, their newest state stays in memory) and resumes by itself once space is back; a "
      "launch does not start under it. Default: two checkpoints of this job plus 64. 0: pause "
      "only when the filesystem is full or a write fails")(
      "no-memory-snapshots",
      "keep no every-step state in host memory (restart from disk checkpoints only)")(
      "retain-hours", Decimal(&co.supervisor.agent_retain_hours, co.supervisor.agent_retain_hours),
      "hours of traces each node's trace.db keeps (older rows are summed per step into "
      "step_rollups, then dropped); 0: keep everything")(
      "retain-rollup-hours",
      Decimal(&co.supervisor.agent_retain_rollup_hours, co.supervisor.agent_retain_rollup_hours),
      "hours each node's trace.db keeps the per-step rollups, at least --retain-hours; 0: for "
      "ever");
  return loop;
}

// Where the nodes run, and who may reach their agents.
po::options_description PlacementOptions(LaunchArgs& a) {
  po::options_description place("Placement");
  place.add_options()("allow-remote",
                      "agents and the control endpoint listen on every address, not only loopback")(
      "hosts", po::value(&a.hosts_arg),
      "run each node on a host of its own: 'testbed' (the hosts of scripts/testbed.sh up N) or a "
      "hosts file (NAME NETNS BACKEND_ADDR FRONTEND_ADDR per line). Nodes take the hosts in "
      "order, spares the ones after them; ranks bind the backend address, agents listen on the "
      "frontend address and require the run's token")(
      "slurm",
      "inside a Slurm allocation (sbatch or salloc): the nodes are the allocation's (--nodes: all "
      "of them but --spares), every agent, rank and self-check runs as a step of the job on its "
      "node (srun), agents listen on the node's NodeAddr; the run directory must be on a file "
      "system every node shares")(
      "iface", po::value(&a.iface),
      "with --hosts or --slurm: ranks bind this interface's address on their host (the training "
      "network, e.g. eth0 or ib0) instead of the host's listed or Slurm address")(
      "store", po::value(&a.store),
      "the fleet's ClickHouse store, clickhouse://[USER[:PASSWORD]@]HOST[:8123][/DATABASE]"
      "[?cluster=NAME] (default $MEGASCOPE_STORE; docs/formats.md section 4b): every agent ships "
      "its trace.db rows there and the controller its control.db events, exactly once; "
      "`megascope query --store` answers the SRE views from it across jobs and weeks");
  return place;
}

// The detector, the straggler analysis, the policy's confidence, and injected faults.
po::options_description DetectionOptions(LaunchArgs& a) {
  controller::ControllerOptions& co = a.co;
  po::options_description detect("Detection");
  detect.add_options()("detector-tick", Decimal(&co.detector_tick_s, co.detector_tick_s),
                       "seconds between detector ticks over the agents' /metrics (0: no detector)")(
      "detector-warmup",
      po::value(&co.detector_warmup_ticks)->default_value(co.detector_warmup_ticks),
      "detector ticks in which a node only teaches its usual level")(
      "detector-min-peers", po::value(&co.detector_min_peers)->default_value(co.detector_min_peers),
      "nodes of the same pipeline stages needed before the detector judges them")(
      "straggler-every", po::value(&co.straggler_every)->default_value(co.straggler_every),
      "run the straggler analysis over every this many steps (0: never)")(
      "straggler-ratio", Decimal(&co.straggler_ratio, co.straggler_ratio),
      "a rank computing this many times its peers' median is slow in that step")(
      "straggler-min-cost", Decimal(&co.straggler_min_cost_s, co.straggler_min_cost_s),
      "seconds per step a straggler must cost the job")(
      "straggler-windows",
      po::value(&co.policy.straggler_windows)->default_value(co.policy.straggler_windows),
      "straggler analyses in a row naming a node before the policy acts")(
      "act-confidence", Decimal(&co.policy.check_confidence, co.policy.check_confidence),
      "verdicts of the detector and straggler analysis below this confidence only alert")(
      "convict-confidence", Decimal(&co.policy.convict_confidence, co.policy.convict_confidence),
      "a compute straggler slow in at least this share of its window's steps, in "
      "--straggler-windows analyses, is evicted without a self-check; a weaker one is "
      "self-checked and stays when it passes")(
      "inject", po::value(&a.injects)->composing(),
      "inject a fault into the real processes (repeatable): "
      "crash|hang|freeze|stall-send:node=N|rank=R,at=STEP; "
      "slow:node=N|rank=R|pp=S,at=STEP,seconds=X|factor=F; "
      "metric:node=N,what=nic-errors|memory,at=STEP|SECONDSs[,seconds=D]; "
      "link:node=N,kind=slow[,rate=MBPS]|loss[,loss=PCT]|down,at=STEP|SECONDSs[,seconds=D] "
      "(loss and down need --hosts); "
      "kill-agent:node=N,at=STEP|SECONDSs; corrupt-checkpoint; degrade:node=N[,factor=F]. A fault "
      "of a rank aimed at node=N with ',persist' fires again in every attempt until the node is "
      "evicted (a machine that stays broken)");
  return detect;
}

// The loop's numbers checked, and the disk space to keep free: empty, or what is wrong.
std::string CheckLoopOptions(const po::variables_map& vm, LaunchArgs& a) {
  controller::ControllerOptions& co = a.co;
  if (a.spares < 0) return "--spares must be >= 0";
  const double hours = co.supervisor.agent_retain_hours;
  const double rollup_hours = co.supervisor.agent_retain_rollup_hours;
  if (!(hours >= 0)) return "--retain-hours must be >= 0 (0: keep everything)";
  if (!(rollup_hours == 0 || rollup_hours >= hours))
    return "--retain-rollup-hours must be 0 (for ever) or at least --retain-hours";
  if (vm.count("min-free-mb")) {
    const double mb = vm["min-free-mb"].as<double>();
    if (!(mb >= 0)) return "--min-free-mb must be >= 0";
    co.min_free_bytes = static_cast<uint64_t>(mb * 1e6);
  } else {  // a checkpoint: every rank's parameters and two moments in fp32, per replica
    co.min_free_bytes = 2 * static_cast<uint64_t>(a.c.model.ParameterCount()) * 12 *
                            static_cast<uint64_t>(a.c.layout.dp) +
                        64000000;
  }
  if (!(co.policy.convict_confidence >= 0 && co.policy.convict_confidence <= 1))
    return "--convict-confidence must be between 0 and 1";
  if (co.tick_s <= 0 || co.hang_after_s <= 0 || co.max_evictions < 0)
    return "--tick and --hang-after must be positive, --max-evictions >= 0";
  if (co.detector_tick_s < 0 || co.straggler_every < 0 || co.policy.straggler_windows < 1 ||
      co.detector_min_peers < 2) {
    return "--detector-tick and --straggler-every must be >= 0 (0: off), --straggler-windows "
           ">= 1, --detector-min-peers >= 2";
  }
  return "";
}

// How the controller starts this job's processes, and what each attempt's run.json says.
void WireSupervisor(const LaunchArgs& a, const controller::Hosts& hosts, const std::string& exe,
                    controller::ControllerOptions& co) {
  const runtime::TrainConfig& c = a.c;
  co.supervisor.self_exe = exe;
  co.supervisor.run_dir = c.run_dir;
  co.supervisor.job = c.job;
  co.supervisor.shm_dir = c.shm_dir;
  co.supervisor.agent_host = co.allow_remote ? "0.0.0.0" : "127.0.0.1";
  // Agents reachable from other hosts serve the job's state only with the run's token.
  if (co.allow_remote || !hosts.hosts.empty())
    co.supervisor.agent_token_file = RunLayout(c.run_dir).token();
  co.world = c.layout.world();
  for (int r = 0; r < co.world; ++r) co.stage_of_rank.push_back(c.layout.CoordsOf(r).pp);
  co.steps = c.steps;
  co.run_json = c.ToJson();
}

// After the run, from here: what any node's trace.db still holds unshipped (a node evicted while
// the store was down keeps its rows, and its agent is gone) and control.db's last events. Every
// agent has stopped by now: no two sinks ship one database at once.
void ShipTheRest(const tracer::agent::StoreSinkOptions& control, const std::string& run_dir) {
  std::vector<tracer::agent::StoreSinkOptions> all = {control};
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(RunLayout(run_dir).nodes(), ec)) {
    const std::string node = e.path().filename().string();
    if (!std::filesystem::exists(RunLayout(run_dir).trace_db(node))) continue;
    tracer::agent::StoreSinkOptions so = control;
    so.node = node;
    so.db_path = RunLayout(run_dir).trace_db(node);
    so.source = tracer::StoreSource::kTrace;
    all.push_back(so);
  }
  for (const auto& so : all) {
    auto sink = tracer::agent::StoreSink::Open(so);
    Status st = sink.ok() ? Status::Ok() : sink.status();
    for (int pass = 0; st.ok() && pass < 1000; ++pass) {
      auto got = (*sink)->Pass(/*last=*/true);  // its agent is gone: every step is over
      st = got.status();
      if (st.ok() && (*sink)->lag_rows() == 0) break;
    }
    if (!st.ok())
      std::fprintf(stderr,
                   "[launch] store: %s: the rows left to ship stay there for the next agent or "
                   "launch on it: %s\n",
                   so.db_path.c_str(), st.message().c_str());
  }
}

}  // namespace

int RunLaunch(const Args& args) {
  LaunchArgs a;
  runtime::TrainConfig& c = a.c;
  controller::ControllerOptions& co = a.co;
  c.job = "launch";
  c.memory_snapshots = true;
  po::options_description opts("Options");
  opts.add_options()("help,h", "show this help");
  opts.add(TrainingOptions(&c));
  opts.add(LoopOptions(a)).add(PlacementOptions(a)).add(DetectionOptions(a));
  po::variables_map vm;
  if (auto rc = ParseArgs("launch",
                          "megascope launch --nodes N --spares K --dp D --tp T --pp P --data "
                          "DATA.bin --run-dir DIR [--hosts FILE | --slurm] [options]",
                          args, opts, {}, &vm)) {
    return *rc;
  }
  c.trace = vm.count("no-trace") == 0;
  c.memory_snapshots = vm.count("no-memory-snapshots") == 0;
  co.allow_remote = vm.count("allow-remote") > 0;
  if (std::string err = CheckLoopOptions(vm, a); !err.empty())
    return Fail("launch", err, kExitUsage);
  auto hosts = controller::ResolveHosts({vm.count("slurm") > 0, a.hosts_arg, a.iface});
  if (!hosts.ok()) return Fail("launch", hosts.status().message(), kExitUsage);
  // Under Slurm, the job's nodes are the allocation's less the spares unless --nodes says.
  if (vm.count("slurm") && vm["nodes"].defaulted())
    c.nodes = std::max(1, static_cast<int>(hosts->hosts.size()) - a.spares);
  if (Status st = controller::CheckHostCount(*hosts, c.nodes, a.spares); !st.ok())
    return Fail("launch", st.message(), kExitUsage);
  // The layout before the nodes it names (an injection's node among them).
  if (std::string err = c.Validate(); !err.empty()) return Fail("launch", err, kExitUsage);
  if (Status st =
          controller::PlanLaunch({c.nodes, a.spares, c.layout.world(), *hosts, a.injects}, &co);
      !st.ok())
    return Fail("launch", st.message(), kExitUsage);
  if (Status st = runtime::PrepareRunDirectory(c, /*keep_progress=*/true); !st.ok())
    return Fail("launch", st.message(), kExitUsage);
  auto exe = launch::SelfExe();
  if (!exe.ok()) return Fail("launch", exe.status().message());
  WireSupervisor(a, *hosts, *exe, co);
  // The store: the agents (children) find it in their environment; control.db's events go from
  // here.
  if (a.store.empty()) {
    if (const char* env = std::getenv("MEGASCOPE_STORE"); env != nullptr) a.store = env;
  }
  std::unique_ptr<tracer::agent::StoreLoop> shipper;
  tracer::agent::StoreSinkOptions control;
  if (!a.store.empty()) {
    auto of = tracer::agent::StoreSinkOptions::Of(a.store, c.job, "controller",
                                                  RunLayout(c.run_dir).control_db(),
                                                  tracer::StoreSource::kControl);
    if (!of.ok()) return Fail("launch", of.status().message(), kExitUsage);
    control = *of;
    ::setenv("MEGASCOPE_STORE", a.store.c_str(), 1);
    co.store = a.store;  // straggler windows from the store
    auto loop = tracer::agent::StoreLoop::Start({control}, 1.0, [](const std::string& line) {
      std::fprintf(stderr, "[launch] %s\n", line.c_str());
    });
    if (!loop.ok()) return Fail("launch", loop.status().message());
    shipper = std::move(*loop);
  }
  // The controller adopts the state an unfinished launch in this run directory left in memory, and
  // drops any other under this job name.
  controller::Controller ctl(std::move(co));
  const int rc = ctl.Run();
  if (shipper) {
    shipper.reset();
    ShipTheRest(control, c.run_dir);  // the last events, and any node's rows left behind
  }
  return rc;
}

int RunReport(const Args& args) {
  std::string run_dir, html;
  po::options_description opts("Options");
  opts.add_options()("help,h", "show this help")("run-dir", po::value(&run_dir)->required(),
                                                 "run directory of a launch")(
      "html", po::value(&html),
      "write the incident report as one self-contained HTML page (events, incident stages, "
      "per-rank compute heat map, loss curve, each verdict's evidence) to this file");
  po::positional_options_description pos;
  pos.add("run-dir", 1);
  po::variables_map vm;
  if (auto rc =
          ParseArgs("report", "megascope report RUN_DIR [--html OUT.html]", args, opts, pos, &vm))
    return *rc;
  if (!html.empty()) {
    // The page links the run's files (dumps, the timeline) from wherever it is written.
    controller::HtmlReportOptions o;
    std::error_code ec;
    namespace fs = std::filesystem;
    const fs::path from = fs::absolute(fs::path(html), ec).parent_path();
    const fs::path rel = fs::relative(fs::absolute(run_dir, ec), from, ec);
    if (!ec && rel != ".") o.link_base = rel.string() + "/";
    auto page = controller::BuildHtmlReport(run_dir, o);
    if (!page.ok()) return Fail("report", page.status().message());
    if (Status st = tracer::WriteFileAtomic(html, *page); !st.ok())
      return Fail("report", st.message());
    std::printf("wrote %s\n", html.c_str());
    return 0;
  }
  auto r = controller::BuildReport(run_dir);
  if (!r.ok()) return Fail("report", r.status().message());
  std::fputs(r->c_str(), stdout);
  return 0;
}

namespace {
int Control(const char* name, const Args& args, bool needs_node) {
  std::string run_dir, node;
  po::options_description opts("Options");
  opts.add_options()("help,h", "show this help")("run-dir", po::value(&run_dir)->required(),
                                                 "run directory of a running launch");
  po::positional_options_description pos;
  if (needs_node) {
    opts.add_options()("node", po::value(&node)->required(), "the node to evict");
    pos.add("node", 1);
  }
  po::variables_map vm;
  const std::string usage =
      std::string("megascope ") + name + (needs_node ? " NODE" : "") + " --run-dir DIR";
  if (auto rc = ParseArgs(name, usage.c_str(), args, opts, pos, &vm)) return *rc;
  Status st = controller::SendControlCommand(run_dir, name, node);
  if (!st.ok()) return Fail(name, st.message());
  std::printf("%s: accepted by the controller of %s\n", name, run_dir.c_str());
  return 0;
}
}  // namespace

int RunEvict(const Args& args) { return Control("evict", args, true); }
int RunStop(const Args& args) { return Control("stop", args, false); }

}  // namespace megascope::cli
