// A megascope flight-recorder dump from anywhere: parse it, and when it parses, analyse it (alone,
// and as two ranks' worth) -- no input may crash, hang or read out of bounds.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "megascope/analyzer/hang.h"
#include "megascope/tracer/dump.h"

using namespace megascope;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto d = tracer::ParseDump(text, "fuzz.json");
  if (!d.ok()) return 0;
  (void)tracer::DumpToJson(*d);                      // what parsed can be written back
  if (d->snapshot.info.world_size > 4096) return 0;  // the analysis allocates per rank
  std::vector<std::pair<std::string, tracer::Dump>> dumps = {{"fuzz.json", *d}};
  auto in = analyzer::MakeHangInput(std::move(dumps));
  if (in.ok()) (void)analyzer::AnalyzeHang(*in, {});
  return 0;
}
