// Flight-recorder dumps: the JSON file of docs/formats.md section 1 ("megascope-flight-recorder",
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

// The dump as JSON text (docs/formats.md section 1). `alive` is false when the writer is a reader
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

// The binary form of a stream of dumps (an agent's GET /dumps?form=binary, what live hang analysis
// reads): what the JSON form carries, in fixed-width little-endian fields, a few times cheaper to
// write and read than JSON at 100,000 ranks. The stream starts with kDumpStreamMagic, its version
// (u32) and the writer's spelling of each code of its enums (op, state, dtype, phase, waiting_on:
// a count, then length-prefixed docs/formats.md names), so that a reader maps codes by name and
// keeps a value it does not know as the JSON reader does (Dump::unknown_values). Then one frame a
// rank: its length
// (u32), alive (u8), dumped_at_ns, job and node (length-prefixed), rank, world_size, local_rank,
// attempt, pid, dp, pp, tp (i32), clock_offset_ns; the heartbeat's step, phase (u8) and
// updated_at_ns; the groups (a count; each its name, kind and runs of ranks: first, stride, count);
// the entries (a count; each group index, seq, op, peer, bytes, dtype, state, enqueued, started,
// completed, bytes_sent, bytes_received, waiting_on (u8)).
inline constexpr std::string_view kDumpStreamMagic = "MSDUMPS\n";
inline constexpr uint32_t kDumpStreamVersion = 2;  // 2: waiting_on
void AppendDumpStreamHeader(std::string* out);
void AppendDumpFrame(const Dump& dump, std::string* out);

// Reads a dump stream as it arrives, in pieces of any size. Errors name `source` and the dump.
class DumpStreamReader {
 public:
  explicit DumpStreamReader(std::string source);
  // Hands each dump completed by `data` to `on_dump`; an error from it stops the reading.
  Status Feed(std::string_view data, const std::function<Status(Dump)>& on_dump);
  // Whether the stream ended where a dump ends.
  Status Finish() const;
  size_t dumps() const { return frames_; }

  struct Code {    // a code of the writer's enum (the stream's header)
    uint8_t mine;  // this build's code for the writer's name; 255: a name it does not know
    std::string name;
  };

 private:
  static constexpr uint32_t kMaxFrame = 1u << 30;
  Result<size_t> ParseHeader();  // the header's length; 0 while the buffer does not hold it all
  Result<Dump> ParseFrame(std::string_view frame);
  template <typename E>
  static E Decode(const std::vector<Code>& table, uint8_t code, const char* field, int64_t entry,
                  Dump* d);

  std::string source_;
  std::string buffer_;
  bool header_done_ = false;
  size_t frames_ = 0;
  std::vector<Code> ops_, states_, dtypes_, phases_, waits_;
};

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
