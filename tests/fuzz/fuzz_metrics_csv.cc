// Metrics CSV lines (docs/formats.md section 3) from anywhere: parse each line and stream what
// parses through the detector.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "megascope/detector/detector.h"
#include "megascope/detector/samples.h"

using namespace megascope::detector;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  Detector det{DetectorConfig{}};
  Stream stream(&det, 1.0, 5.0);
  int lines = 0;
  while (!text.empty() && lines++ < 2000) {
    const size_t nl = text.find('\n');
    const std::string_view line = text.substr(0, nl);
    Sample s;
    // Times far apart would make the stream walk every tick between them: keep them near, and
    // shift them so that the stream sees times before 0 too (other sources may send them).
    if (ParseMetricsLine(line, &s).ok() && s.time_s < 3600) {
      s.time_s -= 1800;
      stream.Add(s);
    }
    if (nl == std::string_view::npos) break;
    text.remove_prefix(nl + 1);
  }
  stream.Flush();
  (void)stream.TakeVerdicts();
  return 0;
}
