#include "megascope/runtime/self_check.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string_view>
#include <thread>
#include <vector>

#include "megascope/kernels/cpu.h"
#include "megascope/runtime/comm.h"
#include "megascope/tracer/format.h"
#include "megascope/tracer/ring.h"
#include "megascope/tracer/tracer.h"

namespace megascope::runtime {
namespace {

using Clock = std::chrono::steady_clock;

// The fault seam: a degraded node's processes carry MEGASCOPE_INJECT_SLOWDOWN=F (>= 1).
double InjectedSlowdown() {
  const char* v = std::getenv("MEGASCOPE_INJECT_SLOWDOWN");
  const double f = v ? std::atof(v) : 1.0;
  return f > 1.0 ? f : 1.0;
}

// Burns CPU for `seconds`, as work stolen from the node would.
void Burn(double seconds) {
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  volatile double x = 1;
  while (Clock::now() < end) {
    for (int i = 0; i < 10000; ++i) x = x * 1.0000001 + 1e-9;
  }
}

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

constexpr std::string_view kSelfCheckJob = "selfcheck-";

// Ends the process when a phase with the neighbour outlives its deadline (exit_when_stalled).
class StallWatch {
 public:
  explicit StallWatch(bool on) {
    if (on) thread_ = std::thread([this] { Watch(); });
  }
  ~StallWatch() {
    done_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  // Past `deadline` the process says `message` and ends; the message must outlive the phase, and
  // Clear() ends it.
  void Begin(const char* message, Clock::time_point deadline) {
    message_.store(message);
    deadline_ns_.store(std::max<int64_t>(1, deadline.time_since_epoch().count()));
  }
  void Clear() { deadline_ns_.store(0); }

 private:
  void Watch() {
    while (!done_.load()) {
      const int64_t d = deadline_ns_.load();
      if (d > 0 && Clock::now().time_since_epoch().count() > d) {
        std::fprintf(stderr, "megascope self-check: %s\n", message_.load());
        std::_Exit(1);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  std::atomic<bool> done_{false};
  std::atomic<int64_t> deadline_ns_{0};  // steady clock ticks; 0: no phase
  std::atomic<const char*> message_{""};
  std::thread thread_;
};

std::filesystem::path PresenceMark(const std::string& dir, int rank) {
  return std::filesystem::path(dir) / ("megascope-present-" + std::to_string(rank));
}

// Says this process is here: a file in the rendezvous directory, written as it starts.
Status MarkPresent(const std::string& dir, int rank) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  std::FILE* f = std::fopen(PresenceMark(dir, rank).c_str(), "w");
  if (f == nullptr) return ErrnoError("cannot write " + PresenceMark(dir, rank).string(), errno);
  std::fclose(f);
  return Status::Ok();
}

// Waits until every process of the check has said it is here, for at most `timeout`: a neighbour
// that a loaded host started late is no dead link.
Status AwaitNeighbours(const std::string& dir, int world, std::chrono::milliseconds timeout) {
  const auto end = Clock::now() + timeout;
  std::error_code ec;
  for (int r = 0; r < world; ++r) {
    while (!std::filesystem::exists(PresenceMark(dir, r), ec)) {
      if (Clock::now() > end)
        return {StatusCode::kDeadlineExceeded,
                "self-check rank " + std::to_string(r) + " did not start within " +
                    std::to_string(timeout.count()) + " ms (" + dir + ")"};
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  return Status::Ok();
}

// GEMM throughput: 256^3 single precision, repeated for `seconds`, stretched by `slow`.
double MeasureGemm(double seconds, double slow) {
  constexpr int kN = 256;
  constexpr size_t kElems = static_cast<size_t>(kN) * kN;
  std::vector<float> a(kElems, 0.5f), b(kElems, 0.25f), c(kElems);
  int64_t reps = 0;
  const auto g0 = Clock::now();
  while (Seconds(g0, Clock::now()) < seconds) {
    kernels::Gemm(false, false, kN, kN, kN, 1.0f, a.data(), b.data(), 0.0f, c.data());
    ++reps;
  }
  double gemm_s = Seconds(g0, Clock::now());
  if (slow > 1) {
    Burn(gemm_s * (slow - 1));
    gemm_s *= slow;
  }
  return 2.0 * kN * kN * kN * static_cast<double>(reps) / gemm_s / 1e9;
}

std::string Stalled(const char* what, int ms) {
  return std::string(what) + " moved nothing with its neighbour within " + std::to_string(ms) +
         " ms: the link is dead or crawls";
}

// All-reduce bandwidth with the neighbour (GB/s, stretched by `slow`): a warm-up, then
// allreduce_iters timed ones, each watched for `op_ms`, all of them for the floor.
Result<double> MeasureAllReduce(Communicator& comm, const SelfCheckOptions& o, int op_ms,
                                double slow, StallWatch* watch) {
  std::vector<float> buf(o.allreduce_bytes / 4, 1.0f);
  const int world_group = comm.Find(GroupKind::kWorld);
  const std::string op_stalled = Stalled("an all-reduce", op_ms);
  // The floor: all-reduces that have run longer than their bytes take at half of it (0.5 s at
  // least) are a link that crawls, and the controller would fail the check on its figure anyway.
  auto phase_end = Clock::time_point::max();
  std::string under_floor;
  if (o.min_allreduce_gbps > 0) {
    const double bytes = static_cast<double>(o.allreduce_bytes) * (o.allreduce_iters + 1);
    const double budget_s = std::max(0.5, bytes / (0.5e9 * o.min_allreduce_gbps));
    phase_end = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                   std::chrono::duration<double>(budget_s));
    std::string line = tracer::Format(
        "the all-reduces with its neighbour moved under half of the %.3f GB/s floor "
        "(%.0f ms for their %.1f MB): the link crawls",
        o.min_allreduce_gbps, 1e3 * budget_s, bytes / 1e6);
    under_floor = line;
  }
  auto all_reduce = [&] {
    const auto op_end = Clock::now() + std::chrono::milliseconds(op_ms);
    if (phase_end < op_end) {
      watch->Begin(under_floor.c_str(), phase_end);
    } else {
      watch->Begin(op_stalled.c_str(), op_end);
    }
    Status s = comm.AllReduce(world_group, buf.data(), buf.size(), ReduceOp::kSum);
    watch->Clear();
    return s;
  };
  Status st = all_reduce();  // warm-up
  const auto r0 = Clock::now();
  for (int i = 0; i < o.allreduce_iters && st.ok(); ++i) st = all_reduce();
  double ar_s = Seconds(r0, Clock::now());
  if (slow > 1 && st.ok()) {
    Burn(ar_s * (slow - 1));
    ar_s *= slow;
  }
  if (st.ok()) st = comm.Barrier(world_group);
  RETURN_IF_ERROR(st);
  return static_cast<double>(o.allreduce_bytes) * o.allreduce_iters / ar_s / 1e9;
}

}  // namespace

int RemoveStaleSelfCheckRings(const std::string& dir) {
  // "megascope.selfcheck-": the rings' names up to the pid (RingFilePrefix ends in a '.').
  std::string prefix = tracer::RingFilePrefix(std::string(kSelfCheckJob));
  prefix.pop_back();
  int removed = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string digits =
        name.substr(prefix.size(), name.find('.', prefix.size()) - prefix.size());
    if (digits.empty() || digits.size() > 9 ||
        digits.find_first_not_of("0123456789") != std::string::npos)
      continue;
    const pid_t pid = std::stoi(digits);
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;  // alive (or not ours to judge)
    removed += ::unlink(e.path().c_str()) == 0 ? 1 : 0;
  }
  return removed;
}

Result<SelfCheckResult> RunSelfCheck(const SelfCheckOptions& o) {
  if (o.rank < 0 || o.rank >= o.world)
    return InvalidArgument("self-check rank must be in [0, world)");
  RETURN_IF_ERROR(MarkPresent(o.dir, o.rank));
  kernels::SetBlasThreads(1);
  const double slow = InjectedSlowdown();
  SelfCheckResult out;
  out.gemm_gflops = MeasureGemm(o.gemm_seconds, slow);
  if (o.on_gemm) o.on_gemm(out.gemm_gflops);

  // All-reduce with the neighbour.
  Layout layout{o.world, 1, 1};
  // A self-check records nothing: it makes no ring (older versions made one; leftovers of those
  // killed mid-check are cleared here).
  RemoveStaleSelfCheckRings("/dev/shm");
  CommFaults faults(nullptr);  // a node's slowed link slows its self-check too
  GlooOptions go;
  go.rendezvous_dir = o.dir;
  go.timeout = std::chrono::milliseconds(o.timeout_ms);
  go.connect_timeout = std::chrono::milliseconds(std::min(o.connect_timeout_ms, o.timeout_ms));
  go.faults = &faults;
  StallWatch watch(o.exit_when_stalled);
  const int probe_ms = std::min(o.connect_timeout_ms, o.timeout_ms);
  // The connect deadline counts once both ends are there; a neighbour that never starts fails
  // the check as a link that never connects did before (its host is gone).
  RETURN_IF_ERROR(AwaitNeighbours(o.dir, o.world,
                                  std::chrono::milliseconds(std::min(2 * probe_ms, o.timeout_ms))));
  const std::string connect_stalled = Stalled("connecting", probe_ms);
  watch.Begin(connect_stalled.c_str(), Clock::now() + std::chrono::milliseconds(probe_ms));
  auto transport = CreateGlooCommunicator(o.rank, layout, go);
  watch.Clear();
  if (!transport.ok()) return transport.status();
  std::unique_ptr<Communicator> comm = DelayLinks(std::move(*transport), &faults);
  ASSIGN_OR_RETURN(out.allreduce_gbps,
                   MeasureAllReduce(*comm, o, std::min(2 * probe_ms, o.timeout_ms), slow, &watch));
  return out;
}

}  // namespace megascope::runtime
