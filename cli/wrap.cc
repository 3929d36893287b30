// `megascope wrap [options] -- CMD ...`: traces a job megascope did not start. The command runs
// with megascope's in-process library named in its environment as NCCL's profiler plugin
// (NCCL_PROFILER_PLUGIN) and as the CUDA driver's injection library (CUDA_INJECTION64_PATH), so
// every process of it that uses NCCL or CUDA -- torchrun's workers, Megatron's ranks, an MPI
// job's -- records its collectives and its kernels, copies and synchronising calls in a ring of its
// own; the node's agent (started here, or found if another wrap
// on this node started it) drains the rings into RUN_DIR/nodes/<node>/trace.db. When the command
// is interrupted (a hang an operator gave up on) or fails, every rank's flight recorder is taken
// from the agent first, while the ranks are still there, into RUN_DIR/dumps/attempt_<A>/; the run
// directory then answers `query`, `analyze hang`, `analyze slow`, `timeline` and `report` as a
// `train` or `launch` run's does.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <thread>

#include "command.h"
#include "megascope/controller/control_db.h"
#include "megascope/launch/process.h"
#include "megascope/launch/supervisor.h"
#include "megascope/tracer/clickhouse.h"
#include "megascope/tracer/dump.h"
#include "megascope/tracer/file_util.h"
#include "megascope/tracer/http_client.h"
#include "megascope/tracer/ring.h"
#include "megascope/tracer/run_layout.h"

namespace megascope::cli {
namespace {

namespace fs = std::filesystem;

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

std::string Trimmed(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  return s;
}

// A job name as rings spell it ([A-Za-z0-9_-], at most 48).
std::string JobName(std::string s) {
  for (char& c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') c = '-';
  }
  return s.substr(0, 48);
}

// The plugin: --nccl-plugin, else beside this binary as the build tree or an install lays it out.
std::string FindPlugin(const std::string& given) {
  if (!given.empty()) return fs::absolute(given).string();
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec).parent_path();
  for (const fs::path& p :
       {exe / "../tracer/nccl/libnccl-profiler-megascope.so",
        exe / "../lib/libnccl-profiler-megascope.so", exe / "libnccl-profiler-megascope.so",
        fs::path(MEGASCOPE_NCCL_PLUGIN_PATH)}) {
    if (fs::exists(p, ec)) return fs::canonical(p, ec).string();
  }
  return "";
}

// The node's agent: the one another wrap on this node started (its port file answers), else one
// started here (the launch supervisor's: it also clears rings an earlier run of the job left).
struct Agent {
  std::unique_ptr<launch::Supervisor> owner;  // set when this wrap started it
  std::string url;
};

Result<Agent> FindOrStartAgent(const RunLayout& layout, const std::string& node,
                               const std::string& job, const std::string& shm_dir) {
  fs::create_directories(layout.node_dir(node));
  const std::string lock_path = layout.node_dir(node) + "/agent.lock";
  const int lock = ::open(lock_path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
  if (lock < 0) return ErrnoError("cannot open " + lock_path, errno);
  ::flock(lock, LOCK_EX);  // one wrap at a time decides; closing the file lets the next one in
  Agent a;
  if (auto port = tracer::ReadFile(layout.agent_port(node)); port.ok()) {
    const std::string url = "http://127.0.0.1:" + Trimmed(*port);
    if (tracer::HttpGet(url + "/state", 2000).ok()) {
      a.url = url;
      ::close(lock);
      return a;
    }
  }
  launch::SupervisorOptions o;
  o.self_exe = fs::read_symlink("/proc/self/exe").string();
  o.run_dir = layout.dir();
  o.job = job;
  o.shm_dir = shm_dir;
  a.owner = std::make_unique<launch::Supervisor>(o);
  auto port = a.owner->StartAgent(node);
  ::close(lock);
  if (!port.ok()) return port.status();
  a.url = "http://127.0.0.1:" + std::to_string(*port);
  return a;
}

// Every rank's flight recorder as the agent has it, written to the attempt's dump directory, once
// the agent has found every ring of the job on this node (it looks each drain pass).
int CollectDumps(const Agent& agent, const RunLayout& layout, const std::string& job,
                 const std::string& shm_dir, int attempt) {
  size_t rings = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(shm_dir, ec)) {
    const std::string name = e.path().filename().string();
    rings +=
        name.rfind(tracer::RingFilePrefix(job), 0) == 0 && name.find(".init.") == std::string::npos;
  }
  const std::string dir = layout.dumps(attempt);
  fs::create_directories(dir, ec);
  int written = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  do {
    auto body =
        tracer::HttpGet(agent.url + "/dumps?form=json&attempt=" + std::to_string(attempt), 30000);
    if (!body.ok()) break;
    std::istringstream lines(*body);
    std::vector<tracer::Dump> dumps;
    for (std::string line; std::getline(lines, line);) {
      auto d = tracer::ParseDump(line, agent.url + "/dumps");
      if (d.ok()) dumps.push_back(std::move(*d));
    }
    if (dumps.size() < rings && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    for (const tracer::Dump& d : dumps) {
      written +=
          tracer::WriteFileAtomic(layout.dump(attempt, d.snapshot.info.rank), tracer::DumpToJson(d))
              .ok();
    }
    break;
  } while (true);
  return written;
}

void Record(const RunLayout& layout, controller::EventKind kind, int attempt,
            const std::string& node, nlohmann::json detail) {
  auto db = controller::ControlDb::Open(layout.control_db());
  if (!db.ok()) return;
  controller::Event e;
  e.ts_ns = tracer::WallNowNs();
  e.attempt = attempt;
  e.kind = kind;
  e.node = node;
  e.detail = std::move(detail);
  (void)(*db)->Record(e);
}

// The command's environment: where and as what it traces, and the libraries that trace it (the
// NCCL profiler plugin, which is also the CUDA injection library when built with CUPTI).
std::vector<std::pair<std::string, std::string>> TracingEnv(const std::string& run_dir,
                                                            const std::string& node,
                                                            const std::string& job,
                                                            const std::string& shm_dir, int attempt,
                                                            std::string plugin, bool cupti) {
  std::vector<std::pair<std::string, std::string>> env = {
      {"MEGASCOPE_RUN_DIR", run_dir},
      {"MEGASCOPE_NODE", node},
      {"MEGASCOPE_JOB", job},
      {"MEGASCOPE_SHM_DIR", shm_dir},
      {"MEGASCOPE_ATTEMPT", std::to_string(attempt)}};
  plugin = FindPlugin(plugin);
  if (plugin.empty()) {
    Warn("wrap", {"libnccl-profiler-megascope.so not found (give --nccl-plugin): NCCL "
                  "collectives and device activity are not traced"});
    return env;
  }
  if (Env("NCCL_PROFILER_PLUGIN").empty()) env.emplace_back("NCCL_PROFILER_PLUGIN", plugin);
  // The same file as the injection library (a build with CUPTI's headers lays the link
  // libmegascope-cupti.so beside it): loaded once, both write the process's one ring.
  std::error_code ec;
  const bool injects = fs::exists(fs::path(plugin).parent_path() / "libmegascope-cupti.so", ec);
  if (cupti && injects && Env("CUDA_INJECTION64_PATH").empty())
    env.emplace_back("CUDA_INJECTION64_PATH", plugin);
  return env;
}

// Runs `spec` to its end. SIGINT and SIGTERM are taken here: the ranks' flight recorders first,
// then the command is stopped. `interrupted`: the signal that stopped it, or 0.
Result<launch::ExitStatus> Supervise(const launch::ProcessSpec& spec, const Agent& agent,
                                     const RunLayout& layout, const std::string& job,
                                     const std::string& shm_dir, int attempt, int& interrupted) {
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  ASSIGN_OR_RETURN(auto child, launch::Process::Spawn(spec));
  interrupted = 0;
  std::optional<launch::ExitStatus> status;
  while (!(status = child->Poll())) {
    timespec tick{0, 50'000'000};
    const int sig = sigtimedwait(&stop_signals, nullptr, &tick);
    if (sig <= 0) continue;
    interrupted = sig;
    const int n = CollectDumps(agent, layout, job, shm_dir, attempt);
    std::fprintf(stderr, "megascope wrap: %s: %d flight recorder(s) kept in %s; stopping %s\n",
                 strsignal(sig), n, layout.dumps(attempt).c_str(), spec.argv[0].c_str());
    status = child->Stop(std::chrono::seconds(30));
    break;
  }
  if (!interrupted && !status->success()) {  // what its ranks held when it failed
    const int n = CollectDumps(agent, layout, job, shm_dir, attempt);
    if (n > 0)
      std::fprintf(stderr, "megascope wrap: %s %s; %d flight recorder(s) kept in %s\n",
                   spec.argv[0].c_str(), status->Describe().c_str(), n,
                   layout.dumps(attempt).c_str());
  }
  return *status;
}

}  // namespace

int RunWrap(const Args& all) {
  // Ours before "--", the command after it.
  Args args, cmd;
  auto dash = std::find(all.begin(), all.end(), "--");
  args.assign(all.begin(), dash);
  if (dash != all.end()) cmd.assign(dash + 1, all.end());
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  std::string run_dir = Env("MEGASCOPE_RUN_DIR"), node = Env("MEGASCOPE_NODE"), job,
              shm_dir = "/dev/shm", plugin, store;
  int attempt = std::atoi(Env("TORCHELASTIC_RESTART_COUNT").c_str());
  for (const char* v : {"MEGASCOPE_JOB", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID"}) {
    if (job.empty()) job = Env(v);
  }
  po::options_description opts("Options");
  opts.add_options()("help,h", "show this help")(
      "run-dir", po::value(&run_dir)->default_value(run_dir.empty() ? "megascope-run" : run_dir),
      "run directory: nodes/<node>/trace.db, dumps/, control.db (default $MEGASCOPE_RUN_DIR, "
      "else ./megascope-run; on several nodes, a shared directory)")(
      "node", po::value(&node)->default_value(node.empty() ? host : node),
      "this node's name (default $MEGASCOPE_NODE, else the host name)")(
      "job", po::value(&job)->default_value(job.empty() ? "wrap" : job),
      "job name, the same on every node (default $MEGASCOPE_JOB, $SLURM_JOB_ID or "
      "$TORCHELASTIC_RUN_ID, else wrap)")(
      "attempt", po::value(&attempt)->default_value(attempt),
      "attempt number of this run of the job (default $TORCHELASTIC_RESTART_COUNT, else 0)")(
      "shm-dir", po::value(&shm_dir)->default_value(shm_dir), "where the processes' rings live")(
      "nccl-plugin", po::value(&plugin),
      "the NCCL profiler plugin to load (default: libnccl-profiler-megascope.so beside this "
      "binary); an NCCL_PROFILER_PLUGIN already set is kept. The same file is the CUDA "
      "injection library (CUDA_INJECTION64_PATH) that records kernels, copies and synchronising "
      "calls through CUPTI")("no-cupti", "leave CUDA_INJECTION64_PATH unset: no device spans")(
      "store", po::value(&store),
      "the agent started here also ships its trace.db rows to the fleet's ClickHouse store, "
      "clickhouse://HOST:8123/DB (default $MEGASCOPE_STORE; docs/formats.md section 4b)");
  po::variables_map vm;
  if (auto rc = ParseArgs("wrap",
                          "megascope wrap [--run-dir D] [--node N] [--job J] -- CMD [ARGS...]\n"
                          "example: megascope wrap --run-dir /shared/runs/job7 -- torchrun "
                          "--nproc-per-node 8 train.py",
                          args, opts, {}, &vm))
    return *rc;
  if (cmd.empty()) return Fail("wrap", "give the command to run after --", kExitUsage);
  if (!store.empty()) {  // the agent (a child) reads it from its environment
    if (auto u = tracer::StoreUrl::Parse(store); !u.ok())
      return Fail("wrap", u.status().message(), kExitUsage);
    ::setenv("MEGASCOPE_STORE", store.c_str(), 1);
  }
  job = JobName(job);
  run_dir = fs::absolute(run_dir).string();
  RunLayout layout(run_dir);
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  if (ec) return Fail("wrap", "cannot make " + run_dir + ": " + ec.message());
  launch::ProcessSpec spec(cmd);
  spec.env = TracingEnv(run_dir, node, job, shm_dir, attempt, plugin, vm.count("no-cupti") == 0);
  auto agent = FindOrStartAgent(layout, node, job, shm_dir);
  if (!agent.ok()) return Fail("wrap", agent.status().message());
  const bool owner = agent->owner != nullptr;
  if (owner)
    Record(layout, controller::EventKind::kRestart, attempt, "",
           {{"cause", "wrap"}, {"nodes", {node}}, {"resume_step", 0}, {"source", "none"}});
  std::fprintf(stderr, "megascope wrap: tracing into %s (node %s, job %s; agent %s%s)\n",
               run_dir.c_str(), node.c_str(), job.c_str(), agent->url.c_str(),
               owner ? "" : ", another wrap's");
  int interrupted = 0;
  auto status = Supervise(spec, *agent, layout, job, shm_dir, attempt, interrupted);
  if (!status.ok()) return Fail("wrap", status.status().message());
  if (owner) {
    Record(layout, controller::EventKind::kJobFinished, attempt, "",
           {{"status", interrupted ? "interrupted" : (status->success() ? "finished" : "failed")},
            {"exit", status->Describe()}});
    agent->owner->StopAgent(node);  // it drains what is left first
  }
  if (interrupted) return 128 + interrupted;
  return status->exited() ? status->code() : 128 + status->signal();
}

}  // namespace megascope::cli
