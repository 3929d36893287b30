// The online loop of `megascope launch` (docs/architecture.md section 8). Every tick it reads the
// workers' progress stream, the exits of ranks and agents, and each agent's /state; a crash, a job
// that stops advancing (no rank's step moves for max(hang_after, hang_factor x median step time)),
// an op open past its budget or a person's `megascope evict` opens an incident: verdict (the
// analyzer's hang analysis on the live state, or the crash's origin), survivors' dumps, stop,
// eviction by policy, a self-checked spare, restart from the newest state every rank has (memory
// snapshot on a node still in the job, else disk checkpoint) with attempt + 1. Every stage lands in
// control.db with its time. Safety: at most max_evictions per eviction_window, never a node that
// failed its self-check, no looping without spares -- the controller pauses and says what it needs.
// Faults that do not stop the job are found online: the detector over the agents' metrics and the
// straggler analysis over recent steps give verdicts that go through the eviction policy
// (policy.h): alert, self-check the suspect (it stays if it passes), or evict.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "megascope/controller/disk_guard.h"
#include "megascope/controller/fleet.h"
#include "megascope/controller/inject.h"
#include "megascope/controller/policy.h"
#include "megascope/launch/attempt_plan.h"
#include "megascope/launch/exit_codes.h"
#include "megascope/launch/state_files.h"
#include "megascope/launch/supervisor.h"
#include "megascope/launch/worker_fault.h"
#include "megascope/tracer/status.h"

namespace megascope::controller {

// A fault the worker carries out, given to it in run.json.
using launch::WorkerFault;

// What one attempt runs with; the launcher turns it into run.json.
// What the controller plans for an attempt (launch/attempt_plan.h): run.json's attempt part.
using launch::AttemptPlan;

struct ControllerOptions {
  launch::SupervisorOptions supervisor;
  int world = 1;
  std::vector<std::string> nodes;   // the job's nodes at the start
  std::vector<std::string> spares;  // standing by, self-checked before they join
  int64_t steps = 0;
  double tick_s = 0.25;
  double hang_after_s = 3;  // no step progress for this long (at least) is a hang
  double hang_factor = 8;   // ... or this many median step times, whichever is longer
  double startup_grace_s =
      60;  // an attempt's rendezvous + load may take this long before its first step
  double op_timeout_s = 120;  // an op open this long is a hang whatever the steps do
  int max_evictions = 2;      // per eviction_window_s; past it the controller pauses for a person
  double eviction_window_s = 3600;
  double readmit_after_s =
      0;  // an evicted node may rejoin (after a self-check) this long after; 0: never
  double min_gemm_ratio = 0.5;  // a node passes its self-check at this share of the healthy figure
  double min_bandwidth_ratio = 0.3;
  std::vector<Injection> injections;
  std::vector<int> stage_of_rank;  // pipeline stage of each rank (slow:pp=S injections)
  // Evidence of faults that do not stop the job. The detector reads every agent's /metrics each
  // detector_tick_s (0: off) and judges each node among the nodes of its pipeline stages.
  double detector_tick_s = 1;
  int detector_warmup_ticks = 60;  // a node's first ticks only teach the detector its usual level
  int detector_min_peers = 4;      // fewer nodes doing the same work: no judgement
  // The straggler analysis runs over the trace databases every straggler_every steps (0: off).
  int straggler_every = 20;
  double straggler_ratio = 1.2;         // compute this much above the peers' median is a slow step
  double straggler_min_cost_s = 0.005;  // ... costing the job at least this much per step
  // The fleet's ClickHouse store the agents ship to (docs/formats.md section 4b; "": none): the
  // straggler window is read from it in one statement per part instead of a part from every
  // agent; while it fails (or is behind), the agents' parts as without one.
  std::string store;
  PolicyOptions policy;
  bool allow_remote = false;  // the control endpoint binds 0.0.0.0 instead of 127.0.0.1
  // The run directory must keep this much free (disk_guard.h): under it the job pauses until
  // space is back; a launch does not start under it. 0: pause only when it is full or a write
  // fails.
  uint64_t min_free_bytes = uint64_t{64} << 20;
  DiskGuard::Probe free_space = FreeBytes;  // the seam the disk guard reads
  // The run directory's last launch finished: train it again as a new run (a new attempt in
  // control.db, from the newest disk checkpoint when one is kept, else from step 0). Without it,
  // such a launch says the run is finished and exits kLaunchFinished without training. An
  // unfinished run is adopted either way.
  bool new_run = false;
  // The job's run.json as the launcher made it (runtime::TrainConfig::ToJson): each attempt's
  // RUN_DIR/run.json is this with the attempt's part set (launch::RunJsonForAttempt). Empty: no
  // run.json is written (a fleet whose ranks read none: the tests' fakes).
  std::string run_json;
};

// Exit codes of Run() (launch/exit_codes.h).
using launch::kLaunchFailed;
using launch::kLaunchFinished;
using launch::kLaunchIncomplete;
using launch::kLaunchPaused;
using launch::kLaunchStopped;

class Controller {
 public:
  // The job's processes through `fleet` (nullptr: launch::Supervisor's, from options.supervisor),
  // its time through `clock` (nullptr: the real one; a fake outlives the controller).
  explicit Controller(ControllerOptions options, std::unique_ptr<Fleet> fleet = nullptr,
                      LoopClock* clock = nullptr);
  ~Controller();
  // Runs the job to its end; prints progress and every incident to stdout.
  int Run();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Asks the controller of the run in `run_dir` to act: "stop", or "evict" with `node`. Reads the
// run's token (RUN_DIR/control.token) and where the controller listens (controller.json).
Status SendControlCommand(const std::string& run_dir, const std::string& command,
                          const std::string& node);

}  // namespace megascope::controller
