#include "megascope/launch/process.h"

#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <sstream>
#include <thread>

#include "megascope/tracer/file_util.h"
#include "megascope/tracer/format.h"

extern char** environ;

namespace megascope::launch {
namespace {

constexpr auto kPollStep = std::chrono::milliseconds(5);

Result<int> OpenLog(const std::string& path, bool append) {
  if (path.empty()) return -1;
  const int fd =
      ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | (append ? O_APPEND : O_TRUNC), 0644);
  if (fd < 0) return ErrnoError("cannot open log " + path, errno);
  return fd;
}

// In the child, between fork and exec/body: only async-signal-safe calls.
void EnterChild(int log_fd, pid_t parent, int parent_death_signal) {
  ::setpgid(0, 0);
  // A launcher that dies (even by SIGKILL) takes its children along: no orphaned agents or ranks.
  ::prctl(PR_SET_PDEATHSIG, parent_death_signal);
  if (::getppid() != parent) ::_exit(128 + parent_death_signal);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::signal(SIGINT, SIG_DFL);
  ::signal(SIGTERM, SIG_DFL);
  if (log_fd >= 0) {
    ::dup2(log_fd, 1);
    ::dup2(log_fd, 2);
  }
}

// Forks; the child enters its own group and runs `child` (which must not return normally). The
// parent gets the pid; `log_fd` is closed in the parent either way.
Result<pid_t> ForkChild(int log_fd, int parent_death_signal, const std::function<void()>& child) {
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    if (log_fd >= 0) ::close(log_fd);
    return ErrnoError("fork", err);
  }
  if (pid == 0) {
    EnterChild(log_fd, parent, parent_death_signal);
    child();
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also from the parent: no race with an early Signal()
  if (log_fd >= 0) ::close(log_fd);
  return pid;
}

}  // namespace

CpuTime SelfCpuTime() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  auto secs = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6;
  };
  return {secs(u.ru_utime), secs(u.ru_stime)};
}

std::string Describe(const CpuTime& t) {
  return tracer::Format("cpu %.3f s user, %.3f s system", t.user_s, t.system_s);
}

bool ExitStatus::exited() const { return WIFEXITED(raw); }
int ExitStatus::code() const { return WIFEXITED(raw) ? WEXITSTATUS(raw) : -1; }
bool ExitStatus::signaled() const { return WIFSIGNALED(raw); }
int ExitStatus::signal() const { return WIFSIGNALED(raw) ? WTERMSIG(raw) : 0; }
std::string ExitStatus::Describe() const {
  if (signaled())
    return "was killed by signal " + std::to_string(signal()) + " (" + ::strsignal(signal()) + ")";
  return "exited with code " + std::to_string(code());
}

Result<std::unique_ptr<Process>> Process::Spawn(const ProcessSpec& spec) {
  if (spec.argv.empty()) return InvalidArgument("Process::Spawn: empty argv");
  if (::access(spec.argv[0].c_str(), X_OK) != 0)
    return ErrnoError("cannot run " + spec.argv[0], errno);
  int ns_fd = -1;
  if (!spec.netns.empty()) {
    const std::string ns_path = "/run/netns/" + spec.netns;
    ns_fd = ::open(ns_path.c_str(), O_RDONLY | O_CLOEXEC);
    if (ns_fd < 0) return ErrnoError("cannot open network namespace " + ns_path, errno);
  }
  struct CloseNs {
    int fd;
    ~CloseNs() {
      if (fd >= 0) ::close(fd);
    }
  } close_ns{ns_fd};
  ASSIGN_OR_RETURN(int fd, OpenLog(spec.log_path, spec.append_log));
  // Everything exec needs is built before fork: the child only calls async-signal-safe functions.
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    bool replaced = false;
    for (const auto& [k, v] : spec.env) replaced = replaced || kv.rfind(k + "=", 0) == 0;
    if (!replaced) env_strings.push_back(kv);
  }
  for (const auto& [k, v] : spec.env) env_strings.push_back(k + "=" + v);
  std::vector<char*> argv, envp;
  for (const std::string& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const std::string& e : env_strings) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  ASSIGN_OR_RETURN(pid_t pid, ForkChild(fd, spec.parent_death_signal, [&] {
                     if (ns_fd >= 0 && ::setns(ns_fd, CLONE_NEWNET) != 0) {
                       static const char kNs[] = "megascope: cannot enter network namespace\n";
                       (void)!::write(2, kNs, sizeof(kNs) - 1);
                       ::_exit(126);
                     }
                     ::execve(argv[0], argv.data(), envp.data());
                     static const char kMsg[] = "megascope: exec failed\n";
                     (void)!::write(2, kMsg, sizeof(kMsg) - 1);
                   }));
  return std::unique_ptr<Process>(new Process(pid, spec.log_path));
}

Result<std::unique_ptr<Process>> Process::Fork(const std::function<int()>& body,
                                               const std::string& log_path) {
  ASSIGN_OR_RETURN(int fd, OpenLog(log_path, false));
  ASSIGN_OR_RETURN(pid_t pid, ForkChild(fd, SIGTERM, [&] { ::_exit(body()); }));
  return std::unique_ptr<Process>(new Process(pid, log_path));
}

Process::~Process() {
  if (!exit_) Stop(std::chrono::milliseconds(0));
}

std::optional<ExitStatus> Process::Poll() {
  if (exit_) return exit_;
  int status = 0;
  const pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    exit_ = ExitStatus{status};
    ::kill(-pid_, SIGKILL);  // anything it left behind in its group
  } else if (r < 0 && errno == ECHILD) {
    exit_ = ExitStatus{0};  // reaped elsewhere: nothing more to learn
  }
  return exit_;
}

std::optional<ExitStatus> Process::WaitFor(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (auto e = Poll()) return e;
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(kPollStep);
  }
}

ExitStatus Process::Wait() {
  while (!exit_) {
    int status = 0;
    const pid_t r = ::waitpid(pid_, &status, 0);
    if (r == pid_)
      exit_ = ExitStatus{status};
    else if (r < 0 && errno != EINTR)
      exit_ = ExitStatus{0};
  }
  ::kill(-pid_, SIGKILL);
  return *exit_;
}

bool Process::Signal(int sig) {
  if (Poll()) return false;
  return ::kill(-pid_, sig) == 0 || ::kill(pid_, sig) == 0;
}

ExitStatus Process::Stop(std::chrono::milliseconds grace) {
  StopAll({this}, grace);
  return *exit_;
}

std::string Process::LogTail(size_t lines) const { return FileTail(log_, lines); }

void StopAll(const std::vector<Process*>& processes, std::chrono::milliseconds grace) {
  if (grace.count() > 0) {
    // SIGCONT after SIGTERM: a stopped process (a frozen rank) handles its SIGTERM only once it
    // runs again; otherwise it would sit out the grace and lose what its handler saves.
    for (Process* p : processes) {
      p->Signal(SIGTERM);
      p->Signal(SIGCONT);
    }
    const auto deadline = std::chrono::steady_clock::now() + grace;
    for (;;) {
      bool all = true;
      for (Process* p : processes) all = !p->running() && all;
      if (all || std::chrono::steady_clock::now() >= deadline) break;
      std::this_thread::sleep_for(kPollStep);
    }
  }
  for (Process* p : processes) {
    p->Signal(SIGKILL);
    p->Wait();
  }
}

std::string FileTail(const std::string& path, size_t lines) {
  std::ifstream in(path);
  std::deque<std::string> last;
  for (std::string l; std::getline(in, l);) {
    last.push_back(l);
    if (last.size() > lines) last.pop_front();
  }
  std::string out;
  for (const auto& l : last) out += "    " + l + "\n";
  return out;
}

Result<std::string> FindTool(const std::string& name) {
  std::string path = std::getenv("PATH") ? std::getenv("PATH") : "";
  path += ":/usr/sbin:/sbin:/usr/bin:/bin";
  std::stringstream dirs(path);
  for (std::string d; std::getline(dirs, d, ':');) {
    if (!d.empty() && ::access((d + "/" + name).c_str(), X_OK) == 0) return d + "/" + name;
  }
  return NotFound("'" + name + "' is not installed (scripts/setup.sh installs it)");
}

Result<std::string> RunTool(std::vector<std::string> argv, const std::string& netns,
                            std::chrono::milliseconds timeout) {
  std::string line;
  for (const std::string& a : argv) line += (line.empty() ? "" : " ") + a;
  ASSIGN_OR_RETURN(std::string exe, FindTool(argv[0]));
  argv[0] = exe;
  char log[] = "/tmp/megascope-tool-XXXXXX";
  const int fd = ::mkstemp(log);
  if (fd < 0) return ErrnoError("cannot create a temporary file for '" + line + "'", errno);
  ::close(fd);
  ProcessSpec spec(std::move(argv), log);
  spec.netns = netns;
  auto p = Process::Spawn(spec);
  if (!p.ok()) {
    ::unlink(log);
    return p.status().WithContext(line);
  }
  auto e = (*p)->WaitFor(timeout);
  std::string out = tracer::ReadFile(log).value_or("");
  ::unlink(log);
  if (!e) {
    return Status(StatusCode::kDeadlineExceeded,
                  "'" + line + "' did not finish in " + std::to_string(timeout.count()) + " ms");
  }
  if (!e->success()) {
    const size_t tail = out.size() > 2000 ? out.size() - 2000 : 0;
    return Status(StatusCode::kInternal,
                  "'" + line + "' " + e->Describe() + ":\n" + out.substr(tail));
  }
  return out;
}

Result<std::string> SelfExe() {
  char exe[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return ErrnoError("cannot find my own executable in /proc/self/exe", errno);
  return std::string(exe, static_cast<size_t>(n));
}

}  // namespace megascope::launch
