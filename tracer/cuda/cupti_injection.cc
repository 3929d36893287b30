// The CUDA driver's injection entry point: CUDA_INJECTION64_PATH names this library (megascope wrap
// sets it to libmegascope-cupti.so, the same file NCCL loads as its profiler plugin), and the
// driver calls InitializeInjection during cuInit. From then on CUPTI's activity records of kernels,
// copies and memsets, and the runtime's synchronising calls, become device spans in the process's
// ring (process_recorder.h), with the correlation id of the runtime call that launched each: the
// node's agent stores them in trace.db (`spans`, `device_spans`) and the timeline draws them.
//
// CUPTI is loaded at run time, never linked: the one the process already has (a PyTorch wheel's)
// first, else MEGASCOPE_CUPTI_LIB, else the toolkit's. A process without CUPTI, or with one older
// than the API these records are read as (CUPTI 13), runs untraced and says why on stderr once;
// nothing here ever makes the job fail. MEGASCOPE_CUPTI=0 turns it off.
//
// Records arrive in 4 MiB buffers CUPTI fills and returns from its own thread (flushed every
// second, and forced at exit); synchronising calls are timed by CUPTI's callbacks on the calling
// thread (or, when another tool holds CUPTI's one subscriber, read from its runtime records).
#include <cupti_activity.h>
#include <cupti_callbacks.h>
#include <cupti_result.h>
#include <cupti_runtime_cbid.h>
#include <cupti_version.h>
#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_map>

#include "../nccl/process_recorder.h"
#include "cupti_spans.h"

namespace megascope::tracer::cupti {
namespace {

constexpr size_t kBufferBytes = size_t{4} << 20;
constexpr uint32_t kMinApi = 130000;  // CUpti_ActivityKernel10 and friends: CUPTI 13

// CUPTI's entry points, looked up in the library found at run time.
struct Api {
  decltype(&::cuptiGetVersion) get_version = nullptr;
  decltype(&::cuptiGetResultString) result_string = nullptr;
  decltype(&::cuptiGetTimestamp) get_timestamp = nullptr;
  decltype(&::cuptiActivityRegisterCallbacks) register_callbacks = nullptr;
  decltype(&::cuptiActivityEnable) enable = nullptr;
  decltype(&::cuptiActivityGetNextRecord) next_record = nullptr;
  decltype(&::cuptiActivityFlushAll) flush_all = nullptr;
  decltype(&::cuptiActivityFlushPeriod) flush_period = nullptr;
  decltype(&::cuptiActivityGetNumDroppedRecords) dropped = nullptr;
  decltype(&::cuptiSubscribe) subscribe = nullptr;
  decltype(&::cuptiEnableCallback) enable_callback = nullptr;
};

// The process's CUPTI client: made once, never destroyed (CUPTI calls back until exit).
struct Client {
  Api api;
  std::once_flag claimed;
  Tracer* tracer = nullptr;  // set by Claim
  std::mutex names_mu;
  std::unordered_map<std::string, NameId> names;  // guarded by names_mu
  NameId fallback[4] = {};                        // by kind, when the name table is full
  std::atomic<uint64_t> records{0}, dropped{0};
};

Client* TheClient() {
  static Client* c = new Client;
  return c;
}

// The libcupti to use and why not, if none.
void* OpenCupti(std::string* why) {
  const std::string named = inproc::Env("MEGASCOPE_CUPTI_LIB");
  if (!named.empty()) {
    void* h = ::dlopen(named.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) *why = "MEGASCOPE_CUPTI_LIB=" + named + ": " + ::dlerror();
    return h;
  }
  const char* sonames[] = {"libcupti.so.13", "libcupti.so.12", "libcupti.so"};
  for (const char* so : sonames) {  // the process's own first: one CUPTI per process
    if (void* h = ::dlopen(so, RTLD_NOW | RTLD_NOLOAD)) return h;
  }
  const std::string home = inproc::Env("CUDA_HOME", "/usr/local/cuda");
  const std::string paths[] = {"libcupti.so.13", "libcupti.so", home + "/lib64/libcupti.so",
                               home + "/extras/CUPTI/lib64/libcupti.so"};
  for (const std::string& p : paths) {
    if (void* h = ::dlopen(p.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
  }
  *why = "no libcupti found (set MEGASCOPE_CUPTI_LIB): " + std::string(::dlerror());
  return nullptr;
}

template <typename F>
bool Find(void* lib, const char* name, F* out) {
  *out = reinterpret_cast<F>(::dlsym(lib, name));
  return *out != nullptr;
}

bool LoadApi(void* lib, Api* a) {
  return Find(lib, "cuptiGetVersion", &a->get_version) &&
         Find(lib, "cuptiGetResultString", &a->result_string) &&
         Find(lib, "cuptiGetTimestamp", &a->get_timestamp) &&
         Find(lib, "cuptiActivityRegisterCallbacks", &a->register_callbacks) &&
         Find(lib, "cuptiActivityEnable", &a->enable) &&
         Find(lib, "cuptiActivityGetNextRecord", &a->next_record) &&
         Find(lib, "cuptiActivityFlushAll", &a->flush_all) &&
         Find(lib, "cuptiActivityFlushPeriod", &a->flush_period) &&
         Find(lib, "cuptiActivityGetNumDroppedRecords", &a->dropped) &&
         Find(lib, "cuptiSubscribe", &a->subscribe) &&
         Find(lib, "cuptiEnableCallback", &a->enable_callback);
}

std::string Describe(const Api& a, CUptiResult r) {
  const char* s = nullptr;
  if (a.result_string == nullptr || a.result_string(r, &s) != CUPTI_SUCCESS || s == nullptr)
    return "CUPTI error " + std::to_string(static_cast<int>(r));
  return s;
}

// The process's ring, claimed at the first span this process has to record, not when CUDA starts:
// every process of the job inherits CUDA_INJECTION64_PATH, and one that starts CUDA without
// running a kernel (torchrun's own process, seen on a GPU machine with PyTorch 2.11: it holds no
// rank variable, so it took rank 0's ring before rank 0 could) must not take a rank's ring.
// Null (said once) when the ring cannot be had.
Tracer* Claim(Client* c) {
  std::call_once(c->claimed, [c] {
    const inproc::Process& proc = inproc::TheProcess();
    if (proc.tracer == nullptr) {
      std::fprintf(stderr, "megascope cupti: device spans off: no ring: %s\n", proc.error.c_str());
      return;
    }
    const char* fallback[4] = {"kernel", "memcpy", "memset", "sync"};
    for (size_t k = 0; k < 4; ++k) {
      auto id = proc.tracer->InternName(fallback[k]);
      if (id.ok()) c->fallback[k] = *id;
    }
    c->tracer = proc.tracer;
  });
  return c->tracer;
}

NameId Intern(Client* c, SpanKind kind, const std::string& name) {
  std::lock_guard<std::mutex> lock(c->names_mu);
  if (auto it = c->names.find(name); it != c->names.end()) return it->second;
  auto id = c->tracer->InternName(name);
  const size_t k = static_cast<size_t>(kind) - static_cast<size_t>(SpanKind::kKernel);
  if (!id.ok()) return k < 4 ? c->fallback[k] : NameId{};
  c->names.emplace(name, *id);
  return *id;
}

TimeMap Now(Client* c) {
  TimeMap m;
  (void)c->api.get_timestamp(&m.cupti_ns);
  m.ticks = c->tracer->Ticks();
  m.ns_per_tick = c->tracer->clock().Calibration().ns_per_tick;
  return m;
}

void CUPTIAPI BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI BufferCompleted(CUcontext context, uint32_t stream, uint8_t* buffer, size_t /*size*/,
                              size_t valid) {
  Client* c = TheClient();
  CUpti_Activity* record = nullptr;
  bool any = false;  // a span to record: only then is the ring claimed
  while (!any && c->api.next_record(buffer, valid, &record) == CUPTI_SUCCESS)
    any = ToDeviceSpan(record).has_value();
  if (!any || Claim(c) == nullptr) {
    std::free(buffer);
    return;
  }
  const TimeMap map = Now(c);
  const int64_t step = c->tracer->step();
  record = nullptr;  // from the first record again
  while (c->api.next_record(buffer, valid, &record) == CUPTI_SUCCESS) {
    const auto span = ToDeviceSpan(record);
    if (!span) continue;
    c->tracer->RecordDeviceSpan(span->kind, Intern(c, span->kind, span->name), step,
                                map.ToTicks(span->start_ns), map.ToTicks(span->end_ns),
                                {span->correlation, span->device, span->stream, span->bytes});
    c->records.fetch_add(1, std::memory_order_relaxed);
  }
  size_t dropped = 0;
  if (c->api.dropped(context, stream, &dropped) == CUPTI_SUCCESS && dropped > 0)
    c->dropped.fetch_add(dropped, std::memory_order_relaxed);
  std::free(buffer);
}

// A synchronising runtime call, timed on its own thread: entry keeps the start in CUPTI's
// per-call slot, exit records the span.
void CUPTIAPI OnRuntimeCall(void* /*userdata*/, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                            const void* data) {
  if (domain != CUPTI_CB_DOMAIN_RUNTIME_API || data == nullptr) return;
  const char* name = SyncCallName(cbid);
  if (name == nullptr) return;
  const auto* call = static_cast<const CUpti_CallbackData*>(data);
  Client* c = TheClient();
  if (Claim(c) == nullptr) return;
  if (call->callbackSite == CUPTI_API_ENTER) {
    *call->correlationData = static_cast<uint64_t>(c->tracer->Ticks());
    return;
  }
  c->tracer->RecordDeviceSpan(SpanKind::kSync, Intern(c, SpanKind::kSync, name), c->tracer->step(),
                              static_cast<int64_t>(*call->correlationData), c->tracer->Ticks(),
                              {call->correlationId, 0, 0, 0});
}

void FlushAtExit() {
  Client* c = TheClient();
  (void)c->api.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  if (const uint64_t d = c->dropped.load(); d > 0)
    std::fprintf(stderr, "megascope cupti: CUPTI dropped %llu activity records\n",
                 static_cast<unsigned long long>(d));
}

// Starts CUPTI's activity collection into the process's ring; "" or why it could not.
std::string Start() {
  if (inproc::Env("MEGASCOPE_CUPTI") == "0") return "";
  std::string why;
  void* lib = OpenCupti(&why);
  if (lib == nullptr) return why;
  Client* c = TheClient();
  if (!LoadApi(lib, &c->api)) return "the libcupti found lacks an entry point of CUPTI 13";
  uint32_t version = 0;
  if (c->api.get_version(&version) != CUPTI_SUCCESS || version < kMinApi)
    return "CUPTI API version " + std::to_string(version) + " is older than " +
           std::to_string(kMinApi) + " (CUPTI 13), whose records this library reads";
  CUptiResult r = c->api.register_callbacks(BufferRequested, BufferCompleted);
  if (r != CUPTI_SUCCESS) return "cuptiActivityRegisterCallbacks: " + Describe(c->api, r);
  for (CUpti_ActivityKind kind : {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                  CUPTI_ACTIVITY_KIND_MEMSET}) {
    r = c->api.enable(kind);
    if (r != CUPTI_SUCCESS)
      return "cuptiActivityEnable(" + std::to_string(static_cast<int>(kind)) +
             "): " + Describe(c->api, r);
  }
  // Synchronising calls: by callback, only those; else (CUPTI's one subscriber is taken) from
  // every runtime call's record.
  CUpti_SubscriberHandle subscriber = nullptr;
  bool timed = c->api.subscribe(&subscriber, OnRuntimeCall, nullptr) == CUPTI_SUCCESS;
  for (CUpti_CallbackId cbid : {CUPTI_RUNTIME_TRACE_CBID_cudaDeviceSynchronize_v3020,
                                CUPTI_RUNTIME_TRACE_CBID_cudaStreamSynchronize_v3020,
                                CUPTI_RUNTIME_TRACE_CBID_cudaStreamSynchronize_ptsz_v7000,
                                CUPTI_RUNTIME_TRACE_CBID_cudaEventSynchronize_v3020}) {
    timed = timed && c->api.enable_callback(1, subscriber, CUPTI_CB_DOMAIN_RUNTIME_API, cbid) ==
                         CUPTI_SUCCESS;
  }
  if (!timed) (void)c->api.enable(CUPTI_ACTIVITY_KIND_RUNTIME);
  (void)c->api.flush_period(1000);
  std::atexit(FlushAtExit);
  return "";
}

}  // namespace
}  // namespace megascope::tracer::cupti

// Called by the CUDA driver once, during cuInit. Always succeeds: tracing that cannot start says
// why and leaves the job alone.
extern "C" __attribute__((visibility("default"))) int InitializeInjection(void) {
  static const std::string why = megascope::tracer::cupti::Start();
  if (!why.empty()) std::fprintf(stderr, "megascope cupti: device spans off: %s\n", why.c_str());
  return 1;
}
