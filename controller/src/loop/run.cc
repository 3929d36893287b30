// The run: start-up (agents, the baseline self-check, the first attempt), the loop, and the end
// (records, reports, the timeline).
#include <algorithm>
#include <cstdio>

#include "impl.h"
#include "megascope/analyzer/query.h"
#include "megascope/analyzer/timeline.h"
#include "megascope/controller/report.h"

namespace megascope::controller {

volatile sig_atomic_t g_interrupted = 0;

namespace {
void OnInterrupt(int) { g_interrupted = 1; }
}  // namespace

// Start-up ended by Ctrl-C or SIGTERM (before any step): says so and stops what it started.
int Controller::Impl::StartInterrupted(const std::string& during) {
  Log("interrupted during start-up (" + during + "): stopping every process");
  fleet->StopRanks();
  fleet->StopAgents();
  ClearNetFaults();
  return kLaunchStopped;
}

// A start-up phase's failure: the interruption, where there was one (its processes saw it too).
int Controller::Impl::StartFailed(const std::string& during, const std::string& error) {
  if (g_interrupted) return StartInterrupted(during);
  std::fprintf(stderr, "megascope launch: %s\n", error.c_str());
  fleet->StopAgents();
  return kLaunchFailed;
}

int Controller::Impl::Run() {
  // From the first moment: an interruption during start-up (the baseline self-check takes
  // seconds) is said and cleaned up like one during training. The latch starts clear: a signal
  // before the handler is in place ended the process, and a controller run in a process that
  // ran another (the loop's tests) must not inherit that one's interruption.
  g_interrupted = 0;
  struct sigaction sa {
  }, old_int{}, old_term{};
  sa.sa_handler = &OnInterrupt;
  ::sigaction(SIGINT, &sa, &old_int);
  ::sigaction(SIGTERM, &sa, &old_term);
  const int rc = RunInterruptible();
  ::sigaction(SIGINT, &old_int, nullptr);
  ::sigaction(SIGTERM, &old_term, nullptr);
  return rc;
}

int Controller::Impl::RunInterruptible() {
  if (Status st = Setup(); !st.ok()) return StartFailed("setup", st.ToString());
  if (!finished_before.empty()) {
    Log(finished_before);
    return kLaunchFinished;
  }
  for (const std::string& node : active) {
    if (g_interrupted) return StartInterrupted("starting the agents");
    if (auto port = fleet->StartAgent(node); !port.ok())
      return StartFailed("starting the agents", port.status().message());
  }
  if (g_interrupted) return StartInterrupted("starting the agents");
  if (Status st = Baseline(); !st.ok())
    return StartFailed("the baseline self-check", st.ToString());
  if (g_interrupted) return StartInterrupted("the baseline self-check");
  Log(std::to_string(opt.world) + " ranks on " + Join(active) +
      (spares.empty() ? "" : "; spares " + Join({spares.begin(), spares.end()})) +
      "; control: megascope evict NODE --run-dir " + layout.dir() + " | megascope stop --run-dir " +
      layout.dir());
  launch::ResumePoint resume;  // a fresh run: from scratch, or the newest disk checkpoint
  if (adopted) {
    resume = launch::FindResumePoint(layout, MemoryDirs(), opt.world);
    if (!resume.log.empty()) std::printf("%s", resume.log.c_str());
    last_step_done = std::max<int64_t>(resume.step, 0);
    Log("adopted: resuming after step " + std::to_string(last_step_done) + " (" + resume.source +
        ")");
  }
  Record(EventKind::kRestart, "", -1,
         {{"cause", adopted ? "adopted" : "start"},
          {"nodes", active},
          {"resume_step", std::max<int64_t>(resume.step, 0)},
          {"source", resume.source}});
  if (Status st = StartAttempt(adopted ? &resume : nullptr); !st.ok())
    return StartFailed("starting the ranks", st.ToString());
  int rc = Loop();
  fleet->StopRanks();
  fleet->StopAgents();
  ClearNetFaults();
  PumpProgress();
  if (rc == kLaunchFinished || rc == kLaunchPaused || rc == kLaunchStopped) {
    const std::string lost = LostRecords();
    Record(EventKind::kJobFinished, "", -1,
           {{"status", rc == kLaunchFinished ? "finished"
                       : rc == kLaunchPaused ? "paused"
                                             : "stopped"},
            {"steps", last_step_done},
            {"wall_s", Since(launch_start)},
            {"records_lost", lost}});
  }
  WriteOwnFile(layout.report_md(), BuildReport(layout.dir()), "report: " + layout.report_md());
  WriteTimeline();  // before the HTML report, which links it
  WriteOwnFile(layout.dir() + "/report.html", BuildHtmlReport(layout.dir()),
               "report: " + layout.dir() + "/report.html (megascope report --html)");
  if (rc == kLaunchFinished) {  // the state in memory is only needed to resume
    std::error_code ec;
    fs::remove_all(MemoryRoot(opt.supervisor.shm_dir, opt.supervisor.job), ec);
  }
  if (const std::string lost = LostRecords(); !lost.empty()) {
    std::fprintf(stderr,
                 "megascope launch: the run could not keep all its records (a full disk?): %s\n",
                 lost.c_str());
    if (rc == kLaunchFinished) rc = kLaunchIncomplete;
  }
  return rc;
}

// timeline.html: the steps around the last incident (its root ranks highlighted), else the first
// ones.
void Controller::Impl::WriteTimeline() {
  analyzer::TimelineOptions o;
  o.first_step = std::max<int64_t>(0, incident_step - 3);
  o.last_step = incident_step + 3;
  o.highlight_ranks = incident_ranks;
  o.title = "megascope launch " + layout.dir() +
            (incident_ranks.empty() ? "" : ", steps around the last incident");
  // Only those steps are read (a run of 1,536 nodes is past SQLite's attach limit: a copy).
  auto db = analyzer::RunDatabase::Open(layout.dir(), {-1, o.first_step, o.last_step, ""});
  if (!db.ok()) return;
  auto j = analyzer::TimelineJson(**db, o);
  if (j.ok()) {
    WriteOwnFile(layout.timeline_html(), analyzer::TimelineHtml(*j, o),
                 "timeline: " + layout.timeline_html());
  }
}

int Controller::Impl::Loop() {
  const auto tick = std::chrono::duration<double>(opt.tick_s);
  for (;;) {
    clock.Sleep(tick);
    if (g_interrupted) {
      Log("interrupted: stopping every process");
      return kLaunchStopped;
    }
    PumpProgress();
    if (std::string why; disk.Short(&why)) {
      if (auto rc = WaitForSpace(why)) return *rc;
      continue;
    }
    std::deque<Command> todo;
    {
      std::lock_guard<std::mutex> lock(mu);
      todo.swap(commands);
      nodes_known = active;
    }
    for (const Command& c : todo) {
      if (c.what == "stop") {
        Log("stop requested through the control endpoint");
        PumpProgress();
        return kLaunchStopped;
      }
      if (std::find(active.begin(), active.end(), c.node) == active.end()) {
        Log("evict " + c.node + " ignored: not a node of the job (" + Join(active) + ")");
        continue;
      }
      if (!Incident(
              {TriggerCause::kManual, "evict requested for " + c.node, {}, c.node, {}, Streak{}}))
        return kLaunchPaused;
    }
    FireControllerInjections();
    for (const launch::AgentExit& a : fleet->PollAgents()) {
      if (std::find(active.begin(), active.end(), a.node) == active.end()) continue;
      auto port =
          fleet->StartAgent(a.node);  // its rings wait for it; cursors in trace.db say where it was
      Log("agent of " + a.node + " " + a.status.Describe() + ": restarted" +
          (port.ok() ? "" : " FAILED: " + port.status().message()));
      Record(EventKind::kAgentRestarted, a.node, -1,
             {{"exit", a.status.Describe()}, {"ok", port.ok()}});
      if (port.ok()) WriteScrapeTargets();  // it listens on another port now
    }
    std::vector<launch::RankExit> failures;
    for (const launch::RankExit& e : fleet->PollRanks()) {
      if (e.status.success())
        ++finished_ranks;
      else
        failures.push_back(e);
    }
    if (!failures.empty()) {
      const launch::RankExit& f = failures[0];
      if (!Incident({TriggerCause::kCrash,
                     "rank " + std::to_string(f.rank) + " " + f.status.Describe(),
                     failures,
                     "",
                     {},
                     Streak{}}))
        return kLaunchPaused;
      continue;
    }
    if (finished_ranks == opt.world) {
      PumpProgress();
      if (last_step_done < opt.steps) {  // the ranks ran them; their lines never arrived
        missing_steps += opt.steps - last_step_done;
        Log("every rank finished, but the progress stream stops at step " +
            std::to_string(last_step_done) + " of " + std::to_string(opt.steps));
      }
      Log("done: " + std::to_string(opt.steps) + " steps in " +
          std::to_string(static_cast<int>(Since(launch_start))) + " s");
      last_step_done = opt.steps;
      return kLaunchFinished;
    }
    if (!Watch()) return kLaunchPaused;
    std::string why;
    if (Stalled(&why)) {
      if (!Incident({TriggerCause::kHang, why, {}, "", {}, Streak{}})) return kLaunchPaused;
    }
  }
}

}  // namespace megascope::controller
