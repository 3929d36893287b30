// Ranks grouped by what they were doing when they dumped (MegaScale and ByteRobust cluster stack
// traces to find the odd rank out). Pure: dumps in, groups out.
#pragma once

#include <string>
#include <vector>

#include "megascope/analyzer/hang_input.h"

namespace megascope::analyzer {

struct StackGroup {
  std::vector<int32_t> ranks;
  // What the group shares: the functions of the rank's own code on its main thread's stack,
  // innermost first (for a PyTorch dump: the frames that issued the op it is stuck at).
  std::vector<std::string> key;
  tracer::ThreadStack stack;  // the first rank's, whole
};

// Groups, largest first (ties: lowest rank first); ranks whose dump carries no stack are left out.
std::vector<StackGroup> GroupByStack(const HangInput& in);

// The group that differs, as a line for a verdict's evidence: the ranks whose threads are outside
// every collective (no open op in their flight recorder) while the others wait in one; failing
// that, a group smaller than every other. Empty when the stacks agree or say nothing apart.
std::string OddStackEvidence(const HangInput& in, const std::vector<StackGroup>& groups);

// The distinct stacks with the ranks that share each, for `analyze hang`.
std::string FormatStackGroups(const std::vector<StackGroup>& groups, size_t max_frames = 16);

}  // namespace megascope::analyzer
