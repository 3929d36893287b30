// Tracer hot-path costs: recording a span, a collective state change, and draining records.
// Targets (issue 2): span median <= 25 ns, state change <= 50 ns, drain >= 20 M records/s/core.
// Run: bench/run.sh tracer   (results in bench/results/tracer_bench.txt)
#include <benchmark/benchmark.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>
#include <vector>

#include "bench_tracer.h"

namespace megascope::tracer {
namespace {

// The floor: one TSC read.
void BM_ReadTsc(benchmark::State& state) {
  auto clock = MakeDefaultClock();
  for (auto _ : state) benchmark::DoNotOptimize(clock->Ticks());
  state.SetLabel(clock->Name());
}
BENCHMARK(BM_ReadTsc);

// A whole span: two clock reads (begin, end) and one record pushed.
void BM_RecordSpan(benchmark::State& state) {
  auto t = MakeTracer(1 << 16);
  NameId name = *t->InternName("forward");
  BackgroundDrain drain(t->ring().path());
  int64_t step = 0;
  for (auto _ : state) {
    Tracer::Span s = t->BeginSpan(SpanKind::kForward, name, step++, 0);
    t->EndSpan(s);
  }
  state.counters["dropped_frac"] =
      static_cast<double>(drain.Dropped()) / static_cast<double>(state.iterations());
  state.SetLabel(t->clock().Name());
}
BENCHMARK(BM_RecordSpan);

// One collective's life: enqueue, start, complete (three state changes, one record pushed).
void BM_CollectiveStateChange(benchmark::State& state) {
  auto t = MakeTracer(1 << 16);
  std::vector<int32_t> ranks = {0, 1};
  GroupId g = *t->RegisterGroup("tp.0.0", "tp", ranks);
  BackgroundDrain drain(t->ring().path());
  for (auto _ : state) {
    OpHandle h = t->Enqueue(g, OpType::kAllreduce, 4096, DType::kF32);
    t->Start(h);
    t->Complete(h);
  }
  state.counters["state_changes"] = benchmark::Counter(3, benchmark::Counter::kAvgIterations);
  state.counters["dropped_frac"] =
      static_cast<double>(drain.Dropped()) / static_cast<double>(state.iterations());
}
BENCHMARK(BM_CollectiveStateChange);

// Draining a full ring on one core (records copied out in batches of 4096 and committed).
void BM_Drain(benchmark::State& state) {
  constexpr uint32_t kCap = 1 << 20;
  auto t = MakeTracer(kCap);
  auto reader = std::move(RingReader::Attach(t->ring().path(), RingReader::Mode::kConsume)).value();
  std::vector<Record> buf(4096);
  Record r{};
  r.span.type = RecordType::kSpan;
  uint64_t drained = 0;
  for (auto _ : state) {
    state.PauseTiming();
    for (uint32_t i = 0; i < kCap; ++i) t->ring().Push(r);
    state.ResumeTiming();
    size_t n;
    while ((n = reader->Drain(buf)) > 0) drained += n;
  }
  state.SetItemsProcessed(static_cast<int64_t>(drained));
  state.SetBytesProcessed(static_cast<int64_t>(drained * sizeof(Record)));
}
BENCHMARK(BM_Drain)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace megascope::tracer

BENCHMARK_MAIN();
