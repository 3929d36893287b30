#include "megascope/runtime/optimizer.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

namespace megascope::runtime {

float LearningRate(const TrainConfig& cfg, int64_t step) {
  if (step < cfg.warmup)
    return cfg.lr * static_cast<float>(step + 1) / static_cast<float>(cfg.warmup);
  const double progress = static_cast<double>(step - cfg.warmup) /
                          static_cast<double>(std::max<int64_t>(1, cfg.steps - cfg.warmup));
  return cfg.min_lr + 0.5f * (cfg.lr - cfg.min_lr) *
                          static_cast<float>(1 + std::cos(M_PI * std::min(1.0, progress)));
}

Result<float> SyncGradientsAndStep(const TrainConfig& cfg, Communicator& comm, kernels::Kernels& k,
                                   GptStage& model, float* m, float* v, int64_t step) {
  const Layout& l = cfg.layout;
  float* g = model.grads();
  float* p = model.params();
  const size_t count = model.count();
  if (const int emb = comm.Find(GroupKind::kEmb); emb >= 0) {  // the tied embedding: two stages
    const ParamTensor* wte = model.Find("wte");
    RETURN_IF_ERROR(comm.AllReduce(emb, g + wte->offset, wte->size, ReduceOp::kSum));
  }
  if (l.dp > 1) {  // bucketed data-parallel gradient all-reduce
    constexpr size_t kBucket = 1 << 18;
    const int dp = comm.Find(GroupKind::kDp);
    for (size_t off = 0; off < count; off += kBucket)
      RETURN_IF_ERROR(comm.AllReduce(dp, g + off, std::min(kBucket, count - off), ReduceOp::kSum));
  }
  std::vector<std::pair<size_t, size_t>> counted;
  for (const ParamTensor& t : model.tensors()) {
    if (t.unique) counted.emplace_back(t.offset, t.size);
  }
  float sumsq = k.SumSquares(g, counted);
  if (l.tp * l.pp > 1)
    RETURN_IF_ERROR(comm.AllReduce(comm.Find(GroupKind::kMp), &sumsq, 1, ReduceOp::kSum));
  const float norm = std::sqrt(sumsq);
  const float clip = cfg.grad_clip > 0 && norm > cfg.grad_clip ? cfg.grad_clip / norm : 1.0f;
  kernels::AdamW opt;
  opt.lr = LearningRate(cfg, step);
  opt.weight_decay = cfg.weight_decay;
  if (clip != 1.0f) k.Scale(g, count, clip);
  for (const ParamTensor& t : model.tensors()) {
    k.AdamWUpdate(p + t.offset, g + t.offset, m + t.offset, v + t.offset, t.size, opt, step + 1,
                  t.decay);
  }
  model.ZeroGrads();
  if (std::string e = k.error(); !e.empty()) return Internal("optimizer step: " + e);
  return norm;
}

}  // namespace megascope::runtime
