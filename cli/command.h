// The megascope binary's subcommands: each is a function from its arguments to an exit code
// (0 success, 1 failure, kExitUsage (2) a usage error: launch/exit_codes.h, where `launch`'s own
// codes are too), with shared option-parsing helpers.
#pragma once

#include <boost/program_options.hpp>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "megascope/launch/exit_codes.h"
#include "megascope/tracer/format.h"

namespace megascope::cli {

using launch::kExitUsage;

namespace po = boost::program_options;

using Args = std::vector<std::string>;

struct Command {
  const char* name;
  const char* summary;
  int (*run)(const Args& args);
  bool hidden = false;  // internal helpers (e.g. re-exec targets) stay out of --help
};

// Parses `args` for subcommand `name`. Returns an exit code when the caller should stop:
// 0 after printing --help, kExitUsage after printing a usage error.
std::optional<int> ParseArgs(const char* name, const char* usage, const Args& args,
                             const po::options_description& options,
                             const po::positional_options_description& positional,
                             po::variables_map* vm);

// Prints "megascope <name>: <message>" to stderr and returns `code`.
int Fail(const char* name, const std::string& message, int code = 1);

// A floating-point option whose default reads as a person writes it in --help ("0.3"), not as
// program_options prints a double ("0.29999999999999999").
template <typename T>
po::typed_value<T>* Decimal(T* v, T def) {
  return po::value(v)->default_value(def, tracer::Format("%g", static_cast<double>(def)));
}
// --steps A:B (or A alone: that one step), the steps A through B. nullopt, with `why` set, when it
// is not two whole numbers with A <= B.
struct StepRange {
  int64_t first = 0, last = 0;
};
std::optional<StepRange> ParseStepRange(const std::string& spec, std::string* why);

// Prints "megascope <name>: warning: <line>" for each line, on stderr.
void Warn(const char* name, const std::vector<std::string>& lines);

int RunTraceDemo(const Args& args);
int RunDetect(const Args& args);
int RunFleetSim(const Args& args);
int RunTrain(const Args& args);
int RunWorkerCommand(const Args& args);
int RunPrepareData(const Args& args);
int RunAgent(const Args& args);
int RunQuery(const Args& args);
int RunAnalyze(const Args& args);
int RunTimeline(const Args& args);
int RunMetrics(const Args& args);
int RunStore(const Args& args);
int RunSelfCheckCommand(const Args& args);
int RunLaunch(const Args& args);
int RunReport(const Args& args);
int RunEvict(const Args& args);
int RunStop(const Args& args);
int RunWrap(const Args& args);

}  // namespace megascope::cli
