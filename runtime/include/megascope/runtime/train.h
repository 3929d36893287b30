// Training: the job configuration (written to RUN_DIR/run.json), the worker (one rank: model,
// 1F1B pipeline schedule, gradient sync, AdamW, checkpoints, tracing, faults) and the launcher
// that starts dp*tp*pp workers on this machine grouped into simulated nodes, streams progress,
// and stops every worker when one fails.
#pragma once

#include <string>
#include <vector>

#include "megascope/runtime/layout.h"
#include "megascope/runtime/model.h"
#include "megascope/tracer/status.h"

namespace megascope::runtime {

// --fault KIND:rank=R,step=S[,seconds=X]
struct Fault {
  std::string kind;  // crash, hang, stall-send, slow
  int rank = -1;
  int64_t step = 0;
  double seconds = 0;
};
Result<Fault> ParseFault(const std::string& spec);

struct TrainConfig {
  std::string run_dir;
  std::string data;
  std::string job = "train";
  std::string shm_dir = "/dev/shm";
  Layout layout;
  ModelConfig model;
  int nodes = 1;
  int attempt = 0;
  int64_t global_batch = 8;  // sequences per step, over all dp ranks
  int microbatches = 2;
  int64_t steps = 20;
  float lr = 1e-3f;
  float min_lr = 1e-4f;
  int warmup = 5;
  float grad_clip = 1.0f;
  float weight_decay = 0.1f;
  int checkpoint_every = 0;  // 0: only on request
  int timeout_ms = 30000;  // collective timeout
  std::vector<Fault> faults;
  bool trace = true;  // false: spans and flight recorder off (to measure their cost)
  bool agents = true;  // start one megascope agent per simulated node
  std::vector<std::pair<std::string, int>> agent_ports;  // node -> HTTP port, filled by the launcher

  // Empty when valid; otherwise what is wrong, said before any worker starts.
  std::string Validate() const;
  std::string ToJson() const;
  static Result<TrainConfig> FromJson(const std::string& text, const std::string& source);
  std::string NodeOf(int rank) const;
  int LocalRankOf(int rank) const;
};

// Exit codes of a worker.
inline constexpr int kExitOk = 0;
inline constexpr int kExitSetup = 4;
inline constexpr int kExitCommFailure = 3;

// Runs rank `rank` of the job in RUN_DIR/run.json; returns the process exit code.
int RunWorker(const std::string& run_dir, int rank);

// Starts the job: validates, writes run.json, spawns `self_exe worker` per rank, streams progress
// to stdout; returns 0 when every worker finished, 1 when one failed (named, with its log tail).
int RunTraining(const TrainConfig& config, const std::string& self_exe);

// The newest complete, uncorrupted checkpoint step under run_dir (-1: none); `log` receives a
// line for each checkpoint skipped and why.
int64_t FindResumableCheckpoint(const std::string& run_dir, int world, std::string* log);

}  // namespace megascope::runtime
