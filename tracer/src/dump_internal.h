// Shared by the two readings of a dump (dump.cc: the reference, with its errors; dump_fast.cc:
// the fast one for well-formed dumps).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "megascope/tracer/dump.h"

namespace megascope::tracer {

struct RankRun {
  int32_t first = 0;
  uint32_t count = 0;
  int32_t stride = 1;
};
// Python's range(start, stop, step) as ranks, appended to a group of `have` members; nullopt when
// it is empty, reaches outside [0, INT32_MAX] or makes the group larger than kMaxGroupSize.
std::optional<RankRun> RangeOfRanks(int64_t start, int64_t stop, int64_t step, size_t have);

}  // namespace megascope::tracer
