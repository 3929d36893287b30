// A megascope flight-recorder dump from anywhere: parse it, and when it parses, analyse it (alone,
// and as two ranks' worth) -- no input may crash, hang or read out of bounds. Whatever the fast
// reading accepts, the reference reading must read the same way.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "megascope/analyzer/hang.h"
#include "megascope/tracer/dump.h"

using namespace megascope;

namespace {

bool Same(const tracer::Dump& a, const tracer::Dump& b) {
  if (tracer::DumpToJson(a) != tracer::DumpToJson(b)) return false;
  if (a.unknown_values.size() != b.unknown_values.size()) return false;
  for (size_t i = 0; i < a.unknown_values.size(); ++i) {
    const auto &x = a.unknown_values[i], &y = b.unknown_values[i];
    if (x.where != y.where || x.field != y.field || x.value != y.value) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  if (auto fast = tracer::ParseDumpFast(text)) {
    auto ref = tracer::ParseDumpReference(text, "fuzz.json");
    if (!ref.ok() || !Same(*fast, *ref)) {
      std::fprintf(stderr, "the fast reading accepted what the reference reads otherwise: %s\n",
                   ref.ok() ? "a different dump" : ref.status().ToString().c_str());
      std::abort();
    }
  }
  auto d = tracer::ParseDump(text, "fuzz.json");
  if (!d.ok()) return 0;
  (void)tracer::DumpToJson(*d);                      // what parsed can be written back
  if (d->snapshot.info.world_size > 4096) return 0;  // the analysis allocates per rank
  std::vector<std::pair<std::string, tracer::Dump>> dumps = {{"fuzz.json", *d}};
  auto in = analyzer::MakeHangInput(std::move(dumps));
  if (in.ok()) (void)analyzer::AnalyzeHang(*in, {});
  return 0;
}
