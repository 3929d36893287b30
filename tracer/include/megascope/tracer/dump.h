// Flight-recorder dumps: the JSON file of FORMATS.md section 1 ("megascope-flight-recorder",
// version 1), written from a RankSnapshot and parsed back into one. Also the SIGUSR1 trigger that
// runs a dump from a dedicated thread (never inside the signal handler).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "megascope/tracer/snapshot.h"
#include "megascope/tracer/stacks.h"
#include "megascope/tracer/status.h"

namespace megascope::tracer {

inline constexpr std::string_view kDumpFormat = "megascope-flight-recorder";
inline constexpr int kDumpVersion = 1;
// A group of more members than this is written as `rank_ranges` (Python ranges [start, stop,
// step]) in place of `ranks`, so that a 12,288-rank job's dumps do not each list the world.
inline constexpr size_t kListedGroupSize = 64;
// Larger groups are refused as corrupt.
inline constexpr size_t kMaxGroupSize = size_t{1} << 24;

// A value this build does not know in a field it knows (a heartbeat phase, an op, a state, a
// dtype): written by a newer version. The field reads as kUnknown, the value is kept here, and the
// analysis goes on; callers report it once as a warning.
struct UnknownValue {
  std::string where;  // "heartbeat" or "entries[12]"
  std::string field;  // "phase", "op", "state", "dtype"
  std::string value;
};

struct Dump {
  RankSnapshot snapshot;
  bool alive = true;
  int64_t dumped_at_ns = 0;
  std::vector<UnknownValue> unknown_values;
  // Every thread's backtrace when the rank wrote the dump itself (empty when a reader wrote it).
  std::vector<ThreadStack> stacks;
  // Read, not written: the writer queues ops ahead of a device that runs them in order (PyTorch's
  // NCCL recorder), so a rank is stuck at its oldest open op. Otherwise (megascope's own tracer,
  // where the CPU thread waits in its op) at its newest.
  bool oldest_open_blocks = false;
};

// The dump as JSON text (FORMATS.md section 1). `alive` is false when the writer is a reader
// speaking for a rank whose process is gone.
std::string DumpToJson(const Dump& dump);
// The same, appended to `out` (a buffer reused across many dumps costs no allocation each);
// `one_line`: on one line ending in a newline (NDJSON, as the agent's /dumps sends them).
void AppendDumpJson(const Dump& dump, std::string* out, bool one_line = false);
// Parses a dump; errors name `source` (a file name) and what was wrong. Forward compatible: fields
// it does not know are ignored, unknown values of known fields are kept (Dump::unknown_values); a
// format or version it does not know is an error.
Result<Dump> ParseDump(std::string_view text, const std::string& source);
// ParseDump's two readings, for tests that hold them to the same answers: the fast one (simdjson)
// takes well-formed dumps and gives up (nullopt) at anything it would not read exactly as the
// reference does; the reference (nlohmann) reads everything and says what is wrong.
std::optional<Dump> ParseDumpFast(std::string_view text);
Result<Dump> ParseDumpReference(std::string_view text, const std::string& source);
Result<Dump> ReadDumpFile(const std::string& path);

// Calls `on_signal` from its own thread each time the process receives `signo` (default
// SIGUSR1). The signal handler only writes a byte to a pipe. One instance per process.
class SignalDumper {
 public:
  static Result<std::unique_ptr<SignalDumper>> Start(std::function<void()> on_signal,
                                                     int signo = 10 /* SIGUSR1 */);
  ~SignalDumper();  // restores the previous handler and joins the thread
  SignalDumper(const SignalDumper&) = delete;
  SignalDumper& operator=(const SignalDumper&) = delete;

 private:
  SignalDumper() = default;
  std::function<void()> on_signal_;
  int signo_ = 0;
  std::thread thread_;
};

}  // namespace megascope::tracer
