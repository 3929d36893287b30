// A rank's training state (parameters and AdamW's moments): read off the device into a shard,
// written in the background -- a disk checkpoint where one is due, a snapshot in host memory every
// step -- and loaded back onto the device to resume (launch/state_files.h holds the formats).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "megascope/kernels/kernels.h"
#include "megascope/launch/state_files.h"
#include "megascope/runtime/model.h"
#include "megascope/runtime/train.h"
#include "megascope/tracer/status.h"

namespace megascope::runtime {

// Waits, at most 4 s (inside the launcher's 5-s grace), for the state writes in flight (any
// StateWriter's) to end: a stopping rank lets them finish.
void WaitForWritesInFlight();

// Where a rank keeps its state in host memory: its own node's area, then its buddy node's (the
// next node of the job).
std::vector<std::string> MemoryDirsOf(const TrainConfig& cfg, int rank);

// The rank's state at the end of `step` as a shard (parameters and moments brought to the host
// first); nullptr, said on stderr, when the device could not be read.
std::shared_ptr<std::string> EncodeState(kernels::Kernels& k, GptStage& model, const float* m,
                                         const float* v, int64_t step, int rank);

// The state to resume from, loaded onto the device: the one run.json names (memory snapshot or
// disk checkpoint), or alone, the newest valid disk checkpoint. A step < 0: start afresh.
Result<launch::ResumePoint> LoadState(const TrainConfig& cfg, const RunLayout& layout, int rank,
                                      kernels::Kernels& k, GptStage& model, float* m, float* v);

// One write of each kind in flight at a time, each on its own thread while training goes on.
class StateWriter {
 public:
  StateWriter(const TrainConfig& cfg, const RunLayout& layout, int rank, std::atomic<bool>* stop)
      : cfg_(cfg), layout_(layout), rank_(rank), stop_(stop) {}
  ~StateWriter() { Join(); }
  StateWriter(const StateWriter&) = delete;
  StateWriter& operator=(const StateWriter&) = delete;

  // The disk checkpoint of `step`: this rank's shard, then (rank 0, once every shard is there)
  // the manifest, then older checkpoints pruned past cfg.keep_checkpoints.
  void Checkpoint(int64_t step, std::shared_ptr<std::string> shard);
  // The snapshot of `step` into host memory on this node and its buddy; the one of three steps
  // back removed once the new one is in place (ranks can be a step apart when one dies, and a
  // corrupt newest copy must leave an older complete step behind).
  void Snapshot(int64_t step, std::shared_ptr<std::string> shard);
  void JoinCheckpoint() {
    if (ckpt_.joinable()) ckpt_.join();
  }
  void Join() {
    JoinCheckpoint();
    if (mem_.joinable()) mem_.join();
  }

 private:
  const TrainConfig& cfg_;
  const RunLayout& layout_;
  int rank_;
  std::atomic<bool>* stop_;  // the rank is stopping: the manifest waits no more
  std::thread ckpt_, mem_;
};

}  // namespace megascope::runtime
