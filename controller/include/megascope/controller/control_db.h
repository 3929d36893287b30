// control.db (docs/formats.md section 4): every fault, trigger, verdict, action, self-check and
// attempt of a run, with its time. One table, events(ts_ns, attempt, kind, node, rank,
// detail_json); the kinds are the enum below with their spellings. The file is created 0600.
//
// Thread safety: one ControlDb per thread (the controller thread writes; readers open their own).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "megascope/tracer/sqlite.h"
#include "megascope/tracer/status.h"

namespace megascope::controller {

enum class EventKind {
  kFaultInjected,     // fault_injected: a fault fired (from the worker or the controller's seam)
  kTrigger,           // trigger: what made the controller look (crash, hang, manual, agent_dead)
  kVerdict,           // verdict: docs/formats.md section 2 JSON
  kStopped,           // stopped: the attempt's processes are gone (dumps collected first)
  kEviction,          // eviction: a node left the job, and why
  kSelfCheck,         // self_check: a node's GEMM and all-reduce figures, passed or not
  kRestart,           // restart: attempt + 1 started on a node set
  kCheckpointSaved,   // checkpoint_saved
  kCheckpointLoaded,  // checkpoint_loaded: where the attempt resumed (memory or disk), rendezvous
                      // and load times
  kResumed,           // resumed: the first step of the new attempt completed
  kAgentRestarted,    // agent_restarted: a node's agent died and was started again (no eviction)
  kPaused,            // paused: the controller stopped acting and needs a person; detail says why
  kJobFinished,       // job_finished
  kDecision,          // decision: what the policy made of a verdict (action, reason, confirmed)
  kSlurmSteps,        // slurm_steps: under --slurm, the job id and the step id of each process
                      // of the attempt (role@node -> JOB.STEP), once its first step is done
};
std::string_view Name(EventKind kind);
std::optional<EventKind> ParseEventKind(std::string_view name);

// What opened an incident: a `trigger` event's detail `cause` (docs/formats.md section 4).
enum class TriggerCause { kCrash, kHang, kManual, kDetector, kStraggler };
std::string_view Name(TriggerCause cause);  // crash, hang, manual, detector, straggler

struct Event {
  int64_t ts_ns = 0;
  int attempt = 0;
  EventKind kind = EventKind::kTrigger;
  std::string kind_name;  // as stored (a newer writer's kind is kept as given)
  std::string node;       // "" : NULL
  int rank = -1;          // -1 : NULL
  nlohmann::json detail = nlohmann::json::object();
};

// A verdict's identity across events: its detected_at_ns (decision and eviction events carry a copy
// of the verdict they act on).
int64_t VerdictId(const nlohmann::json& verdict);
// The verdicts the controller acted on -- a decision other than an alert, or an eviction, carries
// them -- by VerdictId.
std::set<int64_t> ActedOnVerdicts(const std::vector<Event>& events);

class ControlDb {
 public:
  // Opens (creating, 0600) `path`; read_only opens an existing file only.
  static Result<std::unique_ptr<ControlDb>> Open(const std::string& path, bool read_only = false);

  Status Record(const Event& e);
  // Every event in time order.
  Result<std::vector<Event>> Events();
  // Counts of events of `kind` grouped by detail_json's `field` (for Prometheus counters).
  Result<std::vector<std::pair<std::string, int64_t>>> CountBy(EventKind kind,
                                                               const std::string& field);

 private:
  ControlDb() = default;
  tracer::sql::Database db_;
};

}  // namespace megascope::controller
