// The CPU backend with activations stored in bf16: every op reads its activations from bf16,
// runs the fp32 reference and rounds what it stores back to bf16 (to nearest, ties to even, as
// the device does). It is the CUDA backend's storage on a CPU: the model's mixed-precision
// plumbing (the bf16 compute copy of the parameters, bf16 collectives, the conversions at a
// stage's edges) runs and is tested on machines without a GPU. Slow (a copy per operand) and not
// for training.
#include <cstring>
#include <vector>

#include "megascope/kernels/kernels.h"

namespace megascope::kernels {
namespace {

uint16_t ToBf16Bits(float x) {
  uint32_t u = 0;
  std::memcpy(&u, &x, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float FromBf16Bits(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float x = 0;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}

// An activation operand expanded to fp32 for the reference, rounded back when it is an output.
class Operand {
 public:
  Operand(CAct a, size_t n) : src_(a.p), n_(a.p != nullptr ? n : 0), f_(n_) {
    const auto* b = static_cast<const uint16_t*>(src_);
    for (size_t i = 0; i < n_; ++i) f_[i] = FromBf16Bits(b[i]);
  }
  Act AsAct() { return {src_ != nullptr ? f_.data() : nullptr}; }
  CAct AsCAct() const { return {src_ != nullptr ? f_.data() : nullptr}; }
  // Stores the fp32 values back into `dst` (the operand's own memory) rounded to bf16.
  void StoreTo(Act dst) const {
    auto* b = static_cast<uint16_t*>(dst.p);
    for (size_t i = 0; i < n_; ++i) b[i] = ToBf16Bits(f_[i]);
  }

 private:
  const void* src_;
  size_t n_;
  std::vector<float> f_;
};

class Bf16StorageKernels final : public Kernels {
 public:
  Bf16StorageKernels() : f_(CreateCpuKernels()) {}

  Backend backend() const override { return Backend::kCpu; }
  std::string device_name() const override {
    return f_->device_name() + ", activations stored in bf16";
  }
  void* Allocate(size_t bytes) override { return f_->Allocate(bytes); }
  void Free(void* p) override { f_->Free(p); }
  void* AllocateHost(size_t bytes) override { return f_->AllocateHost(bytes); }
  void FreeHost(void* p) override { f_->FreeHost(p); }
  bool IsDevicePointer(const void* p) const override { return f_->IsDevicePointer(p); }
  void Upload(void* dst, const void* src, size_t bytes) override { f_->Upload(dst, src, bytes); }
  void Download(void* dst, const void* src, size_t bytes) override {
    f_->Download(dst, src, bytes);
  }
  void Copy(void* dst, const void* src, size_t bytes) override { f_->Copy(dst, src, bytes); }
  void Fill(float* x, size_t n, float value) override { f_->Fill(x, n, value); }
  std::string Synchronize() override { return f_->Synchronize(); }
  std::string error() const override { return f_->error(); }

  Storage storage() const override { return Storage::kBF16; }
  void ToAct(Act dst, const float* src, size_t n) override {
    auto* b = static_cast<uint16_t*>(dst.p);
    for (size_t i = 0; i < n; ++i) b[i] = ToBf16Bits(src[i]);
  }
  void FromAct(float* dst, CAct src, size_t n) override {
    const auto* b = static_cast<const uint16_t*>(src.p);
    for (size_t i = 0; i < n; ++i) dst[i] = FromBf16Bits(b[i]);
  }
  void Scale(float* x, size_t n, float s) override { f_->Scale(x, n, s); }
  float SumSquares(const float* x, const std::vector<std::pair<size_t, size_t>>& r) override {
    return f_->SumSquares(x, r);
  }

  void Gemm(bool ta, bool tb, int m, int n, int k, float alpha, CAct a, CAct b, float beta,
            Act c) override {
    Operand oa(a, Mul(m, k)), ob(b, Mul(k, n)), oc(c, Mul(m, n));
    f_->Gemm(ta, tb, m, n, k, alpha, oa.AsCAct(), ob.AsCAct(), beta, oc.AsAct());
    oc.StoreTo(c);
  }
  void GemmToFloat(bool ta, bool tb, int m, int n, int k, float alpha, CAct a, CAct b, float beta,
                   float* c) override {
    Operand oa(a, Mul(m, k)), ob(b, Mul(k, n));
    f_->GemmToFloat(ta, tb, m, n, k, alpha, oa.AsCAct(), ob.AsCAct(), beta, c);
  }
  void Linear(int m, int n, int k, CAct a, CAct w, CAct bias, Act out, Act pre_gelu) override {
    Operand oa(a, Mul(m, k)), ow(w, Mul(k, n)), ob(bias, n), oo(out, Mul(m, n)),
        op(pre_gelu, Mul(m, n));
    f_->Linear(m, n, k, oa.AsCAct(), ow.AsCAct(), ob.AsCAct(), oo.AsAct(), op.AsAct());
    oo.StoreTo(out);
    if (pre_gelu.p != nullptr) op.StoreTo(pre_gelu);
  }
  void LinearGeluBackward(int m, int n, int k, CAct dy, CAct w, CAct pre_gelu, Act dpre,
                          float* dbias) override {
    Operand od(dy, Mul(m, k)), ow(w, Mul(n, k)), op(pre_gelu, Mul(m, n)), odp(dpre, Mul(m, n));
    f_->LinearGeluBackward(m, n, k, od.AsCAct(), ow.AsCAct(), op.AsCAct(), odp.AsAct(), dbias);
    odp.StoreTo(dpre);
  }
  void AddBias(Act x, CAct bias, int n, int c) override {
    Operand ox(x, Mul(n, c)), ob(bias, c);
    f_->AddBias(ox.AsAct(), ob.AsCAct(), n, c);
    ox.StoreTo(x);
  }
  void ColumnSum(CAct x, int n, int c, float* out) override {
    Operand ox(x, Mul(n, c));
    f_->ColumnSum(ox.AsCAct(), n, c, out);
  }
  void Add(Act y, CAct x, size_t n) override {
    Operand oy(y, n), ox(x, n);
    f_->Add(oy.AsAct(), ox.AsCAct(), n);
    oy.StoreTo(y);
  }
  void EmbeddingForward(const int32_t* tokens, int n, int t, CAct wte, int vocab_start, int rows,
                        CAct wpe, int c, Act out) override {
    Operand ow(wte, Mul(rows, c)), op(wpe, Mul(t, c)), oo(out, Mul(n, c));
    f_->EmbeddingForward(tokens, n, t, ow.AsCAct(), vocab_start, rows, op.AsCAct(), c, oo.AsAct());
    oo.StoreTo(out);
  }
  void EmbeddingBackward(const int32_t* tokens, int n, int t, CAct dout, int vocab_start, int rows,
                         int c, float* dwte, float* dwpe) override {
    Operand od(dout, Mul(n, c));
    f_->EmbeddingBackward(tokens, n, t, od.AsCAct(), vocab_start, rows, c, dwte, dwpe);
  }
  void AddPositions(Act x, CAct wpe, int n, int t, int c) override {
    Operand ox(x, Mul(n, c)), ow(wpe, Mul(t, c));
    f_->AddPositions(ox.AsAct(), ow.AsCAct(), n, t, c);
    ox.StoreTo(x);
  }
  void LayerNormForward(CAct x, CAct gamma, CAct beta, int n, int c, Act out, float* mean,
                        float* rstd) override {
    Operand ox(x, Mul(n, c)), og(gamma, c), ob(beta, c), oo(out, Mul(n, c));
    f_->LayerNormForward(ox.AsCAct(), og.AsCAct(), ob.AsCAct(), n, c, oo.AsAct(), mean, rstd);
    oo.StoreTo(out);
  }
  // As the device does: the residual is rounded when stored, and the norm reads it rounded.
  void ResidualLayerNormForward(Act x, CAct delta, CAct bias, CAct gamma, CAct beta, int n, int c,
                                Act out, float* mean, float* rstd) override {
    {
      Operand ox(x, Mul(n, c)), od(delta, Mul(n, c)), ob(bias, c);
      f_->Add(ox.AsAct(), od.AsCAct(), Mul(n, c));
      if (bias.p != nullptr) f_->AddBias(ox.AsAct(), ob.AsCAct(), n, c);
      ox.StoreTo(x);
    }
    LayerNormForward(x, gamma, beta, n, c, out, mean, rstd);
  }
  void LayerNormBackward(CAct dout, CAct x, CAct gamma, const float* mean, const float* rstd, int n,
                         int c, Act dx, float* dgamma, float* dbeta) override {
    Operand od(dout, Mul(n, c)), ox(x, Mul(n, c)), og(gamma, c), odx(dx, Mul(n, c));
    f_->LayerNormBackward(od.AsCAct(), ox.AsCAct(), og.AsCAct(), mean, rstd, n, c, odx.AsAct(),
                          dgamma, dbeta);
    odx.StoreTo(dx);
  }
  void AttentionForward(CAct qkv, int b, int t, int h, int d, Act out, Act att) override {
    const size_t rows = Mul(b, t);
    Operand oq(qkv, rows * 3 * h * d), oo(out, rows * h * d), oa(att, Mul(b, h) * t * t);
    f_->AttentionForward(oq.AsCAct(), b, t, h, d, oo.AsAct(), oa.AsAct());
    oo.StoreTo(out);
    oa.StoreTo(att);
  }
  void AttentionBackward(CAct dout, CAct qkv, CAct att, int b, int t, int h, int d,
                         Act dqkv) override {
    const size_t rows = Mul(b, t);
    Operand od(dout, rows * h * d), oq(qkv, rows * 3 * h * d), oa(att, Mul(b, h) * t * t),
        odq(dqkv, rows * 3 * h * d);
    f_->AttentionBackward(od.AsCAct(), oq.AsCAct(), oa.AsCAct(), b, t, h, d, odq.AsAct());
    odq.StoreTo(dqkv);
  }
  void CrossEntropyForward(CAct logits, const int32_t* targets, int rows, int cols, int vocab_start,
                           float* max, float* sumexp, float* target_logit) override {
    Operand ol(logits, Mul(rows, cols));
    f_->CrossEntropyForward(ol.AsCAct(), targets, rows, cols, vocab_start, max, sumexp,
                            target_logit);
  }
  void RescaleSumExp(float* sumexp, float* max, const float* gmax, int rows) override {
    f_->RescaleSumExp(sumexp, max, gmax, rows);
  }
  void AddLoss(const float* sumexp, const float* max, const float* target_logit, int rows,
               double* host_sum) override {
    f_->AddLoss(sumexp, max, target_logit, rows, host_sum);
  }
  void CrossEntropyBackward(Act logits, const int32_t* targets, const float* max,
                            const float* sumexp, int rows, int cols, int vocab_start,
                            float scale) override {
    Operand ol(logits, Mul(rows, cols));
    f_->CrossEntropyBackward(ol.AsAct(), targets, max, sumexp, rows, cols, vocab_start, scale);
    ol.StoreTo(logits);
  }
  void AdamWUpdate(float* param, const float* grad, float* m, float* v, size_t n, const AdamW& opt,
                   int64_t t, bool decay) override {
    f_->AdamWUpdate(param, grad, m, v, n, opt, t, decay);
  }

 private:
  static size_t Mul(int a, int b) { return static_cast<size_t>(a) * static_cast<size_t>(b); }
  std::unique_ptr<Kernels> f_;  // the fp32 CPU backend doing the arithmetic
};

}  // namespace

std::unique_ptr<Kernels> CreateCpuKernels(Storage storage) {
  if (storage == Storage::kF32) return CreateCpuKernels();
  return std::make_unique<Bf16StorageKernels>();
}

}  // namespace megascope::kernels
