#include "megascope/tracer/records.h"

#include <array>

#include "megascope/tracer/enum_names.h"

namespace megascope::tracer {
namespace {

constexpr std::array<std::string_view, 12> kSpanKinds = {
    "forward", "backward", "optimizer", "data",   "checkpoint", "comm",
    "compute", "other",    "kernel",    "memcpy", "memset",     "sync"};
constexpr std::array<std::string_view, 9> kOps = {"allreduce", "reduce_scatter", "allgather",
                                                  "broadcast", "reduce",         "barrier",
                                                  "alltoall",  "send",           "recv"};
constexpr std::array<std::string_view, 4> kStates = {"enqueued", "started", "completed", "failed"};
constexpr std::array<std::string_view, 8> kDTypes = {"f32", "f16", "bf16", "f64",
                                                     "i32", "i64", "u8",   "u16"};
constexpr std::array<size_t, 8> kDTypeSizes = {4, 2, 2, 8, 4, 8, 1, 2};
constexpr std::array<std::string_view, 3> kWaitSides = {"", "gpu", "network"};
constexpr std::array<std::string_view, 8> kPhases = {
    "init", "data", "forward", "backward", "optimizer", "checkpoint", "idle", "done"};

}  // namespace

std::string_view Name(SpanKind k) { return NameFrom(kSpanKinds, k); }
std::string_view Name(OpType o) { return NameFrom(kOps, o); }
std::string_view Name(OpState s) { return NameFrom(kStates, s); }
std::string_view Name(DType d) { return NameFrom(kDTypes, d); }
std::string_view Name(Phase p) { return NameFrom(kPhases, p); }
std::string_view Name(WaitSide w) { return NameFrom(kWaitSides, w); }
std::optional<WaitSide> ParseWaitSide(std::string_view s) {
  return ParseFrom<WaitSide>(kWaitSides, s);  // "": kNone
}
std::optional<SpanKind> ParseSpanKind(std::string_view s) {
  return ParseFrom<SpanKind>(kSpanKinds, s);
}
std::optional<OpType> ParseOpType(std::string_view s) { return ParseFrom<OpType>(kOps, s); }
std::optional<OpState> ParseOpState(std::string_view s) { return ParseFrom<OpState>(kStates, s); }
std::optional<DType> ParseDType(std::string_view s) { return ParseFrom<DType>(kDTypes, s); }
std::optional<Phase> ParsePhase(std::string_view s) { return ParseFrom<Phase>(kPhases, s); }
size_t DTypeSize(DType d) {
  auto i = static_cast<size_t>(d);
  return i < kDTypeSizes.size() ? kDTypeSizes[i] : 0;
}

}  // namespace megascope::tracer
