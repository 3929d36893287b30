#include "megascope/launch/slurm.h"

#include <cstdlib>
#include <sstream>

#include "megascope/launch/process.h"

namespace megascope::launch {

std::map<std::string, std::string> ParseNodeAddrs(const std::string& text) {
  std::map<std::string, std::string> out;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream fields(line);
    std::string name, addr;
    for (std::string f; fields >> f;) {
      if (f.rfind("NodeName=", 0) == 0) name = f.substr(9);
      if (f.rfind("NodeAddr=", 0) == 0) addr = f.substr(9);
    }
    if (!name.empty()) out[name] = addr.empty() ? name : addr;  // no NodeAddr: the name resolves
  }
  return out;
}

Result<SlurmAllocation> CurrentSlurmAllocation() {
  const char* job = std::getenv("SLURM_JOB_ID");
  const char* list = std::getenv("SLURM_JOB_NODELIST");
  if (job == nullptr || *job == '\0' || list == nullptr || *list == '\0') {
    return FailedPrecondition(
        "--slurm runs inside a Slurm allocation (sbatch or salloc): SLURM_JOB_ID and "
        "SLURM_JOB_NODELIST are not set");
  }
  SlurmAllocation a;
  a.job_id = job;
  RETURN_IF_ERROR(FindTool("srun").status());
  ASSIGN_OR_RETURN(std::string names, RunTool({"scontrol", "show", "hostnames", list}));
  ASSIGN_OR_RETURN(std::string nodes, RunTool({"scontrol", "show", "node", "--oneliner", list}));
  const auto addrs = ParseNodeAddrs(nodes);
  std::istringstream in(names);
  for (std::string name; in >> name;) {
    auto it = addrs.find(name);
    if (it == addrs.end()) {
      return Status(StatusCode::kInternal,
                    "scontrol does not describe node " + name + " of the allocation " + a.job_id);
    }
    Host h;
    h.name = name;
    h.backend_addr = h.frontend_addr = it->second;
    h.slurm_job = a.job_id;
    a.hosts.push_back(std::move(h));
  }
  if (a.hosts.empty())
    return Status(StatusCode::kInternal, "the allocation " + a.job_id + " lists no node");
  return a;
}

std::vector<std::string> SrunPrefix(const std::string& job_id, const std::string& node,
                                    const std::string& step_name) {
  // --overlap: the node's steps share it (an agent, its ranks, a self-check); --quiet: srun's
  // own notes would interleave with the task's log; the environment goes with the task.
  return {FindTool("srun").value_or("srun"),
          "--jobid=" + job_id,
          "--nodelist=" + node,
          "--nodes=1",
          "--ntasks=1",
          "--overlap",
          "--job-name=" + step_name,
          "--export=ALL",
          "--kill-on-bad-exit=0",
          "--quiet"};
}

Result<std::map<std::string, std::string>> SlurmSteps(const std::string& job_id) {
  ASSIGN_OR_RETURN(std::string out, RunTool({"squeue", "--noheader", "--steps", "--jobs=" + job_id,
                                             "--format=%i %j"}));
  std::map<std::string, std::string> steps;
  std::istringstream lines(out);
  for (std::string id, name; lines >> id >> name;) steps[name] = id;
  return steps;
}

}  // namespace megascope::launch
