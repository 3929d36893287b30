// The controller's seam to the machines of a job (PyTorch elastic's agent talks to its workers the
// same way): everything the loop does to processes and reads from agents goes through a Fleet, and
// every time it reads or waits goes through a LoopClock. The real fleet (MakeSupervisorFleet)
// starts agents, ranks and self-checks as processes through launch::Supervisor and reads the
// agents over HTTP; a test scripts a fake one (exits, hangs, frozen ranks, failing self-checks,
// agent deaths) under a fake clock, so the controller's decisions are tested in milliseconds.
// What stays real either way: the run directory's files (progress stream, control.db, run.json,
// dumps, checkpoints), which the fleet's processes write and the controller reads.
//
// Thread safety: one thread (the controller's loop) calls a Fleet and a LoopClock.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "megascope/analyzer/hang.h"
#include "megascope/launch/attempt_plan.h"
#include "megascope/launch/supervisor.h"
#include "megascope/tracer/loop_clock.h"
#include "megascope/tracer/status.h"

namespace megascope::controller {

// What one node of a self-check pair measured (`megascope self-check`'s JSON line).
struct SelfCheckFigures {
  bool ok = false;
  double gemm_gflops = 0, allreduce_gbps = 0;  // the GEMM's also when it failed on its link
  std::string error;                           // why it did not finish (ok false)
};

// What a self-check process said in its log (`megascope self-check`: its GEMM's figure on a line
// of its own, flushed, then the figures of the whole check on its last line). `ended` says how the
// process ended: "" when it finished well; else its exit, or why it was stopped (its partner's
// check failed first: under load either end of a crawling link may be the one to notice). A check
// that did not finish keeps the GEMM figure it printed: its compute held or not, whatever ended it.
SelfCheckFigures ReadSelfCheckLog(const std::string& text, const std::string& ended);

class Fleet {
 public:
  virtual ~Fleet() = default;

  // --- agents (one a node)
  // Starts `node`'s agent; its port once it listens.
  virtual Result<int> StartAgent(const std::string& node) = 0;
  virtual std::optional<int> AgentPort(const std::string& node) const = 0;
  // Stops `node`'s agent; with `wait` false it is only asked and reaped later (an eviction does
  // not wait for its final drain).
  virtual void StopAgent(const std::string& node, bool wait) = 0;
  virtual void StopAgents() = 0;
  // Agents that ended since the last call (never blocks).
  virtual std::vector<launch::AgentExit> PollAgents() = 0;
  virtual bool SignalAgent(const std::string& node, int sig) = 0;
  // GET `path` (/state, /metrics) from `node`'s agent within `timeout_ms`, with the run's token.
  virtual Result<std::string> AgentGet(const std::string& node, const std::string& path,
                                       int timeout_ms, const std::string& token) = 0;
  // The same from every agent of `nodes` at once (one answer per node, in order), all within one
  // deadline `timeout_ms` from now: a tick costs one timeout however many nodes there are, and a
  // node that does not answer in time is an error (stale), not a wait.
  virtual std::vector<Result<std::string>> AgentGetAll(const std::vector<std::string>& nodes,
                                                       const std::string& path, int timeout_ms,
                                                       const std::string& token);
  // Every live rank of `attempt` as the agents of `nodes` see it now (live hang analysis).
  virtual Result<analyzer::HangInput> LiveHangInput(const std::vector<std::string>& nodes,
                                                    int attempt, const std::string& token) = 0;

  // --- ranks (of the current attempt)
  // Starts `world` ranks of `plan`'s attempt on its nodes, rank r on
  // plan.nodes[r / (world / plan.nodes.size())], each carrying out the plan (its faults, its
  // resume point: what run.json tells a real rank).
  virtual Status StartRanks(const launch::AttemptPlan& plan, int world) = 0;
  // Ranks that ended since the last call (never blocks).
  virtual std::vector<launch::RankExit> PollRanks() = 0;
  // Given the failures seen so far, waits up to `window` for the rank whose failure started them
  // (one whose exit is not a peer's, launch::PeersFailure); what else ended goes to `others`.
  virtual launch::RankExit FindOrigin(const std::vector<launch::RankExit>& failures,
                                      std::chrono::milliseconds window,
                                      std::vector<launch::RankExit>* others) = 0;
  // Asks every live rank for its flight recorder (RUN_DIR/dumps/attempt_<A>/rank_<r>.json) and
  // waits up to `timeout`; the ranks that wrote none.
  virtual std::vector<int> CollectDumps(std::chrono::milliseconds timeout) = 0;
  // Stops every rank (grace, then SIGKILL).
  virtual void StopRanks() = 0;
  virtual bool SignalRank(int rank, int sig) = 0;
  virtual std::string NodeOfRank(int rank) const = 0;

  // --- self-checks
  // Runs every pair (a, b) at once (`megascope self-check` on both nodes); the figures of a and b.
  // `min_allreduce_gbps` (0: none) is the bandwidth the caller will accept: a pair whose
  // all-reduces move under half of it ends at once (`self-check --min-gbps`).
  virtual std::vector<std::pair<SelfCheckFigures, SelfCheckFigures>> SelfCheckPairs(
      const std::vector<std::pair<std::string, std::string>>& pairs, double min_allreduce_gbps) = 0;

  // --- the nodes' environments and hosts (fault seams)
  // Adds KEY=VALUE to the environment of every process started on `node` from now on.
  virtual void AddNodeEnv(const std::string& node, const std::string& key,
                          const std::string& value) = 0;
  // The node's own host (a testbed's namespace, a cluster node), or nullptr: this machine.
  virtual const launch::Host* HostOf(const std::string& node) const = 0;
};

// GET `path` from the agents of `nodes` at `urls` (in the same order; "" for a node without one)
// side by side, all within one deadline `timeout_ms` from now (Fleet::AgentGetAll): one answer per
// node, an error for a node not asked in time.
std::vector<Result<std::string>> AskAgents(const std::vector<std::string>& nodes,
                                           const std::vector<std::string>& urls,
                                           const std::string& path, int timeout_ms,
                                           const std::string& token);

// `ask` of each node of `nodes` in turn (ask(node, ms left)), all within one deadline `timeout_ms`
// from now by `clock`: each is given what is left of it, and the nodes it has passed before they
// were reached are an error (kDeadlineExceeded: not asked in time). Fleet::AgentGetAll's default,
// for fleets that cannot ask side by side.
std::vector<Result<std::string>> AskInTurn(
    const std::vector<std::string>& nodes, int timeout_ms, tracer::LoopClock& clock,
    const std::function<Result<std::string>(const std::string& node, int ms)>& ask);

// The fleet of processes on this machine, its hosts' namespaces or a Slurm allocation.
std::unique_ptr<Fleet> MakeSupervisorFleet(const launch::SupervisorOptions& options);

// Time as the loop sees it (tracer/loop_clock.h): monotonic time for its deadlines, wall time for
// its records, and its waits.
using tracer::LoopClock;
using tracer::RealLoopClock;

}  // namespace megascope::controller
