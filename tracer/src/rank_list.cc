#include "megascope/tracer/rank_list.h"

#include <algorithm>

namespace megascope::tracer {

void RankList::push_back(int32_t rank) {
  if (!runs_.empty()) {
    Run& last = runs_.back();
    if (last.count == 1) {
      last.stride = rank - last.first;
      last.count = 2;
      ++size_;
      return;
    }
    if (last[last.count - 1] + last.stride == rank) {
      ++last.count;
      ++size_;
      return;
    }
  }
  runs_.push_back({rank, 1, 1, static_cast<uint32_t>(size_)});
  ++size_;
}

void RankList::AppendRun(int32_t first, uint32_t count, int32_t stride) {
  // What pushing each rank would build, without pushing each once the last run continues them.
  for (uint32_t k = 0; k < count; ++k) {
    const int32_t rank = first + static_cast<int32_t>(k) * stride;
    if (!runs_.empty()) {
      Run& last = runs_.back();
      if (last.count >= 2 && last.stride == stride && last[last.count - 1] + stride == rank) {
        last.count += count - k;
        size_ += count - k;
        return;
      }
    }
    push_back(rank);
  }
}

int32_t RankList::operator[](size_t i) const {
  auto it = std::upper_bound(runs_.begin(), runs_.end(), i,
                             [](size_t v, const Run& r) { return v < r.offset; });
  const Run& r = *(it - 1);
  return r[static_cast<uint32_t>(i - r.offset)];
}

int RankList::IndexOf(int32_t rank) const {
  for (const Run& r : runs_) {
    const int64_t d = static_cast<int64_t>(rank) - r.first;
    if (r.count == 1 || r.stride == 0) {
      if (d == 0) return static_cast<int>(r.offset);
      continue;
    }
    if (d % r.stride != 0) continue;
    const int64_t k = d / r.stride;
    if (k >= 0 && k < r.count) return static_cast<int>(r.offset + k);
  }
  return -1;
}

}  // namespace megascope::tracer
