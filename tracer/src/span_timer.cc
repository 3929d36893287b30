#include "megascope/tracer/span_timer.h"

namespace megascope::tracer {
namespace {

class HostSpanTimer final : public SpanTimer {
 public:
  explicit HostSpanTimer(Tracer* t) : t_(t) {}
  Open Begin(SpanKind kind, NameId name, int64_t step, int32_t microbatch) override {
    return {kind, name, microbatch, step, t_->Ticks(), -1};
  }
  void End(const Open& o) override {
    t_->RecordSpan(o.kind, o.name, o.step, o.microbatch, o.start_ticks, t_->Ticks());
  }
  std::string name() const override { return "host clock"; }

 private:
  Tracer* t_;
};

}  // namespace

std::unique_ptr<SpanTimer> CreateHostSpanTimer(Tracer* tracer) {
  return std::make_unique<HostSpanTimer>(tracer);
}

#ifndef MEGASCOPE_HAVE_CUDA
std::unique_ptr<SpanTimer> CreateCudaSpanTimer(Tracer*, void*, int, std::string* error) {
  *error = "this megascope was built without CUDA (the cuda preset builds CUDA-event timing)";
  return nullptr;
}
#endif

}  // namespace megascope::tracer
