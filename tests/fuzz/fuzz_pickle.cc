// Any bytes as a pickle: read as data or refused, never followed into code, never unbounded.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "megascope/analyzer/pickle.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto v =
      megascope::analyzer::ReadPickle(std::string_view(reinterpret_cast<const char*>(data), size));
  if (v.ok()) (void)v->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return 0;
}
