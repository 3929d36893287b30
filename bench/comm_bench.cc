// The host cost of a traced op: the same op through a communicator stack with and without the
// tracing decorator (comm.h), side by side in one run. Two transports: one that finishes every op
// at once (so the difference is the decorator alone: the record's enqueue, start, progress and
// completion, its observer, the Work), and real Gloo on a one-rank group (what an op costs the host
// before any byte leaves). The ring is drained as the agent would.
// Run: bench/run.sh comm   (results in bench/results/comm_bench.txt)
#include <benchmark/benchmark.h>

#include <filesystem>

#include "bench_tracer.h"
#include "megascope/runtime/comm.h"

namespace megascope::runtime {
namespace {

// Every op over before Post returns, as a transport with nothing to move would be.
class InstantTransport final : public Communicator {
 public:
  InstantTransport() { groups_.push_back({"dp.0.0", GroupKind::kDp, {0}}); }
  const std::vector<GroupSpec>& groups() const override { return groups_; }
  std::unique_ptr<Work> Post(const CommOp& op, std::shared_ptr<OpObserver> obs) override {
    if (obs != nullptr) {
      obs->Started();
      obs->Moved(static_cast<int64_t>(op.bytes()), static_cast<int64_t>(op.bytes()));
      obs->Finished(true);
    }
    return DoneWork(Status::Ok());
  }
  void Abort() override {}

 private:
  std::vector<GroupSpec> groups_;
};

std::unique_ptr<Communicator> Gloo() {
  GlooOptions o;
  o.rendezvous_dir = "/tmp/megascope-comm-bench-" + std::to_string(::getpid());
  auto c = CreateGlooCommunicator(0, Layout{1, 1, 1}, o);
  if (!c.ok()) {
    std::fprintf(stderr, "%s\n", c.status().ToString().c_str());
    std::abort();
  }
  return std::move(*c);
}

// state.range(0): 0 instant, 1 Gloo; state.range(1): 1 traced.
void BM_AllReduceOneFloat(benchmark::State& state) {
  auto tracer = tracer::MakeTracer(1 << 16);
  tracer::BackgroundDrain drain(tracer->ring().path());
  std::unique_ptr<Communicator> c =
      state.range(0) == 0 ? std::make_unique<InstantTransport>() : Gloo();
  if (state.range(1) == 1) c = std::move(TraceCommunicator(std::move(c), tracer.get())).value();
  const int group = c->Find(state.range(0) == 0 ? GroupKind::kDp : GroupKind::kWorld);
  float x = 1.0f;
  for (auto _ : state) {
    if (!c->AllReduce(group, &x, 1, ReduceOp::kSum).ok()) state.SkipWithError("all-reduce failed");
    benchmark::DoNotOptimize(x);
  }
  state.SetLabel(std::string(state.range(0) == 0 ? "instant" : "gloo") +
                 (state.range(1) == 1 ? " traced" : " untraced"));
  state.counters["dropped_frac"] =
      static_cast<double>(drain.Dropped()) / static_cast<double>(state.iterations());
  if (state.range(0) == 1) {
    std::filesystem::remove_all("/tmp/megascope-comm-bench-" + std::to_string(::getpid()));
  }
}
// Interleaved: untraced then traced, per transport, so drift hits both alike.
BENCHMARK(BM_AllReduceOneFloat)->Args({0, 0})->Args({0, 1})->Args({1, 0})->Args({1, 1});

}  // namespace
}  // namespace megascope::runtime

BENCHMARK_MAIN();
