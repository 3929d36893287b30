// CUDA-event span timing (span_timer.h). A pool of event pairs is made once; Begin and End record
// one pair on the compute stream (two cudaEventRecord calls, no synchronisation); a resolver thread
// polls the oldest pair with cudaEventQuery, never blocking the device or the training thread, and
// writes the span into the ring from its own lane once the device has passed the end event. Device
// time becomes host time through an anchor: an event recorded on an idle stream of its own and
// waited for, bracketed by two host clock reads (the midpoint is when the device passed it),
// renewed every few seconds while nothing is outstanding so float milliseconds stay precise. When
// every pair is in flight (the resolver fell behind), a span is timed on the host and counted.
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <thread>
#include <vector>

#include "megascope/tracer/span_timer.h"

namespace megascope::tracer {
namespace {

class CudaEventTimer final : public SpanTimer {
 public:
  CudaEventTimer(Tracer* t, cudaStream_t stream, int pool)
      : t_(t), stream_(stream), slots_(static_cast<size_t>(pool)) {}
  ~CudaEventTimer() override {
    stop_.store(true);
    if (resolver_.joinable()) resolver_.join();
    for (Slot& s : slots_) {
      if (s.start != nullptr) cudaEventDestroy(s.start);
      if (s.end != nullptr) cudaEventDestroy(s.end);
    }
    if (anchor_ != nullptr) cudaEventDestroy(anchor_);
    if (anchor_stream_ != nullptr) cudaStreamDestroy(anchor_stream_);
  }

  std::string Init() {
    for (Slot& s : slots_) {
      if (cudaEventCreate(&s.start) != cudaSuccess || cudaEventCreate(&s.end) != cudaSuccess)
        return Error("cudaEventCreate");
    }
    if (cudaEventCreate(&anchor_) != cudaSuccess) return Error("cudaEventCreate");
    if (cudaStreamCreateWithFlags(&anchor_stream_, cudaStreamNonBlocking) != cudaSuccess)
      return Error("cudaStreamCreateWithFlags");
    if (std::string e = Anchor(); !e.empty()) return e;
    resolver_ = std::thread([this] { Resolve(); });
    return "";
  }

  Open Begin(SpanKind kind, NameId name, int64_t step, int32_t microbatch) override {
    Open o{kind, name, microbatch, step, t_->Ticks(), -1};
    const uint64_t h = head_.load(std::memory_order_relaxed);
    Slot& s = slots_[h % slots_.size()];
    if (s.state.load(std::memory_order_acquire) != kFree ||
        cudaEventRecord(s.start, stream_) != cudaSuccess) {
      host_timed_.fetch_add(1, std::memory_order_relaxed);
      return o;
    }
    s.state.store(kBegun, std::memory_order_relaxed);
    head_.store(h + 1, std::memory_order_release);
    o.slot = static_cast<int32_t>(h % slots_.size());
    return o;
  }

  void End(const Open& o) override {
    if (o.slot < 0) {
      t_->RecordSpan(o.kind, o.name, o.step, o.microbatch, o.start_ticks, t_->Ticks());
      return;
    }
    Slot& s = slots_[static_cast<size_t>(o.slot)];
    s.open = o;
    s.recorded = cudaEventRecord(s.end, stream_) == cudaSuccess;
    s.host_end_ticks = t_->Ticks();
    s.state.store(kEnded, std::memory_order_release);
  }

  void Flush() override {
    for (int i = 0;
         i < 5000 && tail_.load(std::memory_order_acquire) != head_.load(std::memory_order_acquire);
         ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  std::string name() const override {
    return "CUDA events (pool of " + std::to_string(slots_.size()) + ", " +
           std::to_string(host_timed_.load()) + " spans timed on the host)";
  }

 private:
  enum : int { kFree = 0, kBegun = 1, kEnded = 2 };
  struct Slot {
    cudaEvent_t start = nullptr, end = nullptr;
    std::atomic<int> state{kFree};
    Open open{};
    bool recorded = false;
    int64_t host_end_ticks = 0;
  };

  static std::string Error(const char* call) {
    const cudaError_t e = cudaGetLastError();
    return std::string(call) + ": " + cudaGetErrorString(e);
  }

  // The host ticks at which the device passes an event on an idle stream.
  std::string Anchor() {
    const int64_t before = t_->Ticks();
    if (cudaEventRecord(anchor_, anchor_stream_) != cudaSuccess ||
        cudaEventSynchronize(anchor_) != cudaSuccess)
      return Error("anchoring the device clock");
    const int64_t after = t_->Ticks();
    anchor_ticks_ = before + (after - before) / 2;
    ticks_per_ms_ = 1e6 / t_->clock().Calibration().ns_per_tick;
    last_anchor_ = std::chrono::steady_clock::now();
    return "";
  }

  // Milliseconds from the anchor to `e` (negative when e came first).
  bool SinceAnchor(cudaEvent_t e, double* ms) {
    float f = 0;
    if (cudaEventElapsedTime(&f, anchor_, e) == cudaSuccess) {
      *ms = f;
      return true;
    }
    (void)cudaGetLastError();
    if (cudaEventElapsedTime(&f, e, anchor_) == cudaSuccess) {
      *ms = -f;
      return true;
    }
    (void)cudaGetLastError();
    return false;
  }

  void Resolve() {
    while (!stop_.load()) {
      const uint64_t tail = tail_.load(std::memory_order_relaxed);
      if (tail == head_.load(std::memory_order_acquire)) {
        if (std::chrono::steady_clock::now() - last_anchor_ > std::chrono::seconds(5))
          (void)Anchor();
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        continue;
      }
      Slot& s = slots_[tail % slots_.size()];
      if (s.state.load(std::memory_order_acquire) != kEnded) {  // still open on the host
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        continue;
      }
      const cudaError_t q = s.recorded ? cudaEventQuery(s.end) : cudaErrorInvalidValue;
      if (q == cudaErrorNotReady) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        continue;
      }
      const Open& o = s.open;
      double start_ms = 0, end_ms = 0;
      if (q == cudaSuccess && SinceAnchor(s.start, &start_ms) && SinceAnchor(s.end, &end_ms)) {
        t_->RecordSpan(o.kind, o.name, o.step, o.microbatch,
                       anchor_ticks_ + std::llround(start_ms * ticks_per_ms_),
                       anchor_ticks_ + std::llround(end_ms * ticks_per_ms_));
      } else {  // the device cannot say: the host's view, rather than nothing
        (void)cudaGetLastError();
        host_timed_.fetch_add(1, std::memory_order_relaxed);
        t_->RecordSpan(o.kind, o.name, o.step, o.microbatch, o.start_ticks, s.host_end_ticks);
      }
      s.state.store(kFree, std::memory_order_release);
      tail_.store(tail + 1, std::memory_order_release);
    }
  }

  Tracer* t_;
  cudaStream_t stream_;
  std::vector<Slot> slots_;
  std::atomic<uint64_t> head_{0}, tail_{0};  // pairs taken (training thread), resolved (resolver)
  std::atomic<uint64_t> host_timed_{0};
  std::atomic<bool> stop_{false};
  cudaEvent_t anchor_ = nullptr;
  cudaStream_t anchor_stream_ = nullptr;
  int64_t anchor_ticks_ = 0;  // resolver thread only, after Init
  double ticks_per_ms_ = 1e6;
  std::chrono::steady_clock::time_point last_anchor_;
  std::thread resolver_;
};

}  // namespace

std::unique_ptr<SpanTimer> CreateCudaSpanTimer(Tracer* tracer, void* stream, int pool,
                                               std::string* error) {
  auto t = std::make_unique<CudaEventTimer>(tracer, static_cast<cudaStream_t>(stream),
                                            pool > 0 ? pool : 4096);
  if (std::string e = t->Init(); !e.empty()) {
    *error = e;
    return nullptr;
  }
  return t;
}

}  // namespace megascope::tracer
