// Slurm as the source of a job's nodes (`megascope launch --slurm`, inside sbatch or salloc): the
// allocation's nodes with their addresses, each process of a node started as a step of the job
// on that node (srun: one task, sharing the node with the node's other steps), and the steps'
// ids for the record. Slurm's own tools do the work (scontrol, srun, squeue): they speak to
// slurmctld however the site has set it up.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "megascope/launch/supervisor.h"
#include "megascope/tracer/status.h"

namespace megascope::launch {

struct SlurmAllocation {
  std::string job_id;
  std::vector<Host> hosts;  // the allocation's nodes in Slurm's order, each with slurm_job set
};

// The allocation this process runs in (SLURM_JOB_ID, SLURM_JOB_NODELIST) and its nodes' addresses
// (NodeAddr, from scontrol). Errors: not inside an allocation, Slurm's tools missing or failing.
Result<SlurmAllocation> CurrentSlurmAllocation();

// `scontrol show node --oneliner` output -> node name -> NodeAddr.
std::map<std::string, std::string> ParseNodeAddrs(const std::string& scontrol_output);

// The srun command line that runs one task named `step_name` on `node` as a step of `job_id`;
// the command to run follows it.
std::vector<std::string> SrunPrefix(const std::string& job_id, const std::string& node,
                                    const std::string& step_name);

// The job's running steps: step name -> step id ("JOB.STEP"), from squeue.
Result<std::map<std::string, std::string>> SlurmSteps(const std::string& job_id);

}  // namespace megascope::launch
