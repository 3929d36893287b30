// A PyTorch Flight Recorder dump (JSON form) from anywhere: convert it and analyse it.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "megascope/analyzer/hang.h"

using namespace megascope;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto d = analyzer::ParsePyTorchDump(text, "rank_0.json", 0);
  if (!d.ok() || d->snapshot.info.world_size > 4096) return 0;
  std::vector<std::pair<std::string, tracer::Dump>> dumps = {{"rank_0.json", *d}};
  auto in = analyzer::MakeHangInput(std::move(dumps));
  if (in.ok()) (void)analyzer::AnalyzeHang(*in, {});
  return 0;
}
