// Whole-file reads and atomic writes: the one place the tree reads a file into a string or
// replaces one.
#pragma once

#include <string>
#include <string_view>

#include "megascope/tracer/status.h"

namespace megascope::tracer {

// The file's bytes. NotFound when it does not exist, IoError when it cannot be read.
Result<std::string> ReadFile(const std::string& path);
// Writes `text` to `path` atomically (temp file in the same directory, fsync, rename), creating
// missing parent directories.
Status WriteFileAtomic(const std::string& path, std::string_view text);
// A secret kept in a file (a run's control.token): its first word. PermissionDenied when the file
// cannot be read or holds none.
Result<std::string> ReadToken(const std::string& path);

}  // namespace megascope::tracer
