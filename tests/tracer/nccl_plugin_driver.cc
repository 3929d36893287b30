// Plays NCCL for one rank against a profiler plugin: dlopens the .so, looks up its
// ncclProfiler_v<N> and calls it in the orders and from the threads NCCL does (NCCL 2.31,
// src/plugin/profiler.cc): init once per communicator; per op, the Coll/P2p startEvent and its
// stopEvent ("enqueued") on the user's thread, then on the communicator's proxy thread a
// KernelCh startEvent per channel, a ProxyOp with its ProxySteps (their state changes carrying the
// bytes moved), and each channel's KernelCh state KernelChStop and stopEvent.
//
// v7 (NCCL 2.31) adds, as NCCL issues them: every plan in a Group event; with `sym`, each
// collective step a symmetric plan of two all-reduces whose channels (and their KernelPhase
// sub-events: start, KernelPhaseStop, stop) report to the head op only, the other carrying
// nChannels 0; with `ras`, halfway through the ops NCCL's RAS rewrites the event mask the plugin's
// init set (kernel channels and proxy events off, the API events on, each with rank 0 in its
// descriptor as NCCL gives them, issue 2300): later ops have no child events.
//
// Usage: nccl_plugin_driver PLUGIN.so|- VERSION RANK WORLD OPS HUNG_RANK [hold] [sym] [ras]
//   (with CUDA_INJECTION64_PATH set, it first plays the CUDA driver loading that library)
//   OPS all-reduces complete on every rank (between them, rank 0 sends to rank 1 once); then
//   every rank but HUNG_RANK issues one more, whose kernels start and whose proxy steps wait on
//   the network forever, while HUNG_RANK never issues it. Prints "ready" and waits for stdin to
//   close (its ring must belong to a live process when it is read), or with `hold` until it is
//   signalled. "-" loads the plugin NCCL_PROFILER_PLUGIN names, as NCCL does.
#include <dlfcn.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <iostream>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>

#include "../../tracer/nccl/profiler_abi.h"

namespace {

using namespace megascope::nccl;

// The communicator's proxy thread: runs what the user's thread posts, in order.
class ProxyThread {
 public:
  ProxyThread() : t_([this] { Loop(); }) {}
  ~ProxyThread() {
    Post(nullptr);
    t_.join();
  }
  void Post(std::function<void()> f) {
    std::lock_guard<std::mutex> l(mu_);
    q_.push_back(std::move(f));
    cv_.notify_one();
  }
  void Drain() {  // waits until everything posted so far ran
    std::mutex m;
    std::condition_variable done;
    bool ran = false;
    Post([&] {
      std::lock_guard<std::mutex> l(m);
      ran = true;
      done.notify_one();
    });
    std::unique_lock<std::mutex> l(m);
    done.wait(l, [&] { return ran; });
  }

 private:
  void Loop() {
    for (;;) {
      std::function<void()> f;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return !q_.empty(); });
        f = std::move(q_.front());
        q_.pop_front();
      }
      if (!f) return;
      f();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> q_;
  std::thread t_;
};

constexpr int kChannels = 2;
constexpr size_t kCount = 1024;  // floats

// What NCCL's mask lets through now (`mask` is NCCL's variable: the plugin's init wrote it, RAS
// may rewrite it).
bool On(const int* mask, uint64_t type) { return (*mask & static_cast<int>(type)) != 0; }

// The device side of an op: every channel's kernel starts, the proxy moves the bytes in two steps
// (the first waits for the GPU, the second for the network), the kernels stop. `finish` false:
// the steps wait on the network and nothing stops. Only what `mask` lets through is issued.
template <typename Descr>
void DeviceSide(ProfilerApi<Descr>* api, void* ctx, int rank, void* op, bool send, bool finish,
                const int* mask) {
  if (!On(mask, kKernelCh)) return;  // no child event: the plugin sees the op issued, no more
  void* ch[kChannels] = {};
  for (int c = 0; c < kChannels; ++c) {
    Descr k{};
    k.type = kKernelCh;
    k.parentObj = op;
    k.rank = rank;
    k.kernelCh.channelId = static_cast<uint8_t>(c);
    api->startEvent(ctx, &ch[c], &k);
  }
  if constexpr (std::is_same_v<Descr, DescrV7>) {  // a symmetric kernel's barrier phases
    for (int c = 0; c < kChannels && finish && On(mask, kKernelPhase); ++c) {
      static const char* kPhases[] = {"initial_sync", "compute", "final_sync"};
      for (uint8_t ph = 0; ph < 3; ++ph) {
        Descr k{};
        k.type = kKernelPhase;
        k.parentObj = ch[c];
        k.rank = rank;
        k.kernelPhase.channelId = static_cast<uint8_t>(c);
        k.kernelPhase.phaseId = ph;
        k.kernelPhase.phaseName = kPhases[ph];
        k.kernelPhase.pTimer = 100u * ph;
        void* phase = nullptr;
        api->startEvent(ctx, &phase, &k);
        if (phase != nullptr) {
          StateArgs a{};
          a.kernelCh.pTimer = 100u * ph + 50;
          api->recordEventState(phase, kKernelPhaseStop, &a);
          api->stopEvent(phase);
        }
      }
    }
  }
  if (!On(mask, kProxyOp)) {
    for (int c = 0; c < kChannels && finish; ++c) {
      StateArgs a{};
      a.kernelCh.pTimer = 1000 + c;
      api->recordEventState(ch[c], kKernelChStop, &a);
      api->stopEvent(ch[c]);
    }
    return;
  }
  Descr p{};
  p.type = kProxyOp;
  p.parentObj = op;
  p.rank = rank;
  p.proxyOp.isSend = send ? 1 : 0;
  p.proxyOp.nSteps = 2;
  void* proxy_op = nullptr;
  api->startEvent(ctx, &proxy_op, &p);
  for (int s = 0; s < 2; ++s) {
    Descr st{};
    st.type = kProxyStep;
    st.parentObj = proxy_op;
    st.rank = rank;
    st.proxyStep.step = s;
    void* step = nullptr;
    api->startEvent(ctx, &step, &st);
    StateArgs a{};
    a.proxyStep.transSize = kCount * sizeof(float) / 2;
    api->recordEventState(step, send ? kProxyStepSendGpuWait : kProxyStepRecvWait, &a);
    if (!finish) {
      api->recordEventState(step, send ? kProxyStepSendWait : kProxyStepRecvWait, &a);
      return;  // stuck: the peer never arrives
    }
    api->recordEventState(step, send ? kProxyStepSendWait : kProxyStepRecvGpuWait, &a);
    api->stopEvent(step);
  }
  api->stopEvent(proxy_op);
  for (int c = 0; c < kChannels; ++c) {
    StateArgs a{};
    a.kernelCh.pTimer = 1000 + c;
    api->recordEventState(ch[c], kKernelChStop, &a);
    api->stopEvent(ch[c]);
  }
}

struct Flags {
  bool hold = false, sym = false, ras = false;
};

// NCCL's RAS rewriting the event mask while the job runs (ncclProfilerSetRasOverride): kernel
// channels and proxy events off, the API events on.
constexpr int kRasMask =
    static_cast<int>(kColl | kP2p | kGroupApi | kCollApi | kP2pApi | kKernelLaunch);

// An API event as NCCL issues it: rank 0 in its descriptor whatever the communicator's rank.
template <typename Descr>
void* StartApi(ProfilerApi<Descr>* api, void* ctx, uint64_t type, const char* func, bool coll,
               const int* mask) {
  void* h = nullptr;
  if (!On(mask, type)) return h;
  Descr d{};
  d.type = type;
  d.rank = 0;
  if (type == kCollApi || type == kP2pApi) {
    auto& a = coll ? d.collApi.func : d.p2pApi.func;
    a = func;
    (coll ? d.collApi.count : d.p2pApi.count) = kCount;
    (coll ? d.collApi.datatype : d.p2pApi.datatype) = "ncclFloat32";
    if constexpr (std::is_same_v<Descr, DescrV7>) (coll ? d.collApi.userTag : d.p2pApi.userTag) = 7;
  }
  api->startEvent(ctx, &h, &d);
  return h;
}

template <typename Descr>
int Drive(void* lib, const char* symbol, int rank, int world, int ops, int hung, Flags flags) {
  auto* api = static_cast<ProfilerApi<Descr>*>(dlsym(lib, symbol));
  if (api == nullptr) {
    std::fprintf(stderr, "no %s: %s\n", symbol, dlerror());
    return 2;
  }
  void* ctx = nullptr;
  int mask = 0;
  if (api->init(&ctx, 0x5eedULL, &mask, "world", 1, world, rank, nullptr) != kSuccess ||
      ctx == nullptr || (mask & kColl) == 0 || (mask & kKernelCh) == 0) {
    std::fprintf(stderr, "init refused: ctx %p mask %d\n", ctx, mask);
    return 3;
  }
  ProxyThread proxy;
  auto device = [&](void* op, bool send, bool finish) {
    proxy.Post([=, &mask] { DeviceSide<Descr>(api, ctx, rank, op, send, finish, &mask); });
  };
  constexpr bool v7 = std::is_same_v<Descr, DescrV7>;
  // A plan: its Group event (v7), then one all-reduce -- with `sym`, a symmetric plan of two whose
  // channels report to the first.
  auto collective = [&](bool finish) {
    void* api_group = StartApi(api, ctx, kGroupApi, nullptr, true, &mask);
    void* api_coll = StartApi(api, ctx, kCollApi, "AllReduce", true, &mask);
    void* group = nullptr;
    if (v7) {
      Descr g{};
      g.type = kGroup;
      g.rank = rank;
      api->startEvent(ctx, &group, &g);
    }
    void* head = nullptr;
    for (int k = 0; k < (flags.sym ? 2 : 1); ++k) {
      Descr d{};
      d.type = kColl;
      d.parentObj = api_coll;
      d.rank = rank;
      d.coll.func = "AllReduce";
      d.coll.datatype = "ncclFloat32";
      d.coll.count = kCount;
      d.coll.nChannels = k == 0 ? kChannels : 0;
      if constexpr (v7) {
        d.coll.parentGroup = group;
        d.coll.userTag = 7;
        if (flags.sym) {
          d.coll.isSymColl = true;
          d.coll.kernelVariant = "ARxLL_R";
          d.coll.algo = "LL_R";
          d.coll.proto = "";
        }
      }
      void* op = nullptr;
      api->startEvent(ctx, &op, &d);
      api->stopEvent(op);  // enqueued; the device runs it later
      if (k == 0) head = op;
    }
    void* launch = StartApi(api, ctx, kKernelLaunch, nullptr, true, &mask);
    device(head, true, finish);
    for (void* h : {launch, api_coll, api_group}) {
      if (h != nullptr) api->stopEvent(h);
    }
    if (group != nullptr) proxy.Post([=] { api->stopEvent(group); });  // after the plan ran
  };
  for (int i = 0; i < ops; ++i) {
    if (flags.ras && i == ops / 2) {
      proxy.Drain();
      mask = kRasMask;  // NCCL's RAS, out of band: what the plugin asked for is gone
    }
    collective(true);
    if (i == ops / 2 && world > 1 && rank <= 1) {  // rank 0 sends to rank 1 once
      void* api_p2p = StartApi(api, ctx, kP2pApi, rank == 0 ? "Send" : "Recv", false, &mask);
      Descr d{};
      d.type = kP2p;
      d.rank = rank;
      d.p2p.func = rank == 0 ? "Send" : "Recv";
      d.p2p.datatype = "ncclFloat32";
      d.p2p.count = kCount;
      d.p2p.peer = 1 - rank;
      d.p2p.nChannels = kChannels;
      void* op = nullptr;
      api->startEvent(ctx, &op, &d);
      api->stopEvent(op);
      device(op, rank == 0, true);
      if (api_p2p != nullptr) api->stopEvent(api_p2p);
    }
  }
  if (rank != hung) collective(false);
  proxy.Drain();
  std::cout << "ready" << std::endl;
  if (flags.hold) {
    for (;;) pause();  // until a signal ends it
  }
  std::string line;
  while (std::getline(std::cin, line)) {
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 7) {
    std::fprintf(stderr,
                 "usage: %s PLUGIN.so|- VERSION RANK WORLD OPS HUNG_RANK [hold] [sym] [ras]\n",
                 argv[0]);
    return 1;
  }
  const char* path = std::string(argv[1]) == "-" ? std::getenv("NCCL_PROFILER_PLUGIN") : argv[1];
  if (path == nullptr) {
    std::fprintf(stderr, "NCCL_PROFILER_PLUGIN is not set\n");
    return 2;
  }
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    std::fprintf(stderr, "dlopen: %s\n", dlerror());
    return 2;
  }
  // As the CUDA driver loads the injection library CUDA_INJECTION64_PATH names (megascope's: the
  // same file under its other name) and calls it at cuInit: the process must still have one
  // library, so one ring.
  if (const char* inject = std::getenv("CUDA_INJECTION64_PATH")) {
    void* injected = dlopen(inject, RTLD_NOW | RTLD_LOCAL);
    if (injected == nullptr) {
      std::fprintf(stderr, "dlopen: %s\n", dlerror());
      return 2;
    }
    if (injected != lib) {
      std::fprintf(stderr, "%s is loaded apart from %s\n", inject, path);
      return 3;
    }
    auto* init = reinterpret_cast<int (*)()>(dlsym(injected, "InitializeInjection"));
    if (init == nullptr || init() != 1) {
      std::fprintf(stderr, "InitializeInjection missing or failed\n");
      return 3;
    }
    std::fprintf(stderr, "cuda injection: the profiler plugin's own object\n");
  }
  const int version = std::atoi(argv[2]), rank = std::atoi(argv[3]), world = std::atoi(argv[4]),
            ops = std::atoi(argv[5]), hung = std::atoi(argv[6]);
  Flags flags;
  for (int i = 7; i < argc; ++i) {
    const std::string f = argv[i];
    flags.hold |= f == "hold";
    flags.sym |= f == "sym";
    flags.ras |= f == "ras";
  }
  if (version == 7) return Drive<DescrV7>(lib, "ncclProfiler_v7", rank, world, ops, hung, flags);
  if (version == 6) return Drive<DescrV6>(lib, "ncclProfiler_v6", rank, world, ops, hung, flags);
  return Drive<DescrV5>(lib, "ncclProfiler_v5", rank, world, ops, hung, flags);
}
