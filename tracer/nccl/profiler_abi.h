// NCCL's profiler-plugin ABI, versions 5 and 6, declared here (NCCL does not install its headers):
// the layouts follow NCCL's published plugin headers (plugins/profiler/example/nccl/profiler*.h,
// NCCL 2.30), field for field, since NCCL hands the plugin pointers to these. Version 6 (NCCL 2.29)
// adds copy-engine collectives to v5's descriptor union; the state arguments are v5's.
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
  kCeColl = 1 << 12,   // v6
  kCeSync = 1 << 13,   // v6
  kCeBatch = 1 << 14,  // v6
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

// The layouts NCCL's headers give on x86-64.
static_assert(offsetof(DescrV5, coll) == 24 && sizeof(DescrV5::coll) == 88);
static_assert(offsetof(DescrV5, p2p) == 24);
static_assert(offsetof(DescrV6, coll) == 24 && offsetof(DescrV6, ceColl) == 24);
static_assert(sizeof(DescrV6::ceColl) == 88 && sizeof(DescrV6) == sizeof(DescrV5));

}  // namespace megascope::nccl
