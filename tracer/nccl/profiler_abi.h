// NCCL's profiler-plugin ABI, versions 5, 6 and 7, declared here (NCCL does not install its
// headers): the layouts follow NCCL's published plugin headers (plugins/profiler/example/nccl/
// profiler*.h, NCCL 2.31), field for field, since NCCL hands the plugin pointers to these.
// Version 6 (NCCL 2.29) adds copy-engine collectives to v5's descriptor union; the state
// arguments are v5's. Version 7 (NCCL 2.31) adds a per-call user tag (userTag) to the API, Coll,
// P2p and CeColl descriptors, the kernel variant and whether it is a symmetric-memory collective
// to Coll, and the KernelPhase sub-event of a kernel channel (its stop: state KernelPhaseStop,
// its time in the kernelCh state arguments).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>

namespace megascope::nccl {

// ncclResult_t: every callback but init must return success (0).
enum Result : int { kSuccess = 0, kInternalError = 3 };

// ncclDebugLogger_t; the level and subsystem enums are ints on the ABI.
using Logger = void (*)(int level, unsigned long flags, const char* file, int line, const char* fmt,
                        ...);

// Event type bits: the descriptor's `type` and the activation mask.
enum EventType : uint64_t {
  kGroup = 1 << 0,
  kColl = 1 << 1,
  kP2p = 1 << 2,
  kProxyOp = 1 << 3,
  kProxyStep = 1 << 4,
  kProxyCtrl = 1 << 5,
  kKernelCh = 1 << 6,
  kNetPlugin = 1 << 7,
  kGroupApi = 1 << 8,
  kCollApi = 1 << 9,
  kP2pApi = 1 << 10,
  kKernelLaunch = 1 << 11,
  kCeColl = 1 << 12,       // v6
  kCeSync = 1 << 13,       // v6
  kCeBatch = 1 << 14,      // v6
  kKernelPhase = 1 << 15,  // v7: gated on kKernelCh (NCCL turns that on with it)
};

// ncclProfilerEventState_t values the plugin reads.
enum State : int {
  kProxyOpInProgress = 19,
  kProxyStepSendGpuWait = 8,
  kProxyStepSendPeerWait = 20,
  kProxyStepSendWait = 9,
  kProxyStepRecvWait = 10,
  kProxyStepRecvFlushWait = 11,
  kProxyStepRecvGpuWait = 12,
  kKernelChStop = 22,
  kKernelPhaseStop = 31,  // v7
};

struct DescrV5 {
  uint64_t type;
  void* parentObj;
  int rank;
  union {
    struct {
      bool graphCaptured;
      int groupDepth;
    } groupApi;
    struct {
      const char* func;
      size_t count;
      const char* datatype;
      int root;
      void* stream;
      bool graphCaptured;
    } collApi;
    struct {
      const char* func;
      size_t count;
      const char* datatype;
      void* stream;
      bool graphCaptured;
    } p2pApi;
    struct {
      void* stream;
    } kernelLaunch;
    struct {
      uint64_t seqNumber;  // per communicator and collective type
      const char* func;
      const void* sendBuff;
      void* recvBuff;
      size_t count;
      int root;
      const char* datatype;
      uint8_t nChannels;
      uint8_t nWarps;
      const char* algo;
      const char* proto;
      void* parentGroup;
    } coll;
    struct {
      const char* func;
      void* buff;
      const char* datatype;
      size_t count;
      int peer;  // rank in the communicator
      uint8_t nChannels;
      void* parentGroup;
    } p2p;
    struct {
      pid_t pid;
      uint8_t channelId;
      int peer;
      int nSteps;
      int chunkSize;
      int isSend;
    } proxyOp;
    struct {
      int step;
    } proxyStep;
    struct {
      uint8_t channelId;
      uint64_t pTimer;
    } kernelCh;
    struct {
      int64_t id;
      void* data;
    } netPlugin;
  };
};

// v5's union plus the copy-engine descriptors.
struct DescrV6 {
  uint64_t type;
  void* parentObj;
  int rank;
  union {
    decltype(DescrV5::groupApi) groupApi;
    decltype(DescrV5::collApi) collApi;
    decltype(DescrV5::p2pApi) p2pApi;
    decltype(DescrV5::kernelLaunch) kernelLaunch;
    decltype(DescrV5::coll) coll;
    decltype(DescrV5::p2p) p2p;
    decltype(DescrV5::proxyOp) proxyOp;
    decltype(DescrV5::proxyStep) proxyStep;
    decltype(DescrV5::kernelCh) kernelCh;
    decltype(DescrV5::netPlugin) netPlugin;
    struct {
      uint64_t seqNumber;
      const char* func;
      const void* sendBuff;
      void* recvBuff;
      size_t count;
      int root;
      const char* datatype;
      const char* syncStrategy;
      bool intraBatchSync;
      uint32_t batchSize;
      uint32_t numBatches;
      uint32_t ceSeqNum;
      void* stream;
    } ceColl;
    struct {
      bool isComplete;
      int nRanks;
    } ceCollSync;
    struct {
      int numOps;
      size_t totalBytes;
      bool useIntraSync;
    } ceCollBatch;
  };
};

// v6's union with v7's tags, kernel variant and KernelPhase (NCCL 2.31's profiler_v7.h).
struct DescrV7 {
  uint64_t type;
  void* parentObj;
  int rank;  // Coll's is the communicator's rank; API events' is 0 (NCCL issue 2300): unused here
  union {
    decltype(DescrV5::groupApi) groupApi;
    struct {
      const char* func;
      size_t count;
      const char* datatype;
      int root;
      void* stream;
      bool graphCaptured;
      uint64_t userTag;  // 0: untagged
    } collApi;
    struct {
      const char* func;
      size_t count;
      const char* datatype;
      void* stream;
      bool graphCaptured;
      uint64_t userTag;
    } p2pApi;
    decltype(DescrV5::kernelLaunch) kernelLaunch;
    struct {
      uint64_t seqNumber;
      const char* func;
      const void* sendBuff;
      void* recvBuff;
      size_t count;
      int root;
      const char* datatype;
      uint8_t nChannels;  // a symmetric plan's: on its head op only, 0 on the others
      uint8_t nWarps;
      const char* algo;
      const char* proto;
      void* parentGroup;
      const char* kernelVariant;  // a symmetric kernel's ("AGxLL_R"), else null
      bool isSymColl;
      uint64_t userTag;
    } coll;
    struct {
      const char* func;
      void* buff;
      const char* datatype;
      size_t count;
      int peer;
      uint8_t nChannels;
      void* parentGroup;
      uint64_t userTag;
    } p2p;
    decltype(DescrV5::proxyOp) proxyOp;
    decltype(DescrV5::proxyStep) proxyStep;
    decltype(DescrV5::kernelCh) kernelCh;
    decltype(DescrV5::netPlugin) netPlugin;
    struct {
      uint64_t seqNumber;
      const char* func;
      const void* sendBuff;
      void* recvBuff;
      size_t count;
      int root;
      const char* datatype;
      const char* syncStrategy;
      bool intraBatchSync;
      uint32_t batchSize;
      uint32_t numBatches;
      uint32_t ceSeqNum;
      void* stream;
      uint64_t userTag;
    } ceColl;
    decltype(DescrV6::ceCollSync) ceCollSync;
    decltype(DescrV6::ceCollBatch) ceCollBatch;
    struct {
      uint8_t channelId;
      uint8_t phaseId;  // 0 initial_sync, 1 compute, 2 final_sync
      const char* phaseName;
      uint64_t pTimer;  // start (GPU globaltimer)
    } kernelPhase;
  };
};

union StateArgs {
  struct {
    size_t transSize;
  } proxyStep;
  struct {
    int appendedProxyOps;
  } proxyCtrl;
  struct {
    void* data;
  } netPlugin;
  struct {
    uint64_t pTimer;
  } kernelCh;
};

template <typename Descr>
struct ProfilerApi {
  const char* name;
  int (*init)(void** context, uint64_t comm_id, int* activation_mask, const char* comm_name,
              int n_nodes, int n_ranks, int rank, Logger log);
  int (*startEvent)(void* context, void** handle, Descr* descr);
  int (*stopEvent)(void* handle);
  int (*recordEventState)(void* handle, int state, StateArgs* args);
  int (*finalize)(void* context);
};
using ProfilerV5 = ProfilerApi<DescrV5>;
using ProfilerV6 = ProfilerApi<DescrV6>;
using ProfilerV7 = ProfilerApi<DescrV7>;

// The layouts NCCL's headers give on x86-64.
static_assert(offsetof(DescrV5, coll) == 24 && sizeof(DescrV5::coll) == 88);
static_assert(offsetof(DescrV5, p2p) == 24);
static_assert(offsetof(DescrV6, coll) == 24 && offsetof(DescrV6, ceColl) == 24);
static_assert(sizeof(DescrV6::ceColl) == 88 && sizeof(DescrV6) == sizeof(DescrV5));
static_assert(offsetof(DescrV7, coll) == 24 && sizeof(DescrV7::coll) == 112);
static_assert(offsetof(DescrV7, coll.parentGroup) == offsetof(DescrV5, coll.parentGroup));
static_assert(sizeof(DescrV7::p2p) == 56 && sizeof(DescrV7::ceColl) == 96);
static_assert(sizeof(DescrV7::kernelPhase) == 24 && sizeof(DescrV7) == 24 + 112);

}  // namespace megascope::nccl
