// The run directory's free space, watched by the controller. A job whose checkpoints, progress and
// records cannot be written must not go on as if they were: the controller pauses it when the
// space falls under a floor (before writes fail) or when a write failed for want of space, and
// resumes it once the floor is free again (and the failed records could be written).
//
// Pure over its probe (the seam: statvfs in production, a script in tests), so every decision is
// tested without filling a disk.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "megascope/tracer/status.h"

namespace megascope::controller {

// Bytes an unprivileged writer may still use on the filesystem holding `path` (statvfs f_bavail).
Result<uint64_t> FreeBytes(const std::string& path);

// "12.5 MB" (10^6 bytes, as df -H and the user's --min-free-mb read).
std::string FormatMegabytes(uint64_t bytes);

class DiskGuard {
 public:
  using Probe = std::function<Result<uint64_t>(const std::string& path)>;
  // floor_bytes 0: no floor; only a full filesystem (0 bytes free) or a failed write pauses.
  DiskGuard(std::string path, uint64_t floor_bytes, Probe probe = FreeBytes);

  // A write under `path` failed for want of space (ENOSPC, EDQUOT, SQLite's "disk is full") or
  // for an I/O error: the guard stays short until Short() finds the floor free again.
  void NoteFailedWrite(const std::string& what);

  // Whether the job must wait for space now; *why then says where, how much is free and how much
  // is needed (or which write failed). A probe that fails is said in *why but is not short: the
  // guard never stops a job on a question it cannot answer.
  bool Short(std::string* why);

  const std::string& path() const { return path_; }
  uint64_t floor_bytes() const { return floor_; }

 private:
  std::string path_;
  uint64_t floor_;
  Probe probe_;
  std::string failed_write_;  // since the space was last found sufficient
};

}  // namespace megascope::controller
