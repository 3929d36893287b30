// printf's formatting into a std::string: the tree's one way to put numbers into text (no buffer
// of a guessed size at each call; the compiler checks the arguments against the format). Only the
// capture core (ring.cc) and the in-process NCCL plugin, which link nothing but the capture core,
// keep fixed buffers of their own.
#pragma once

#include <string>

namespace megascope::tracer {

std::string Format(const char* format, ...) __attribute__((format(printf, 1, 2)));

}  // namespace megascope::tracer
