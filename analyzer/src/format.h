// Private: printf-style formatting of one number, for the analyzer's explanations.
#pragma once

#include <cstdio>
#include <string>

namespace megascope::analyzer {

inline std::string Fmt(const char* format, double v) {
  char b[64];
  std::snprintf(b, sizeof(b), format, v);
  return b;
}

}  // namespace megascope::analyzer
