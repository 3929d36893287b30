// Process: one child process with a log file, started, polled, signalled and stopped with a grace
// (SIGTERM, wait, SIGKILL), and always reaped -- the only place in the tree that forks. Modelled
// on PyTorch elastic's process context: start, poll, close with a grace.
//
// Thread safety: a Process is used by one thread at a time. Children run in their own process
// group, so Stop() also reaches what they started (a `sh -c` and its command), and they get
// SIGTERM when the thread that started them dies (PR_SET_PDEATHSIG): a launcher killed by
// SIGKILL leaves no orphaned agent or rank behind.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <csignal>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "megascope/tracer/status.h"

namespace megascope::launch {

// CPU time this process has used so far, every thread counted (getrusage).
struct CpuTime {
  double user_s = 0, system_s = 0;
};
CpuTime SelfCpuTime();
// "cpu 1.234 s user, 0.056 s system": how processes report their cost when they end.
std::string Describe(const CpuTime& t);

// How a child ended (the raw wait status, decoded).
struct ExitStatus {
  int raw = 0;
  bool exited() const;
  int code() const;  // exit code; -1 if killed by a signal
  bool signaled() const;
  int signal() const;  // 0 unless signaled
  bool success() const { return exited() && code() == 0; }
  // "exited with code 3", "was killed by signal 6 (Aborted)".
  std::string Describe() const;
};

struct ProcessSpec {
  ProcessSpec() = default;
  ProcessSpec(std::vector<std::string> command,
              std::string log = "")  // NOLINT(google-explicit-constructor)
      : argv(std::move(command)), log_path(std::move(log)) {}

  std::vector<std::string> argv;  // argv[0]: the executable's path
  std::string log_path;           // stdout and stderr go here ("" : inherit the parent's)
  bool append_log = false;        // append instead of truncating
  std::vector<std::pair<std::string, std::string>>
      env;            // added to (or replacing in) the environment
  std::string netns;  // run in this network namespace (ip netns: /run/netns/NAME); "" : ours
  // Sent to the child when the launcher dies, even by SIGKILL (prctl PDEATHSIG): no orphaned
  // agents or ranks. A child that must tell "my launcher is gone" from a stop asks for its own.
  int parent_death_signal = SIGTERM;
};

class Process {
 public:
  // Starts argv (fork + exec). Errors: the executable missing or not runnable, the log not
  // writable.
  static Result<std::unique_ptr<Process>> Spawn(const ProcessSpec& spec);
  // Runs `body` in a forked child whose exit code is body's return (tests and trace-demo writers).
  static Result<std::unique_ptr<Process>> Fork(const std::function<int()>& body,
                                               const std::string& log_path = "");
  // Stops the child (no grace) if it still runs, and reaps it: a Process never leaves a zombie.
  ~Process();

  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_; }
  // The exit status once the child has ended (never blocks).
  std::optional<ExitStatus> Poll();
  bool running() { return !Poll().has_value(); }
  // Waits up to `timeout` for the child to end.
  std::optional<ExitStatus> WaitFor(std::chrono::milliseconds timeout);
  ExitStatus Wait();
  // Sends `sig` to the child's process group; false once it has ended.
  bool Signal(int sig);
  // SIGTERM, up to `grace` for it to exit, then SIGKILL; returns how it ended.
  ExitStatus Stop(std::chrono::milliseconds grace);

  // The last `lines` lines of the log, each indented by four spaces.
  std::string LogTail(size_t lines) const;

 private:
  Process(pid_t pid, std::string log) : pid_(pid), log_(std::move(log)) {}
  pid_t pid_;
  std::string log_;
  std::optional<ExitStatus> exit_;
};

// Stops several processes together: SIGTERM to all, one shared grace, SIGKILL to what is left.
void StopAll(const std::vector<Process*>& processes, std::chrono::milliseconds grace);

// The last `lines` lines of a text file, each indented by four spaces.
std::string FileTail(const std::string& path, size_t lines);

// The executable `name` on PATH or in the sbin directories, where root's tools live.
Result<std::string> FindTool(const std::string& name);

// Runs a tool to its end and returns what it printed (stdout and stderr). argv[0] is found by
// FindTool; `netns` as in ProcessSpec. Errors: not installed (kNotFound), over `timeout`
// (kDeadlineExceeded, the tool is killed), a failed exit (kInternal); each names the command line
// and carries the tail of the output.
Result<std::string> RunTool(std::vector<std::string> argv, const std::string& netns = "",
                            std::chrono::milliseconds timeout = std::chrono::seconds(10));

// This executable's path (/proc/self/exe).
Result<std::string> SelfExe();

}  // namespace megascope::launch
