// The tracer's own dump (docs/formats.md section 1): JSON and stacks, so in megascope::tracer, not
// in the capture core that anyone's process may load.
#include "megascope/tracer/dump.h"
#include "megascope/tracer/file_util.h"
#include "megascope/tracer/stacks.h"
#include "megascope/tracer/tracer.h"

namespace megascope::tracer {

std::string Tracer::DumpJson(bool stacks) const {
  Dump d{Snapshot(), true, WallNowNs(), {}, {}};
  if (stacks) d.stacks = CaptureThreadStacks();
  return DumpToJson(d);
}

Status Tracer::WriteDump(const std::string& path, bool stacks) const {
  return WriteFileAtomic(path, DumpJson(stacks));
}

}  // namespace megascope::tracer
