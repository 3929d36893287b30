#include "megascope/controller/launch_plan.h"

#include <algorithm>
#include <cstdlib>

#include "megascope/launch/slurm.h"

namespace megascope::controller {

Result<Hosts> ResolveHosts(const HostSource& source) {
  Hosts out;
  if (source.slurm && !source.hosts.empty())
    return InvalidArgument("--slurm and --hosts both say where the nodes are: give one");
  if (source.slurm) {
    auto alloc = launch::CurrentSlurmAllocation();
    if (!alloc.ok()) return InvalidArgument(alloc.status().message());
    out.hosts = std::move(alloc->hosts);
    out.where = "the Slurm allocation " + alloc->job_id + " has";
  } else if (!source.hosts.empty()) {
    const char* bed = std::getenv("MEGASCOPE_TESTBED");
    const std::string file =
        source.hosts == "testbed"
            ? "/run/megascope-testbed/" + std::string(bed && *bed ? bed : "msh") + ".hosts"
            : source.hosts;
    auto read = launch::ReadHostsFile(file);
    if (!read.ok()) {
      return InvalidArgument(
          read.status().message() +
          (source.hosts == "testbed" ? " (bring the testbed up: scripts/testbed.sh up N)" : ""));
    }
    out.hosts = std::move(read).value();
    out.where = file + " lists";
  }
  if (!source.iface.empty()) {
    if (out.hosts.empty()) return InvalidArgument("--iface needs --hosts or --slurm");
    for (launch::Host& h : out.hosts) h.bind_iface = source.iface;
  }
  return out;
}

Status CheckHostCount(const Hosts& hosts, int nodes, int spares) {
  const int wanted = nodes + spares;
  if (hosts.hosts.empty() || static_cast<int>(hosts.hosts.size()) >= wanted) return Status::Ok();
  return InvalidArgument("--nodes " + std::to_string(nodes) + " and --spares " +
                         std::to_string(spares) + " need " + std::to_string(wanted) + " hosts; " +
                         hosts.where + " " + std::to_string(hosts.hosts.size()));
}

Status PlanLaunch(const LaunchRequest& request, ControllerOptions* options) {
  const std::vector<launch::Host>& hosts = request.hosts.hosts;
  const int wanted = request.nodes + request.spares;
  RETURN_IF_ERROR(CheckHostCount(request.hosts, request.nodes, request.spares));
  for (int k = 0; k < wanted; ++k) {
    const std::string name = hosts.empty() ? "node" + std::to_string(k) : hosts[k].name;
    (k < request.nodes ? options->nodes : options->spares).push_back(name);
    if (!hosts.empty()) options->supervisor.hosts[name] = hosts[k];
  }
  const auto known = [&](const std::string& node) {
    return std::find(options->nodes.begin(), options->nodes.end(), node) != options->nodes.end() ||
           std::find(options->spares.begin(), options->spares.end(), node) != options->spares.end();
  };
  for (const std::string& spec : request.injections) {
    ASSIGN_OR_RETURN(Injection in, ParseInjection(spec));
    if (!in.node.empty() && !known(in.node)) {
      return InvalidArgument(
          "--inject '" + spec + "': no node " + in.node + " (nodes are " + options->nodes.front() +
          ".." + (options->spares.empty() ? options->nodes.back() : options->spares.back()) + ")");
    }
    if (in.kind == FaultKind::kLink && in.link != LinkFaultKind::kSlow) {
      auto host = options->supervisor.hosts.find(in.node);
      if (host == options->supervisor.hosts.end() || host->second.netns.empty()) {
        return InvalidArgument("--inject '" + spec + "': kind=" + std::string(Name(in.link)) +
                               " needs a real link: run the nodes on hosts of their own (--hosts "
                               "testbed)");
      }
    }
    if (in.rank >= request.world)
      return InvalidArgument("--inject '" + spec + "': rank outside the world");
    options->injections.push_back(std::move(in));
  }
  return Status::Ok();
}

}  // namespace megascope::controller
