#include "megascope/controller/disk_guard.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <utility>

#include "megascope/tracer/format.h"

namespace megascope::controller {

Result<uint64_t> FreeBytes(const std::string& path) {
  struct statvfs s {};
  if (::statvfs(path.c_str(), &s) != 0)
    return ErrnoError("cannot read the free space of " + path, errno);
  return static_cast<uint64_t>(s.f_bavail) * static_cast<uint64_t>(s.f_frsize);
}

std::string FormatMegabytes(uint64_t bytes) {
  return tracer::Format("%.1f MB", static_cast<double>(bytes) / 1e6);
}

DiskGuard::DiskGuard(std::string path, uint64_t floor_bytes, Probe probe)
    : path_(std::move(path)), floor_(floor_bytes), probe_(std::move(probe)) {}

void DiskGuard::NoteFailedWrite(const std::string& what) {
  if (failed_write_.empty()) failed_write_ = what;
}

bool DiskGuard::Short(std::string* why) {
  Result<uint64_t> free = probe_(path_);
  if (!free.ok()) {
    *why = free.status().message();
    return false;
  }
  // After a failed write, at least one megabyte more than nothing: a filesystem at 0 bytes is
  // not back because one block was freed.
  const uint64_t need = std::max<uint64_t>(floor_, failed_write_.empty() ? 1 : 1000000);
  if (*free >= need) {
    failed_write_.clear();
    why->clear();
    return false;
  }
  *why = "the run directory's filesystem (" + path_ + ") " +
         (*free == 0 ? "is full" : "has " + FormatMegabytes(*free) + " free") +
         (floor_ > 0 ? ", " + FormatMegabytes(need) + " needed (--min-free-mb)" : "");
  if (!failed_write_.empty()) *why += "; a write failed: " + failed_write_;
  return true;
}

}  // namespace megascope::controller
