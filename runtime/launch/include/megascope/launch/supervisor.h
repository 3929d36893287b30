// Supervisor: a job on a set of nodes. Starts each node's agent, then the job's ranks on them
// (`megascope worker`, one process per rank, rank r on nodes[r / ranks_per_node]); reports exits
// and names the origin of a failure (a rank that failed on its own beats the peers that then
// exited with kExitCommFailure or kExitUnreachable); asks survivors for their flight recorders and
// waits until the dumps are written before anything is killed; stops ranks and agents with a grace.
// A restart is StopRanks + StartRanks with attempt + 1 and a new node list. Links without Gloo,
// BLAS or the model.
//
// Thread safety: one thread drives a Supervisor.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "megascope/launch/exit_codes.h"
#include "megascope/launch/process.h"
#include "megascope/tracer/run_layout.h"
#include "megascope/tracer/status.h"

namespace megascope::launch {

// Where a node's collectives bind (the worker's Gloo device): an address, or else the address of
// an interface (a cluster's training network); 127.0.0.1 when neither is set.
inline constexpr const char* kBindAddrEnv = "MEGASCOPE_BIND_ADDR";
inline constexpr const char* kBindIfaceEnv = "MEGASCOPE_BIND_IFACE";

// A node's own host, as on a cluster or a testbed of network namespaces (scripts/testbed.sh): its
// processes run in `netns` ("" : this machine's network), its collectives bind `backend_addr`,
// its agent listens on `frontend_addr` and is reached there. `switch_netns`/`switch_port`: the
// far end of its backend link (a testbed's switch), where traffic towards the host can be shaped.
// `bind_iface`: its collectives bind this interface's address instead (each process looks it up
// on its host). `slurm_job`: a node of that Slurm job; its processes start as steps on it (srun).
struct Host {
  std::string name;
  std::string netns;
  std::string backend_addr;
  std::string frontend_addr;
  std::string switch_netns, switch_port;
  std::string bind_iface;
  std::string slurm_job;
};
// Reads a hosts file: one "NAME NETNS BACKEND_ADDR FRONTEND_ADDR [SWITCH_NETNS:PORT]" per line
// ('#' starts a comment; NETNS "-" : this machine's network). Errors name the file and line.
Result<std::vector<Host>> ReadHostsFile(const std::string& path);

struct SupervisorOptions {
  std::string self_exe;  // the megascope binary
  std::string run_dir;
  std::string job = "train";
  std::string shm_dir = "/dev/shm";
  std::string agent_host = "127.0.0.1";   // 0.0.0.0 with --allow-remote
  std::chrono::milliseconds grace{5000};  // SIGTERM -> SIGKILL
  std::chrono::milliseconds agent_start_timeout{10000};
  std::map<std::string, Host> hosts;  // node -> its own host; nodes not here run on this machine
  std::string agent_token_file;       // agents require this token (those beyond loopback)
  double agent_retain_hours = 24;     // each agent's trace.db keeps this window (0: everything)
  double agent_retain_rollup_hours = 24 * 7;  // and its per-step rollups this long (0: for ever)
};

struct RankExit {
  int rank = -1;
  ExitStatus status;
};

struct AgentExit {
  std::string node;
  ExitStatus status;
};

class Supervisor {
 public:
  explicit Supervisor(SupervisorOptions options);
  ~Supervisor();  // stops whatever still runs

  const RunLayout& layout() const { return layout_; }
  const SupervisorOptions& options() const { return opt_; }

  // Environment given to every process started on `node` (fault seams such as a slowdown).
  void SetNodeEnv(const std::string& node, std::vector<std::pair<std::string, std::string>> env);
  const std::vector<std::pair<std::string, std::string>>& NodeEnv(const std::string& node) const;
  // A process of `node` (`role`: agent, rank<r>, self-check): its environment, its host's network
  // namespace and bind address; on a Slurm node, a step of the job named role@node.
  ProcessSpec NodeProcess(const std::string& node, const std::string& role,
                          std::vector<std::string> argv, std::string log_path) const;
  // The node's host, or nullptr when it runs on this machine.
  const Host* HostOf(const std::string& node) const;

  // Starts `node`'s agent and waits until it listens; returns its port. Before the run's first
  // agent it removes rings of the same job name whose writer is gone (left by an earlier run that
  // was killed): a new agent would otherwise drain that run's records into this run's trace.db.
  Result<int> StartAgent(const std::string& node);
  // Removes rings of this job whose writer process is gone; returns how many.
  int RemoveStaleRings();
  // Stops `node`'s agent (it drains what is left first). With `wait` false it is only asked
  // (SIGTERM) and reaped later -- by StopAgents at the latest -- so an eviction does not wait
  // for its final drain.
  void StopAgent(const std::string& node, bool wait = true);
  // Stops every agent; then removes rings nobody will drain any more.
  void StopAgents();
  std::optional<int> AgentPort(const std::string& node) const;
  std::string AgentUrl(const std::string& node) const;
  std::vector<std::string> AgentNodes() const;
  // Sends `sig` to `node`'s agent (fault injection: SIGKILL).
  bool SignalAgent(const std::string& node, int sig);

  // Starts `world` ranks of `attempt` on `nodes` (world divisible by nodes.size()).
  Status StartRanks(int attempt, const std::vector<std::string>& nodes, int world);
  int attempt() const { return attempt_; }
  const std::vector<std::string>& nodes() const { return nodes_; }
  std::string NodeOfRank(int rank) const;
  int running_ranks();

  // Newly ended ranks and agents since the last call (never blocks).
  std::vector<RankExit> PollRanks();
  std::vector<AgentExit> PollAgents();
  // Given the failures seen so far, waits up to `window` for the rank whose failure started it: a
  // failure that is not a peer's (PeersFailure). Returns the origin; adds what else ended to
  // `others`.
  RankExit FindOrigin(const std::vector<RankExit>& failures, std::chrono::milliseconds window,
                      std::vector<RankExit>* others);

  // SIGUSR1 to every running rank, then waits up to `timeout` until each has written
  // dumps/attempt_<A>/rank_<r>.json. Returns the ranks that did not.
  std::vector<int> CollectDumps(std::chrono::milliseconds timeout);
  // Stops every rank of the current attempt (grace, then SIGKILL); their agents drain their rings.
  void StopRanks();
  // Signals one rank (fault injection).
  bool SignalRank(int rank, int sig);

 private:
  SupervisorOptions opt_;
  RunLayout layout_;
  std::map<std::string, std::vector<std::pair<std::string, std::string>>> node_env_;
  std::map<std::string, std::unique_ptr<Process>> agents_;
  std::map<std::string, int> agent_ports_;
  std::vector<std::unique_ptr<Process>> retiring_agents_;  // asked to stop, not yet reaped
  std::vector<std::unique_ptr<Process>> ranks_;
  std::set<int> reported_;
  std::vector<std::pair<int, int>> started_;  // (attempt, world) of every StartRanks  // ranks
                                              // whose exit PollRanks already returned
  std::vector<std::string> nodes_;
  int attempt_ = 0;
  int world_ = 0;
  bool stale_rings_checked_ = false;
};

}  // namespace megascope::launch
