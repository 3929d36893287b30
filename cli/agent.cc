// `megascope agent`: the per-node collector.
#include "megascope/tracer/agent/agent.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>

#include "command.h"
#include "megascope/analyzer/node_query.h"
#include "megascope/analyzer/window.h"
#include "megascope/launch/process.h"
#include "megascope/tracer/clickhouse.h"
#include "megascope/tracer/file_util.h"
#include "megascope/tracer/run_layout.h"

namespace megascope::cli {
namespace {

tracer::agent::Agent* g_agent = nullptr;
void OnStop(int) {
  if (g_agent != nullptr) g_agent->Stop();
}

// The store's fault seam for crash tests: MEGASCOPE_AGENT_CRASH=before-commit:N|after-commit:N
// kills the agent with SIGKILL at that point of its Nth write that reaches it (trace_store.h).
Result<tracer::WriteHook> CrashHookFromEnv() {
  const char* v = std::getenv("MEGASCOPE_AGENT_CRASH");
  if (v == nullptr || *v == '\0') return tracer::WriteHook();
  const std::string spec = v;
  const auto colon = spec.find(':');
  const std::string where = spec.substr(0, colon);
  const int n = colon == std::string::npos ? 0 : std::atoi(spec.c_str() + colon + 1);
  if ((where != "before-commit" && where != "after-commit") || n < 1)
    return InvalidArgument("MEGASCOPE_AGENT_CRASH='" + spec +
                           "': expected before-commit:N or after-commit:N (N >= 1)");
  const auto point = where == "before-commit" ? tracer::WritePoint::kBeforeCommit
                                              : tracer::WritePoint::kAfterCommit;
  return tracer::WriteHook([point, n, seen = 0](tracer::WritePoint p) mutable {
    if (p == point && ++seen == n) ::kill(::getpid(), SIGKILL);
  });
}

// The agent's options, read into `o`; the token file's path and the drain priority's spelling
// into their own strings.
po::options_description AgentOptionsOf(tracer::agent::AgentOptions& o, std::string& token_file,
                                       std::string& drain_priority) {
  po::options_description opts("Options");
  opts.add_options()("help,h", "show this help")(
      "node", po::value(&o.node)->required(),
      "this node's name (rings of other nodes are left alone)")(
      "run-dir", po::value(&o.run_dir)->required(),
      "run directory: writes nodes/<node>/trace.db and dumps/")(
      "job", po::value(&o.job)->default_value(o.job), "job whose rings to drain")(
      "listen", po::value(&o.listen)->default_value(o.listen),
      "HTTP address for /metrics, /state, /dump/<rank> (port 0: any free)")(
      "sample-interval", po::value(&o.sample_interval_s)->default_value(1.0),
      "seconds between host metric samples")(
      "drain-interval", po::value(&o.drain_interval_s)->default_value(o.drain_interval_s, "0.2"),
      "seconds between drain passes into trace.db (a pass reading half a batch or more goes "
      "again at once): shorter shows rows sooner, longer writes fewer transactions")(
      "shm-dir", po::value(&o.shm_dir)->default_value(o.shm_dir), "where rank rings live")(
      "max-db-mb", po::value(&o.max_db_mb)->default_value(0),
      "cap trace.db at this many MiB (0: no cap)")(
      "retain-hours", Decimal(&o.retain_hours, o.retain_hours),
      "trace.db keeps this many hours of rows: older spans and collectives are summed per step "
      "into step_rollups, then dropped with older heartbeats and metrics, once a minute (0: keep "
      "everything)")(
      "retain-rollup-hours", Decimal(&o.retain_rollup_hours, o.retain_rollup_hours),
      "the per-step rollups are kept this many hours, at least --retain-hours (0: for ever)")(
      "drain-priority", po::value(&drain_priority)->default_value(drain_priority),
      "CPU scheduling policy of the drain: batch (SCHED_BATCH: an equal share of the CPU, but "
      "never preempting a running rank when it wakes up), idle (SCHED_IDLE: only cores no rank "
      "wants; where the ranks keep every core busy, trace.db and the straggler watch fall behind "
      "and full rings count drops) or normal. HTTP requests are served at the normal policy "
      "either way")(
      "token-file", po::value(&token_file),
      "require \"Authorization: Bearer <token>\" on every request, the token read from this file "
      "(a launch gives its agents RUN_DIR/control.token when they listen beyond loopback)")(
      "store", po::value(&o.store),
      "also ship every row committed to trace.db to the fleet's ClickHouse store, "
      "clickhouse://[USER[:PASSWORD]@]HOST[:8123][/DATABASE][?cluster=NAME] (default "
      "$MEGASCOPE_STORE; docs/formats.md section 4b): exactly once, from a cursor kept in "
      "trace.db; while the store is slow or down the rows wait in trace.db and training never "
      "does")(
      "proc-root", po::value(&o.proc_root)->default_value(o.proc_root),
      "root of the /proc tree to sample (tests use a fake one; default $MEGASCOPE_PROC_ROOT or "
      "/proc)");
  return opts;
}

// The numbers and spellings checked, the token read: empty, or what is wrong.
std::string CheckAgentOptions(tracer::agent::AgentOptions& o, const std::string& token_file,
                              const std::string& drain_priority) {
  if (o.sample_interval_s <= 0) return "--sample-interval must be positive";
  if (!(o.retain_hours >= 0)) return "--retain-hours must be >= 0 (0: keep everything)";
  if (!(o.retain_rollup_hours == 0 || o.retain_rollup_hours >= o.retain_hours))
    return "--retain-rollup-hours must be 0 (for ever) or at least --retain-hours";
  if (!(o.drain_interval_s > 0 && o.drain_interval_s <= 60))
    return "--drain-interval must be above 0 and at most 60 seconds";
  if (o.store.empty()) {
    if (const char* env = std::getenv("MEGASCOPE_STORE"); env != nullptr) o.store = env;
  }
  if (!o.store.empty()) {
    if (auto u = tracer::StoreUrl::Parse(o.store); !u.ok()) return u.status().message();
  }
  auto p = tracer::agent::ParseDrainPriority(drain_priority);
  if (!p) return "--drain-priority '" + drain_priority + "': expected idle, batch or normal";
  o.drain_priority = *p;
  if (!token_file.empty()) {
    auto token = tracer::ReadToken(token_file);
    if (!token.ok()) return token.status().message();
    o.token = *token;
  }
  return "";
}

}  // namespace

int RunAgent(const Args& args) {
  tracer::agent::AgentOptions o;
  auto hook = CrashHookFromEnv();
  if (!hook.ok()) return Fail("agent", hook.status().ToString(), kExitUsage);
  o.write_hook = *hook;
  // The fault seam of `megascope launch --inject metric:...`: the node's agent samples a /proc tree
  // of its own.
  if (const char* root = std::getenv("MEGASCOPE_PROC_ROOT"); root != nullptr && *root != '\0')
    o.proc_root = root;
  std::string token_file;
  std::string drain_priority(tracer::agent::Name(o.drain_priority));
  po::options_description opts = AgentOptionsOf(o, token_file, drain_priority);
  po::variables_map vm;
  if (auto rc = ParseArgs(
          "agent", "megascope agent --node NAME --run-dir DIR [--job J] [--listen 127.0.0.1:PORT]",
          args, opts, {}, &vm)) {
    return *rc;
  }
  if (std::string err = CheckAgentOptions(o, token_file, drain_priority); !err.empty())
    return Fail("agent", err, kExitUsage);
  // GET /window: the node's part of a straggler window, over its own trace.db.
  auto windows = std::make_shared<analyzer::WindowServer>(o.run_dir, o.node);
  o.window = [windows](std::string_view query) { return windows->Serve(query); };
  // GET /query: an SRE query's part, over the same database, read-only.
  auto queries = std::make_shared<analyzer::QueryServer>(o.run_dir, o.node);
  o.query = [queries](std::string_view query) { return queries->Serve(query); };
  auto agent = tracer::agent::Agent::Create(o);
  if (!agent.ok()) return Fail("agent", agent.status().ToString());
  g_agent = agent->get();
  struct sigaction sa {};
  sa.sa_handler = &OnStop;
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
  const int port = (*agent)->port();
  std::string host = o.listen.substr(0, o.listen.rfind(':'));
  if (host.empty() || host == "0.0.0.0") host = "127.0.0.1";
  // The port file tells the launcher (and people) where to scrape.
  const std::string port_file = RunLayout(o.run_dir).agent_port(o.node);
  std::ofstream(port_file) << port << "\n";
  std::fprintf(
      stderr,
      "[agent %s] job %s: http://%s:%d/metrics, /state, /dump/<rank>, /query%s; trace.db in "
      "%s/nodes/%s\n",
      o.node.c_str(), o.job.c_str(), host.c_str(), port,
      o.token.empty() ? "" : " (with the run's token)", o.run_dir.c_str(), o.node.c_str());
  (*agent)->Run();
  std::fprintf(stderr, "[agent %s] stopped after %llu rows (%llu database errors); %s\n",
               o.node.c_str(), static_cast<unsigned long long>((*agent)->rows_written()),
               static_cast<unsigned long long>((*agent)->db_errors()),
               launch::Describe(launch::SelfCpuTime()).c_str());
  g_agent = nullptr;
  return 0;
}

}  // namespace megascope::cli
