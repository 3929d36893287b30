// CUPTI activity records, built here as CUPTI fills them, converted to spans: kernels with their
// demangled names and launch correlation, copies named by direction with their bytes, memsets, and
// of the runtime calls only those that wait for the device.
#include "cupti_spans.h"

#include <cupti_runtime_cbid.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>

namespace megascope::tracer::cupti {
namespace {

TEST(CuptiSpansTest, AKernelIsASpanWithItsDemangledNameStreamAndLaunchCorrelation) {
  CUpti_ActivityKernel10 k;
  std::memset(&k, 0, sizeof(k));
  k.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
  k.name = "_Z6matmulPKfS0_Pfi";  // matmul(float const*, float const*, float*, int)
  k.start = 1000;
  k.end = 5000;
  k.deviceId = 0;
  k.streamId = 7;
  k.correlationId = 42;
  const auto s = ToDeviceSpan(reinterpret_cast<const CUpti_Activity*>(&k));
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->kind, SpanKind::kKernel);
  EXPECT_EQ(s->name, "matmul(float const*, float const*, float*, int)");
  EXPECT_EQ(s->start_ns, 1000u);
  EXPECT_EQ(s->end_ns, 5000u);
  EXPECT_EQ(s->stream, 7u);
  EXPECT_EQ(s->correlation, 42u);
  EXPECT_EQ(Name(s->kind), "kernel");
  // A name longer than a timeline row is cut, and a name that is not mangled stays as it is.
  const std::string longname(400, 'k');
  k.name = longname.c_str();
  EXPECT_EQ(ToDeviceSpan(reinterpret_cast<const CUpti_Activity*>(&k))->name.size(), 160u);
  k.kind = CUPTI_ACTIVITY_KIND_KERNEL;
  k.name = "plain_kernel";
  EXPECT_EQ(ToDeviceSpan(reinterpret_cast<const CUpti_Activity*>(&k))->name, "plain_kernel");
}

TEST(CuptiSpansTest, CopiesAreNamedByDirectionAndMemsetsCarryTheirBytes) {
  CUpti_ActivityMemcpy6 m;
  std::memset(&m, 0, sizeof(m));
  m.kind = CUPTI_ACTIVITY_KIND_MEMCPY;
  m.copyKind = CUPTI_ACTIVITY_MEMCPY_KIND_DTOH;
  m.bytes = 1 << 20;
  m.start = 10;
  m.end = 20;
  m.correlationId = 9;
  auto s = ToDeviceSpan(reinterpret_cast<const CUpti_Activity*>(&m));
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->kind, SpanKind::kMemcpy);
  EXPECT_EQ(s->name, "memcpy DtoH");
  EXPECT_EQ(s->bytes, 1u << 20);
  EXPECT_EQ(s->correlation, 9u);
  m.copyKind = CUPTI_ACTIVITY_MEMCPY_KIND_HTOD;
  EXPECT_EQ(ToDeviceSpan(reinterpret_cast<const CUpti_Activity*>(&m))->name, "memcpy HtoD");
  CUpti_ActivityMemset4 z;
  std::memset(&z, 0, sizeof(z));
  z.kind = CUPTI_ACTIVITY_KIND_MEMSET;
  z.bytes = 4096;
  z.start = 30;
  z.end = 31;
  s = ToDeviceSpan(reinterpret_cast<const CUpti_Activity*>(&z));
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->kind, SpanKind::kMemset);
  EXPECT_EQ(s->bytes, 4096u);
}

TEST(CuptiSpansTest, OnlyRuntimeCallsThatWaitForTheDeviceAreSpans) {
  CUpti_ActivityAPI a;
  std::memset(&a, 0, sizeof(a));
  a.kind = CUPTI_ACTIVITY_KIND_RUNTIME;
  a.start = 100;
  a.end = 900;
  a.correlationId = 5;
  a.cbid = CUPTI_RUNTIME_TRACE_CBID_cudaStreamSynchronize_v3020;
  auto s = ToDeviceSpan(reinterpret_cast<const CUpti_Activity*>(&a));
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->kind, SpanKind::kSync);
  EXPECT_EQ(s->name, "cudaStreamSynchronize");
  a.cbid = CUPTI_RUNTIME_TRACE_CBID_cudaDeviceSynchronize_v3020;
  EXPECT_EQ(ToDeviceSpan(reinterpret_cast<const CUpti_Activity*>(&a))->name,
            "cudaDeviceSynchronize");
  a.cbid = CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000;  // a launch: its kernel is the span
  EXPECT_FALSE(ToDeviceSpan(reinterpret_cast<const CUpti_Activity*>(&a)).has_value());
  // A record whose end CUPTI could not take, and a kind that is no span here.
  a.cbid = CUPTI_RUNTIME_TRACE_CBID_cudaEventSynchronize_v3020;
  a.end = 0;
  EXPECT_FALSE(ToDeviceSpan(reinterpret_cast<const CUpti_Activity*>(&a)).has_value());
  CUpti_Activity other{};
  other.kind = CUPTI_ACTIVITY_KIND_MARKER;
  EXPECT_FALSE(ToDeviceSpan(&other).has_value());
  EXPECT_FALSE(ToDeviceSpan(nullptr).has_value());
}

// CUPTI's times become the ring's ticks from one paired reading, whatever CUPTI's epoch: a record
// before the reading lands before it, after it after, scaled by the tracer clock's rate.
TEST(CuptiSpansTest, CuptiTimesBecomeTracerTicksFromOnePairedReading) {
  const TimeMap tsc{/*cupti_ns=*/5'000'000'000ULL, /*ticks=*/1'000'000, /*ns_per_tick=*/0.25};
  EXPECT_EQ(tsc.ToTicks(5'000'000'000ULL), 1'000'000);
  EXPECT_EQ(tsc.ToTicks(5'000'000'100ULL), 1'000'400);  // 100 ns at 4 ticks per ns
  EXPECT_EQ(tsc.ToTicks(4'999'999'000ULL), 996'000);    // a kernel that ended before the reading
  const TimeMap ns{/*cupti_ns=*/123, /*ticks=*/1'700'000'000'000'000'000, /*ns_per_tick=*/1.0};
  EXPECT_EQ(ns.ToTicks(100), 1'700'000'000'000'000'000 - 23);
}

// Only the calls that block the host on its device are timed by callback.
TEST(CuptiSpansTest, TheSynchronisingCallsAreNamedAndNoOther) {
  EXPECT_STREQ(SyncCallName(CUPTI_RUNTIME_TRACE_CBID_cudaStreamSynchronize_ptsz_v7000),
               "cudaStreamSynchronize");
  EXPECT_STREQ(SyncCallName(CUPTI_RUNTIME_TRACE_CBID_cudaEventSynchronize_v3020),
               "cudaEventSynchronize");
  EXPECT_EQ(SyncCallName(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_v3020), nullptr);
  EXPECT_EQ(SyncCallName(CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000), nullptr);
}

}  // namespace
}  // namespace megascope::tracer::cupti
