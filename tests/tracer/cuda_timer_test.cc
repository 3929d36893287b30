// CUDA-event span timing on a real device (label gpu): a span around work the host only queues
// lasts as long as the device takes, not as long as the queueing; it lies between host clock
// reads taken before Begin and after the device finished.
#include <gtest/gtest.h>

#include <vector>

#include "megascope/kernels/kernels.h"
#include "megascope/tracer/span_timer.h"
#include "test_util.h"

namespace megascope::tracer {
namespace {

TEST(CudaSpanTimerTest, ASpanCoversTheDeviceWorkNotItsQueueing) {
  std::string why;
  auto k = kernels::CreateKernels(kernels::Backend::kCuda, 0, &why);
  ASSERT_NE(k, nullptr) << why;
  megascope::testing::TempDir dir;
  RingOptions o;
  o.dir = dir.path();
  o.job = "cudatimer";
  o.world_size = 1;
  auto t = Tracer::Create(o);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  Tracer& tracer = **t;
  auto reader = RingReader::Attach(tracer.ring().path(), RingReader::Mode::kConsume);
  ASSERT_TRUE(reader.ok());
  auto timer = CreateCudaSpanTimer(&tracer, k->stream(), 64, &why);
  ASSERT_NE(timer, nullptr) << why;
  const NameId name = *tracer.InternName("forward");
  const int n = 4096;
  kernels::ActBuffer a(k.get(), size_t{n} * n), c(k.get(), size_t{n} * n);
  k->Gemm(false, false, n, n, n, 1, a.cact(), a.cact(), 0, c.act());  // plan and warm-up
  ASSERT_EQ(k->Synchronize(), "");

  const int64_t host_before = tracer.Ticks();
  int64_t queued_ticks = 0;
  {
    SpanTimer::Scope span(timer.get(), SpanKind::kForward, name, 1, 0);
    const int64_t q0 = tracer.Ticks();
    for (int i = 0; i < 20; ++i) k->Gemm(false, false, n, n, n, 1, a.cact(), a.cact(), 0, c.act());
    queued_ticks = tracer.Ticks() - q0;
  }
  ASSERT_EQ(k->Synchronize(), "");
  const int64_t host_after = tracer.Ticks();
  timer->Flush();

  std::vector<Record> out(16);
  const size_t got = (*reader)->Drain(out);
  const Record* span = nullptr;
  for (size_t i = 0; i < got; ++i) {
    if (out[i].type == RecordType::kSpan) span = &out[i];
  }
  ASSERT_NE(span, nullptr) << timer->name();
  const ClockCalibration cal = tracer.clock().Calibration();
  const int64_t dur_ns = cal.ToNs(span->span.end_ticks) - cal.ToNs(span->span.start_ticks);
  const int64_t queued_ns = cal.ToNs(queued_ticks) - cal.ToNs(0);
  // 20 GEMMs of 4096^3 (2.7 TFLOP) take milliseconds on any GPU; queueing them, microseconds.
  EXPECT_GT(dur_ns, 10 * queued_ns) << "span " << dur_ns << " ns, queueing " << queued_ns << " ns";
  const int64_t slack = 200'000;  // ns: the anchor's error and the resolver's polling
  EXPECT_GE(cal.ToNs(span->span.start_ticks), cal.ToNs(host_before) - slack);
  EXPECT_LE(cal.ToNs(span->span.end_ticks), cal.ToNs(host_after) + slack);
  EXPECT_EQ(span->span.microbatch, 0);
}

}  // namespace
}  // namespace megascope::tracer
