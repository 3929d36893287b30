// Training: the job configuration (written to RUN_DIR/run.json; src/config.cc), the worker (one
// rank: model, 1F1B pipeline schedule, gradient sync, AdamW, checkpoints, tracing, faults;
// src/worker.cc) and `megascope train` (src/train.cc), which starts dp*tp*pp workers on this
// machine grouped into simulated nodes, streams progress, and stops every worker when one fails.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "megascope/launch/state_files.h"
#include "megascope/launch/supervisor.h"
#include "megascope/launch/worker_fault.h"
#include "megascope/runtime/layout.h"
#include "megascope/runtime/model.h"
#include "megascope/tracer/status.h"

namespace megascope::runtime {

// --fault KIND:rank=R,step=S[,seconds=X]
using Fault = launch::WorkerFault;  // the same on the controller's floor
Result<Fault> ParseFault(const std::string& spec);

struct TrainConfig {
  std::string run_dir;
  std::string data;
  std::string job = "train";
  std::string shm_dir = "/dev/shm";
  Layout layout;
  ModelConfig model;
  int nodes = 1;
  std::vector<std::string> node_names;  // the node of each slot (empty: node0..node<N-1>)
  int attempt = 0;
  bool memory_snapshots =
      false;  // every step, state into host memory on this node and a buddy node
  bool resume_set =
      false;  // resume below was decided by the controller (else: newest disk checkpoint)
  launch::ResumePoint resume;
  int64_t global_batch = 8;  // sequences per step, over all dp ranks
  int microbatches = 2;
  int64_t steps = 20;
  float lr = 1e-3f;
  float min_lr = 1e-4f;
  int warmup = 5;
  float grad_clip = 1.0f;
  float weight_decay = 0.1f;
  int checkpoint_every = 0;  // 0: only on request
  int keep_checkpoints = 3;  // the newest complete disk checkpoints kept (0: every one)
  int timeout_ms = 30000;    // collective timeout
  // The compute backend: "cpu", or "cuda" (every rank on CUDA device `cuda_device`; with NCCL,
  // on `cuda_device` + its local rank, one GPU each).
  std::string device = "cpu";
  int cuda_device = 0;
  // The transport: "gloo" (host memory; device data through pinned host buffers, so any number of
  // ranks can share one GPU), or "nccl" (device memory, --device cuda, one GPU per rank).
  std::string comm = "gloo";
  std::vector<Fault> faults;
  bool trace = true;  // false: spans and flight recorder off (to measure their cost)
  // > 0: tracing on and off in alternating blocks of this many steps (on, off, off, on, ...), and
  // each rank writes every step's wall and CPU time to RunLayout::step_costs: what tracing costs,
  // measured side by side in one run (bench/tracing_cost.sh).
  int trace_alternate = 0;
  bool agents = true;  // start one megascope agent per simulated node
  std::vector<std::pair<std::string, int>>
      agent_ports;  // node -> HTTP port, filled by the launcher
  std::map<std::string, std::string>
      agent_addrs;  // node -> the address its agent listens on, when not 127.0.0.1 (a host's)

  // Empty when valid; otherwise what is wrong, said before any worker starts.
  std::string Validate() const;
  // The part of Validate() that indexing by rank and node relies on (also checked on every
  // run.json read).
  std::string ValidateLayout() const;
  std::string ToJson() const;
  static Result<TrainConfig> FromJson(const std::string& text, const std::string& source);
  std::string NodeOf(int rank) const;
  std::vector<std::string> NodeNames() const;  // node_names, or node0..node<N-1>
  int LocalRankOf(int rank) const;
};

using launch::kExitCommFailure;
using launch::kExitJobError;
using launch::kExitOk;
using launch::kExitSetup;
using launch::kExitStopped;
using launch::kExitUnreachable;

// Runs rank `rank` of the job in RUN_DIR/run.json; returns the process exit code.
int RunWorker(const std::string& run_dir, int rank);

// Validates the configuration and the data file, creates the run directory and clears progress
// (unless keep_progress: a launch keeps the run's history and reads on after it).
Status PrepareRunDirectory(const TrainConfig& config, bool keep_progress = false);

// Starts the job: validates, writes run.json, spawns `self_exe worker` per rank, streams progress
// to stdout; returns 0 when every worker finished, 1 when one failed (named, with its log tail).
int RunTraining(const TrainConfig& config, const std::string& self_exe);

}  // namespace megascope::runtime
