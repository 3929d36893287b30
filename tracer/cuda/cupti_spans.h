// CUPTI activity records as spans: what ran on a GPU (kernels, copies, memsets) and the runtime
// calls that wait for one (device, stream and event synchronisation), each with the correlation
// id CUPTI gives the runtime call that launched it. Pure: a record in, a span out. The injection
// library (libmegascope-cupti.so) writes them into the process's ring; the conversion is tested
// without a GPU from records built in the test.
#pragma once

#include <cupti_activity.h>
#include <cupti_callbacks.h>

#include <cstdint>
#include <optional>
#include <string>

#include "megascope/tracer/records.h"

namespace megascope::tracer::cupti {

struct DeviceSpan {
  SpanKind kind = SpanKind::kKernel;
  std::string
      name;  // a kernel's demangled name (cut at 160), "memcpy HtoD", "cudaStreamSynchronize"
  uint64_t start_ns = 0, end_ns = 0;  // CUPTI's clock (cuptiGetTimestamp)
  uint32_t correlation = 0;           // the launching runtime call's correlationId
  uint32_t device = 0, stream = 0;    // a runtime call's: 0
  uint64_t bytes = 0;                 // a copy's or memset's
};

// The span of one activity record, or nothing for a kind (or runtime call) that is no span here.
// Understands CONCURRENT_KERNEL and KERNEL (CUpti_ActivityKernel10), MEMCPY
// (CUpti_ActivityMemcpy6), MEMSET (CUpti_ActivityMemset4) and RUNTIME (CUpti_ActivityAPI: the
// synchronising calls).
// `record` points into CUPTI's activity buffer (cuptiActivityGetNextRecord); it is read by copy.
std::optional<DeviceSpan> ToDeviceSpan(const CUpti_Activity* record);

// The name of a runtime call that blocks the host until the device is done
// (cudaDeviceSynchronize, cudaStreamSynchronize, cudaEventSynchronize), or null for any other.
const char* SyncCallName(CUpti_CallbackId cbid);

// CUPTI's clock against the tracer's: one reading of both taken together (cuptiGetTimestamp, then
// Tracer::Ticks) and the tracer clock's ns per tick, so a record's times become the ring's ticks
// whatever CUPTI's epoch is.
struct TimeMap {
  uint64_t cupti_ns = 0;
  int64_t ticks = 0;
  double ns_per_tick = 1.0;
  int64_t ToTicks(uint64_t ns) const {
    const double delta = static_cast<double>(static_cast<int64_t>(ns - cupti_ns));
    return ticks + static_cast<int64_t>(delta / ns_per_tick);
  }
};

}  // namespace megascope::tracer::cupti
