// `megascope train` (start a job), `megascope worker` (one rank; started by train) and
// `megascope prepare-data` (text -> token file).
#include "megascope/runtime/train.h"

#include <unistd.h>

#include <climits>
#include <cstdio>

#include "command.h"
#include "megascope/launch/process.h"
#include "megascope/runtime/data.h"
#include "megascope/runtime/self_check.h"
#include "training_options.h"

namespace megascope::cli {

po::options_description TrainingOptions(runtime::TrainConfig* c_ptr) {
  runtime::TrainConfig& c = *c_ptr;
  po::options_description opts("Training");
  opts.add_options()("dp", po::value(&c.layout.dp)->default_value(1), "data-parallel size")(
      "tp", po::value(&c.layout.tp)->default_value(1),
      "tensor-parallel size (divides heads and vocab)")(
      "pp", po::value(&c.layout.pp)->default_value(1), "pipeline-parallel size (<= layers)")(
      "nodes", po::value(&c.nodes)->default_value(1),
      "simulated nodes the ranks are grouped into (node0..)")(
      "data", po::value(&c.data)->required(), "token file (megascope prepare-data)")(
      "run-dir", po::value(&c.run_dir)->required(),
      "run directory (run.json, logs, checkpoints, dumps)")(
      "job", po::value(&c.job)->default_value("train"), "job name (names the shared-memory rings)")(
      "layers", po::value(&c.model.layers)->default_value(4), "transformer layers")(
      "heads", po::value(&c.model.heads)->default_value(4), "attention heads")(
      "width", po::value(&c.model.width)->default_value(128), "model width")(
      "seq", po::value(&c.model.seq)->default_value(64), "sequence length")(
      "vocab", po::value(&c.model.vocab)->default_value(256), "vocabulary size")(
      "parallel-block", po::bool_switch(&c.model.parallel_block),
      "MegaScale/PaLM parallel attention + MLP block")(
      "seed", po::value(&c.model.seed)->default_value(1234), "initialisation seed")(
      "batch", po::value(&c.global_batch)->default_value(8), "global batch in sequences")(
      "microbatches", po::value(&c.microbatches)->default_value(2),
      "microbatches per replica and step")("steps", po::value(&c.steps)->default_value(20),
                                           "training steps")("lr", Decimal(&c.lr, 1e-3f),
                                                             "peak learning rate")(
      "min-lr", Decimal(&c.min_lr, 1e-4f), "final learning rate of the cosine schedule")(
      "warmup", po::value(&c.warmup)->default_value(5), "warm-up steps")(
      "grad-clip", po::value(&c.grad_clip)->default_value(1.0f),
      "global gradient-norm clip (0: off)")("checkpoint-every",
                                            po::value(&c.checkpoint_every)->default_value(0),
                                            "checkpoint to disk every K steps (0: never)")(
      "keep-checkpoints", po::value(&c.keep_checkpoints)->default_value(3),
      "the newest complete disk checkpoints kept; older ones (and partial ones a crash left) are "
      "removed once a newer one is complete (0: keep every one)")(
      "device", po::value(&c.device)->default_value("cpu"),
      "compute backend: cpu, or cuda (a build with the cuda preset; see --comm for how ranks "
      "share GPUs)")(
      "cuda-device", po::value(&c.cuda_device)->default_value(0),
      "the CUDA device ordinal the ranks use (with --comm nccl: the first; rank r of a node uses "
      "this + its local rank)")(
      "comm", po::value(&c.comm)->default_value("gloo"),
      "transport: gloo (host memory; on cuda through pinned host buffers, so every rank may share "
      "one GPU), or nccl (device memory; --device cuda, one GPU per rank)")(
      "shm-dir", po::value(&c.shm_dir)->default_value("/dev/shm"),
      "where rank rings (and memory snapshots) live")(
      "no-trace", "turn spans and the flight recorder off (to measure what tracing costs)")(
      "trace-alternate", po::value(&c.trace_alternate)->default_value(0),
      "N > 0: tracing on and off in alternating blocks of N steps (on, off, off, on, ...); each "
      "rank writes every step's wall and CPU time to RUN_DIR/ranks/R/step_costs.csv (what "
      "tracing costs, side by side in one run)");
  return opts;
}

int RunTrain(const Args& args) {
  runtime::TrainConfig c;
  std::vector<std::string> faults;
  po::options_description opts("Options");
  opts.add_options()("help,h", "show this help");
  opts.add(TrainingOptions(&c));
  opts.add_options()("timeout", po::value(&c.timeout_ms)->default_value(30000),
                     "collective timeout in milliseconds")(
      "attempt", po::value(&c.attempt)->default_value(0), "attempt number (restarts bump it)")(
      "no-agents", "do not start a megascope agent per node")(
      "fault", po::value(&faults)->composing(),
      "inject a fault: KIND:rank=R,step=S[,seconds=X] with KIND crash, hang, freeze (SIGSTOP), "
      "stall-send, slow or "
      "slow-checkpoint (its disk checkpoints from step S take X s longer) (repeatable)");
  po::variables_map vm;
  if (auto rc = ParseArgs(
          "train",
          "megascope train --dp D --tp T --pp P --nodes N --data DATA.bin --run-dir DIR [options]",
          args, opts, {}, &vm)) {
    return *rc;
  }
  c.trace = vm.count("no-trace") == 0;
  c.agents = vm.count("no-agents") == 0;
  for (const std::string& f : faults) {
    auto parsed = runtime::ParseFault(f);
    if (!parsed.ok()) return Fail("train", parsed.status().message(), kExitUsage);
    c.faults.push_back(*parsed);
  }
  auto exe = launch::SelfExe();
  if (!exe.ok()) return Fail("train", exe.status().message());
  return runtime::RunTraining(c, *exe);
}

int RunWorkerCommand(const Args& args) {
  std::string run_dir;
  int rank = -1;
  po::options_description opts("Options");
  opts.add_options()("help,h", "show this help")("run-dir", po::value(&run_dir)->required(),
                                                 "run directory holding run.json")(
      "rank", po::value(&rank)->required(), "global rank");
  po::variables_map vm;
  if (auto rc = ParseArgs("worker", "megascope worker --run-dir DIR --rank R", args, opts, {}, &vm))
    return *rc;
  return runtime::RunWorker(run_dir, rank);
}

int RunSelfCheckCommand(const Args& args) {
  runtime::SelfCheckOptions o;
  po::options_description opts("Options");
  opts.add_options()("help,h", "show this help")(
      "dir", po::value(&o.dir)->required(),
      "rendezvous directory shared with the neighbour (fresh per check)")(
      "rank", po::value(&o.rank)->default_value(0), "0 or 1")(
      "world", po::value(&o.world)->default_value(2), "processes in the check")(
      "gemm-seconds", Decimal(&o.gemm_seconds, o.gemm_seconds), "how long to run GEMMs")(
      "timeout", po::value(&o.timeout_ms)->default_value(o.timeout_ms),
      "rendezvous/collective timeout in milliseconds")(
      "connect-timeout", po::value(&o.connect_timeout_ms)->default_value(o.connect_timeout_ms),
      "milliseconds to connect to the neighbour once both processes are there (twice it for any "
      "one all-reduce with it): past it the link is dead (or crawls) and the check fails")(
      "min-gbps", Decimal(&o.min_allreduce_gbps, o.min_allreduce_gbps),
      "all-reduce bandwidth floor in GB/s (0: none): all-reduces that move under half of it fail "
      "the check at once (the controller passes --min-bandwidth-ratio of its healthy figure)");
  po::variables_map vm;
  if (auto rc = ParseArgs("self-check", "megascope self-check --dir DIR --rank R [--world 2]", args,
                          opts, {}, &vm))
    return *rc;
  o.exit_when_stalled = true;  // a process of its own: a dead or crawling link ends it
  // The GEMM's figure first, on a line of its own (flushed: a stalled link ends the process with
  // _Exit), so a check that fails on its link still says whether its compute held.
  o.on_gemm = [&o](double gemm_gflops) {
    std::printf("{\"rank\": %d, \"gemm_gflops\": %.3f}\n", o.rank, gemm_gflops);
    std::fflush(stdout);
  };
  auto r = runtime::RunSelfCheck(o);
  if (!r.ok()) return Fail("self-check", r.status().ToString());
  std::printf("{\"rank\": %d, \"gemm_gflops\": %.3f, \"allreduce_gbps\": %.4f}\n", o.rank,
              r->gemm_gflops, r->allreduce_gbps);
  return 0;
}

int RunPrepareData(const Args& args) {
  std::string text, out;
  po::options_description opts("Options");
  opts.add_options()("help,h", "show this help")("text", po::value(&text)->required(),
                                                 "the text file to read")(
      "out,o", po::value(&out)->required(), "token file to write");
  po::positional_options_description pos;
  pos.add("text", 1);
  po::variables_map vm;
  if (auto rc = ParseArgs("prepare-data", "megascope prepare-data TEXT -o DATA.bin", args, opts,
                          pos, &vm))
    return *rc;
  auto n = runtime::PrepareByteTokens(text, out);
  if (!n.ok()) return Fail("prepare-data", n.status().message());
  std::printf("wrote %s: %lld tokens (byte-level, vocab 256)\n", out.c_str(),
              static_cast<long long>(*n));
  return 0;
}

}  // namespace megascope::cli
