// The agent's loop (agent.h): created, run, stopped; its parts in the files agent_impl.h names.
#include "megascope/tracer/agent/agent.h"

#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "agent_impl.h"
#include "megascope/tracer/enum_names.h"
#include "megascope/tracer/http_serve.h"
#include "megascope/tracer/run_layout.h"

namespace megascope::tracer::agent {

void Log(const std::string& node, const std::string& msg) {
  std::fprintf(stderr, "[agent %s] %s\n", node.c_str(), msg.c_str());
  std::fflush(stderr);
}

Agent::Agent(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<Agent>> Agent::Create(const AgentOptions& o) {
  if (o.run_dir.empty()) return InvalidArgument("the agent needs a run directory");
  auto impl = std::make_unique<Impl>(o);
  impl->wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (impl->wake_fd < 0)
    return Internal(std::string("cannot create the agent's eventfd: ") + std::strerror(errno));
  impl->host = HostSampler(o.proc_root);
  impl->nvml = Nvml::Load();
  ASSIGN_OR_RETURN(impl->store,
                   TraceStore::Open(RunLayout(o.run_dir).trace_db(o.node), o.max_db_mb << 20));
  if (o.write_hook) impl->store->set_write_hook(o.write_hook);
  impl->BuildFamilies();
  if (!o.store.empty()) {
    ASSIGN_OR_RETURN(auto so, StoreSinkOptions::Of(o.store, o.job, o.node, impl->store->path()));
    ASSIGN_OR_RETURN(impl->shipper, StoreLoop::Start({so}, o.store_interval_s,
                                                     [node = o.node](const std::string& line) {
                                                       Log(node, line);
                                                     }));
  }
  std::unique_ptr<Agent> agent(new Agent(std::move(impl)));
  RETURN_IF_ERROR(agent->impl_->Serve(agent.get()));
  return agent;
}

Agent::~Agent() {
  if (!impl_->http) return;
  // (an eviction, a restart and every `train` wait for the agent to exit)
  const size_t colon = impl_->opt.listen.rfind(':');
  tracer::StopServerPromptly(colon == std::string::npos ? "" : impl_->opt.listen.substr(0, colon),
                             port(), [this] { impl_->http->close(); });
}

int Agent::port() const {
  auto ports = impl_->http->getListeningPorts();
  return ports.empty() ? 0 : ports.front();
}

Result<size_t> Agent::Poll(bool sample) {
  impl_->DiscoverIfDue();
  impl_->RetainIfDue();
  return impl_->Drain(sample);
}

namespace {

constexpr std::array<std::string_view, 3> kDrainPriorityNames = {"normal", "batch", "idle"};

// Gives the calling thread `p`'s scheduling policy (sched(7)); a failure leaves the drain's policy
// as it was and says so.
void ApplyDrainPriority(const std::string& node, DrainPriority p) {
  constexpr std::array<int, kDrainPriorityNames.size()> kPolicies = {SCHED_OTHER, SCHED_BATCH,
                                                                     SCHED_IDLE};
  const int policy = kPolicies.at(static_cast<size_t>(p));
  const sched_param param{};
  if (::sched_setscheduler(0, policy, &param) != 0)
    Log(node, "cannot give the drain the " + std::string(Name(p)) +
                  " scheduling policy: " + std::strerror(errno) + " (it stays as it was)");
}

}  // namespace

std::string_view Name(DrainPriority p) { return NameFrom(kDrainPriorityNames, p); }

std::optional<DrainPriority> ParseDrainPriority(std::string_view s) {
  return ParseFrom<DrainPriority>(kDrainPriorityNames, s);
}

void Agent::Stop() {
  stop_ = true;
  const uint64_t one = 1;
  (void)!::write(impl_->wake_fd, &one, sizeof(one));
}

void Agent::Run() {
  ApplyDrainPriority(impl_->opt.node, impl_->opt.drain_priority);
  // At least 1 ms: an interval under half a millisecond must not become a busy loop.
  const int wait_ms =
      static_cast<int>(std::max<long>(1, std::lround(impl_->opt.drain_interval_s * 1000)));
  auto next_sample = impl_->clock.Now();
  while (!stop_) {
    const auto now = impl_->clock.Now();
    const bool sample = now >= next_sample;
    if (sample)
      next_sample = now + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(impl_->opt.sample_interval_s));
    auto n = Poll(sample);
    if (n.ok() && *n >= impl_->opt.batch_records / 2) continue;  // more waiting: no pause
    pollfd wake{impl_->wake_fd, POLLIN, 0};
    (void)::poll(&wake, 1, wait_ms);
  }
  for (int i = 0; i < 100; ++i) {  // final drain; the first pass also checks for dead ranks
    auto n = Poll(i == 0);
    if (!n.ok() || *n == 0) break;
  }
  if (impl_->shipper) impl_->shipper->Finish();  // what the final drain wrote goes too
}
std::string Agent::MetricsText() { return impl_->MetricsText(); }
std::string Agent::StateJson() { return impl_->State(); }
Result<std::string> Agent::DumpJson(int rank) { return impl_->RankDump(rank); }
void Agent::StreamDumps(int attempt, bool binary,
                        const std::function<void(std::string_view)>& sink) {
  impl_->AllDumps(attempt, binary, sink);
}
Result<std::string> Agent::StacksJson(int rank, std::chrono::milliseconds wait) {
  return impl_->RankStacks(rank, wait);
}
uint64_t Agent::rows_written() const { return impl_->rows.load(); }
uint64_t Agent::db_errors() const { return impl_->db_errors.load(); }

}  // namespace megascope::tracer::agent
