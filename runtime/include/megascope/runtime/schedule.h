// The pipeline's schedule, apart from what runs in it: the order in which one stage passes its
// microbatches forward and backward (1F1B, PipeDream-Flush's and Megatron's non-interleaved
// schedule: warm-up forwards, then one forward and one backward in turn, then the cool-down).
#pragma once

#include <vector>

namespace megascope::runtime {

struct PipelinePass {
  bool forward;    // else backward
  int microbatch;  // 0 .. microbatches - 1
  bool operator==(const PipelinePass&) const = default;
};

// Stage `stage` of `stages` (0 first) with `microbatches` microbatches: every microbatch forward,
// then backward; the stage holds at most stages - stage microbatches' activations at once.
std::vector<PipelinePass> OneFOneB(int microbatches, int stage, int stages);

}  // namespace megascope::runtime
