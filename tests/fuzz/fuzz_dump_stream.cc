// A binary dump stream from anywhere (an agent's GET /dumps?form=binary, as live hang analysis
// reads it): fed in pieces whose size the input's first byte picks, then analysed -- no input may
// crash, hang or read out of bounds, and every dump it yields writes back to a stream that reads
// as the same dump.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "megascope/analyzer/hang.h"
#include "megascope/tracer/dump.h"

using namespace megascope;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t piece = 1 + data[0] % 64;
  const std::string_view s(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::vector<std::pair<std::string, tracer::Dump>> dumps;
  tracer::DumpStreamReader reader("fuzz");
  const auto keep = [&](tracer::Dump d) {
    dumps.emplace_back("fuzz", std::move(d));
    return Status::Ok();
  };
  for (size_t at = 0; at < s.size(); at += piece) {
    if (!reader.Feed(s.substr(at, piece), keep).ok()) break;
  }
  (void)reader.Finish();
  for (const auto& [src, d] : dumps) {
    std::string again;
    tracer::AppendDumpStreamHeader(&again);
    tracer::AppendDumpFrame(d, &again);
    tracer::DumpStreamReader back("again");
    std::vector<tracer::Dump> got;
    const Status st = back.Feed(again, [&](tracer::Dump x) {
      got.push_back(std::move(x));
      return Status::Ok();
    });
    // Values it did not know were read as kUnknown and are written back as such: only a dump
    // that was read whole must come back the same.
    if (d.unknown_values.empty() &&
        (!st.ok() || got.size() != 1 || tracer::DumpToJson(got[0]) != tracer::DumpToJson(d))) {
      std::fprintf(stderr, "a dump read from the stream does not read back the same: %s\n",
                   st.ToString().c_str());
      std::abort();
    }
    if (d.snapshot.info.world_size > 4096) return 0;  // the analysis allocates per rank
  }
  auto in = analyzer::MakeHangInput(std::move(dumps));
  if (in.ok()) (void)analyzer::AnalyzeHang(*in, {});
  return 0;
}
