// The launcher: starts every rank of a job on this machine and watches them.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "megascope/runtime/train.h"
#include "megascope/tracer/dump.h"
#include "megascope/tracer/ring.h"

namespace megascope::runtime {
namespace {

namespace fs = std::filesystem;

std::string Tail(const std::string& path, size_t lines) {
  std::ifstream in(path);
  std::deque<std::string> last;
  for (std::string l; std::getline(in, l);) {
    last.push_back(l);
    if (last.size() > lines) last.pop_front();
  }
  std::string out;
  for (const auto& l : last) out += "    " + l + "\n";
  return out;
}

volatile sig_atomic_t g_interrupted = 0;
void OnInterrupt(int) { g_interrupted = 1; }

}  // namespace

int RunTraining(const TrainConfig& cfg, const std::string& self_exe) {
  if (std::string err = cfg.Validate(); !err.empty()) {
    std::fprintf(stderr, "megascope train: %s\n", err.c_str());
    return 2;
  }
  if (!fs::exists(cfg.data)) {
    std::fprintf(stderr, "megascope train: data file %s does not exist (make one with 'megascope prepare-data')\n",
                 cfg.data.c_str());
    return 2;
  }
  const int world = cfg.layout.world();
  std::error_code ec;
  fs::create_directories(cfg.run_dir + "/ranks", ec);
  const std::string probe = cfg.run_dir + "/.write-test";
  if (ec || !std::ofstream(probe)) {
    std::fprintf(stderr, "megascope train: run directory %s is not writable%s\n", cfg.run_dir.c_str(),
                 ec ? (": " + ec.message()).c_str() : "");
    return 2;
  }
  fs::remove(probe);
  fs::remove(cfg.run_dir + "/progress.jsonl", ec);
  // One agent per simulated node, started first so that run.json can say where they listen.
  TrainConfig run = cfg;
  std::vector<pid_t> agents;
  auto stop_agents = [&] {
    for (pid_t p : agents) ::kill(p, SIGTERM);  // each drains what is left, then exits
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
    for (pid_t& p : agents) {
      while (p > 0) {
        if (::waitpid(p, nullptr, WNOHANG) == p) p = -1;
        else if (std::chrono::steady_clock::now() > deadline) ::kill(p, SIGKILL);
        else std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
  };
  if (cfg.agents) {
    for (int k = 0; k < cfg.nodes; ++k) {
      const std::string node = "node" + std::to_string(k), dir = cfg.run_dir + "/nodes/" + node;
      fs::create_directories(dir, ec);
      fs::remove(dir + "/agent.port", ec);
      pid_t pid = ::fork();
      if (pid == 0) {
        int fd = ::open((dir + "/agent.log").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd >= 0) {
          ::dup2(fd, 1);
          ::dup2(fd, 2);
        }
        ::execl(self_exe.c_str(), "megascope", "agent", "--node", node.c_str(), "--run-dir", cfg.run_dir.c_str(), "--job",
                cfg.job.c_str(), "--shm-dir", cfg.shm_dir.c_str(), static_cast<char*>(nullptr));
        ::_exit(127);
      }
      agents.push_back(pid);
    }
    for (int k = 0; k < cfg.nodes; ++k) {
      const std::string node = "node" + std::to_string(k), file = cfg.run_dir + "/nodes/" + node + "/agent.port";
      int port = 0;
      for (int i = 0; i < 500 && port == 0; ++i) {
        std::ifstream in(file);
        if (!(in >> port)) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      if (port == 0) {
        stop_agents();
        std::fprintf(stderr, "megascope train: the agent of %s did not start; see %s/nodes/%s/agent.log\n%s", node.c_str(),
                     cfg.run_dir.c_str(), node.c_str(), Tail(cfg.run_dir + "/nodes/" + node + "/agent.log", 5).c_str());
        return 1;
      }
      run.agent_ports.emplace_back(node, port);
    }
  }
  if (Status st = tracer::WriteFileAtomic(cfg.run_dir + "/run.json", run.ToJson()); !st.ok()) {
    stop_agents();
    std::fprintf(stderr, "megascope train: %s\n", st.ToString().c_str());
    return 1;
  }
  // Gloo's FileStore refuses keys that exist: a rerun of this attempt starts a fresh rendezvous.
  fs::remove_all(cfg.run_dir + "/rendezvous/attempt_" + std::to_string(cfg.attempt), ec);
  const std::string dir_abs = fs::absolute(cfg.run_dir).string();
  std::printf("[train] %d ranks (dp=%d tp=%d pp=%d) on %d simulated nodes, %lld steps; run dir %s\n", world,
              cfg.layout.dp, cfg.layout.tp, cfg.layout.pp, cfg.nodes, static_cast<long long>(cfg.steps), dir_abs.c_str());
  for (const auto& [node, port] : run.agent_ports) {
    std::printf("[train] agent %s: http://127.0.0.1:%d/metrics\n", node.c_str(), port);
  }
  std::fflush(stdout);

  std::vector<pid_t> pids(world, -1);
  for (int r = 0; r < world; ++r) {
    const std::string log_dir = cfg.run_dir + "/ranks/" + std::to_string(r);
    fs::create_directories(log_dir, ec);
    const std::string log = log_dir + "/worker.log";
    pid_t pid = ::fork();
    if (pid < 0) {
      std::perror("fork");
      for (pid_t p : pids) if (p > 0) ::kill(p, SIGKILL);
      stop_agents();
      return 1;
    }
    if (pid == 0) {
      int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
      const std::string rank = std::to_string(r);
      ::execl(self_exe.c_str(), "megascope", "worker", "--run-dir", dir_abs.c_str(), "--rank", rank.c_str(),
              static_cast<char*>(nullptr));
      std::perror("exec");
      ::_exit(127);
    }
    pids[r] = pid;
  }

  struct sigaction sa{}, old_int{}, old_term{};
  sa.sa_handler = &OnInterrupt;
  ::sigaction(SIGINT, &sa, &old_int);
  ::sigaction(SIGTERM, &sa, &old_term);
  auto stop_all = [&] {
    // First ask every survivor for its flight recorder (SIGUSR1: a stuck rank dumps too), then stop it.
    const auto asked = fs::file_time_type::clock::now();
    for (pid_t p : pids) if (p > 0) ::kill(p, SIGUSR1);
    // Give each survivor up to 3 s to write its dump (a loaded machine can be slow).
    const std::string dumps = cfg.run_dir + "/dumps/attempt_" + std::to_string(cfg.attempt) + "/rank_";
    for (int i = 0; i < 150; ++i) {
      bool all = true;
      for (int r = 0; r < world && all; ++r) {
        std::error_code e;
        all = pids[r] <= 0 || fs::last_write_time(dumps + std::to_string(r) + ".json", e) >= asked;
      }
      if (all) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    for (pid_t p : pids) if (p > 0) ::kill(p, SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    for (pid_t& p : pids) {
      while (p > 0) {
        if (::waitpid(p, nullptr, WNOHANG) == p) p = -1;
        else if (std::chrono::steady_clock::now() > deadline) ::kill(p, SIGKILL);
        else std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
  };

  std::ifstream progress;
  std::string partial;
  auto pump_progress = [&] {
    if (!progress.is_open()) progress.open(cfg.run_dir + "/progress.jsonl");
    if (!progress.is_open()) return;
    progress.clear();
    for (std::string line; std::getline(progress, line);) {
      if (progress.eof()) {  // a line still being written
        partial += line;
        break;
      }
      line = partial + line;
      partial.clear();
      try {
        auto j = nlohmann::json::parse(line);
        std::printf("step %4lld/%lld | loss %.4f | %8.0f tokens/s | step %.3f s | lr %.2e | grad norm %.3f\n",
                    j["step"].get<long long>(), static_cast<long long>(cfg.steps), j["loss"].get<double>(),
                    j["tokens_per_s"].get<double>(), j["step_time_s"].get<double>(), j["lr"].get<double>(),
                    j["grad_norm"].get<double>());
        std::fflush(stdout);
      } catch (const std::exception&) {
      }
    }
  };

  int running = world, failed_rank = -1, failed_status = 0;
  while (running > 0 && failed_rank < 0 && !g_interrupted) {
    for (int r = 0; r < world; ++r) {
      int status = 0;
      if (pids[r] > 0 && ::waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        pids[r] = -1;
        --running;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
          failed_rank = r;
          failed_status = status;
          break;
        }
      }
    }
    pump_progress();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  pump_progress();
  if (failed_rank >= 0) {
    // Peers of a dead rank fail right after it (their collectives lose a peer, exit code
    // kExitCommFailure). Gather what exits in the next moment and name the rank that did not fail
    // that way: it is the origin.
    auto is_victim = [](int st) { return WIFEXITED(st) && WEXITSTATUS(st) == kExitCommFailure; };
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (is_victim(failed_status) && std::chrono::steady_clock::now() < deadline) {
      for (int r = 0; r < world; ++r) {
        int status = 0;
        if (pids[r] > 0 && ::waitpid(pids[r], &status, WNOHANG) == pids[r]) {
          pids[r] = -1;
          const bool failed = !WIFEXITED(status) || WEXITSTATUS(status) != 0;
          if (failed && !is_victim(status) && is_victim(failed_status)) {
            failed_rank = r;
            failed_status = status;
          }
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  if (failed_rank >= 0 || g_interrupted) stop_all();
  stop_agents();
  ::sigaction(SIGINT, &old_int, nullptr);
  ::sigaction(SIGTERM, &old_term, nullptr);
  // Rings the agents could not remove (no agent, or it died): nothing will drain them now.
  for (int r = 0; r < world; ++r) fs::remove(cfg.shm_dir + "/" + tracer::RingFileName(cfg.job, cfg.attempt, r), ec);
  if (g_interrupted) {
    std::fprintf(stderr, "[train] interrupted: every worker stopped\n");
    return 130;
  }
  if (failed_rank >= 0) {
    const std::string how = WIFSIGNALED(failed_status) ? "was killed by signal " + std::to_string(WTERMSIG(failed_status)) +
                                                             " (" + strsignal(WTERMSIG(failed_status)) + ")"
                                                       : "exited with code " + std::to_string(WEXITSTATUS(failed_status));
    std::fprintf(stderr, "[train] rank %d (%s) %s; every other worker was stopped.\n[train] last lines of %s/ranks/%d/worker.log:\n%s",
                 failed_rank, cfg.NodeOf(failed_rank).c_str(), how.c_str(), cfg.run_dir.c_str(), failed_rank,
                 Tail(cfg.run_dir + "/ranks/" + std::to_string(failed_rank) + "/worker.log", 12).c_str());
    return 1;
  }
  std::printf("[train] done: %lld steps; logs in %s/ranks/\n", static_cast<long long>(cfg.steps), cfg.run_dir.c_str());
  return 0;
}

}  // namespace megascope::runtime
