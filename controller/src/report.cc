#include "megascope/controller/report.h"

#include <cstdio>
#include <map>

#include "megascope/controller/control_db.h"
#include "megascope/launch/progress.h"
#include "megascope/launch/run_layout.h"

namespace megascope::controller {
namespace {

std::string Secs(double s) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.2f s", s);
  return b;
}

}  // namespace

Result<std::string> BuildReport(const std::string& run_dir, ReportFigures* figures) {
  launch::RunLayout layout(run_dir);
  ASSIGN_OR_RETURN(std::unique_ptr<ControlDb> db,
                   ControlDb::Open(layout.control_db(), /*read_only=*/true));
  ASSIGN_OR_RETURN(std::vector<Event> events, db->Events());
  ReportFigures f;
  // Productive time: each step counted once, from its last (kept) run.
  std::map<int64_t, double> kept;
  launch::ProgressReader progress(layout.progress());
  for (const auto& line : progress.Poll()) {
    if (!line.contains("event") && line.contains("step"))
      kept[line.value("step", int64_t{0})] = line.value("step_time_s", 0.0);
  }
  for (const auto& [step, s] : kept) f.productive_s += s;
  const int64_t start_ns = events.empty() ? 0 : events.front().ts_ns;
  int64_t end_ns = events.empty() ? 0 : events.back().ts_ns;
  std::string status = "running (no job_finished event yet)";
  for (const Event& e : events) {
    if (e.kind_name == "job_finished") {
      end_ns = e.ts_ns;
      status = e.detail.value("status", "finished");
    }
  }
  f.wall_s = static_cast<double>(end_ns - start_ns) / 1e9;
  f.ettr = f.wall_s > 0 ? f.productive_s / f.wall_s : 0;

  std::string out = "# megascope launch report: " + run_dir + "\n\n";
  std::string body;
  // An incident runs from a trigger to the next trigger (or the end); the fault that fired last
  // before the trigger is its cause when there is one.
  const Event* last_fault = nullptr;
  for (size_t i = 0; i < events.size(); ++i) {
    const Event& e = events[i];
    if (e.kind_name == "fault_injected" && e.detail.value("kind", "") != "degrade") last_fault = &e;
    if (e.kind_name == "eviction") ++f.evictions;
    if (e.kind_name != "trigger") continue;
    ++f.incidents;
    const int64_t t0 = e.ts_ns;
    auto at = [&](int64_t ts) {
      return (ts >= t0 ? "+" : "") + Secs(static_cast<double>(ts - t0) / 1e9);
    };
    body += "## Incident " + std::to_string(f.incidents) + " (attempt " +
            std::to_string(e.attempt) + "): " + e.detail.value("cause", "") + "\n\n";
    body += "| stage | at (from trigger) | detail |\n| --- | --- | --- |\n";
    if (last_fault != nullptr && last_fault->ts_ns <= t0) {
      body += "| fault injected | " + at(last_fault->ts_ns) + " | " +
              last_fault->detail.value("kind", "") +
              (last_fault->rank >= 0 ? " on rank " + std::to_string(last_fault->rank) : "") +
              (last_fault->node.empty() ? "" : " (" + last_fault->node + ")") + " |\n";
    }
    last_fault = nullptr;
    body += "| trigger (detected) | +0.00 s | " + e.detail.value("detail", "") + " |\n";
    for (size_t j = i + 1; j < events.size() && events[j].kind_name != "trigger"; ++j) {
      const Event& s = events[j];
      const std::string& k = s.kind_name;
      if (k == "verdict") {
        body += "| verdict | " + at(s.ts_ns) + " | " + s.detail.value("cause", "") + ": " +
                s.detail.value("explanation", "") + " |\n";
      } else if (k == "stopped") {
        body += "| stopped | " + at(s.ts_ns) +
                " | survivors' dumps collected, every rank stopped in " +
                Secs(s.detail.value("seconds", 0.0)) + " |\n";
      } else if (k == "eviction") {
        body += "| eviction | " + at(s.ts_ns) + " | **" + s.node +
                "** evicted: " + s.detail.value("reason", "") + " |\n";
      } else if (k == "self_check") {
        char b[200];
        std::snprintf(b, sizeof(b), "%s %s (%s): GEMM %.2f GFLOP/s, all-reduce %.3f GB/s",
                      s.node.c_str(), s.detail.value("passed", false) ? "passed" : "FAILED",
                      s.detail.value("why", "").c_str(), s.detail.value("gemm_gflops", 0.0),
                      s.detail.value("allreduce_gbps", 0.0));
        body += "| self-check | " + at(s.ts_ns) + " | " + b + " |\n";
      } else if (k == "restart") {
        std::string nodes;
        for (const auto& n : s.detail.value("nodes", nlohmann::json::array()))
          nodes += (nodes.empty() ? "" : ", ") + n.get<std::string>();
        body += "| restart | " + at(s.ts_ns) + " | attempt " + std::to_string(s.attempt) + " on " +
                nodes + ", from " + s.detail.value("source", "") + " after step " +
                std::to_string(s.detail.value("resume_step", 0)) + "; **" +
                std::to_string(s.detail.value("steps_lost", 0)) + " step(s) lost** |\n";
      } else if (k == "checkpoint_loaded") {
        body += "| state loaded | " + at(s.ts_ns) + " | rendezvous " +
                Secs(s.detail.value("rendezvous_s", 0.0)) + ", load " +
                Secs(s.detail.value("load_s", 0.0)) + " (" + s.detail.value("source", "") + ") |\n";
      } else if (k == "resumed") {
        body += "| resumed (first step done) | " + at(s.ts_ns) + " | step " +
                std::to_string(s.detail.value("step", 0)) + " |\n";
      } else if (k == "decision") {
        body += "| policy | " + at(s.ts_ns) + " | " + s.detail.value("action", "") +
                (s.node.empty() ? "" : " " + s.node) + ": " + s.detail.value("reason", "") + " |\n";
      } else if (k == "paused") {
        body += "| **paused** | " + at(s.ts_ns) + " | " + s.detail.value("reason", "") + " |\n";
      } else if (k == "agent_restarted") {
        body += "| agent restarted | " + at(s.ts_ns) + " | " + s.node + " (" +
                s.detail.value("exit", "") + ") |\n";
      }
    }
    body += "\n";
  }
  // Agent restarts outside incidents.
  for (const Event& e : events) {
    if (e.kind_name == "agent_restarted")
      body +=
          "- agent of " + e.node + " restarted (" + e.detail.value("exit", "") + "), no eviction\n";
  }
  char summary[512];
  std::snprintf(summary, sizeof(summary),
                "Status: **%s**. %d incident(s), %d eviction(s). Wall time %.1f s, productive step "
                "time %.1f s: "
                "**ETTR %.3f**.\n\n",
                status.c_str(), f.incidents, f.evictions, f.wall_s, f.productive_s, f.ettr);
  out += summary + body;
  if (f.incidents == 0) out += "No incident.\n";
  if (figures) *figures = f;
  return out;
}

}  // namespace megascope::controller
