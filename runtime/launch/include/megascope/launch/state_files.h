// Training-state files and where a restart resumes from. A shard is one rank's model + optimizer
// state after `step` completed steps: magic "MSCKPT01", {step, rank, n} as int64, then n floats of
// each state array; its FNV-1a 64 checksum sits beside it in <shard>.sum, written after it. The
// same shard is written to disk checkpoints (checkpoints/step_<N>/rank_<r>.bin + manifest.json,
// written last by rank 0) and, every step, into host memory (NodeMemoryDir, files
// rank_<r>.step_<N>.bin) on the rank's own node and on its buddy node. Restart picks the newest
// step for which every rank has a valid shard on a node still in the job, else the newest complete
// disk checkpoint; a corrupt or partial one is skipped with the reason logged.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "megascope/launch/run_layout.h"
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
// The newer of the two (memory wins a tie: it is already in host memory).
ResumePoint FindResumePoint(const RunLayout& layout,
                            const std::vector<std::string>& node_memory_dirs, int world);

}  // namespace megascope::launch
