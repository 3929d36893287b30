// How a compute span is timed, one seam for every backend (docs/architecture.md section 3): on CPU
// the host clock at its begin and end; on CUDA a pair of events recorded on the compute stream and
// turned into host time by a background thread once the device has passed them (tracer/cuda/), so a
// span says when the GPU did the work, not when the host queued it. Either way the span lands in
// the rank's ring as any other span. Begin/End come from one thread (the training thread).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "megascope/tracer/tracer.h"

namespace megascope::tracer {

class SpanTimer {
 public:
  virtual ~SpanTimer() = default;
  struct Open {
    SpanKind kind;
    NameId name;
    int32_t microbatch;
    int64_t step;
    int64_t start_ticks;  // host ticks at Begin (the fallback when no event was free)
    int32_t slot;         // the event pair, or -1: timed on the host
  };
  virtual Open Begin(SpanKind kind, NameId name, int64_t step, int32_t microbatch = -1) = 0;
  virtual void End(const Open& open) = 0;
  // Returns once every span ended so far is in the ring (end of training, tests).
  virtual void Flush() {}
  // What times the spans, for logs: "host clock", "CUDA events (pool of 4096)".
  virtual std::string name() const = 0;

  // RAII: a span over [construction, destruction).
  class Scope {
   public:
    Scope(SpanTimer* t, SpanKind kind, NameId name, int64_t step, int32_t microbatch = -1)
        : t_(t), open_(t->Begin(kind, name, step, microbatch)) {}
    ~Scope() { t_->End(open_); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    SpanTimer* t_;
    Open open_;
  };
};

// Host clock: exactly Tracer::Scope.
std::unique_ptr<SpanTimer> CreateHostSpanTimer(Tracer* tracer);

// CUDA events on `stream` (a cudaStream_t) of the current device, `pool` event pairs created once.
// nullptr with *error set in a build without CUDA or when the events cannot be made.
std::unique_ptr<SpanTimer> CreateCudaSpanTimer(Tracer* tracer, void* stream, int pool,
                                               std::string* error);

}  // namespace megascope::tracer
