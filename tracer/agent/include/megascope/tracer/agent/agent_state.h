// Reading an agent's GET /state answer (tracer/agent writes it: each rank's heartbeat and open
// flight-recorder entries) for what a controller needs of it every tick, fast (simdjson): at
// MegaScale's size a controller reads 1,536 of them a tick.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <string_view>

namespace megascope::tracer::agent {

struct RankBeat {
  int rank = -1, attempt = -1;
  int64_t step = 0;  // its heartbeat's
  // The earliest issue time of its open ops (ns since the epoch); INT64_MAX: none open.
  int64_t oldest_enqueued_ns = std::numeric_limits<int64_t>::max();
};

// Calls `fn` for each rank of a /state answer (a field it lacks keeps RankBeat's default); false
// when the answer is not one (not JSON, no "ranks" array).
bool ReadAgentState(std::string_view body, const std::function<void(const RankBeat&)>& fn);

}  // namespace megascope::tracer::agent
