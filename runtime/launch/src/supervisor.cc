#include "megascope/launch/supervisor.h"

#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>

#include "megascope/launch/slurm.h"
#include "megascope/tracer/format.h"
#include "megascope/tracer/ring.h"

namespace megascope::launch {
namespace {
namespace fs = std::filesystem;
}  // namespace

Supervisor::Supervisor(SupervisorOptions options)
    : opt_(std::move(options)), layout_(opt_.run_dir) {}

Supervisor::~Supervisor() {
  StopRanks();
  StopAgents();
}

void Supervisor::SetNodeEnv(const std::string& node,
                            std::vector<std::pair<std::string, std::string>> env) {
  node_env_[node] = std::move(env);
}

const std::vector<std::pair<std::string, std::string>>& Supervisor::NodeEnv(
    const std::string& node) const {
  static const std::vector<std::pair<std::string, std::string>> kNone;
  auto it = node_env_.find(node);
  return it == node_env_.end() ? kNone : it->second;
}

Result<std::vector<Host>> ReadHostsFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound("cannot read the hosts file " + path);
  std::vector<Host> hosts;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    line = line.substr(0, line.find('#'));
    std::istringstream fields(line);
    Host h;
    if (!(fields >> h.name)) continue;
    std::string sw, extra;
    if (!(fields >> h.netns >> h.backend_addr >> h.frontend_addr) ||
        ((fields >> sw) && sw.find(':') == std::string::npos) || (fields >> extra)) {
      return InvalidArgument(
          path + ":" + std::to_string(n) +
          ": expected NAME NETNS BACKEND_ADDR FRONTEND_ADDR [SWITCH_NETNS:PORT]");
    }
    if (!sw.empty()) {
      h.switch_netns = sw.substr(0, sw.find(':'));
      h.switch_port = sw.substr(sw.find(':') + 1);
    }
    if (h.netns == "-") h.netns.clear();
    for (const Host& other : hosts) {
      if (other.name == h.name)
        return InvalidArgument(path + ":" + std::to_string(n) + ": host " + h.name + " twice");
    }
    hosts.push_back(std::move(h));
  }
  if (hosts.empty()) return InvalidArgument("the hosts file " + path + " lists no host");
  return hosts;
}

const Host* Supervisor::HostOf(const std::string& node) const {
  auto it = opt_.hosts.find(node);
  return it == opt_.hosts.end() ? nullptr : &it->second;
}

ProcessSpec Supervisor::NodeProcess(const std::string& node, const std::string& role,
                                    std::vector<std::string> argv, std::string log_path) const {
  const Host* h = HostOf(node);
  if (h != nullptr && !h->slurm_job.empty()) {
    std::vector<std::string> srun = SrunPrefix(h->slurm_job, node, role + "@" + node);
    argv.insert(argv.begin(), srun.begin(), srun.end());
  }
  ProcessSpec spec(std::move(argv), std::move(log_path));
  spec.env = NodeEnv(node);
  if (h != nullptr) {
    spec.netns = h->netns;
    if (h->bind_iface.empty()) {
      spec.env.emplace_back(kBindAddrEnv, h->backend_addr);
    } else {
      spec.env.emplace_back(kBindAddrEnv, "");
      spec.env.emplace_back(kBindIfaceEnv, h->bind_iface);
    }
  }
  return spec;
}

int Supervisor::RemoveStaleRings() {
  int removed = 0;
  const std::string prefix = tracer::RingFilePrefix(opt_.job);
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(opt_.shm_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    auto ring =
        tracer::RingReader::Attach(e.path().string(), tracer::RingReader::Mode::kSnapshotOnly);
    if (ring.ok() && (*ring)->WriterAlive())
      continue;  // another live job of the same name: not ours to touch
    std::error_code rm;
    if (fs::remove(e.path(), rm)) ++removed;
  }
  return removed;
}

Result<int> Supervisor::StartAgent(const std::string& node) {
  std::error_code ec;
  if (!std::exchange(stale_rings_checked_, true) && agents_.empty() && started_.empty()) {
    if (const int n = RemoveStaleRings(); n > 0) {
      std::fprintf(stderr, "[launch] removed %d ring(s) of job '%s' left in %s by an earlier run\n",
                   n, opt_.job.c_str(), opt_.shm_dir.c_str());
    }
  }
  fs::create_directories(layout_.node_dir(node), ec);
  // Where the rings and memory snapshots live: a --shm-dir of the user's may not exist yet (every
  // rank failed its set-up then, on every node alike).
  if (fs::create_directories(opt_.shm_dir, ec); ec)
    return IoError("cannot create --shm-dir " + opt_.shm_dir + ": " + ec.message());
  fs::remove(layout_.agent_port(node), ec);
  const Host* host = HostOf(node);
  std::vector<std::string> argv = {
      opt_.self_exe, "agent",     "--node",
      node,          "--run-dir", opt_.run_dir,
      "--job",       opt_.job,    "--shm-dir",
      opt_.shm_dir,  "--listen",  (host ? host->frontend_addr : opt_.agent_host) + ":0"};
  if (!opt_.agent_token_file.empty()) {
    argv.emplace_back("--token-file");
    argv.push_back(opt_.agent_token_file);
  }
  for (const auto& [flag, hours] :
       {std::pair{"--retain-hours", opt_.agent_retain_hours},
        std::pair{"--retain-rollup-hours", opt_.agent_retain_rollup_hours}}) {
    std::string text = tracer::Format("%g", hours);
    argv.emplace_back(flag);
    argv.emplace_back(text);
  }
  ProcessSpec spec = NodeProcess(node, "agent", std::move(argv), layout_.agent_log(node));
  spec.append_log = true;  // a restarted agent continues the log
  ASSIGN_OR_RETURN(std::unique_ptr<Process> p, Process::Spawn(spec));
  const auto deadline = std::chrono::steady_clock::now() + opt_.agent_start_timeout;
  int port = 0;
  while (port == 0) {
    std::ifstream in(layout_.agent_port(node));
    if (in >> port && port > 0) break;
    port = 0;
    if (auto e = p->Poll()) {
      return Status(StatusCode::kUnavailable, "the agent of " + node + " " + e->Describe() +
                                                  "; see " + layout_.agent_log(node) + "\n" +
                                                  p->LogTail(5));
    }
    if (std::chrono::steady_clock::now() > deadline) {
      p->Stop(std::chrono::milliseconds(0));
      return Status(StatusCode::kDeadlineExceeded, "the agent of " + node + " did not start; see " +
                                                       layout_.agent_log(node) + "\n" +
                                                       p->LogTail(5));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  agents_[node] = std::move(p);
  agent_ports_[node] = port;
  return port;
}

void Supervisor::StopAgent(const std::string& node, bool wait) {
  auto it = agents_.find(node);
  if (it == agents_.end()) return;
  if (wait) {
    it->second->Stop(std::chrono::milliseconds(15000));  // it drains the rings first
  } else {
    it->second->Signal(SIGTERM);
    retiring_agents_.push_back(std::move(it->second));
  }
  agents_.erase(it);
  agent_ports_.erase(node);
}

void Supervisor::StopAgents() {
  std::vector<Process*> all;
  for (auto& [node, p] : agents_) all.push_back(p.get());
  for (auto& p : retiring_agents_) all.push_back(p.get());
  StopAll(all, std::chrono::milliseconds(15000));
  agents_.clear();
  retiring_agents_.clear();
  agent_ports_.clear();
  // Rings the agents did not remove (no agent, or it died): nothing will drain them now.
  std::error_code ec;
  for (const auto& [attempt, world] : started_) {
    if (running_ranks() > 0 && attempt == attempt_) continue;
    for (int r = 0; r < world; ++r)
      fs::remove(opt_.shm_dir + "/" + tracer::RingFileName(opt_.job, attempt, r), ec);
  }
}

std::optional<int> Supervisor::AgentPort(const std::string& node) const {
  auto it = agent_ports_.find(node);
  if (it == agent_ports_.end()) return std::nullopt;
  return it->second;
}

std::string Supervisor::AgentUrl(const std::string& node) const {
  auto port = AgentPort(node);
  const Host* h = HostOf(node);
  const std::string host = h                              ? h->frontend_addr
                           : opt_.agent_host == "0.0.0.0" ? "127.0.0.1"
                                                          : opt_.agent_host;
  return port ? "http://" + host + ":" + std::to_string(*port) : "";
}

std::vector<std::string> Supervisor::AgentNodes() const {
  std::vector<std::string> out;
  for (const auto& [node, p] : agents_) out.push_back(node);
  return out;
}

bool Supervisor::SignalAgent(const std::string& node, int sig) {
  auto it = agents_.find(node);
  return it != agents_.end() && it->second->Signal(sig);
}

Status Supervisor::StartRanks(int attempt, const std::vector<std::string>& nodes, int world) {
  if (nodes.empty() || world % static_cast<int>(nodes.size()) != 0) {
    return InvalidArgument("world size " + std::to_string(world) + " does not divide over " +
                           std::to_string(nodes.size()) + " nodes");
  }
  StopRanks();
  attempt_ = attempt;
  nodes_ = nodes;
  world_ = world;
  started_.emplace_back(attempt, world);
  std::error_code ec;
  // Gloo's FileStore refuses keys that exist: every attempt starts a fresh rendezvous.
  fs::remove_all(layout_.rendezvous(attempt), ec);
  const std::string dir_abs = fs::absolute(opt_.run_dir).string();
  for (int r = 0; r < world; ++r) {
    fs::create_directories(layout_.rank_dir(r), ec);
    ProcessSpec spec =
        NodeProcess(NodeOfRank(r), "rank" + std::to_string(r),
                    {opt_.self_exe, "worker", "--run-dir", dir_abs, "--rank", std::to_string(r)},
                    layout_.worker_log(r));
    spec.append_log = attempt > 0;  // the log of a rank spans its attempts
    // A rank tells its launcher's death (SIGHUP: it moves its state out of host memory, which no
    // one would restart from) from a stop (SIGTERM). srun relays only a stop.
    if (spec.argv[0] == opt_.self_exe) spec.parent_death_signal = SIGHUP;
    auto p = Process::Spawn(spec);
    if (!p.ok()) {
      StopRanks();
      return p.status().WithContext("starting rank " + std::to_string(r));
    }
    ranks_.push_back(std::move(p).value());
  }
  return Status::Ok();
}

std::string Supervisor::NodeOfRank(int rank) const {
  if (nodes_.empty() || world_ <= 0 || rank < 0 || rank >= world_) return "";
  return nodes_[static_cast<size_t>(rank / (world_ / static_cast<int>(nodes_.size())))];
}

int Supervisor::running_ranks() {
  int n = 0;
  for (auto& p : ranks_) n += p->running() ? 1 : 0;
  return n;
}

std::vector<RankExit> Supervisor::PollRanks() {
  std::vector<RankExit> out;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    if (reported_.count(static_cast<int>(r))) continue;  // its exit was returned before
    if (auto e = ranks_[r]->Poll()) {
      reported_.insert(static_cast<int>(r));
      out.push_back({static_cast<int>(r), *e});
    }
  }
  return out;
}

std::vector<AgentExit> Supervisor::PollAgents() {
  std::vector<AgentExit> out;
  for (auto it = agents_.begin(); it != agents_.end();) {
    if (auto e = it->second->Poll()) {
      out.push_back({it->first, *e});
      agent_ports_.erase(it->first);
      it = agents_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

RankExit Supervisor::FindOrigin(const std::vector<RankExit>& failures,
                                std::chrono::milliseconds window, std::vector<RankExit>* others) {
  auto is_victim = [](const ExitStatus& s) { return s.exited() && PeersFailure(s.code()); };
  RankExit origin = failures.at(0);
  for (const RankExit& f : failures) {
    if (is_victim(origin.status) && !is_victim(f.status)) origin = f;
  }
  for (const RankExit& f : failures) {
    if (others && f.rank != origin.rank) others->push_back(f);
  }
  const auto deadline = std::chrono::steady_clock::now() + window;
  while (is_victim(origin.status) && std::chrono::steady_clock::now() < deadline) {
    for (RankExit& e : PollRanks()) {
      if (!e.status.success() && !is_victim(e.status) && is_victim(origin.status)) {
        if (others) others->push_back(origin);
        origin = e;
      } else if (others) {
        others->push_back(e);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return origin;
}

std::vector<int> Supervisor::CollectDumps(std::chrono::milliseconds timeout) {
  const auto asked = fs::file_time_type::clock::now();
  std::vector<int> waiting;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    if (ranks_[r]->Signal(SIGUSR1)) waiting.push_back(static_cast<int>(r));
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!waiting.empty() && std::chrono::steady_clock::now() < deadline) {
    std::erase_if(waiting, [&](int r) {
      std::error_code e;
      return !ranks_[r]->running() || fs::last_write_time(layout_.dump(attempt_, r), e) >= asked;
    });
    if (!waiting.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return waiting;
}

void Supervisor::StopRanks() {
  std::vector<Process*> all;
  for (auto& p : ranks_) all.push_back(p.get());
  StopAll(all, opt_.grace);
  ranks_.clear();
  reported_.clear();
}

bool Supervisor::SignalRank(int rank, int sig) {
  return rank >= 0 && rank < static_cast<int>(ranks_.size()) && ranks_[rank]->Signal(sig);
}

}  // namespace megascope::launch
