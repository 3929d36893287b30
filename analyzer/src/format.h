// Private: printf-style formatting of one number, for the analyzer's explanations.
#pragma once

#include <cstdio>
#include <string>

#include "megascope/tracer/format.h"

namespace megascope::analyzer {

inline std::string Fmt(const char* format, double v) {
  std::string b = tracer::Format(format, v);
  return b;
}

}  // namespace megascope::analyzer
