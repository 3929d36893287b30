// An attempt's part of the run's configuration: what the controller plans for each attempt (its
// nodes, where it resumes, the faults its ranks carry out, where the agents listen), and run.json
// (docs/formats.md section 7) with that part set -- the job's part, written once by whoever
// launches (runtime::TrainConfig::ToJson), left as it is. Below the controller, so that the
// controller writes each attempt's run.json without calling up into the launcher.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "megascope/launch/state_files.h"
#include "megascope/launch/worker_fault.h"
#include "megascope/tracer/status.h"

namespace megascope::launch {

struct AttemptPlan {
  int attempt = 0;
  std::vector<std::string> nodes;  // the node of each slot
  bool resume_set = false;
  ResumePoint resume;
  std::vector<WorkerFault> faults;
  std::vector<std::pair<std::string, int>> agent_ports;
  std::map<std::string, std::string> agent_addrs;  // node -> where its agent listens (on a host)
};

// `run_json` (a run.json) with `plan`'s part set: `attempt`, the layout's `node_names` and each
// rank's `node` (rank r on nodes[r / (world / layout.nodes)]), `resume` (removed when the plan has
// none), `faults` and `agents`. An error names what in `run_json` is not a run.json.
Result<std::string> RunJsonForAttempt(std::string_view run_json, const AttemptPlan& plan);

}  // namespace megascope::launch
