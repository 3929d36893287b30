// A fault a rank injects into itself (launch --inject, or train --inject): what the controller
// plans for an attempt and the worker reads back from run.json. One struct for both floors.
#pragma once

#include <cstdint>
#include <string>

namespace megascope::launch {

struct WorkerFault {
  // crash, hang, stall-send, slow; slow-checkpoint: the rank's disk checkpoint writes take
  // `seconds` longer (a slow filesystem), from `step` on
  std::string kind;
  int rank = -1;
  int64_t step = 0;
  double seconds = 0;
  double factor = 0;  // slow: each step's compute takes this many times as long (> 1)
};

}  // namespace megascope::launch
