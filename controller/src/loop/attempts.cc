// An attempt: its plan (nodes, resume point, the faults its workers carry out, the agents), written
// to run.json, then its ranks started.
#include <algorithm>

#include "impl.h"
#include "megascope/launch/attempt_plan.h"
#include "megascope/tracer/file_util.h"

namespace megascope::controller {

std::string Controller::Impl::HealthyPartner(const std::set<std::string>& avoid) const {
  for (const std::string& n : active) {
    if (!n.empty() && !avoid.count(n)) return n;
  }
  return "";
}

std::string Controller::Impl::NodeOfSlot(int rank) const {
  const int per = opt.world / static_cast<int>(active.size());
  return active.at(static_cast<size_t>(rank / per));
}

int Controller::Impl::FirstRankOf(const std::string& node) const {
  const int per = opt.world / static_cast<int>(active.size());
  for (size_t k = 0; k < active.size(); ++k) {
    if (active[k] == node) return static_cast<int>(k) * per;
  }
  return -1;
}

Status Controller::Impl::StartAttempt(const launch::ResumePoint* resume) {
  AttemptPlan plan;
  plan.attempt = attempt;
  plan.nodes = active;
  if (resume) {
    plan.resume_set = true;
    plan.resume = *resume;
  }
  for (Injection& in : opt.injections) {
    if (!IsWorkerFault(in.kind) || (in.fired && !in.persist)) continue;
    in.fired = false;  // persistent: the node is still broken in this attempt
    int64_t at = in.at_step;
    if (in.persist && resume != nullptr) at = std::max(at, resume->step);
    std::vector<int> ranks;
    if (in.kind == FaultKind::kSlow && in.rank < 0) {  // every rank of the node or the stage
      for (int r = 0; r < opt.world; ++r) {
        const bool of_stage = in.pp >= 0 && r < static_cast<int>(opt.stage_of_rank.size()) &&
                              opt.stage_of_rank[r] == in.pp;
        if (of_stage || (!in.node.empty() && NodeOfSlot(r) == in.node)) ranks.push_back(r);
      }
    } else {
      ranks.push_back(in.rank >= 0 ? in.rank : FirstRankOf(in.node));
    }
    for (int rank : ranks) {
      if (rank < 0 || rank >= opt.world) continue;  // its node is not in the job (any more)
      if (in.planned_rank < 0 || rank < in.planned_rank) in.planned_rank = rank;
      plan.faults.push_back({*WorkerFaultOf(in.kind), rank, at, in.seconds, in.factor});
    }
  }
  for (const std::string& node : active) {
    if (!fleet->AgentPort(node)) {
      auto port = fleet->StartAgent(node);
      if (!port.ok()) return port.status();
    }
    plan.agent_ports.emplace_back(node, *fleet->AgentPort(node));
    if (const launch::Host* h = fleet->HostOf(node)) plan.agent_addrs[node] = h->frontend_addr;
  }
  if (!opt.run_json.empty()) {
    ASSIGN_OR_RETURN(const std::string run_json, launch::RunJsonForAttempt(opt.run_json, plan));
    RETURN_IF_ERROR(tracer::WriteFileAtomic(layout.run_json(), run_json));
  }
  WriteScrapeTargets();
  attempt_start = last_progress = clock.Now();
  attempt_stepped = false;
  ready_load_s.reset();
  straggler_from = resume ? std::max<int64_t>(0, resume->step) : 0;
  stragglers.Reset();
  alerted.clear();
  hb_steps.clear();
  finished_ranks = 0;
  return fleet->StartRanks(plan, opt.world);
}

}  // namespace megascope::controller
