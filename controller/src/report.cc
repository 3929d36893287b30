#include "megascope/controller/report.h"

#include <cstdio>
#include <map>

#include "megascope/launch/progress.h"
#include "megascope/tracer/format.h"
#include "megascope/tracer/run_layout.h"

namespace megascope::controller {
namespace {

std::string Secs(double s) { return tracer::Format("%.2f s", s); }

std::string Nodes(const nlohmann::json& list) {
  std::string out;
  for (const auto& n : list) {
    if (n.is_string()) out += (out.empty() ? "" : ", ") + n.get<std::string>();
  }
  return out;
}

// The stage an event is in an incident's table, and whether it is one an SRE looks for first;
// nullptr for events that are no stage (checkpoints saved, Slurm's step ids, the job's end).
const char* StageName(EventKind k, bool* key) {
  *key = false;
  switch (k) {
    case EventKind::kFaultInjected:
      return "fault injected";
    case EventKind::kTrigger:
      return "trigger (detected)";
    case EventKind::kVerdict:
      return "verdict";
    case EventKind::kDecision:
      return "policy";
    case EventKind::kStopped:
      return "stopped";
    case EventKind::kEviction:
      *key = true;
      return "eviction";
    case EventKind::kSelfCheck:
      return "self-check";
    case EventKind::kRestart:
      *key = true;
      return "restart";
    case EventKind::kCheckpointLoaded:
      return "state loaded";
    case EventKind::kResumed:
      return "resumed (first step done)";
    case EventKind::kPaused:
      *key = true;
      return "paused";
    case EventKind::kAgentRestarted:
      return "agent restarted";
    case EventKind::kCheckpointSaved:
    case EventKind::kJobFinished:
    case EventKind::kSlurmSteps:
      return nullptr;
  }
  return nullptr;
}

}  // namespace

std::string DescribeEvent(const Event& e) {
  const nlohmann::json& d = e.detail;
  const std::optional<EventKind> kind = ParseEventKind(e.kind_name);
  if (!kind) return e.kind_name + " " + e.node + " " + d.dump();  // a newer writer's kind
  switch (*kind) {
    case EventKind::kFaultInjected:
      return d.value("kind", "") + " injected" +
             (e.rank >= 0 ? " on rank " + std::to_string(e.rank) : "") +
             (e.node.empty() ? "" : " (" + e.node + ")") +
             (d.contains("step") ? " at step " + d["step"].dump() : "");
    case EventKind::kTrigger:
      return d.value("cause", "") + ": " + d.value("detail", "");
    case EventKind::kVerdict:
      return d.value("kind", "") + " " + d.value("cause", "") + ": " + d.value("explanation", "");
    case EventKind::kDecision:
      return d.value("action", "") + (e.node.empty() ? "" : " " + e.node) + ": " +
             d.value("reason", "");
    case EventKind::kStopped:
      return "survivors' dumps collected, every rank stopped in " + Secs(d.value("seconds", 0.0));
    case EventKind::kEviction:
      return e.node + " evicted: " + d.value("reason", "");
    case EventKind::kSelfCheck: {
      std::string b =
          tracer::Format("%s %s (%s): GEMM %.2f GFLOP/s, all-reduce %.3f GB/s", e.node.c_str(),
                         d.value("passed", false) ? "passed" : "FAILED", d.value("why", "").c_str(),
                         d.value("gemm_gflops", 0.0), d.value("allreduce_gbps", 0.0));
      return b;
    }
    case EventKind::kRestart:
      return "attempt " + std::to_string(e.attempt) + " on " +
             Nodes(d.value("nodes", nlohmann::json::array())) + ", from " + d.value("source", "") +
             " after step " + std::to_string(d.value("resume_step", 0)) +
             (d.contains("steps_lost")
                  ? "; " + std::to_string(d.value("steps_lost", 0)) + " step(s) lost"
                  : "");
    case EventKind::kCheckpointLoaded:
      return "step " + std::to_string(d.value("step", 0)) + " from " + d.value("source", "") +
             ": rendezvous " + Secs(d.value("rendezvous_s", 0.0)) + ", load " +
             Secs(d.value("load_s", 0.0));
    case EventKind::kResumed:
      return "step " + std::to_string(d.value("step", 0)) + " done";
    case EventKind::kPaused:
      return d.value("reason", "");
    case EventKind::kAgentRestarted:
      return "agent of " + e.node + " restarted (" + d.value("exit", "") + ")";
    case EventKind::kCheckpointSaved:
      return "checkpoint of step " + std::to_string(d.value("step", 0)) + " saved";
    case EventKind::kJobFinished:
      return "job " + d.value("status", "finished") + " after " +
             std::to_string(d.value("steps", 0)) + " steps";
    case EventKind::kSlurmSteps:
      return "Slurm job " + d.value("job", "");
  }
  return e.kind_name;
}

Result<RunReport> ReadRunReport(const std::string& run_dir) {
  RunLayout layout(run_dir);
  ASSIGN_OR_RETURN(std::unique_ptr<ControlDb> db,
                   ControlDb::Open(layout.control_db(), /*read_only=*/true));
  RunReport r;
  r.run_dir = run_dir;
  ASSIGN_OR_RETURN(r.events, db->Events());
  ReportFigures& f = r.figures;
  // Productive time: each step counted once, from its last (kept) run.
  std::map<int64_t, double> kept;
  launch::ProgressReader progress(layout.progress());
  for (const auto& line : progress.Poll()) {
    if (!line.contains("event") && line.contains("step"))
      kept[line.value("step", int64_t{0})] = line.value("step_time_s", 0.0);
  }
  for (const auto& [step, s] : kept) f.productive_s += s;
  const std::vector<Event>& events = r.events;
  const int64_t start_ns = events.empty() ? 0 : events.front().ts_ns;
  int64_t end_ns = events.empty() ? 0 : events.back().ts_ns;
  r.status = "running (no job_finished event yet)";
  for (const Event& e : events) {
    if (e.kind_name == Name(EventKind::kJobFinished)) {
      end_ns = e.ts_ns;
      r.status = e.detail.value("status", "finished");
    }
  }
  f.wall_s = static_cast<double>(end_ns - start_ns) / 1e9;
  f.ettr = f.wall_s > 0 ? f.productive_s / f.wall_s : 0;

  // The fault that fired last before a trigger is its cause when there is one.
  const Event* last_fault = nullptr;
  for (size_t i = 0; i < events.size(); ++i) {
    const Event& e = events[i];
    const std::optional<EventKind> kind = ParseEventKind(e.kind_name);
    if (kind == EventKind::kFaultInjected && e.detail.value("kind", "") != "degrade")
      last_fault = &e;
    if (kind == EventKind::kEviction) ++f.evictions;
    if (kind == EventKind::kAgentRestarted) r.notes.push_back(DescribeEvent(e) + ", no eviction");
    if (kind != EventKind::kTrigger) continue;
    ReportIncident inc;
    inc.number = ++f.incidents;
    inc.attempt = e.attempt;
    inc.cause = e.detail.value("cause", "");
    inc.trigger_ns = e.ts_ns;
    bool key = false;
    if (last_fault != nullptr && last_fault->ts_ns <= e.ts_ns) {
      inc.stages.push_back({StageName(EventKind::kFaultInjected, &key), last_fault->ts_ns,
                            DescribeEvent(*last_fault), false});
    }
    last_fault = nullptr;
    inc.stages.push_back(
        {StageName(EventKind::kTrigger, &key), e.ts_ns, e.detail.value("detail", ""), false});
    for (size_t j = i + 1; j < events.size() && events[j].kind_name != e.kind_name; ++j) {
      const Event& s = events[j];
      const std::optional<EventKind> k = ParseEventKind(s.kind_name);
      const char* stage = k ? StageName(*k, &key) : nullptr;
      if (stage == nullptr) continue;
      std::string detail = DescribeEvent(s);
      if (k == EventKind::kVerdict) {
        detail = s.detail.value("cause", "") + ": " + s.detail.value("explanation", "");
      } else if (k == EventKind::kRestart) {
        inc.steps_lost = s.detail.value("steps_lost", 0);
      } else if (k == EventKind::kResumed && inc.resumed_after_s < 0) {
        inc.resumed_after_s = static_cast<double>(s.ts_ns - e.ts_ns) / 1e9;
      }
      inc.stages.push_back({stage, s.ts_ns, std::move(detail), key});
    }
    r.incidents.push_back(std::move(inc));
  }
  return r;
}

std::string FormatReport(const RunReport& r) {
  const ReportFigures& f = r.figures;
  std::string out = "# megascope launch report: " + r.run_dir + "\n\n";
  std::string summary = tracer::Format(
      "Status: **%s**. %d incident(s), %d eviction(s). Wall time %.1f s, productive step "
      "time %.1f s: **ETTR %.3f**.\n\n",
      r.status.c_str(), f.incidents, f.evictions, f.wall_s, f.productive_s, f.ettr);
  out += summary;
  for (const ReportIncident& inc : r.incidents) {
    out += "## Incident " + std::to_string(inc.number) + " (attempt " +
           std::to_string(inc.attempt) + "): " + inc.cause + "\n\n";
    out += "| stage | at (from trigger) | detail |\n| --- | --- | --- |\n";
    for (const ReportStage& s : inc.stages) {
      const int64_t d = s.ts_ns - inc.trigger_ns;
      out += "| " + s.stage + " | " + (d >= 0 ? "+" : "") + Secs(static_cast<double>(d) / 1e9) +
             " | " + (s.key ? "**" + s.detail + "**" : s.detail) + " |\n";
    }
    out += "\n";
  }
  for (const std::string& n : r.notes) out += "- " + n + "\n";
  if (r.incidents.empty()) out += "No incident.\n";
  return out;
}

Result<std::string> BuildReport(const std::string& run_dir, ReportFigures* figures) {
  ASSIGN_OR_RETURN(RunReport r, ReadRunReport(run_dir));
  if (figures) *figures = r.figures;
  return FormatReport(r);
}

}  // namespace megascope::controller
