#include "megascope/runtime/schedule.h"

#include <algorithm>

namespace megascope::runtime {

std::vector<PipelinePass> OneFOneB(int microbatches, int stage, int stages) {
  const int m = microbatches;
  const int warmup = std::min(stages - stage - 1, m);
  std::vector<PipelinePass> order;
  order.reserve(2 * static_cast<size_t>(m));
  for (int k = 0; k < warmup; ++k) order.push_back({true, k});
  for (int k = 0; k < m - warmup; ++k) {
    order.push_back({true, warmup + k});
    order.push_back({false, k});
  }
  for (int k = m - warmup; k < m; ++k) order.push_back({false, k});
  return order;
}

}  // namespace megascope::runtime
