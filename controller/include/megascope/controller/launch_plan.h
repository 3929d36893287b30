// What `megascope launch` will run on, decided before anything starts: where the nodes are (a
// hosts file, the testbed's, a Slurm allocation, or none: processes on this machine), the job's
// nodes and spares named from them, and every --inject checked against them. The CLI reads the
// flags; the decisions are here, tested without starting anything.
#pragma once

#include <string>
#include <vector>

#include "megascope/controller/controller.h"
#include "megascope/launch/supervisor.h"
#include "megascope/tracer/status.h"

namespace megascope::controller {

// Where the nodes are.
struct HostSource {
  bool slurm = false;  // the Slurm allocation this process runs in
  std::string hosts;   // a hosts file, or "testbed" (scripts/testbed.sh's, $MEGASCOPE_TESTBED)
  std::string iface;   // the interface every host's collectives bind (a cluster's network)
};
struct Hosts {
  std::vector<launch::Host> hosts;  // empty: every node on this machine
  std::string where;                // "FILE lists" / "the Slurm allocation J has", for messages
};
// The hosts `source` names; an InvalidArgument says which flag and why.
Result<Hosts> ResolveHosts(const HostSource& source);

// Whether `hosts` (when any) hold `nodes` + `spares`; an InvalidArgument says how many there are.
Status CheckHostCount(const Hosts& hosts, int nodes, int spares);

struct LaunchRequest {
  int nodes = 1;   // the job's nodes
  int spares = 0;  // standing by
  int world = 1;   // ranks (divisible by nodes)
  Hosts hosts;
  std::vector<std::string> injections;  // --inject specs
};
// Fills `options`' nodes and spares (node0.. on this machine, else the hosts' names in order),
// supervisor.hosts and injections. An InvalidArgument names the flag: too few hosts, an injection
// aimed at a node that is not there or at a rank outside the world, or a link fault that needs a
// real link on a node without a host of its own.
Status PlanLaunch(const LaunchRequest& request, ControllerOptions* options);

}  // namespace megascope::controller
