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
  // `what` must outlive the phase; Clear() ends it.
  void Begin(const char* what, int timeout_ms) {
    what_.store(what);
    deadline_ns_.store(NowNs() + int64_t{timeout_ms} * 1'000'000);
    timeout_ms_.store(timeout_ms);
  }
  void Clear() { deadline_ns_.store(0); }

 private:
  static int64_t NowNs() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
        .count();
  }
  void Watch() {
    while (!done_.load()) {
      const int64_t d = deadline_ns_.load();
      if (d > 0 && NowNs() > d) {
        std::fprintf(stderr,
                     "megascope self-check: %s moved nothing with its neighbour within %d ms: "
                     "the link is dead or crawls\n",
                     what_.load(), timeout_ms_.load());
        std::_Exit(1);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  std::atomic<bool> done_{false};
  std::atomic<int64_t> deadline_ns_{0};
  std::atomic<int> timeout_ms_{0};
  std::atomic<const char*> what_{""};
  std::thread thread_;
};

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
  kernels::SetBlasThreads(1);
  const double slow = InjectedSlowdown();
  SelfCheckResult out;
  // GEMM: 256^3 single precision, repeated for gemm_seconds.
  constexpr int kN = 256;
  constexpr size_t kElems = static_cast<size_t>(kN) * kN;
  std::vector<float> a(kElems, 0.5f), b(kElems, 0.25f), c(kElems);
  int64_t reps = 0;
  const auto g0 = Clock::now();
  while (Seconds(g0, Clock::now()) < o.gemm_seconds) {
    kernels::Gemm(false, false, kN, kN, kN, 1.0f, a.data(), b.data(), 0.0f, c.data());
    ++reps;
  }
  double gemm_s = Seconds(g0, Clock::now());
  if (slow > 1) {
    Burn(gemm_s * (slow - 1));
    gemm_s *= slow;
  }
  out.gemm_gflops = 2.0 * kN * kN * kN * static_cast<double>(reps) / gemm_s / 1e9;

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
  watch.Begin("connecting", probe_ms);
  auto transport = CreateGlooCommunicator(o.rank, layout, go);
  watch.Clear();
  if (!transport.ok()) return transport.status();
  std::unique_ptr<Communicator> comm = DelayLinks(std::move(*transport), &faults);
  std::vector<float> buf(o.allreduce_bytes / 4, 1.0f);
  const int world_group = comm->Find("world");
  auto all_reduce = [&] {
    watch.Begin("an all-reduce", probe_ms);
    Status s = comm->AllReduce(world_group, buf.data(), buf.size(), ReduceOp::kSum);
    watch.Clear();
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
  if (st.ok()) st = comm->Barrier(world_group);
  RETURN_IF_ERROR(st);
  out.allreduce_gbps = static_cast<double>(o.allreduce_bytes) * o.allreduce_iters / ar_s / 1e9;
  return out;
}

}  // namespace megascope::runtime
