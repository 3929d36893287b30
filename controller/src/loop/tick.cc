// What every tick reads: the progress stream, the agents' /state (a stall), and the faults the
// controller itself injects (metric, link, kill-agent).
#include <algorithm>
#include <cstdio>

#include "../net_fault.h"
#include "impl.h"
#include "megascope/launch/link_seam.h"
#include "megascope/launch/scrape_targets.h"
#include "megascope/launch/slurm.h"
#include "megascope/tracer/agent/agent_state.h"
#include "megascope/tracer/clock.h"
#include "megascope/tracer/format.h"

namespace megascope::controller {

void Controller::Impl::PumpProgress() {
  for (const json& line : progress.Poll()) {
    const std::string event = line.value("event", "");
    const int line_attempt = line.value("attempt", attempt);
    if (event == "fault") {
      const std::optional<launch::WorkerFaultKind> kind =
          launch::ParseWorkerFaultKind(line.value("kind", ""));
      Injection* in = line_attempt == attempt && kind
                          ? FiredInjection(opt.injections, *kind, line.value("rank", -2),
                                           line.value("step", int64_t{-1}))
                          : nullptr;
      if (in != nullptr) in->fired = true;
      Log("fault fired: " + line.value("kind", std::string()) + " on rank " +
          std::to_string(line.value("rank", -1)) + " (" + line.value("node", std::string()) +
          ") at step " + std::to_string(line.value("step", 0)));
      Record(EventKind::kFaultInjected, line.value("node", ""), line.value("rank", -1),
             {{"kind", line.value("kind", "")}, {"step", line.value("step", 0)}},
             line.value("ts_ns", int64_t{0}));
    } else if (event == "ready" && line_attempt == attempt) {
      // Where the attempt starts: a launch in a run directory with a checkpoint (an earlier
      // launch's) starts past step 0, and the steps before are not missing from the stream.
      last_step_done = std::max(last_step_done, line.value("step", int64_t{0}));
      ready_load_s = line.value("load_s", 0.0);
      last_progress = clock.Now();  // the stall clock starts when the ranks are ready
      Record(EventKind::kCheckpointLoaded, "", -1,
             {{"step", line.value("step", 0)},
              {"source", line.value("source", "none")},
              {"rendezvous_s", line.value("rendezvous_s", 0.0)},
              {"load_s", line.value("load_s", 0.0)}},
             line.value("ts_ns", int64_t{0}));
    } else if (event.empty() && line.contains("step")) {
      std::printf("%s\n", launch::FormatStepLine(line, opt.steps).c_str());
      std::fflush(stdout);
      const int64_t step = line.value("step", last_step_done);
      if (line_attempt == attempt && attempt_stepped && step > last_step_done + 1)
        missing_steps += step - last_step_done - 1;
      last_step_done = step;
      step_times.push_back(line.value("step_time_s", 0.0));
      last_progress = clock.Now();
      if (line_attempt == attempt && !attempt_stepped) {
        attempt_stepped = true;
        RecordSlurmSteps();
        if (incident_start_ns) {
          const int64_t ts = line.value("ts_ns", clock.WallNs());
          Record(EventKind::kResumed, "", -1,
                 {{"step", last_step_done},
                  {"since_trigger_s", static_cast<double>(ts - *incident_start_ns) / 1e9}},
                 ts);
          Log("training resumed: step " + std::to_string(last_step_done) + " done " +
              std::to_string(static_cast<double>(ts - *incident_start_ns) / 1e9).substr(0, 5) +
              " s after the trigger");
          incident_start_ns.reset();
        }
      }
    }
  }
}

// Under Slurm: which steps of the job run the attempt (every rank has started by its first step).
void Controller::Impl::RecordSlurmSteps() {
  std::string job;
  for (const auto& [node, host] : opt.supervisor.hosts) {
    if (!host.slurm_job.empty()) job = host.slurm_job;
  }
  if (job.empty()) return;
  auto steps = launch::SlurmSteps(job);
  if (!steps.ok()) {
    Log("slurm: cannot list the steps of job " + job + ": " + steps.status().ToString());
    return;
  }
  Record(EventKind::kSlurmSteps, "", -1, {{"job_id", job}, {"steps", *steps}});
}

double Controller::Impl::HangThreshold() const {
  // Before its first step an attempt may rendezvous and load for the start-up grace; once ready, a
  // restart (steps already timed) gets its usual threshold plus a first step's allowance: three of
  // its reporting rank's load times (the other ranks load theirs meanwhile), at least hang_after.
  if (!attempt_stepped && (!ready_load_s || step_times.empty()))
    return std::max(opt.startup_grace_s, opt.hang_after_s);
  const auto n = static_cast<std::ptrdiff_t>(std::min<size_t>(step_times.size(), 20));
  std::vector<double> recent(step_times.end() - n, step_times.end());
  double median = 0;
  if (!recent.empty()) {
    std::nth_element(recent.begin(),
                     recent.begin() + static_cast<std::ptrdiff_t>(recent.size() / 2), recent.end());
    median = recent[recent.size() / 2];
  }
  const double usual = std::max(opt.hang_after_s, opt.hang_factor * median);
  return attempt_stepped ? usual : usual + std::max(opt.hang_after_s, 3 * *ready_load_s);
}

// Reads every agent's /state; true when the job has stalled (no rank's step moved for the
// threshold) or an op has been open past its budget. `why` says which.
bool Controller::Impl::Stalled(std::string* why) {
  const int64_t now = clock.WallNs();
  double oldest_op_s = 0;
  bool moved = false;
  // Every agent at once; one that does not answer in time is stale this tick, not dead (the hang
  // and crash paths decide that).
  for (const Result<std::string>& body : fleet->AgentGetAll(active, "/state", 1000, agent_token)) {
    if (!body.ok()) continue;
    (void)tracer::agent::ReadAgentState(*body, [&](const tracer::agent::RankBeat& r) {
      if (r.attempt != attempt) return;
      auto it = hb_steps.find(r.rank);
      if (it == hb_steps.end() || it->second != r.step) {
        moved = moved || it != hb_steps.end();
        hb_steps[r.rank] = r.step;
      }
      if (r.oldest_enqueued_ns < now)
        oldest_op_s = std::max(oldest_op_s, static_cast<double>(now - r.oldest_enqueued_ns) / 1e9);
    });
  }
  if (moved) last_progress = clock.Now();
  const double threshold = HangThreshold();
  if (Since(last_progress) > threshold) {
    *why = tracer::Format("no rank's step advanced for %.1f s (threshold %.1f s)",
                          Since(last_progress), threshold);
    return true;
  }
  if (oldest_op_s > opt.op_timeout_s) {
    *why = "an op has been open for " + std::to_string(static_cast<int>(oldest_op_s)) + " s";
    return true;
  }
  return false;
}

// RUN_DIR/prometheus_targets.json: the active nodes' agents, for Prometheus' file_sd. A failure
// is said, not fatal: the job trains on without the file.
void Controller::Impl::WriteScrapeTargets() {
  std::vector<launch::ScrapeTarget> targets;
  for (const std::string& node : active) {
    const std::optional<int> port = fleet->AgentPort(node);
    if (!port) continue;
    const launch::Host* h = fleet->HostOf(node);
    targets.push_back({node, h != nullptr ? h->frontend_addr : "127.0.0.1", *port});
  }
  if (Status st = launch::WriteScrapeTargets(layout, targets); !st.ok())
    Log("cannot write the Prometheus targets: " + st.message());
}

bool Controller::Impl::InjectionDue(const Injection& in) {
  return !in.fired && ((in.at_seconds >= 0 && Since(launch_start) >= in.at_seconds) ||
                       (in.at_step >= 0 && last_step_done >= in.at_step));
}

void Controller::Impl::FireControllerInjections() {
  for (Injection& in : opt.injections) {
    if (!InjectionDue(in)) continue;
    if (in.kind == FaultKind::kMetric) FireMetricFault(in);
    if (in.kind == FaultKind::kLink) FireLinkFault(in);
    if (in.kind == FaultKind::kKillAgent && fleet->AgentPort(in.node)) {
      in.fired = fleet->SignalAgent(in.node, SIGKILL);
      Log("fault fired: kill-agent on " + in.node);
      Record(EventKind::kFaultInjected, in.node, -1, {{"kind", "kill-agent"}, {"spec", in.spec}});
    }
  }
  EndLinkFaults();
}

void Controller::Impl::FireMetricFault(Injection& in) {
  proc_faults.at(in.node)->Fire();
  in.fired = true;
  Log("fault fired: metric " + in.what + " on " + in.node +
      (in.seconds > 0 ? " for " + std::to_string(in.seconds).substr(0, 5) + " s" : ""));
  Record(EventKind::kFaultInjected, in.node, -1,
         {{"kind", "metric"}, {"what", in.what}, {"seconds", in.seconds}, {"spec", in.spec}});
}

void Controller::Impl::FireLinkFault(Injection& in) {
  in.fired = true;
  Status st;
  if (HasOwnHost(in.node)) {
    const launch::Host& host = *fleet->HostOf(in.node);
    // The ranks (local processes in their hosts' namespaces) are stopped while tc and nft
    // run: a fault due after step N lands there, not however many steps later the tools are
    // done on a busy machine (CI saw a 12-step job finish before they were).
    std::vector<int> stopped;
    for (int r = 0; r < opt.world; ++r) {
      if (fleet->SignalRank(r, SIGSTOP)) stopped.push_back(r);
    }
    st = ApplyLinkFault(host, in.link, in.rate_mbps, in.loss_pct);
    for (int r : stopped) fleet->SignalRank(r, SIGCONT);
    last_progress = clock.Now();  // no step could advance while they were stopped
    if (st.ok()) {
      net_faults[in.node] = in.seconds > 0
                                ? clock.Now() + std::chrono::duration_cast<Clock::duration>(
                                                    std::chrono::duration<double>(in.seconds))
                                : Clock::time_point::max();
    }
  } else {
    launch::LinkFault f{in.rate_mbps, 0};
    // The node's real processes read the seam against their own clock.
    if (in.seconds > 0) f.until_ns = tracer::WallNowNs() + static_cast<int64_t>(in.seconds * 1e9);
    st = launch::WriteLinkFault(link_seams.at(in.node), f);
  }
  if (!st.ok()) {
    Log("cannot inject " + in.spec + ": " + st.ToString());
    return;
  }
  std::string what = std::string(Name(in.link));
  if (in.link == LinkFaultKind::kSlow)
    what += " (" + std::to_string(in.rate_mbps).substr(0, 6) + " MB/s)";
  if (in.link == LinkFaultKind::kLoss)
    what += " (" + std::to_string(in.loss_pct).substr(0, 5) + " % of packets)";
  Log("fault fired: link " + what + " on " + in.node +
      (HasOwnHost(in.node) ? " (its host's backend link)" : " (link seam)") +
      (in.seconds > 0 ? " for " + std::to_string(in.seconds).substr(0, 5) + " s" : ""));
  Record(EventKind::kFaultInjected, in.node, -1,
         {{"kind", "link"},
          {"what", Name(in.link)},
          {"rate_mbps", in.rate_mbps},
          {"loss_pct", in.loss_pct},
          {"real", HasOwnHost(in.node)},
          {"seconds", in.seconds},
          {"spec", in.spec}});
}

void Controller::Impl::EndLinkFaults() {
  for (auto it = net_faults.begin(); it != net_faults.end();) {
    if (clock.Now() < it->second) {
      ++it;
      continue;
    }
    if (Status st = ClearLinkFault(*fleet->HostOf(it->first)); !st.ok())
      Log("cannot clear the link fault on " + it->first + ": " + st.ToString());
    else
      Log("link fault on " + it->first + " ended");
    it = net_faults.erase(it);
  }
}

}  // namespace megascope::controller
