// The tracer's vocabulary: span kinds, collective ops, op states, dtypes, heartbeat phases, and
// the fixed-size (64-byte) records that travel through a rank's ring. Record layout version
// kRecordVersion is stored in every ring header; a reader refuses rings of another version.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace megascope::tracer {

inline constexpr uint32_t kRecordVersion = 1;
inline constexpr size_t kRecordSize = 64;

enum class SpanKind : uint8_t {
  kForward = 0,
  kBackward,
  kOptimizer,
  kData,
  kCheckpoint,
  kComm,
  kCompute,
  kOther,
  // On a device, from CUPTI: a kernel, a copy, a memset; and a runtime call that waits for the
  // device (cudaStreamSynchronize, ...).
  kKernel,
  kMemcpy,
  kMemset,
  kSync,
};
enum class OpType : uint8_t {
  kAllreduce = 0,
  kReduceScatter,
  kAllgather,
  kBroadcast,
  kReduce,
  kBarrier,
  kAlltoall,
  kSend,
  kRecv,
  kUnknown = 255,  // read from a dump written by a newer version; never written by this one
};
enum class OpState : uint8_t { kEnqueued = 0, kStarted, kCompleted, kFailed, kUnknown = 255 };
enum class DType : uint8_t { kF32 = 0, kF16, kBf16, kF64, kI32, kI64, kU8, kU16, kUnknown = 255 };
// Where an open op's data waits, when the backend can tell (NCCL's proxy steps): on the rank's own
// device (GPU side) or on its peer and the network. kNone: not known.
enum class WaitSide : uint8_t { kNone = 0, kGpu, kNetwork, kUnknown = 255 };
enum class Phase : uint8_t {
  kInit = 0,
  kData,
  kForward,
  kBackward,
  kOptimizer,
  kCheckpoint,
  kIdle,
  kDone,
  kUnknown = 255,
};

// Names exactly as docs/formats.md spells them.
std::string_view Name(SpanKind k);
std::string_view Name(OpType o);
std::string_view Name(OpState s);
std::string_view Name(DType d);
std::string_view Name(Phase p);
std::string_view Name(WaitSide w);  // "" for kNone
std::optional<SpanKind> ParseSpanKind(std::string_view s);
std::optional<OpType> ParseOpType(std::string_view s);
std::optional<OpState> ParseOpState(std::string_view s);
std::optional<DType> ParseDType(std::string_view s);
std::optional<Phase> ParsePhase(std::string_view s);
std::optional<WaitSide> ParseWaitSide(std::string_view s);
inline bool IsP2P(OpType o) { return o == OpType::kSend || o == OpType::kRecv; }
size_t DTypeSize(DType d);

enum class RecordType : uint8_t {
  kEmpty = 0,
  kSpan = 1,
  kCollective = 2,
  kHeartbeat = 3,
  kMetric = 4
};

// Times in records are raw clock ticks; RingReader converts them with the ring's calibration.
struct SpanRecord {
  RecordType type;  // kSpan
  SpanKind kind;
  uint16_t name;       // interned name id (Tracer::InternName)
  int32_t microbatch;  // -1 when not per microbatch
  int64_t step;
  int64_t start_ticks;
  int64_t end_ticks;
  // A device span's (kind kernel, memcpy, memset, sync; Tracer::RecordDeviceSpan): where it ran
  // and the correlation id of the runtime call that launched it. Not written for other kinds:
  // read them only for a device kind.
  uint32_t correlation;
  uint32_t device;
  uint32_t stream;
  uint32_t reserved0;
  uint64_t bytes;  // a copy's or memset's
  uint8_t reserved[8];
};

// Whether spans of `kind` carry SpanRecord's device fields.
constexpr bool IsDeviceSpan(SpanKind kind) {
  return kind == SpanKind::kKernel || kind == SpanKind::kMemcpy || kind == SpanKind::kMemset ||
         kind == SpanKind::kSync;
}

// Written once per op, when it reaches completed or failed.
struct CollectiveRecord {
  RecordType type;  // kCollective
  OpType op;
  OpState state;
  DType dtype;
  uint16_t group;  // index into the rank's group table
  uint16_t reserved0;
  int32_t peer;  // -1 for collectives
  int32_t step;  // the rank's step (Tracer::SetPhase) when the op finished
  uint64_t seq;
  uint64_t bytes;
  int64_t enqueued_ticks;
  int64_t started_ticks;    // 0 if never started
  int64_t completed_ticks;  // completion or failure time
  uint64_t entry_id;        // flight-recorder id (1-based issue index on this rank)
};

struct HeartbeatRecord {
  RecordType type;  // kHeartbeat
  Phase phase;
  uint8_t reserved0[6];
  int64_t step;
  int64_t ticks;
  uint8_t reserved1[40];
};

struct MetricRecord {
  RecordType type;  // kMetric
  uint8_t reserved0;
  uint16_t name;  // interned name id
  uint32_t reserved1;
  int64_t ticks;
  double value;
  uint8_t reserved2[40];
};

union Record {
  RecordType type;
  SpanRecord span;
  CollectiveRecord collective;
  HeartbeatRecord heartbeat;
  MetricRecord metric;
};
static_assert(sizeof(SpanRecord) == kRecordSize);
static_assert(sizeof(CollectiveRecord) == kRecordSize);
static_assert(sizeof(HeartbeatRecord) == kRecordSize);
static_assert(sizeof(MetricRecord) == kRecordSize);
static_assert(sizeof(Record) == kRecordSize);

// Position of a rank in the 3D grid.
struct Coords {
  int32_t dp = 0, pp = 0, tp = 0;
};

}  // namespace megascope::tracer
