// Private: printf-style formatting of one number, for the analyzer's explanations.
#pragma once

#include <cstdio>
#include <string>

#include "megascope/tracer/format.h"

namespace megascope::analyzer {

inline std::string Fmt(const char* format, double v) { return tracer::Format(format, v); }

}  // namespace megascope::analyzer
