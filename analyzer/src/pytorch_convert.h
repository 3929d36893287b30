// Private to the PyTorch reader: one Flight Recorder dump turned into a megascope dump
// (pytorch.cc), for the reader of a whole directory of them (pytorch_set.cc).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "megascope/analyzer/pytorch.h"
#include "megascope/tracer/dump.h"

namespace megascope::analyzer::pytorch_internal {

// A dump converted: the megascope dump, and what PyTorch recorded of each collective (keyed by
// the dump's group index, as group names may still change: LoadPyTorch makes them unique).
struct Converted {
  tracer::Dump dump;
  PyTorchRank rank;
  std::vector<std::pair<std::pair<int, int64_t>, PyTorchOp>> collectives;  // (group, seq) -> op
  std::vector<std::pair<size_t, PyTorchOp>> transfers;  // index in dump's entries -> op
  // Process groups created again under the same name (an in-process restart): name -> the
  // entries of their earlier instances, left out as stale.
  std::map<std::string, int> stale;
};

// One dump's text (the pickle TORCH_NCCL_DUMP_ON_TIMEOUT writes, or JSON) converted; `rank_hint`
// and `world_hint` from the file's name and the set, `ft` PyTorchLoadOptions::ft_group_world_size.
// Errors name `source`.
Result<Converted> ParseConverted(std::string_view text, const std::string& source, int rank_hint,
                                 int world_hint, int ft = 0);

}  // namespace megascope::analyzer::pytorch_internal
