// The benchmarks' main, written once: `run` with what it throws said on stderr as "<name>: <what>"
// and exit code 1.
#pragma once

#include <cstdio>
#include <exception>

namespace megascope::bench {

inline int Main(const char* name, int (*run)(int, char**), int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return 1;
  }
}

}  // namespace megascope::bench
