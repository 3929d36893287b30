// A run.json from anywhere (a run directory copied between machines, edited by hand, written by a
// newer megascope): parse it; what parses must write back to a run.json that parses to the same
// text -- no input may crash, hang or read out of bounds.
#include <cstddef>
#include <cstdint>
#include <string>

#include "megascope/runtime/train.h"

using namespace megascope;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto c = runtime::TrainConfig::FromJson(text, "run.json");
  if (!c.ok()) return 0;
  (void)c->Validate();
  (void)c->NodeNames();
  const std::string written = c->ToJson();
  auto again = runtime::TrainConfig::FromJson(written, "written");
  if (!again.ok() || again->ToJson() != written) __builtin_trap();  // not a fixed point
  return 0;
}
