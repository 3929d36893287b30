#include "cupti_spans.h"

#include <cupti_runtime_cbid.h>
#include <cxxabi.h>

#include <cstdlib>
#include <cstring>
#include <memory>

namespace megascope::tracer::cupti {
namespace {

constexpr size_t kMaxName = 160;

std::string Demangled(const char* name) {
  if (name == nullptr) return "kernel";
  int status = 0;
  std::unique_ptr<char, decltype(&std::free)> d(
      abi::__cxa_demangle(name, nullptr, nullptr, &status), &std::free);
  std::string out = status == 0 && d ? d.get() : name;
  if (out.size() > kMaxName) out = out.substr(0, kMaxName - 3) + "...";
  return out;
}

const char* CopyName(uint8_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD:
      return "memcpy HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH:
      return "memcpy DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD:
      return "memcpy DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH:
      return "memcpy HtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP:
      return "memcpy PtoP";
    default:
      return "memcpy";
  }
}

}  // namespace

// The runtime calls that block the host until the device is done: where a rank that waits for its
// GPU shows it.
const char* SyncCallName(CUpti_CallbackId cbid) {
  switch (cbid) {
    case CUPTI_RUNTIME_TRACE_CBID_cudaDeviceSynchronize_v3020:
      return "cudaDeviceSynchronize";
    case CUPTI_RUNTIME_TRACE_CBID_cudaStreamSynchronize_v3020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaStreamSynchronize_ptsz_v7000:
      return "cudaStreamSynchronize";
    case CUPTI_RUNTIME_TRACE_CBID_cudaEventSynchronize_v3020:
      return "cudaEventSynchronize";
    default:
      return nullptr;
  }
}

namespace {

// A record of CUPTI's buffer as the struct its kind says, copied out (no type-punned reads).
template <typename T>
T As(const CUpti_Activity* record) {
  T out;
  std::memcpy(&out, record, sizeof(out));
  return out;
}

}  // namespace

std::optional<DeviceSpan> ToDeviceSpan(const CUpti_Activity* record) {
  if (record == nullptr) return std::nullopt;
  CUpti_ActivityKind kind;
  std::memcpy(&kind, record, sizeof(kind));  // every record starts with its kind
  DeviceSpan s;
  switch (kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
      const auto k = As<CUpti_ActivityKernel10>(record);
      s = {SpanKind::kKernel, Demangled(k.name), k.start,    k.end,
           k.correlationId,   k.deviceId,        k.streamId, 0};
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
      const auto m = As<CUpti_ActivityMemcpy6>(record);
      s = {SpanKind::kMemcpy, CopyName(m.copyKind), m.start,    m.end,
           m.correlationId,   m.deviceId,           m.streamId, m.bytes};
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
      const auto m = As<CUpti_ActivityMemset4>(record);
      s = {SpanKind::kMemset, "memset",   m.start,    m.end,
           m.correlationId,   m.deviceId, m.streamId, m.bytes};
      break;
    }
    case CUPTI_ACTIVITY_KIND_RUNTIME: {
      const auto a = As<CUpti_ActivityAPI>(record);
      const char* name = SyncCallName(a.cbid);
      if (name == nullptr) return std::nullopt;
      s = {SpanKind::kSync, name, a.start, a.end, a.correlationId, 0, 0, 0};
      break;
    }
    default:
      return std::nullopt;
  }
  if (s.end_ns < s.start_ns) return std::nullopt;  // CUPTI writes 0 for a time it could not take
  return s;
}

}  // namespace megascope::tracer::cupti
