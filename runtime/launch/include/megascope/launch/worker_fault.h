// A fault a rank injects into itself (launch --inject, or train --fault): what the controller
// plans for an attempt and the worker reads back from run.json. One struct for both floors.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

#include "megascope/tracer/enum_names.h"

namespace megascope::launch {

// Spelled as kWorkerFaultNames (run.json's `faults[].kind`, the progress stream's `fault` event,
// `train --fault KIND:...`).
enum class WorkerFaultKind : uint8_t {
  kCrash = 0,      // the rank aborts at `step`
  kHang,           // the rank's compute never ends at `step` (its heartbeat goes on)
  kFreeze,         // the whole process stops (SIGSTOP) at `step`, heartbeat included
  kStallSend,      // a Gloo send of `step` stalls
  kSlow,           // from `step` on, each step computes `seconds` longer or `factor` times as long
  kSlowCheckpoint  // from `step` on, the rank's disk checkpoint writes take `seconds` longer
};
inline constexpr std::array<std::string_view, 6> kWorkerFaultNames = {
    "crash", "hang", "freeze", "stall-send", "slow", "slow-checkpoint"};
inline std::string_view Name(WorkerFaultKind k) { return tracer::NameFrom(kWorkerFaultNames, k); }
inline std::optional<WorkerFaultKind> ParseWorkerFaultKind(std::string_view s) {
  return tracer::ParseFrom<WorkerFaultKind>(kWorkerFaultNames, s);
}

struct WorkerFault {
  WorkerFaultKind kind = WorkerFaultKind::kCrash;
  int rank = -1;
  int64_t step = 0;
  double seconds = 0;
  double factor = 0;  // slow: each step's compute takes this many times as long (> 1)
};

}  // namespace megascope::launch
