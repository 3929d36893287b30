// Hang analysis from the agents' live state at scale: real rings written through the tracer, real
// agents serving them over HTTP, the analyzer asking every agent (GET /dumps) and analysing.
//
// Each node is one child process: it creates its ranks' rings in a shared-memory directory of its
// own, writes each rank's flight-recorder history through Tracer (the benchmark job of
// scale_layout.h; one rank never joins its data-parallel all-reduce, the others wait in it), starts
// an agent on those rings and keeps the ranks' heartbeats fresh. The parent then times
// LoadFromAgents + AnalyzeHang, and reports its own CPU and the agents' CPU while they answered.
//
// This machine has 2 cores and cannot hold 12,500 processes: each child holds a node's worth of
// ranks many times over (--ranks-per-node), and the agents' work (serialising their ranks' dumps),
// which a real cluster spreads over every node, runs here on the same two cores as the analyzer.
// The agents are quiesced (drained once, then only answering) so that their drain loops over
// 100,000 rings do not compete with the measurement; their answers are taken from the live rings.
//
// Usage: live_scale [WORLD=dp,tp,pp] [RANKS_PER_NODE]   e.g. live_scale 625,8,20 1000
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "megascope/analyzer/hang.h"
#include "megascope/analyzer/live.h"
#include "megascope/tracer/agent/agent.h"
#include "megascope/tracer/clock.h"
#include "megascope/tracer/tracer.h"
#include "scale_layout.h"

using namespace megascope;
namespace fs = std::filesystem;

namespace {

constexpr int kHistory = 256;  // docs/formats.md's least history, the ring's flight recorder

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "live_scale: %s\n", what.c_str());
  std::exit(1);
}

// CPU seconds (user + system) of a process, from /proc.
double CpuSeconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::vector<std::string> f;
  std::string cur;
  for (char c : stat.substr(close + 2)) {
    if (c == ' ') {
      f.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  // Fields after the name start at state (3): utime is 14, stime 15.
  if (f.size() < 13) return 0;
  return static_cast<double>(std::stoll(f[11]) + std::stoll(f[12])) /
         static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// One node: its ranks' rings and histories, then an agent; writes the agent's port to `out`.
[[noreturn]] void Node(const bench::ScaleLayout& job, int node, int first, int count, int stuck,
                       const std::string& root, int out) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  const std::string name = "node" + std::to_string(node);
  const std::string shm = root + "/shm/" + name;
  fs::create_directories(shm);
  auto clock = std::make_shared<tracer::FakeClock>(tracer::WallNowNs() - 180'000'000'000LL);
  std::vector<std::unique_ptr<tracer::Tracer>> ranks;
  for (int r = first; r < first + count; ++r) {
    tracer::RingOptions o;
    o.dir = shm;
    o.job = "scale";
    o.node = name;
    o.rank = r;
    o.world_size = job.world();
    o.local_rank = r - first;
    o.coords = job.CoordsOf(r);
    o.lanes = 1;
    o.lane_capacity = 64;
    o.flight_entries = kHistory;
    o.max_names = 64;
    o.max_groups = 8;
    o.rank_runs = 64;
    auto t = tracer::Tracer::Create(o, clock);
    if (!t.ok()) Die(t.status().ToString());
    std::vector<tracer::GroupId> ids;
    for (const tracer::GroupInfo& g : job.Groups(r)) {
      auto id = (*t)->RegisterGroup(g.name, g.kind, g.ranks);
      if (!id.ok()) Die(id.status().ToString());
      ids.push_back(*id);
    }
    clock->Set(tracer::WallNowNs() - 180'000'000'000LL);
    for (int k = 0; k < kHistory; ++k) {
      const bench::ScaleLayout::Op op = job.OpAt(r, k);
      const tracer::OpHandle h =
          (*t)->Enqueue(ids[op.group], op.op, op.bytes, tracer::DType::kBf16, op.peer);
      clock->Advance(2'000);
      (*t)->Start(h);
      clock->Advance(498'000);
      (*t)->Complete(h);
      clock->Advance(500'000);
    }
    if (r != stuck) {  // the others wait in the data-parallel all-reduce `stuck` never joins
      clock->Set(tracer::WallNowNs() - 60'000'000'000LL);
      (*t)->Start((*t)->Enqueue(ids[bench::ScaleLayout::kDp], tracer::OpType::kAllreduce, 1 << 20,
                                tracer::DType::kBf16));
    }
    ranks.push_back(std::move(*t));
  }
  auto beat = [&] {
    clock->Set(tracer::WallNowNs());
    for (size_t i = 0; i < ranks.size(); ++i)
      ranks[i]->SetPhase(9, first + static_cast<int>(i) == stuck ? tracer::Phase::kForward
                                                                 : tracer::Phase::kBackward);
  };
  beat();
  tracer::agent::AgentOptions a;
  a.node = name;
  a.run_dir = root + "/run";
  a.job = "scale";
  a.shm_dir = shm;
  auto agent = tracer::agent::Agent::Create(a);
  if (!agent.ok()) Die(agent.status().ToString());
  for (int i = 0; i < 2; ++i) (void)(*agent)->Poll(i == 0);  // discover, drain, snapshot
  const int port = (*agent)->port();
  if (::write(out, &port, sizeof(port)) != sizeof(port)) Die("cannot report the agent's port");
  ::close(out);
  for (;;) {  // the ranks stay alive and beat; the agent answers from its HTTP threads
    std::this_thread::sleep_for(std::chrono::seconds(1));
    beat();
  }
}

// Starts the `nodes` nodes of `per_node` ranks a few at a time (two cores), each a process with
// its agent: their pids, and their agents' URLs once each reported its port.
void StartNodes(const bench::ScaleLayout& job, int nodes, int per_node, int stuck,
                const std::string& root, std::vector<pid_t>& children,
                std::vector<std::string>& urls) {
  for (int started = 0; started < nodes;) {
    std::vector<int> pipes;
    for (int k = 0; k < 4 && started < nodes; ++k, ++started) {
      int fds[2];
      if (::pipe(fds) != 0) Die("pipe");
      const pid_t pid = ::fork();
      if (pid < 0) Die("fork");
      if (pid == 0) {
        ::close(fds[0]);
        Node(job, started, started * per_node, per_node, stuck, root, fds[1]);
      }
      ::close(fds[1]);
      children.push_back(pid);
      pipes.push_back(fds[0]);
    }
    for (int fd : pipes) {
      int port = 0;
      if (::read(fd, &port, sizeof(port)) != sizeof(port)) Die("a node did not start");
      ::close(fd);
      urls.push_back("http://127.0.0.1:" + std::to_string(port));
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  int dp = 96, tp = 8, pp = 16, per_node = 128;
  if (argc > 1 && std::sscanf(argv[1], "%d,%d,%d", &dp, &tp, &pp) != 3) Die("WORLD is dp,tp,pp");
  if (argc > 2) per_node = std::atoi(argv[2]);
  const bench::ScaleLayout job{dp, tp, pp};
  const int world = job.world(), stuck = world / 3;
  if (per_node <= 0 || world % per_node != 0) Die("RANKS_PER_NODE must divide the world");
  const int nodes = world / per_node;
  const std::string root = "/dev/shm/megascope-live-bench-" + std::to_string(::getpid());
  fs::create_directories(root + "/run");

  auto t0 = std::chrono::steady_clock::now();
  std::vector<pid_t> children;
  std::vector<std::string> urls;
  StartNodes(job, nodes, per_node, stuck, root, children, urls);
  const double setup_s = Since(t0);

  std::fprintf(stderr, "live_scale: %d agents ready after %.0f s; asking them\n", nodes, setup_s);
  std::vector<double> cpu0;
  cpu0.reserve(children.size());
  for (pid_t c : children) cpu0.push_back(CpuSeconds(c));
  rusage self0{}, loaded{}, self1{};
  ::getrusage(RUSAGE_SELF, &self0);
  t0 = std::chrono::steady_clock::now();
  auto in = analyzer::LoadFromAgents(urls, 0, "", false);
  const double load_s = Since(t0);
  if (!in.ok()) Die(in.status().ToString());
  ::getrusage(RUSAGE_SELF, &loaded);
  t0 = std::chrono::steady_clock::now();
  auto verdicts = analyzer::AnalyzeHang(*in);
  const double analyse_s = Since(t0);
  ::getrusage(RUSAGE_SELF, &self1);
  double agents_cpu = 0;
  for (size_t i = 0; i < children.size(); ++i) agents_cpu += CpuSeconds(children[i]) - cpu0[i];
  auto seconds = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6;
  };
  auto cpu = [&](const rusage& r) { return seconds(r.ru_utime) + seconds(r.ru_stime); };
  const bool right = verdicts.size() == 1 && verdicts[0].root_ranks == std::vector<int32_t>{stuck};

  for (pid_t c : children) ::kill(c, SIGKILL);
  for (pid_t c : children) ::waitpid(c, nullptr, 0);
  fs::remove_all(root);

  std::printf(
      "%6d ranks (dp=%d tp=%d pp=%d) live from %d agents of %d ranks, %d entries a rank: "
      "load %.2f s + analysis %.2f s = %.2f s (target <= 10 s); analyzer CPU %.2f s, agents' CPU "
      "answering %.2f s; verdict %s %s rank %d: %s  (setup %.0f s)\n"
      "       analyzer: user %.2f s, system %.2f s; page faults %ld loading, %ld analysing; peak "
      "RSS "
      "%.2f GB\n",
      world, dp, tp, pp, nodes, per_node, kHistory, load_s, analyse_s, load_s + analyse_s,
      cpu(self1) - cpu(self0), agents_cpu,
      verdicts.empty() ? "none" : std::string(Name(verdicts[0].kind)).c_str(),
      verdicts.empty() ? "" : verdicts[0].cause.c_str(),
      verdicts.empty() || verdicts[0].root_ranks.empty() ? -1 : verdicts[0].root_ranks[0],
      right ? "right" : "WRONG", setup_s, seconds(self1.ru_utime) - seconds(self0.ru_utime),
      seconds(self1.ru_stime) - seconds(self0.ru_stime), loaded.ru_minflt - self0.ru_minflt,
      self1.ru_minflt - loaded.ru_minflt, static_cast<double>(self1.ru_maxrss) / (1 << 20));
  return right ? 0 : 1;
}
