// megascope: observability and diagnosis for large-scale LLM training.
#include <charconv>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "command.h"

namespace megascope::cli {
namespace {

int RunVersion(const Args& args) {
  po::options_description opts("Options");
  opts.add_options()("help,h", "show this help");
  po::variables_map vm;
  if (auto rc = ParseArgs("version", "megascope version", args, opts, {}, &vm)) return *rc;
  std::printf("megascope %s\n", MEGASCOPE_VERSION);
  return 0;
}

const Command kCommands[] = {
    {"detect", "find faulty machines in a metrics CSV (optionally scored against labels)",
     &RunDetect},
    {"fleet-sim", "write a labelled synthetic fleet (metrics.csv, labels.csv) for the detector",
     &RunFleetSim},
    {"launch",
     "self-healing training: detect a failed or hung node, evict it, self-check a spare, resume",
     &RunLaunch},
    {"evict", "evict a node from a running launch (needs the run's token)", &RunEvict},
    {"stop", "stop a running launch (needs the run's token)", &RunStop},
    {"report", "incidents of a launch: stage times, evictions, steps lost, ETTR", &RunReport},
    {"wrap",
     "trace a job megascope did not start (NCCL's collectives through the profiler plugin): "
     "wrap -- CMD",
     &RunWrap},
    {"self-check",
     "the GEMM and all-reduce check a node passes before it joins (started by launch)",
     &RunSelfCheckCommand, true},
    {"train", "train a GPT with data, tensor and pipeline parallelism on this machine", &RunTrain},
    {"prepare-data", "turn a text file into a token file for training", &RunPrepareData},
    {"worker", "one rank of a training job (started by train)", &RunWorkerCommand, true},
    {"agent", "the per-node collector: rings -> trace.db, Prometheus /metrics, /state, /dump",
     &RunAgent},
    {"analyze", "find the rank at the root of a hang (analyze hang DIR | RUN_DIR | --agents URLs)",
     &RunAnalyze},
    {"timeline", "a run's 3D-parallel timeline as Perfetto JSON and a self-contained HTML viewer",
     &RunTimeline},
    {"query", "SQL and canned questions over a run's trace databases", &RunQuery},
    {"metrics", "export a run's node and training metrics as CSV (metrics export)", &RunMetrics},
    {"store", "the fleet's ClickHouse store: init (schema), status, prune (retention)", &RunStore},
    {"trace-demo", "run writer processes through the tracer and drain them (self-demonstration)",
     &RunTraceDemo},
    {"version", "print the version", &RunVersion},
};

void PrintHelp(std::FILE* out) {
  std::fprintf(out,
               "megascope %s - observability and diagnosis for large-scale LLM training\n\n"
               "Usage: megascope <command> [options]\n"
               "       megascope <command> --help   options of one command\n\nCommands:\n",
               MEGASCOPE_VERSION);
  for (const Command& c : kCommands) {
    if (!c.hidden) std::fprintf(out, "  %-14s %s\n", c.name, c.summary);
  }
}

}  // namespace

std::optional<int> ParseArgs(const char* name, const char* usage, const Args& args,
                             const po::options_description& options,
                             const po::positional_options_description& positional,
                             po::variables_map* vm) {
  try {
    po::store(po::command_line_parser(args).options(options).positional(positional).run(), *vm);
    if (vm->count("help")) {
      std::cout << "Usage: " << usage << "\n\n" << options << "\n";
      return 0;
    }
    // Every required argument that is missing, in one line with the usage, in the usage's order:
    // a positional one first, as its description names it ("the node to evict"), not as the
    // internal option behind it; then an option by its flag.
    std::vector<std::string> missing, missing_flags;
    for (const auto& o : options.options()) {
      if (!o->semantic()->is_required() || vm->count(o->long_name())) continue;
      bool is_positional = false;
      for (unsigned i = 0; i < positional.max_total_count() && i < 8; ++i)
        is_positional |= positional.name_for_position(i) == o->long_name();
      if (is_positional)
        missing.push_back(o->description());
      else
        missing_flags.push_back("--" + o->long_name());
    }
    missing.insert(missing.end(), missing_flags.begin(), missing_flags.end());
    if (!missing.empty()) {
      std::string what;
      for (size_t i = 0; i < missing.size(); ++i)
        what += (i == 0 ? "" : i + 1 == missing.size() ? " and " : ", ") + missing[i];
      const std::string first_usage(usage, std::strcspn(usage, "\n"));
      std::fprintf(stderr, "megascope %s: %s %s missing (usage: %s; more: megascope %s --help)\n",
                   name, what.c_str(), missing.size() == 1 ? "is" : "are", first_usage.c_str(),
                   name);
      return kExitUsage;
    }
    po::notify(*vm);
  } catch (const po::error& e) {
    std::fprintf(stderr, "megascope %s: %s\nTry 'megascope %s --help'.\n", name, e.what(), name);
    return kExitUsage;
  }
  return std::nullopt;
}

void Warn(const char* name, const std::vector<std::string>& lines) {
  for (const std::string& l : lines)
    std::fprintf(stderr, "megascope %s: warning: %s\n", name, l.c_str());
}

std::optional<StepRange> ParseStepRange(const std::string& spec, std::string* why) {
  const auto number = [](std::string_view s, int64_t* v) {
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *v);
    return ec == std::errc() && end == s.data() + s.size() && !s.empty();
  };
  const auto colon = spec.find(':');
  StepRange r;
  const std::string_view a = std::string_view(spec).substr(0, colon);
  const std::string_view b =
      colon == std::string::npos ? a : std::string_view(spec).substr(colon + 1);
  if (!number(a, &r.first) || !number(b, &r.last)) {
    *why = "--steps must be A:B, two step numbers (e.g. 3:5), or one step, not '" + spec + "'";
    return std::nullopt;
  }
  if (r.last < r.first) {
    *why = "--steps " + spec + ": A:B needs A <= B";
    return std::nullopt;
  }
  return r;
}

int Fail(const char* name, const std::string& message, int code) {
  std::fprintf(stderr, "megascope %s: %s\n", name, message.c_str());
  return code;
}

}  // namespace megascope::cli

int main(int argc, char** argv) {
  using namespace megascope::cli;
  if (argc < 2) {
    PrintHelp(stderr);
    return kExitUsage;
  }
  const std::string cmd = argv[1];
  if (cmd == "help" && argc > 2) {  // megascope help COMMAND: that command's --help
    for (const Command& c : kCommands) {
      if (argv[2] == std::string(c.name)) return c.run(Args{"--help"});
    }
    std::fprintf(stderr,
                 "megascope: no command '%s' to help with\nRun 'megascope --help' for the list of "
                 "commands.\n",
                 argv[2]);
    return kExitUsage;
  }
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    PrintHelp(stdout);
    return 0;
  }
  for (const Command& c : kCommands) {
    if (cmd == c.name || (cmd == "--version" && std::strcmp(c.name, "version") == 0)) {
      return c.run(Args(argv + 2, argv + argc));
    }
  }
  std::fprintf(
      stderr, "megascope: unknown command '%s'\nRun 'megascope --help' for the list of commands.\n",
      cmd.c_str());
  return kExitUsage;
}
