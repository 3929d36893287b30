// `megascope train`: one attempt of a job on this machine through the process layer -- one agent
// per simulated node, then every rank; progress streamed; a failure named (origin, not victims)
// with its log tail after the survivors' flight recorders are collected.
#include "megascope/runtime/train.h"

#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include "megascope/launch/progress.h"
#include "megascope/launch/scrape_targets.h"
#include "megascope/launch/supervisor.h"
#include "megascope/tracer/dump.h"
#include "megascope/tracer/file_util.h"

namespace megascope::runtime {
namespace {

namespace fs = std::filesystem;

volatile sig_atomic_t g_interrupted = 0;
void OnInterrupt(int) { g_interrupted = 1; }

}  // namespace

Status PrepareRunDirectory(const TrainConfig& cfg, bool keep_progress) {
  if (std::string err = cfg.Validate(); !err.empty()) return InvalidArgument(err);
  if (!fs::exists(cfg.data)) {
    return InvalidArgument("data file " + cfg.data +
                           " does not exist (make one with 'megascope prepare-data')");
  }
  std::error_code ec;
  fs::create_directories(RunLayout(cfg.run_dir).ranks(), ec);
  const std::string probe = cfg.run_dir + "/.write-test";
  if (ec || !std::ofstream(probe)) {
    return InvalidArgument("run directory " + cfg.run_dir + " is not writable" +
                           (ec ? ": " + ec.message() : ""));
  }
  fs::remove(probe);
  if (!keep_progress) fs::remove(RunLayout(cfg.run_dir).progress(), ec);
  return Status::Ok();
}

namespace {

// The nodes' agents (started first, so that run.json can say where they listen), run.json, and
// the scrape targets: the run as it was started.
Result<TrainConfig> StartAgents(launch::Supervisor& sup, const TrainConfig& cfg) {
  TrainConfig run = cfg;
  if (cfg.agents) {
    for (const std::string& node : cfg.NodeNames()) {
      ASSIGN_OR_RETURN(const int port, sup.StartAgent(node));
      run.agent_ports.emplace_back(node, port);
    }
  }
  if (Status st = tracer::WriteFileAtomic(sup.layout().run_json(), run.ToJson()); !st.ok())
    return Internal(st.ToString());
  std::vector<launch::ScrapeTarget> targets;
  for (const auto& [node, port] : run.agent_ports) targets.push_back({node, "127.0.0.1", port});
  if (!targets.empty()) {
    if (Status st = launch::WriteScrapeTargets(sup.layout(), targets); !st.ok())
      std::fprintf(stderr, "megascope train: warning: %s\n", st.ToString().c_str());
  }
  return run;
}

// Streams the ranks' progress until every rank finished, one failed or the user interrupted: the
// rank whose failure the others followed, if one failed. Stuck ranks dump before they are stopped.
std::optional<launch::RankExit> WatchRanks(launch::Supervisor& sup, const TrainConfig& cfg) {
  struct sigaction sa {
  }, old_int{}, old_term{};
  sa.sa_handler = &OnInterrupt;
  ::sigaction(SIGINT, &sa, &old_int);
  ::sigaction(SIGTERM, &sa, &old_term);
  launch::ProgressReader progress(sup.layout().progress());
  auto pump = [&] {
    for (const auto& line : progress.Poll()) {
      if (line.contains("step") && !line.contains("event"))
        std::printf("%s\n", launch::FormatStepLine(line, cfg.steps).c_str());
    }
    std::fflush(stdout);
  };
  const int world = cfg.layout.world();
  int finished = 0;
  std::optional<launch::RankExit> failure;
  std::vector<launch::RankExit> failures;
  while (finished < world && failures.empty() && !g_interrupted) {
    for (const launch::RankExit& e : sup.PollRanks()) {
      if (e.status.success())
        ++finished;
      else
        failures.push_back(e);
    }
    pump();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  pump();
  if (!failures.empty()) {
    // Peers of a dead rank fail right after it (launch::PeersFailure): name the one that did not.
    failure = sup.FindOrigin(failures, std::chrono::seconds(2), nullptr);
  }
  if (failure || g_interrupted) {
    sup.CollectDumps(std::chrono::seconds(3));  // a stuck rank dumps too (SIGUSR1)
    sup.StopRanks();
  }
  sup.StopAgents();
  ::sigaction(SIGINT, &old_int, nullptr);
  ::sigaction(SIGTERM, &old_term, nullptr);
  return failure;
}

}  // namespace

int RunTraining(const TrainConfig& cfg, const std::string& self_exe) {
  if (Status st = PrepareRunDirectory(cfg); !st.ok()) {
    std::fprintf(stderr, "megascope train: %s\n", st.message().c_str());
    return 2;
  }
  launch::SupervisorOptions so;
  so.self_exe = self_exe;
  so.run_dir = cfg.run_dir;
  so.job = cfg.job;
  so.shm_dir = cfg.shm_dir;
  launch::Supervisor sup(so);
  auto run = StartAgents(sup, cfg);
  if (!run.ok()) {
    std::fprintf(stderr, "megascope train: %s\n", run.status().message().c_str());
    return 1;
  }
  const int world = cfg.layout.world();
  std::printf(
      "[train] %d ranks (dp=%d tp=%d pp=%d) on %d simulated nodes, %lld steps; run dir %s\n", world,
      cfg.layout.dp, cfg.layout.tp, cfg.layout.pp, cfg.nodes, static_cast<long long>(cfg.steps),
      fs::absolute(cfg.run_dir).string().c_str());
  for (const auto& [node, port] : run->agent_ports) {
    std::printf("[train] agent %s: http://127.0.0.1:%d/metrics\n", node.c_str(), port);
  }
  std::fflush(stdout);
  if (Status st = sup.StartRanks(cfg.attempt, cfg.NodeNames(), world); !st.ok()) {
    std::fprintf(stderr, "megascope train: %s\n", st.ToString().c_str());
    return 1;
  }
  const std::optional<launch::RankExit> failure = WatchRanks(sup, cfg);
  if (g_interrupted) {
    std::fprintf(stderr, "[train] interrupted: every worker stopped\n");
    return 130;
  }
  if (failure) {
    const int r = failure->rank;
    std::fprintf(
        stderr,
        "[train] rank %d (%s) %s; every other worker was stopped.\n[train] last lines of %s:\n%s",
        r, cfg.NodeOf(r).c_str(), failure->status.Describe().c_str(),
        sup.layout().worker_log(r).c_str(),
        launch::FileTail(sup.layout().worker_log(r), 12).c_str());
    return 1;
  }
  std::printf("[train] done: %lld steps; logs in %s/ranks/\n", static_cast<long long>(cfg.steps),
              cfg.run_dir.c_str());
  return 0;
}

}  // namespace megascope::runtime
