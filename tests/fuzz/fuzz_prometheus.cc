// An agent's /metrics page (Prometheus text exposition format) from anywhere.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "megascope/detector/prometheus_text.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)megascope::detector::ParsePrometheusText(
      std::string_view(reinterpret_cast<const char*>(data), size), 0);
  return 0;
}
