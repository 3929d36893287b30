// One rank of a training job.
#include <malloc.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "megascope/kernels/cpu.h"
#include "megascope/launch/process.h"
#include "megascope/launch/progress.h"
#include "megascope/runtime/comm.h"
#include "megascope/runtime/data.h"
#include "megascope/runtime/optimizer.h"
#include "megascope/runtime/schedule.h"
#include "megascope/runtime/train.h"
#include "megascope/tracer/dump.h"
#include "megascope/tracer/file_util.h"
#include "megascope/tracer/span_timer.h"
#include "megascope/tracer/tracer.h"
#include "state.h"

namespace megascope::runtime {
namespace {

namespace fs = std::filesystem;
using tracer::Phase;

using tracer::SpanKind;

// Busy work standing in for extra compute (the slow fault): it burns CPU like a slow GPU would.
void BurnSeconds(double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  volatile double x = 1;
  while (std::chrono::steady_clock::now() < end) {
    for (int i = 0; i < 10000; ++i) x = x * 1.0000001 + 1e-9;
  }
}

// A stop (SIGTERM from the launcher: a person's stop, or peers gone) lets the state writes in
// flight finish, as a user stopping a job expects of its newest checkpoint: RunWorker's stop thread
// waits for them (WaitForWritesInFlight, bounded by the launcher's grace) before the process exits.
std::atomic<bool> g_stop_requested{false};
int g_stop_fd = -1;  // an eventfd the SIGTERM handler wakes the stop thread with

std::atomic<bool> g_orphaned{false};  // the stop is the launcher's death (SIGHUP), not a stop

extern "C" void OnStopSignal(int sig) {  // async-signal-safe: lock-free stores and a write(2)
  if (sig == SIGHUP) g_orphaned.store(true);
  g_stop_requested.store(true);
  const uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = ::write(g_stop_fd, &one, sizeof(one));
}

// A rank whose launcher is gone (killed: the kernel sends the parent-death signal, SIGHUP) leaves
// nothing in host memory, which is RAM on a real node and which no one would restart from: its
// snapshots become disk checkpoints (a relaunch adopts the run from them) and their files go.
struct OrphanState {
  RunLayout layout;
  std::vector<std::string> memory_dirs;
  std::string memory_root;
  // This rank's trace ring (its agent, stopped too, keeps reading what it has mapped).
  std::string ring;
  int rank = 0, world = 1;
};
std::atomic<const OrphanState*> g_orphan{nullptr};  // set once the configuration is read
std::atomic<bool> g_training_over{false};           // the training thread wrote its last state

void MoveStateOutOfMemoryIfOrphaned() {
  const OrphanState* o = g_orphan.load();
  if (o == nullptr || !g_orphaned.load()) return;  // a stop from a live launcher: it resumes
  // The step in flight ends (its peers stop too, so a collective fails fast) and snapshots its
  // state; a rank stuck for good is not waited for past 10 s.
  for (int i = 0; i < 1000 && !g_training_over.load(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  WaitForWritesInFlight();
  auto log =
      launch::PersistMemoryShards(o->layout, o->memory_dirs, o->memory_root, o->rank, o->world);
  std::error_code ec;
  std::filesystem::remove(o->ring, ec);
  std::fprintf(stderr, "[worker] rank %d: the launcher is gone; %s", o->rank,
               log.ok()
                   ? log->c_str()
                   : ("its state stays in host memory: " + log.status().ToString() + "\n").c_str());
}

class Worker {
 public:
  Worker(TrainConfig cfg, int rank) : cfg_(std::move(cfg)), rank_(rank), layout_(cfg_.run_dir) {}
  ~Worker() {
    // The dumper's thread first: a SIGUSR1 that arrives while a failed rank unwinds (the
    // controller asks every rank for its dump) must not write to a dump path already freed.
    dumper_.reset();
    stop_ = true;
    if (beat_.joinable()) beat_.join();
    state_.Join();
    if (prefetch_.valid()) prefetch_.wait();
  }

  int Run() {
    kernels::SetBlasThreads(1);
    Status st = Setup();
    if (!st.ok()) {
      std::fprintf(stderr, "[worker] rank %d: setup failed: %s\n", rank_, st.ToString().c_str());
      // Bad input (the data file not a token file, or cut short; the config) or a name held by a
      // live process (another launch with this job name): no machine could do better.
      const bool job = st.code() == StatusCode::kInvalidArgument ||
                       st.code() == StatusCode::kDataLoss ||
                       st.code() == StatusCode::kAlreadyExists;
      return job ? kExitJobError : unreachable_ ? kExitUnreachable : kExitSetup;
    }
    for (int64_t step = start_step_; step < cfg_.steps; ++step) {
      if (g_stop_requested.load()) {  // no new work once asked to stop; the writes finish
        state_.JoinCheckpoint();
        return kExitStopped;
      }
      if (cfg_.trace_alternate > 0) {
        const StepCost c = MeasuredStep(step, &st);
        step_costs_ += std::to_string(step) + "," + (c.traced ? "1," : "0,") +
                       std::to_string(c.wall_ns) + "," + std::to_string(c.cpu_ns) + "\n";
      } else {
        st = Step(step);
      }
      if (!st.ok()) return Fail(step, st);
    }
    if (cfg_.trace_alternate > 0) {
      st = tracer::WriteFileAtomic(layout_.step_costs(rank_),
                                   "step,traced,wall_ns,cpu_ns\n" + step_costs_);
      if (!st.ok()) {  // the training itself went well: no flight-recorder dump, no comm failure
        std::fprintf(stderr, "[worker] rank %d: %s\n", rank_, st.ToString().c_str());
        return kExitSetup;
      }
    }
    state_.Join();
    timer_->Flush();
    tracer_->SetPhase(cfg_.steps, Phase::kDone);
    stop_ = true;
    if (beat_.joinable()) beat_.join();
    std::fprintf(stderr, "[worker] rank %d: finished %lld steps; %s\n", rank_,
                 static_cast<long long>(cfg_.steps),
                 launch::Describe(launch::SelfCpuTime()).c_str());
    return kExitOk;
  }

 private:
  // The rank's ring, its SIGUSR1 dumper, its heartbeat thread and the names its records use.
  Status StartTracing() {
    const Layout& l = cfg_.layout;
    tracer::RingOptions ro;
    ro.dir = cfg_.shm_dir;
    ro.job = cfg_.job;
    ro.node = cfg_.NodeOf(rank_);
    ro.rank = rank_;
    ro.world_size = l.world();
    ro.local_rank = cfg_.LocalRankOf(rank_);
    ro.attempt = cfg_.attempt;
    ro.coords = coords_;
    ASSIGN_OR_RETURN(tracer_, tracer::Tracer::Create(ro));
    tracer_->set_enabled(cfg_.trace);
    dump_path_ = layout_.dump(cfg_.attempt, rank_);
    ASSIGN_OR_RETURN(dumper_, tracer::SignalDumper::Start([this] {
                       (void)tracer_->WriteDump(dump_path_, /*stacks=*/true);
                     }));
    beat_ =
        std::thread([this] {  // liveness and clock calibration, independent of the training thread
          for (int i = 0; !stop_; ++i) {
            tracer_->Touch();
            if (i % 50 == 49) tracer_->Recalibrate();
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
          }
        });
    tracer_->SetPhase(0, Phase::kInit);
    for (const char* n :
         {"data", "forward", "backward", "optimizer", "checkpoint", "grad_sync", "fault", "step",
          "step_seconds", "tokens_per_second", "loss", "snapshot"}) {
      ASSIGN_OR_RETURN(tracer::NameId id, tracer_->InternName(n));
      names_[n] = id;
    }
    return Status::Ok();
  }

  // The job's compute backend on this rank, and what times its compute spans.
  Status StartKernels() {
    kernels::Backend backend = kernels::Backend::kCpu;
    (void)kernels::ParseBackend(cfg_.device, &backend);  // validated with the config
    std::string why;
    const int ordinal = cfg_.cuda_device + (cfg_.comm == "nccl" ? cfg_.LocalRankOf(rank_) : 0);
    kernels_ = kernels::CreateKernels(backend, ordinal, &why);
    if (kernels_ == nullptr)  // this machine cannot run the job's backend: not the job's fault
      return FailedPrecondition("--device " + cfg_.device + ": " + why);
    if (backend == kernels::Backend::kCuda) {  // compute spans say when the device did the work
      timer_ = tracer::CreateCudaSpanTimer(tracer_.get(), kernels_->stream(), 4096, &why);
      if (timer_ == nullptr)
        std::fprintf(stderr, "[worker] rank %d: CUDA-event timing unavailable (%s): host clock\n",
                     rank_, why.c_str());
    }
    if (timer_ == nullptr) timer_ = tracer::CreateHostSpanTimer(tracer_.get());
    if (backend != kernels::Backend::kCpu) {
      std::fprintf(stderr, "[worker] rank %d: computing on %s; compute spans timed by %s\n", rank_,
                   kernels_->device_name().c_str(), timer_->name().c_str());
    }
    return Status::Ok();
  }

  // The training data, checked against the model.
  Status OpenData() {
    ASSIGN_OR_RETURN(data_, TokenFile::Open(cfg_.data));
    if (data_.max_token() >= cfg_.model.vocab) {
      return InvalidArgument(cfg_.data + " holds token " + std::to_string(data_.max_token()) +
                             ", outside the model's vocabulary of " +
                             std::to_string(cfg_.model.vocab));
    }
    if (data_.size() < static_cast<size_t>(cfg_.model.seq) + 2)
      return InvalidArgument(cfg_.data + " is shorter than one sequence");
    return Status::Ok();
  }

  Status Setup() {
    const Layout& l = cfg_.layout;
    coords_ = l.CoordsOf(rank_);
    RETURN_IF_ERROR(StartTracing());
    GlooOptions go;
    go.rendezvous_dir = layout_.rendezvous(cfg_.attempt);
    go.timeout = std::chrono::milliseconds(cfg_.timeout_ms);
    RETURN_IF_ERROR(StartKernels());
    const auto t_rdzv = std::chrono::steady_clock::now();
    auto comm = Connect(go);
    if (!comm.ok()) {
      // Timed out reaching its peers: the far end or the link as much as this one (the log line
      // names the peer where the transport knows it).
      unreachable_ = comm.status().code() == StatusCode::kUnavailable ||
                     comm.status().code() == StatusCode::kDeadlineExceeded;
      return comm.status();
    }
    comm_ = std::move(comm).value();
    const auto t_load = std::chrono::steady_clock::now();
    model_ = std::make_unique<GptStage>(cfg_.model, l, rank_, comm_.get(), kernels_.get());
    m_ = kernels::Buffer<float>(kernels_.get(), model_->count());
    v_ = kernels::Buffer<float>(kernels_.get(), model_->count());
    RETURN_IF_ERROR(OpenData());
    ASSIGN_OR_RETURN(const launch::ResumePoint resume,
                     LoadState(cfg_, layout_, rank_, *kernels_, *model_, m_.data(), v_.data()));
    if (resume.step >= 0) start_step_ = resume.step;
    if (rank_ == ReportingRank()) {
      const auto now = std::chrono::steady_clock::now();
      AppendProgress({{"event", "ready"},
                      {"attempt", cfg_.attempt},
                      {"step", start_step_},
                      {"source", resume.source},
                      {"rendezvous_s", std::chrono::duration<double>(t_load - t_rdzv).count()},
                      {"load_s", std::chrono::duration<double>(now - t_load).count()},
                      {"ts_ns", tracer::WallNowNs()}});
    }
    return Status::Ok();
  }

  // --trace-alternate: blocks of N steps traced and untraced in the order on, off, off, on (each
  // pair of blocks has one of each, and which comes first alternates, so a drift in the machine's
  // speed cancels); the step's wall time and the process's CPU time (every thread: training,
  // prefetch, heartbeat, Gloo's).
  struct StepCost {
    bool traced;
    int64_t wall_ns, cpu_ns;
  };
  StepCost MeasuredStep(int64_t step, Status* st) {
    const int64_t block = step / cfg_.trace_alternate;
    const bool traced = (block % 2 == 0) != ((block / 2) % 2 == 1);
    tracer_->set_enabled(traced);
    auto cpu_now = [] {
      const launch::CpuTime t = launch::SelfCpuTime();
      return static_cast<int64_t>((t.user_s + t.system_s) * 1e9);
    };
    const int64_t c0 = cpu_now();
    const auto w0 = std::chrono::steady_clock::now();
    *st = Step(step);
    const auto w1 = std::chrono::steady_clock::now();
    return {traced, std::chrono::duration_cast<std::chrono::nanoseconds>(w1 - w0).count(),
            cpu_now() - c0};
  }

  int Fail(int64_t step, const Status& st) {
    std::fprintf(stderr, "[worker] rank %d: step %lld failed: %s\n", rank_,
                 static_cast<long long>(step), st.ToString().c_str());
    Status d = tracer_->WriteDump(dump_path_);
    std::fprintf(stderr, "[worker] rank %d: flight recorder dumped to %s%s\n", rank_,
                 dump_path_.c_str(), d.ok() ? "" : (" (failed: " + d.ToString() + ")").c_str());
    std::fflush(stderr);
    // Peers are gone or stuck: wait for nothing on the way out but this rank's own state writes.
    WaitForWritesInFlight();
    _exit(g_stop_requested.load() ? kExitStopped : kExitCommFailure);  // stopped: its peers too
  }

  // The fault of `kind` aimed at this rank for `step`; its first firing is announced on the
  // progress stream (the controller times detection from it).
  const Fault* FaultAt(launch::WorkerFaultKind kind, int64_t step) {
    for (const Fault& f : cfg_.faults) {
      const bool from_on = kind == launch::WorkerFaultKind::kSlow;
      if (f.kind == kind && f.rank == rank_ && (from_on ? step >= f.step : step == f.step)) {
        if (!fault_announced_) {
          fault_announced_ = true;
          AppendProgress({{"event", "fault"},
                          {"kind", launch::Name(f.kind)},
                          {"rank", rank_},
                          {"node", cfg_.NodeOf(rank_)},
                          {"step", step},
                          {"attempt", cfg_.attempt},
                          {"ts_ns", tracer::WallNowNs()}});
        }
        return &f;
      }
    }
    return nullptr;
  }
  // The communicator stack, chosen here and nowhere else (comm.h): a transport, every op traced,
  // the link seam outermost (a held link makes the rank late to the op, not the op slow).
  Result<std::unique_ptr<Communicator>> Connect(const GlooOptions& go) {
    faults_ = std::make_unique<CommFaults>(tracer_.get());
    std::unique_ptr<Communicator> transport;
    if (cfg_.comm == "nccl") {
      NcclOptions no;
      no.rendezvous_dir = go.rendezvous_dir;
      no.timeout = go.timeout;
      no.stream = kernels_->stream();
      ASSIGN_OR_RETURN(transport, CreateNcclCommunicator(rank_, cfg_.layout, no));
    } else {
      GlooOptions o = go;
      o.faults = faults_.get();
      ASSIGN_OR_RETURN(transport, CreateGlooCommunicator(rank_, cfg_.layout, o));
      transport = StageThroughHost(std::move(transport), kernels_.get());
    }
    ASSIGN_OR_RETURN(auto traced, TraceCommunicator(std::move(transport), tracer_.get()));
    return DelayLinks(std::move(traced), faults_.get());
  }

  int ReportingRank() const { return cfg_.layout.RankOf({0, cfg_.layout.pp - 1, 0}); }

  struct Batches {
    std::vector<std::vector<int32_t>> inputs, targets;  // per microbatch
  };
  // The step's batches: read ahead during the previous step, and the next step's read ahead now.
  Batches StepData(int64_t step) {
    tracer_->SetPhase(step, Phase::kData);
    tracer::Tracer::Scope span(tracer_.get(), SpanKind::kData, names_["data"], step);
    Batches batch = prefetch_.valid() ? prefetch_.get() : LoadBatches(step);
    if (step + 1 < cfg_.steps) {  // the next step's batch is read while this one trains
      prefetch_ = std::async(std::launch::async, [this, step] { return LoadBatches(step + 1); });
    }
    return batch;
  }

  // The faults injected at the start of a step: a crash, a slow step (returns the seconds it
  // burned), a send armed to stall.
  double InjectStepFaults(int64_t step) {
    if (FaultAt(launch::WorkerFaultKind::kCrash, step)) {
      std::fprintf(stderr, "[worker] rank %d: injected crash at step %lld\n", rank_,
                   static_cast<long long>(step));
      std::fflush(stderr);
      std::abort();
    }
    double burned = 0;
    if (const Fault* f = FaultAt(launch::WorkerFaultKind::kSlow,
                                 step)) {  // extra compute, as a slow GPU would take
      tracer::Tracer::Scope span(tracer_.get(), SpanKind::kCompute, names_["fault"], step);
      // A factor slows the rank's work as a throttled GPU would: the extra is (factor - 1) times
      // what its previous step took without the fault.
      burned = f->seconds + (f->factor > 1 ? (f->factor - 1) * last_unslowed_s_ : 0);
      BurnSeconds(burned);
    }
    if (FaultAt(launch::WorkerFaultKind::kStallSend, step)) faults_->ArmSendStall();
    return burned;
  }

  // The step's microbatches through the pipeline in 1F1B order (schedule.h). The last stage sums
  // the loss into `loss_sum`.
  Status Pipeline(int64_t step, Batches& batch, float scale, double* loss_sum) {
    const int m = cfg_.microbatches, stage = coords_.pp, P = cfg_.layout.pp;
    const int64_t mb_size = cfg_.global_batch / cfg_.layout.dp / m;
    const size_t act = static_cast<size_t>(mb_size) * cfg_.model.seq * cfg_.model.width;
    kernels::Buffer<float> buf_in(kernels_.get(), act), buf_out(kernels_.get(), act),
        grad_in(kernels_.get(), act), grad_out(kernels_.get(), act);
    auto forward = [&](int k) -> Status {
      tracer_->SetPhase(step, Phase::kForward);
      if (stage > 0)
        RETURN_IF_ERROR(comm_->Recv(PpGroup(), PeerStage(stage - 1), buf_in.data(), act));
      if (k == 0 && FaultAt(launch::WorkerFaultKind::kHang, step)) Hang(step);
      {
        tracer::SpanTimer::Scope span(timer_.get(), SpanKind::kForward, names_["forward"], step, k);
        RETURN_IF_ERROR(model_->Forward(k, static_cast<int>(mb_size), batch.inputs[k].data(),
                                        buf_in.data(), batch.targets[k].data(), buf_out.data(),
                                        loss_sum));
      }
      if (stage < P - 1)
        RETURN_IF_ERROR(comm_->Send(PpGroup(), PeerStage(stage + 1), buf_out.data(), act));
      if (k == 0 && FaultAt(launch::WorkerFaultKind::kFreeze, step)) Freeze(step);
      return Status::Ok();
    };
    auto backward = [&](int k) -> Status {
      tracer_->SetPhase(step, Phase::kBackward);
      if (stage < P - 1)
        RETURN_IF_ERROR(comm_->Recv(PpGroup(), PeerStage(stage + 1), grad_in.data(), act));
      {
        tracer::SpanTimer::Scope span(timer_.get(), SpanKind::kBackward, names_["backward"], step,
                                      k);
        RETURN_IF_ERROR(model_->Backward(k, grad_in.data(), grad_out.data(), scale));
      }
      if (stage > 0)
        RETURN_IF_ERROR(comm_->Send(PpGroup(), PeerStage(stage - 1), grad_out.data(), act));
      return Status::Ok();
    };
    for (const PipelinePass& pass : OneFOneB(m, stage, P))
      RETURN_IF_ERROR(pass.forward ? forward(pass.microbatch) : backward(pass.microbatch));
    return comm_->WaitSends();
  }

  // A checkpoint where one is due or asked for, and the every-step snapshot in memory: the
  // seconds the snapshot took.
  double SaveState(int64_t step) {
    if (RequestedCheckpoint() == step + 1 ||
        (cfg_.checkpoint_every > 0 && (step + 1) % cfg_.checkpoint_every == 0 &&
         step + 1 < cfg_.steps)) {
      tracer_->SetPhase(step, Phase::kCheckpoint);
      tracer::Tracer::Scope span(tracer_.get(), SpanKind::kCheckpoint, names_["checkpoint"], step);
      state_.Checkpoint(step + 1,
                        EncodeState(*kernels_, *model_, m_.data(), v_.data(), step + 1, rank_));
    }
    if (!cfg_.memory_snapshots) return 0;
    tracer::Tracer::Scope span(tracer_.get(), SpanKind::kCheckpoint, names_["snapshot"], step);
    const auto s0 = std::chrono::steady_clock::now();
    state_.Snapshot(step + 1,
                    EncodeState(*kernels_, *model_, m_.data(), v_.data(), step + 1, rank_));
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count();
  }

  Status Step(int64_t step) {
    const auto t0 = std::chrono::steady_clock::now();
    faults_->set_step(step);
    const int T = cfg_.model.seq;
    Batches batch = StepData(step);
    const double burned = InjectStepFaults(step);
    double loss_sum = 0;
    const float scale = 1.0f / static_cast<float>(cfg_.global_batch * T);
    RETURN_IF_ERROR(Pipeline(step, batch, scale, &loss_sum));
    tracer_->SetPhase(step, Phase::kOptimizer);
    float grad_norm = 0;
    {
      tracer::SpanTimer::Scope span(timer_.get(), SpanKind::kOptimizer, names_["optimizer"], step);
      ASSIGN_OR_RETURN(grad_norm, SyncGradientsAndStep(cfg_, *comm_, *kernels_, *model_, m_.data(),
                                                       v_.data(), step));
    }
    // The loss: summed over microbatches on the last stage, then over data-parallel replicas.
    double loss = NAN;
    if (model_->last()) {
      float sum = static_cast<float>(loss_sum);
      if (cfg_.layout.dp > 1)
        RETURN_IF_ERROR(comm_->AllReduce(comm_->Find(GroupKind::kDp), &sum, 1, ReduceOp::kSum));
      loss = sum * scale;
    }
    const double snapshot_s = SaveState(step);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    last_unslowed_s_ = secs - burned;
    tracer_->RecordMetric(names_["step_seconds"], secs);
    tracer_->RecordMetric(names_["tokens_per_second"],
                          static_cast<double>(cfg_.global_batch) * T / secs);
    if (model_->last()) tracer_->RecordMetric(names_["loss"], loss);
    tracer_->RecordMetric(names_["step"], static_cast<double>(step + 1));
    if (rank_ == ReportingRank()) Report(step, loss, secs, grad_norm, snapshot_s);
    return Status::Ok();
  }

  // A checkpoint on request: RUN_DIR/checkpoint.request holds the step after which to save. A
  // file rather than a signal, so that every rank saves the same step.
  int64_t RequestedCheckpoint() {
    struct stat st {};
    const std::string path = cfg_.run_dir + "/checkpoint.request";
    if (::stat(path.c_str(), &st) != 0) return -1;
    if (st.st_mtim.tv_sec != request_mtime_.tv_sec ||
        st.st_mtim.tv_nsec != request_mtime_.tv_nsec) {
      request_mtime_ = st.st_mtim;
      requested_step_ = std::atoll(tracer::ReadFile(path).value_or("").c_str());
    }
    return requested_step_;
  }

  // This rank's share of the step's global batch, split into microbatches.
  Batches LoadBatches(int64_t step) const {
    const int m = cfg_.microbatches;
    const int64_t local = cfg_.global_batch / cfg_.layout.dp, mb_size = local / m;
    Batches b;
    b.inputs.resize(m);
    b.targets.resize(m);
    for (int k = 0; k < m; ++k) {
      data_.Batch(step, cfg_.global_batch, coords_.dp * local + k * mb_size, mb_size,
                  cfg_.model.seq, &b.inputs[k], &b.targets[k]);
    }
    return b;
  }

  [[noreturn]] void Hang(int64_t step) {
    std::fprintf(
        stderr, "[worker] rank %d: injected hang in compute at step %lld (heartbeat stays alive)\n",
        rank_, static_cast<long long>(step));
    std::fflush(stderr);
    tracer::Tracer::Scope span(tracer_.get(), SpanKind::kCompute, names_["fault"], step);
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }

  // The whole process stops, heartbeat thread included (what uninterruptible sleep or a stuck
  // driver call looks like from outside), its send to the next stage just posted.
  void Freeze(int64_t step) {
    std::fprintf(stderr,
                 "[worker] rank %d: injected freeze at step %lld (SIGSTOP: every thread, the "
                 "heartbeat's too)\n",
                 rank_, static_cast<long long>(step));
    std::fflush(stderr);
    ::raise(SIGSTOP);
  }

  int PpGroup() const { return comm_->Find(GroupKind::kPp); }
  int PeerStage(int stage) const { return cfg_.layout.RankOf({coords_.dp, stage, coords_.tp}); }

  void Report(int64_t step, double loss, double secs, float grad_norm, double snapshot_s) {
    const double tokens = static_cast<double>(cfg_.global_batch) * cfg_.model.seq;
    AppendProgress({{"step", step + 1},
                    {"loss", loss},
                    {"tokens_per_s", tokens / secs},
                    {"step_time_s", secs},
                    {"lr", LearningRate(cfg_, step)},
                    {"grad_norm", grad_norm},
                    {"snapshot_s", snapshot_s},
                    {"attempt", cfg_.attempt},
                    {"ts_ns", tracer::WallNowNs()}});
  }

  // A line of the progress stream. A failed write is said once (on stderr, which may sit on the
  // same full disk: the controller also watches the space and pauses the job) until one succeeds;
  // the lines are kept meanwhile and written, in order, once the disk takes them.
  void AppendProgress(const nlohmann::json& line) {
    const Status st = progress_.Append(line);
    if (!st.ok() && !progress_failing_) {
      std::fprintf(stderr, "[progress] rank %d: %s (kept; written once the disk takes it)\n", rank_,
                   st.ToString().c_str());
    }
    if (st.ok() && progress_failing_) {
      std::fprintf(stderr, "[progress] rank %d: progress lines written again%s\n", rank_,
                   progress_.dropped() > 0 ? " (the oldest kept ones were dropped)" : "");
    }
    progress_failing_ = !st.ok();
  }

  TrainConfig cfg_;
  int rank_;
  tracer::Coords coords_;
  std::unique_ptr<tracer::Tracer> tracer_;
  std::string dump_path_;  // outlives dumper_, whose thread writes it
  std::unique_ptr<tracer::SignalDumper> dumper_;
  std::unique_ptr<kernels::Kernels> kernels_;  // outlives everything that holds its memory
  std::unique_ptr<tracer::SpanTimer> timer_;   // compute spans: host clock or CUDA events
  std::unique_ptr<CommFaults> faults_;         // outlives comm_, which obeys it
  std::unique_ptr<Communicator> comm_;
  bool unreachable_ = false;  // Setup could not connect to its peers (kExitUnreachable)
  std::unique_ptr<GptStage> model_;
  kernels::Buffer<float> m_, v_;  // AdamW's moments
  TokenFile data_;
  std::map<std::string, tracer::NameId> names_;
  std::string step_costs_;  // --trace-alternate: the CSV rows so far
  int64_t start_step_ = 0;
  bool fault_announced_ = false;
  bool progress_failing_ = false;  // the last progress line could not be written
  double last_unslowed_s_ = 0;     // the previous step's time without an injected slowdown
  RunLayout layout_;
  launch::ProgressWriter progress_{layout_.progress()};  // after layout_, which names its file
  std::atomic<bool> stop_{false};
  StateWriter state_{cfg_, layout_, rank_, &stop_};  // after what it reads
  std::thread beat_;
  std::future<Batches> prefetch_;
  timespec request_mtime_{};
  int64_t requested_step_ = -1;
};

}  // namespace

int RunWorker(const std::string& run_dir, int rank) {
  // A peer that dies mid-transfer must fail this rank's collective (an error, exit
  // kExitCommFailure: a victim), not kill it with SIGPIPE: the launcher would name it first.
  ::signal(SIGPIPE, SIG_IGN);
  // SIGTERM (whichever thread it lands on: OpenBLAS's start before us) stops new steps and wakes
  // a thread that lets the checkpoint and snapshot writes in flight finish, then exits.
  g_stop_fd = ::eventfd(0, EFD_CLOEXEC);
  if (g_stop_fd >= 0) {
    struct sigaction sa {};
    sa.sa_handler = &OnStopSignal;
    ::sigemptyset(&sa.sa_mask);
    ::sigaction(SIGTERM, &sa, nullptr);
    ::sigaction(SIGHUP, &sa, nullptr);  // the launcher died (the parent-death signal)
    std::thread([] {
      uint64_t v = 0;
      while (::read(g_stop_fd, &v, sizeof(v)) < 0 && errno == EINTR) {
      }
      WaitForWritesInFlight();
      MoveStateOutOfMemoryIfOrphaned();
      ::_exit(kExitStopped);
    }).detach();
  }
  // Every step allocates and frees the same activations, gradients and messages. By default glibc
  // maps blocks above its mmap threshold afresh and unmaps them on free, and hands the top of the
  // heap back to the kernel once 128 KB of it is free: each step faulted its buffers in again
  // (about 350 page faults a step at the tests' model size, ~10 us each on a paravirtualised VM),
  // and the threshold moves with whatever was freed first, so the same job ran up to a third
  // faster or slower from one process to the next. Fixed, high thresholds keep the freed memory
  // for the next step, as a framework's caching allocator does.
  ::mallopt(M_MMAP_THRESHOLD, 256 << 20);
  ::mallopt(M_TRIM_THRESHOLD, 1 << 30);
  const RunLayout layout(run_dir);
  auto text = tracer::ReadFile(layout.run_json());
  if (!text.ok()) {
    std::fprintf(stderr, "[worker] cannot read the run's configuration: %s\n",
                 text.status().ToString().c_str());
    return kExitSetup;
  }
  auto cfg = TrainConfig::FromJson(*text, layout.run_json());
  if (!cfg.ok()) {
    std::fprintf(stderr, "[worker] %s\n", cfg.status().ToString().c_str());
    return kExitSetup;
  }
  cfg->run_dir = run_dir;
  if (rank < 0 || rank >= cfg->layout.world()) {
    std::fprintf(stderr, "[worker] rank %d is outside world size %d\n", rank, cfg->layout.world());
    return kExitSetup;
  }
  static OrphanState orphan{RunLayout(run_dir),
                            MemoryDirsOf(*cfg, rank),
                            MemoryRoot(cfg->shm_dir, cfg->job),
                            cfg->shm_dir + "/" + tracer::RingFileName(cfg->job, cfg->attempt, rank),
                            rank,
                            cfg->layout.world()};
  g_orphan.store(&orphan);
  int rc = 0;
  {
    Worker w(std::move(cfg).value(), rank);
    rc = w.Run();
  }
  g_training_over.store(true);
  // Stopped: the stop thread ends the process once the state writes are done (and, orphaned, the
  // state is out of memory); a step that failed because its peers stopped first must not cut
  // that short.
  while (g_stop_requested.load() && g_stop_fd >= 0) ::pause();
  return rc;
}

}  // namespace megascope::runtime
