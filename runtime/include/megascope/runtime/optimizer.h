// The step after the pipeline: gradients summed where a tensor lives on several ranks, the global
// gradient norm, clipping, and AdamW -- with the learning rate's schedule.
#pragma once

#include <cstdint>

#include "megascope/kernels/kernels.h"
#include "megascope/runtime/comm.h"
#include "megascope/runtime/model.h"
#include "megascope/runtime/train.h"
#include "megascope/tracer/status.h"

namespace megascope::runtime {

// `step`'s learning rate: linear warm-up over cfg.warmup steps to cfg.lr, then cosine decay to
// cfg.min_lr at the last step.
float LearningRate(const TrainConfig& cfg, int64_t step);

// The tied embedding's gradient summed over its two stages, every gradient over the data-parallel
// replicas (in buckets), the norm over the model-parallel ranks (each tensor counted once), the
// gradients clipped to cfg.grad_clip, then AdamW on every tensor with moments `m` and `v`; the
// gradients zeroed. Returns the norm before clipping.
Result<float> SyncGradientsAndStep(const TrainConfig& cfg, Communicator& comm, kernels::Kernels& k,
                                   GptStage& model, float* m, float* v, int64_t step);

}  // namespace megascope::runtime
