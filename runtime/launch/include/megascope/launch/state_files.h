// Training-state files and where a restart resumes from. A shard is one rank's model + optimizer
// state after `step` completed steps: magic "MSCKPT01", {step, rank, n} as int64, then n floats of
// each state array; its FNV-1a 64 checksum sits beside it in <shard>.sum, written after it. The
// same shard is written to disk checkpoints (checkpoints/step_<N>/rank_<r>.bin + manifest.json,
// written last by rank 0) and, every step, into host memory (NodeMemoryDir, files
// rank_<r>.step_<N>.bin) on the rank's own node and on its buddy node. Restart picks the newest
// step for which every rank has a valid shard on a node still in the job, else the newest complete
// disk checkpoint; a corrupt or partial one is skipped with the reason logged.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "megascope/tracer/run_layout.h"
#include "megascope/tracer/status.h"

namespace megascope::launch {

uint64_t Fnv1a(const char* data, size_t n, uint64_t h = 1469598103934665603ULL);

// Shard bytes of `arrays` (each `n` floats) after `step` steps of `rank`.
std::string EncodeShard(int64_t step, int rank, size_t n, const std::vector<const float*>& arrays);
// Checks magic, header and size; fills `arrays` (each `n` floats).
Status DecodeShard(const std::string& bytes, const std::string& source, int64_t step, int rank,
                   size_t n, const std::vector<float*>& arrays);
// Writes `path` and `path`.sum, each atomically; `sync` fsyncs (disk) or not (memory).
Status WriteShard(const std::string& path, const std::string& bytes, bool sync);
// Reads `path` and checks it against `path`.sum.
Result<std::string> ReadShard(const std::string& path);

std::string MemoryShardName(int rank, int64_t step);

struct ResumePoint {
  int64_t step = -1;               // completed steps to resume after; -1: start from scratch
  std::string source = "none";     // memory, disk, none
  std::vector<std::string> files;  // the shard of each rank
  std::string log;                 // a line per candidate skipped and why
};

// The newest complete, uncorrupted disk checkpoint (step -1: none).
ResumePoint FindDiskCheckpoint(const RunLayout& layout, int world);
// The newest step every rank has a valid shard of in the memory areas of `nodes`.
ResumePoint FindMemorySnapshot(const std::vector<std::string>& node_memory_dirs, int world);
// Rank 0's last word on a disk checkpoint: once every rank's shard of `step` is in its directory
// (waiting for them up to `wait_ms`, and not after *stop turns true), manifest.json lists them
// with their checksums. Until then the checkpoint is partial and never loaded.
Status WriteCheckpointManifest(const RunLayout& layout, int64_t step, int world, int wait_ms,
                               const std::atomic<bool>* stop = nullptr);

// Keeps the `keep` newest complete disk checkpoints (those with a manifest) and removes the older
// ones, with every partial checkpoint older than the newest complete one (a write that died: each
// rank writes its shards in step order, one at a time). A partial checkpoint newer than every
// complete one may be in progress and stays. keep 0: nothing is removed. Returns the steps
// removed; a directory that cannot be removed is an error naming it (the others are still tried).
Result<std::vector<int64_t>> PruneCheckpoints(const RunLayout& layout, int keep);

// A rank whose launcher is gone (no one will restart from memory) moves its state out of host
// memory: each valid shard of `rank` of the two newest steps in `node_memory_dirs` becomes its
// shard of the disk checkpoint of that step (rank 0 then writes the manifest of the newest step
// every rank saved), and its memory files are removed,
// with any directory left empty up to the job's memory root. Returns what it did, for the log.
Result<std::string> PersistMemoryShards(const RunLayout& layout,
                                        const std::vector<std::string>& node_memory_dirs,
                                        const std::string& memory_root, int rank, int world,
                                        int manifest_wait_ms = 5000);

// The newer of the two (memory wins a tie: it is already in host memory).
ResumePoint FindResumePoint(const RunLayout& layout,
                            const std::vector<std::string>& node_memory_dirs, int world);

}  // namespace megascope::launch
