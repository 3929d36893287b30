#include "megascope/runtime/model.h"

#include <cmath>
#include <cstring>
#include <functional>
#include <random>

namespace megascope::runtime {

std::string ModelConfig::Validate(const Layout& l) const {
  if (layers < 1 || heads < 1 || width < 1 || seq < 1 || vocab < 2)
    return "model sizes must be positive";
  if (layers > 4096 || heads > 65536 || width > (1 << 20) || seq > (1 << 20) || vocab > (1 << 24))
    return "a model size is out of range (layers <= 4096, heads <= 65536, width and seq <= 2^20, "
           "vocab <= 2^24)";
  if (width % heads != 0)
    return "width " + std::to_string(width) + " is not divisible by heads " + std::to_string(heads);
  if (heads % l.tp != 0)
    return "tp " + std::to_string(l.tp) + " does not divide heads " + std::to_string(heads);
  if (vocab % l.tp != 0)
    return "tp " + std::to_string(l.tp) + " does not divide vocab " + std::to_string(vocab);
  if ((4 * width) % l.tp != 0) return "tp does not divide the MLP width";
  if (l.pp > layers)
    return "pp " + std::to_string(l.pp) + " is larger than the number of layers " +
           std::to_string(layers);
  return "";
}

using Buf = kernels::Buffer<float>;
using Acts = kernels::ActBuffer;
using kernels::Act;
using kernels::CAct;

// What a microbatch's backward needs: activations in the backend's storage type, per-row
// statistics in fp32.
struct GptStage::Saved {
  int n = 0;  // rows: batch * seq
  kernels::Buffer<int32_t> tokens, targets;
  struct Layer {
    Acts x, ln1, qkv, att, ao, x2, ln2, fc, g;
    Buf ln1_mean, ln1_rstd, ln2_mean, ln2_rstd;
  };
  std::vector<Layer> layers;
  Acts xf, lnf, logits;
  Buf lnf_mean, lnf_rstd, max, sumexp;
};

namespace {

// A global tensor [rows, cols], N(0, std) (or `fill` when std == 0), seeded by its name.
std::vector<float> GlobalTensor(uint64_t seed, const std::string& name, size_t rows, size_t cols,
                                float std, float fill = 0) {
  std::vector<float> t(rows * cols, fill);
  if (std == 0) return t;
  std::mt19937_64 rng(seed ^ std::hash<std::string>{}(name));
  std::normal_distribution<float> dist(0, std);
  for (float& x : t) x = dist(rng);
  return t;
}

// Copies the columns [start, start+len) of each range of a row-major [rows, cols] tensor.
void CopyColumns(const std::vector<float>& g, size_t rows, size_t cols,
                 const std::vector<std::pair<size_t, size_t>>& ranges, float* out) {
  for (size_t r = 0; r < rows; ++r) {
    for (const auto& [start, len] : ranges) {
      std::memcpy(out, g.data() + r * cols + start, len * sizeof(float));
      out += len;
    }
  }
}

}  // namespace

GptStage::GptStage(const ModelConfig& cfg, const Layout& layout, int rank, Communicator* comm,
                   kernels::Kernels* k)
    : cfg_(cfg),
      layout_(layout),
      comm_(comm),
      own_kernels_(k == nullptr ? kernels::CreateCpuKernels() : nullptr),
      k_(k == nullptr ? own_kernels_.get() : k) {
  const tracer::Coords c = layout.CoordsOf(rank);
  stage_ = c.pp;
  tp_rank_ = c.tp;
  tp_group_ = comm ? comm->Find(GroupKind::kTp) : -1;
  hl_ = cfg.heads / layout.tp;
  d_ = cfg.width / cfg.heads;
  vl_ = cfg.vocab / layout.tp;
  // Layers split as evenly as possible, earlier stages taking the remainder.
  const int base = cfg.layers / layout.pp, extra = cfg.layers % layout.pp;
  layer_begin_ = stage_ * base + std::min(stage_, extra);
  layer_end_ = layer_begin_ + base + (stage_ < extra ? 1 : 0);
  const size_t C = cfg.width, Q = size_t{3} * hl_ * d_, F = 4 * C / layout.tp;
  if (first() || last()) wte_ = Add("wte", vl_ * C, true, false);
  if (first()) wpe_ = Add("wpe", cfg.seq * C, true, true);
  for (int l = layer_begin_; l < layer_end_; ++l) {
    const std::string p = "h" + std::to_string(l) + ".";
    LayerOffsets o;
    o.ln1g = Add(p + "ln1.g", C, false, true);
    o.ln1b = Add(p + "ln1.b", C, false, true);
    o.wqkv = Add(p + "qkv.w", C * Q, true, false);
    o.bqkv = Add(p + "qkv.b", Q, false, false);
    o.wo = Add(p + "proj.w", static_cast<size_t>(hl_) * d_ * C, true, false);
    o.bo = Add(p + "proj.b", C, false, true);
    o.ln2g = Add(p + "ln2.g", C, false, true);
    o.ln2b = Add(p + "ln2.b", C, false, true);
    o.w1 = Add(p + "fc.w", C * F, true, false);
    o.b1 = Add(p + "fc.b", F, false, false);
    o.w2 = Add(p + "fc2.w", F * C, true, false);
    o.b2 = Add(p + "fc2.b", C, false, true);
    layer_.push_back(o);
  }
  if (last()) {
    lnfg_ = Add("lnf.g", C, false, true);
    lnfb_ = Add("lnf.b", C, false, true);
  }
  // The head's copy of the tied embedding on the last stage is not counted twice in the norm.
  if (last() && !first()) tensors_.front().unique = false;
  params_ = New(count_);
  grads_ = New(count_);
  if (k_->storage() != kernels::Storage::kF32) compute_params_ = NewActs(count_);
  const std::vector<float> init = InitParams();
  k_->Upload(params_.data(), init.data(), init.size() * sizeof(float));
}

GptStage::~GptStage() = default;

int64_t ModelConfig::ParameterCount() const {
  const int64_t c = width, f = 4 * int64_t{width};
  // ln1 (2c), qkv (3c^2 + 3c), proj (c^2 + c), ln2 (2c), fc (cf + f), fc2 (fc + c)
  const int64_t per_layer = 2 * c + 3 * c * c + 3 * c + c * c + c + 2 * c + c * f + f + f * c + c;
  return int64_t{vocab} * c + int64_t{seq} * c + layers * per_layer + 2 * c;
}

size_t GptStage::Add(const std::string& name, size_t size, bool decay, bool replicated_over_tp) {
  const size_t off = count_;
  count_ += size;
  tensors_.push_back({name, off, size, decay, !replicated_over_tp || tp_rank_ == 0});
  return off;
}

std::vector<float> GptStage::HostParams() const {
  std::vector<float> h(count_);
  k_->Download(h.data(), params_.data(), count_ * sizeof(float));
  return h;
}

std::vector<float> GptStage::HostGrads() const {
  std::vector<float> h(count_);
  k_->Download(h.data(), grads_.data(), count_ * sizeof(float));
  return h;
}

void GptStage::ZeroGrads() { k_->Fill(grads_.data(), count_, 0.0f); }

Acts GptStage::Clone(const Acts& b) {
  Acts c = NewActs(b.size());
  k_->Copy(c.act().p, b.cact().p, b.bytes());
  return c;
}

CAct GptStage::W(size_t off) const {
  if (k_->storage() == kernels::Storage::kF32) return {params_.data() + off};
  return kernels::Offset(compute_params_.cact(), off, k_->storage());
}

void GptStage::RefreshComputeParams() {
  if (k_->storage() == kernels::Storage::kF32 || !compute_params_stale_) return;
  k_->ToAct(compute_params_.act(), params_.data(), count_);
  compute_params_stale_ = false;
}

Status GptStage::AllReduceActs(Act x, size_t n) {
  CommOp op{OpType::kAllreduce, tp_group_, x.p, x.p, n};
  op.dtype = k_->storage() == kernels::Storage::kBF16 ? DType::kBf16 : DType::kF32;
  return comm_->Run(op);
}

Status GptStage::Check() const {
  const std::string e = k_->error();
  if (e.empty()) return Status::Ok();
  return Internal(std::string(kernels::BackendName(k_->backend())) + " backend: " + e);
}

const ParamTensor* GptStage::Find(const std::string& name) const {
  for (const ParamTensor& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

// The stage's share of the global tensors, on the host, laid out as the flat parameters.
std::vector<float> GptStage::InitParams() const {
  std::vector<float> host(count_, 0.0f);
  auto P = [&host](size_t off) { return host.data() + off; };
  const size_t C = cfg_.width, H = cfg_.heads, D = d_, F = 4 * C, tp = layout_.tp;
  const size_t hd_local = hl_ * D, f_local = F / tp;
  const float proj_std = 0.02f / std::sqrt(2.0f * static_cast<float>(cfg_.layers));
  const uint64_t s = cfg_.seed;
  if (first() || last()) {
    auto g = GlobalTensor(s, "wte", cfg_.vocab, C, 0.02f);
    std::memcpy(P(wte_), g.data() + static_cast<size_t>(tp_rank_) * vl_ * C,
                vl_ * C * sizeof(float));
  }
  if (first()) {
    auto g = GlobalTensor(s, "wpe", cfg_.seq, C, 0.01f);
    std::memcpy(P(wpe_), g.data(), g.size() * sizeof(float));
  }
  for (int i = 0; i < static_cast<int>(layer_.size()); ++i) {
    const LayerOffsets& o = layer_[i];
    const std::string p = "h" + std::to_string(layer_begin_ + i) + ".";
    std::fill(P(o.ln1g), P(o.ln1g) + C, 1.0f);
    std::fill(P(o.ln2g), P(o.ln2g) + C, 1.0f);
    std::vector<std::pair<size_t, size_t>> qkv_cols;
    for (size_t part = 0; part < 3; ++part)
      qkv_cols.push_back({part * H * D + tp_rank_ * hd_local, hd_local});
    CopyColumns(GlobalTensor(s, p + "qkv.w", C, 3 * H * D, 0.02f), C, 3 * H * D, qkv_cols,
                P(o.wqkv));
    auto wo = GlobalTensor(s, p + "proj.w", H * D, C, proj_std);
    std::memcpy(P(o.wo), wo.data() + tp_rank_ * hd_local * C, hd_local * C * sizeof(float));
    CopyColumns(GlobalTensor(s, p + "fc.w", C, F, 0.02f), C, F, {{tp_rank_ * f_local, f_local}},
                P(o.w1));
    auto w2 = GlobalTensor(s, p + "fc2.w", F, C, proj_std);
    std::memcpy(P(o.w2), w2.data() + tp_rank_ * f_local * C, f_local * C * sizeof(float));
  }
  if (last()) std::fill(P(lnfg_), P(lnfg_) + C, 1.0f);
  return host;
}

struct GptStage::Residual {
  Acts pending;     // the delta still to add ...
  size_t bias = 0;  // ... with this bias
};

// Layer norm of the residual stream x (after its pending add) with gamma/beta at offsets g and b;
// *saved_in is the norm's input, kept for the backward.
void GptStage::NormForward(Residual& r, Acts& x, size_t g, size_t b, Acts* saved_in, Acts* out,
                           Buf* mean, Buf* rstd, int n) {
  kernels::Kernels& k = *k_;
  const int C = cfg_.width;
  const size_t nc = static_cast<size_t>(n) * C;
  *out = NewActs(nc);
  *mean = New(n);
  *rstd = New(n);
  if (r.pending.size() != 0) {
    k.ResidualLayerNormForward(x.act(), r.pending.cact(), W(r.bias), W(g), W(b), n, C, out->act(),
                               mean->data(), rstd->data());
    r.pending = Acts();
  } else {
    k.LayerNormForward(x.cact(), W(g), W(b), n, C, out->act(), mean->data(), rstd->data());
  }
  *saved_in = Clone(x);
}

// One transformer layer: attention and MLP, sequential or as a parallel block, tp-reduced.
Status GptStage::LayerForward(const LayerOffsets& o, Saved& sv, Residual& r, Acts& x, int batch) {
  kernels::Kernels& k = *k_;
  const int C = cfg_.width, T = cfg_.seq, n = batch * T, Q = 3 * hl_ * d_, HD = hl_ * d_;
  const int F = 4 * C / layout_.tp;
  const size_t nc = static_cast<size_t>(n) * C;
  Saved::Layer L;
  NormForward(r, x, o.ln1g, o.ln1b, &L.x, &L.ln1, &L.ln1_mean, &L.ln1_rstd, n);
  L.qkv = NewActs(static_cast<size_t>(n) * Q);
  k.Linear(n, Q, C, L.ln1.cact(), W(o.wqkv), W(o.bqkv), L.qkv.act(), Act{});
  L.att = NewActs(static_cast<size_t>(batch) * hl_ * T * T);
  L.ao = NewActs(static_cast<size_t>(n) * HD);
  k.AttentionForward(L.qkv.cact(), batch, T, hl_, d_, L.ao.act(), L.att.act());
  Acts partial = NewActs(nc);
  k.Gemm(false, false, n, C, HD, 1, L.ao.cact(), W(o.wo), 0, partial.act());
  auto mlp = [&](const Acts& in_ln, Acts* acc) {
    L.fc = NewActs(static_cast<size_t>(n) * F);
    L.g = NewActs(L.fc.size());
    k.Linear(n, F, C, in_ln.cact(), W(o.w1), W(o.b1), L.g.act(), L.fc.act());
    k.Gemm(false, false, n, C, F, 1, L.g.cact(), W(o.w2), 1, acc->act());
  };
  if (cfg_.parallel_block) {
    mlp(L.ln1, &partial);  // y = x + Attn(LN(x)) + MLP(LN(x)): one all-reduce for both
    if (layout_.tp > 1) RETURN_IF_ERROR(AllReduceActs(partial.act(), nc));
    k.Add(x.act(), partial.cact(), nc);
    k.AddBias(x.act(), W(o.bo), n, C);
    k.AddBias(x.act(), W(o.b2), n, C);
  } else {
    if (layout_.tp > 1) RETURN_IF_ERROR(AllReduceActs(partial.act(), nc));
    r.pending = std::move(partial);
    r.bias = o.bo;
    NormForward(r, x, o.ln2g, o.ln2b, &L.x2, &L.ln2, &L.ln2_mean, &L.ln2_rstd, n);
    Acts p2 = NewActs(nc);
    mlp(L.ln2, &p2);
    if (layout_.tp > 1) RETURN_IF_ERROR(AllReduceActs(p2.act(), nc));
    r.pending = std::move(p2);
    r.bias = o.b2;
  }
  sv.layers.push_back(std::move(L));
  return Status::Ok();
}

// The head: final LN, vocab-parallel logits and cross-entropy.
Status GptStage::HeadForward(Saved& sv, Residual& r, Acts& x, const int32_t* targets,
                             double* loss_sum) {
  kernels::Kernels& k = *k_;
  const int C = cfg_.width, n = sv.n;
  sv.targets = kernels::Buffer<int32_t>(k_, n);
  k.Upload(sv.targets.data(), targets, sv.targets.bytes());
  NormForward(r, x, lnfg_, lnfb_, &sv.xf, &sv.lnf, &sv.lnf_mean, &sv.lnf_rstd, n);
  sv.logits = NewActs(static_cast<size_t>(n) * vl_);
  k.Gemm(false, true, n, vl_, C, 1, sv.lnf.cact(), W(wte_), 0, sv.logits.act());
  sv.max = New(n);
  sv.sumexp = New(n);
  Buf target_logit = New(n);
  k.CrossEntropyForward(sv.logits.cact(), sv.targets.data(), n, vl_, tp_rank_ * vl_, sv.max.data(),
                        sv.sumexp.data(), target_logit.data());
  if (layout_.tp > 1) {
    Buf gmax = New(n);
    k.Copy(gmax.data(), sv.max.data(), gmax.bytes());
    RETURN_IF_ERROR(comm_->AllReduce(tp_group_, gmax.data(), n, ReduceOp::kMax));
    k.RescaleSumExp(sv.sumexp.data(), sv.max.data(), gmax.data(), n);
    RETURN_IF_ERROR(comm_->AllReduce(tp_group_, sv.sumexp.data(), n, ReduceOp::kSum));
    RETURN_IF_ERROR(comm_->AllReduce(tp_group_, target_logit.data(), n, ReduceOp::kSum));
  }
  k.AddLoss(sv.sumexp.data(), sv.max.data(), target_logit.data(), n, loss_sum);
  return Status::Ok();
}

Status GptStage::Forward(int mb, int batch, const int32_t* tokens, const float* in,
                         const int32_t* targets, float* out, double* loss_sum) {
  RefreshComputeParams();
  auto saved = std::make_unique<Saved>();
  Saved& sv = *saved;
  kernels::Kernels& k = *k_;
  const int C = cfg_.width, T = cfg_.seq, n = batch * T;
  const size_t nc = static_cast<size_t>(n) * C;
  sv.n = n;
  Residual r;
  Acts x = NewActs(nc);
  if (first()) {
    sv.tokens = kernels::Buffer<int32_t>(k_, n);
    k.Upload(sv.tokens.data(), tokens, sv.tokens.bytes());
    k.EmbeddingForward(sv.tokens.data(), n, T, W(wte_), tp_rank_ * vl_, vl_, CAct{}, C, x.act());
    if (layout_.tp > 1) RETURN_IF_ERROR(AllReduceActs(x.act(), nc));
    k.AddPositions(x.act(), W(wpe_), n, T, C);
  } else {
    k.ToAct(x.act(), in, nc);
  }
  for (const LayerOffsets& o : layer_) RETURN_IF_ERROR(LayerForward(o, sv, r, x, batch));
  if (last()) {
    RETURN_IF_ERROR(HeadForward(sv, r, x, targets, loss_sum));
  } else {
    if (r.pending.size() != 0) {
      k.Add(x.act(), r.pending.cact(), nc);
      k.AddBias(x.act(), W(r.bias), n, C);
    }
    k.FromAct(out, x.cact(), nc);
  }
  saved_[mb] = std::move(saved);
  return Check();
}

Status GptStage::Backward(int mb, const float* dout, float* din, float loss_scale) {
  auto it = saved_.find(mb);
  if (it == saved_.end())
    return Internal("backward of microbatch " + std::to_string(mb) + " without its forward");
  std::unique_ptr<Saved> saved = std::move(it->second);
  saved_.erase(it);
  Saved& sv = *saved;
  kernels::Kernels& k = *k_;
  const int C = cfg_.width, T = cfg_.seq, n = sv.n, batch = n / T, Q = 3 * hl_ * d_, HD = hl_ * d_;
  const int F = 4 * C / layout_.tp;
  const size_t nc = static_cast<size_t>(n) * C;
  Acts dx = NewActs(nc);
  if (last()) {
    Acts& dlogits = sv.logits;  // the gradient overwrites the logits
    k.CrossEntropyBackward(dlogits.act(), sv.targets.data(), sv.max.data(), sv.sumexp.data(), n,
                           vl_, tp_rank_ * vl_, loss_scale);
    Acts dlnf = NewActs(nc);
    k.Gemm(false, false, n, C, vl_, 1, dlogits.cact(), W(wte_), 0, dlnf.act());
    k.GemmToFloat(true, false, vl_, C, n, 1, dlogits.cact(), sv.lnf.cact(), 1, G(wte_));
    if (layout_.tp > 1) RETURN_IF_ERROR(AllReduceActs(dlnf.act(), nc));
    k.LayerNormBackward(dlnf.cact(), sv.xf.cact(), W(lnfg_), sv.lnf_mean.data(), sv.lnf_rstd.data(),
                        n, C, dx.act(), G(lnfg_), G(lnfb_));
  } else {
    k.ToAct(dx.act(), dout, nc);
  }
  for (int li = static_cast<int>(layer_.size()) - 1; li >= 0; --li) {
    const LayerOffsets& o = layer_[li];
    Saved::Layer& L = sv.layers[li];
    // MLP backward from d(mlp output) `dm`; adds the partial d(LN input of the MLP) to *dln.
    auto mlp_back = [&](const Acts& dm, const Acts& in_ln, Acts* dln) {
      k.ColumnSum(dm.cact(), n, C, G(o.b2));
      Acts dfc = NewActs(L.fc.size());
      k.LinearGeluBackward(n, F, C, dm.cact(), W(o.w2), L.fc.cact(), dfc.act(), G(o.b1));
      k.GemmToFloat(true, false, F, C, n, 1, L.g.cact(), dm.cact(), 1, G(o.w2));
      k.GemmToFloat(true, false, C, F, n, 1, in_ln.cact(), dfc.cact(), 1, G(o.w1));
      k.Gemm(false, true, n, C, F, 1, dfc.cact(), W(o.w1), 1, dln->act());
    };
    auto attn_back = [&](const Acts& da, Acts* dln) {
      k.ColumnSum(da.cact(), n, C, G(o.bo));
      Acts dao = NewActs(L.ao.size()), dqkv = NewActs(L.qkv.size());
      k.Gemm(false, true, n, HD, C, 1, da.cact(), W(o.wo), 0, dao.act());
      k.GemmToFloat(true, false, HD, C, n, 1, L.ao.cact(), da.cact(), 1, G(o.wo));
      k.AttentionBackward(dao.cact(), L.qkv.cact(), L.att.cact(), batch, T, hl_, d_, dqkv.act());
      k.ColumnSum(dqkv.cact(), n, Q, G(o.bqkv));
      k.GemmToFloat(true, false, C, Q, n, 1, L.ln1.cact(), dqkv.cact(), 1, G(o.wqkv));
      k.Gemm(false, true, n, C, Q, 1, dqkv.cact(), W(o.wqkv), 1, dln->act());
    };
    Acts dln1 = NewActs(nc);
    if (cfg_.parallel_block) {
      mlp_back(dx, L.ln1, &dln1);
      attn_back(dx, &dln1);
    } else {
      Acts dln2 = NewActs(nc);
      mlp_back(dx, L.ln2, &dln2);
      if (layout_.tp > 1) RETURN_IF_ERROR(AllReduceActs(dln2.act(), nc));
      k.LayerNormBackward(dln2.cact(), L.x2.cact(), W(o.ln2g), L.ln2_mean.data(), L.ln2_rstd.data(),
                          n, C, dx.act(), G(o.ln2g), G(o.ln2b));
      attn_back(dx, &dln1);
    }
    if (layout_.tp > 1) RETURN_IF_ERROR(AllReduceActs(dln1.act(), nc));
    k.LayerNormBackward(dln1.cact(), L.x.cact(), W(o.ln1g), L.ln1_mean.data(), L.ln1_rstd.data(), n,
                        C, dx.act(), G(o.ln1g), G(o.ln1b));
  }
  if (first()) {
    k.EmbeddingBackward(sv.tokens.data(), n, T, dx.cact(), tp_rank_ * vl_, vl_, C, G(wte_),
                        G(wpe_));
  } else {
    k.FromAct(din, dx.cact(), nc);
  }
  return Check();
}

}  // namespace megascope::runtime
