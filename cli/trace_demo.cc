// `megascope trace-demo`: the tracer's self-demonstration. Forks writer processes that trace a
// mock training loop (spans, collectives, p2p, heartbeats, metrics) into their rings; this process
// drains them as the agent will, checks every record is accounted for, then shows the flight
// recorder of a rank left stuck in an all-reduce: the rank's own SIGUSR1 dump and a reader-side
// dump taken after the rank was killed.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>
#include <vector>

#include "command.h"
#include "megascope/launch/process.h"
#include "megascope/tracer/dump.h"
#include "megascope/tracer/file_util.h"
#include "megascope/tracer/ring.h"
#include "megascope/tracer/tracer.h"

namespace megascope::cli {
namespace {

using namespace megascope::tracer;

struct DemoConfig {
  int ranks = 4;
  int steps = 200;
  std::string job;
  RingOptions ring;
  std::string dump_dir;
};

// A few microseconds of real work so that spans have a duration.
double Spin(int n) {
  volatile double x = 1.0;
  for (int i = 0; i < n; ++i) x = x * 1.0000001 + 1e-9;
  return x;
}

int RunWriter(const DemoConfig& cfg, int rank) {
  RingOptions o = cfg.ring;
  o.rank = rank;
  o.world_size = cfg.ranks;
  o.local_rank = rank;
  o.coords = {rank / 2, 0, rank % 2};
  auto tracer_or = Tracer::Create(o);
  if (!tracer_or.ok()) {
    std::fprintf(stderr, "[demo] rank %d: %s\n", rank, tracer_or.status().ToString().c_str());
    return 1;
  }
  Tracer& t = **tracer_or;
  std::vector<int32_t> world(cfg.ranks), pair = {rank & ~1, (rank & ~1) + 1};
  for (int r = 0; r < cfg.ranks; ++r) world[r] = r;
  GroupId gworld = *t.RegisterGroup("world", "world", world);
  GroupId gtp = *t.RegisterGroup("tp.0." + std::to_string(rank / 2), "tp", pair);
  NameId fwd = *t.InternName("forward"), bwd = *t.InternName("backward"),
         opt = *t.InternName("adamw"), loss = *t.InternName("loss");
  const int partner = rank ^ 1;
  const bool hangs = rank == cfg.ranks - 1;

  auto collective = [&](GroupId g, OpType op, uint64_t bytes, int32_t peer = -1) {
    OpHandle h = t.Enqueue(g, op, bytes, DType::kF32, peer);
    t.Start(h);
    t.Progress(h, static_cast<int64_t>(bytes / 2), static_cast<int64_t>(bytes / 2));
    Spin(200);
    t.Progress(h, static_cast<int64_t>(bytes), static_cast<int64_t>(bytes));
    t.Complete(h);
  };
  for (int step = 0; step < cfg.steps; ++step) {
    t.SetPhase(step, Phase::kForward);
    {
      Tracer::Scope s(&t, SpanKind::kForward, fwd, step, 0);
      Spin(2000);
    }
    collective(gtp, OpType::kAllreduce, 1 << 16);
    collective(gtp, rank < partner ? OpType::kSend : OpType::kRecv, 1 << 14, partner);
    t.SetPhase(step, Phase::kBackward);
    {
      Tracer::Scope s(&t, SpanKind::kBackward, bwd, step, 0);
      Spin(4000);
    }
    collective(gworld, OpType::kAllreduce, 1 << 20);
    t.SetPhase(step, Phase::kOptimizer);
    {
      Tracer::Scope s(&t, SpanKind::kOptimizer, opt, step);
      Spin(500);
    }
    t.RecordMetric(loss, 5.0 / (1.0 + step));
  }
  if (!hangs) return 0;
  // The last rank enters one more all-reduce that never finishes, and waits to be killed.
  auto dumper = SignalDumper::Start([&] {
    std::string path = cfg.dump_dir + "/rank_" + std::to_string(rank) + ".json";
    Status st = t.WriteDump(path);
    if (!st.ok()) std::fprintf(stderr, "[demo] rank %d: %s\n", rank, st.ToString().c_str());
  });
  t.SetPhase(cfg.steps, Phase::kBackward);
  OpHandle stuck = t.Enqueue(gworld, OpType::kAllreduce, 1 << 20, DType::kF32);
  t.Start(stuck);
  t.Progress(stuck, 1 << 19, 1 << 18);
  for (;;) {
    t.Touch();  // alive, but making no progress
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

struct RankTally {
  std::unique_ptr<RingReader> reader;
  uint64_t by_type[5] = {};
  uint64_t drained = 0;
};

std::string Abbreviated(Dump d, size_t keep) {
  auto& e = d.snapshot.entries;
  size_t omitted = e.size() > keep ? e.size() - keep : 0;
  e.erase(e.begin(), e.begin() + static_cast<long>(omitted));
  return DumpToJson(d) + "(" + std::to_string(omitted) + " earlier entries omitted here)\n";
}

// The writers, what has been drained of each, and which have exited. Destroying it stops and
// reaps every writer and removes their rings.
class Demo {
 public:
  explicit Demo(const DemoConfig& cfg)
      : cfg_(cfg), hung_(cfg.ranks - 1), tally_(cfg.ranks), exited_(cfg.ranks, false) {}
  ~Demo() {
    writers_.clear();  // each stopped and reaped
    for (int r = 0; r < cfg_.ranks; ++r)
      ::unlink((cfg_.ring.dir + "/" + RingFileName(cfg_.job, 0, r)).c_str());
  }
  Demo(const Demo&) = delete;
  Demo& operator=(const Demo&) = delete;

  Status Start() {
    for (int r = 0; r < cfg_.ranks; ++r) {
      const DemoConfig& cfg = cfg_;
      auto p = launch::Process::Fork([&cfg, r] { return RunWriter(cfg, r); });
      if (!p.ok()) return p.status();
      writers_.push_back(std::move(p).value());
    }
    return Status::Ok();
  }

  // Drains every ring until the others have finished and the last rank is stuck past its last
  // step with an op open.
  Status DrainUntilStuck() {
    std::vector<Record> buf(4096);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    for (;;) {
      if (std::chrono::steady_clock::now() > deadline)
        return Internal("writers did not finish within 120 s");
      size_t drained = 0;
      for (int r = 0; r < cfg_.ranks; ++r) {
        ASSIGN_OR_RETURN(const size_t n, Drain(r, buf));
        drained += n;
      }
      RETURN_IF_ERROR(PollWriters());
      bool others_done = true;
      for (int r = 0; r < hung_; ++r) others_done = others_done && exited_[r];
      // Stuck = past its last step (its dump thread is up by then) with an op open.
      bool hung_stuck = false;
      if (tally_[hung_].reader) {
        HeartbeatState hb = tally_[hung_].reader->Snapshot().heartbeat;
        hung_stuck = hb.step == cfg_.steps && hb.op_entry_id != 0;
      }
      if (drained == 0 && others_done && hung_stuck) return Status::Ok();
      if (drained == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

  // One line a rank: what was drained of each kind and what was dropped. True if every record
  // emitted was drained or counted as dropped.
  bool PrintTally() {
    std::printf("\n%-5s %-8s %9s %7s %11s %10s %7s %7s %s\n", "rank", "pid", "records", "spans",
                "collectives", "heartbeats", "metrics", "dropped", "accounted");
    bool all_accounted = true;
    for (int r = 0; r < cfg_.ranks; ++r) {
      RankTally& t = tally_[r];
      RankSnapshot s = t.reader->Snapshot();
      bool ok = s.records_total == t.drained + s.dropped_total;
      all_accounted = all_accounted && ok;
      std::printf("%-5d %-8d %9llu %7llu %11llu %10llu %7llu %7llu %s\n", r, s.info.pid,
                  static_cast<unsigned long long>(t.drained),
                  static_cast<unsigned long long>(t.by_type[1]),
                  static_cast<unsigned long long>(t.by_type[2]),
                  static_cast<unsigned long long>(t.by_type[3]),
                  static_cast<unsigned long long>(t.by_type[4]),
                  static_cast<unsigned long long>(s.dropped_total), ok ? "yes" : "NO");
    }
    std::printf("%s\n", all_accounted ? "every record emitted was drained or counted as dropped"
                                      : "RECORDS MISSING: emitted != drained + dropped");
    return all_accounted;
  }

  // The stuck rank dumps its own flight recorder on SIGUSR1 (from its dump thread); killed, a
  // reader can still dump it from the ring, marked not alive.
  Status DumpTheStuckRank() {
    const std::string own_dump = cfg_.dump_dir + "/rank_" + std::to_string(hung_) + ".json";
    std::filesystem::remove(own_dump);
    writers_[hung_]->Signal(SIGUSR1);
    for (int i = 0; i < 500 && !std::filesystem::exists(own_dump); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    auto own = ReadDumpFile(own_dump);
    if (!own.ok()) {
      return own.status().WithContext("rank " + std::to_string(hung_) + " did not dump on SIGUSR1");
    }
    std::printf("\n[demo] rank %d is stuck in an all-reduce; after SIGUSR1 it wrote %s:\n%s", hung_,
                own_dump.c_str(), Abbreviated(*own, 3).c_str());
    writers_[hung_]->Stop(std::chrono::milliseconds(0));
    exited_[hung_] = true;
    RingReader& reader = *tally_[hung_].reader;
    Dump reader_side{reader.Snapshot(), reader.WriterAlive(), WallNowNs(), {}, {}};
    const std::string agent_dump =
        cfg_.dump_dir + "/rank_" + std::to_string(hung_) + ".reader.json";
    Status st = WriteFileAtomic(agent_dump, DumpToJson(reader_side));
    const FlightEntry& last = reader_side.snapshot.entries.back();
    std::printf(
        "\n[demo] after SIGKILL the reader wrote %s (alive=%s): last entry %s #%llu in %s, state "
        "%s, %lld of %llu bytes sent\n",
        agent_dump.c_str(), reader_side.alive ? "true" : "false",
        std::string(Name(last.op)).c_str(), static_cast<unsigned long long>(last.seq),
        reader_side.snapshot.groups[last.group].name.c_str(), std::string(Name(last.state)).c_str(),
        static_cast<long long>(last.bytes_sent), static_cast<unsigned long long>(last.bytes));
    return st;
  }

 private:
  // Drains rank r's ring (attached once it exists) into its tally: how many records.
  Result<size_t> Drain(int r, std::vector<Record>& buf) {
    RankTally& t = tally_[r];
    if (!t.reader) {
      auto rd = RingReader::Attach(cfg_.ring.dir + "/" + RingFileName(cfg_.job, 0, r),
                                   RingReader::Mode::kConsume);
      if (!rd.ok() && (rd.status().code() == StatusCode::kNotFound ||
                       rd.status().code() == StatusCode::kUnavailable))
        return size_t{0};
      if (!rd.ok()) return Internal(rd.status().ToString());
      t.reader = std::move(rd).value();
    }
    const size_t n = t.reader->Drain(buf);
    for (size_t i = 0; i < n; ++i) ++t.by_type[static_cast<int>(buf[i].type) % 5];
    t.drained += n;
    return n;
  }

  Status PollWriters() {
    for (int r = 0; r < cfg_.ranks; ++r) {
      if (exited_[r] || !writers_[r]->Poll()) continue;
      exited_[r] = true;
      if (!writers_[r]->Poll()->success())
        return Internal("writer rank " + std::to_string(r) + " failed");
    }
    return Status::Ok();
  }

  const DemoConfig& cfg_;
  const int hung_;
  std::vector<std::unique_ptr<launch::Process>> writers_;
  std::vector<RankTally> tally_;
  std::vector<bool> exited_;
};

}  // namespace

int RunTraceDemo(const Args& args) {
  DemoConfig cfg;
  po::options_description opts("Options");
  opts.add_options()("help,h", "show this help")("ranks", po::value(&cfg.ranks)->default_value(4),
                                                 "writer processes to start (2..64, even)")(
      "steps", po::value(&cfg.steps)->default_value(200), "mock training steps per writer")(
      "shm-dir", po::value(&cfg.ring.dir)->default_value("/dev/shm"), "where rings are created")(
      "lane-capacity", po::value(&cfg.ring.lane_capacity)->default_value(16384),
      "records per ring lane (a power of two); small values show drops")(
      "dump-dir", po::value(&cfg.dump_dir), "where flight-recorder dumps go (default: a temp dir)");
  po::variables_map vm;
  if (auto rc = ParseArgs("trace-demo", "megascope trace-demo [options]", args, opts, {}, &vm))
    return *rc;
  if (cfg.ranks < 2 || cfg.ranks > 64 || cfg.ranks % 2 != 0) {
    return Fail("trace-demo", "--ranks must be an even number in 2..64", kExitUsage);
  }
  if (cfg.steps < 1) return Fail("trace-demo", "--steps must be >= 1", kExitUsage);
  cfg.job = "trace-demo-" + std::to_string(::getpid());
  cfg.ring.job = cfg.job;
  if (cfg.dump_dir.empty()) cfg.dump_dir = std::filesystem::temp_directory_path() / cfg.job;
  std::filesystem::create_directories(cfg.dump_dir);

  std::printf("[demo] starting %d writer processes, %d steps each; job %s\n", cfg.ranks, cfg.steps,
              cfg.job.c_str());
  std::fflush(stdout);
  Demo demo(cfg);
  if (Status st = demo.Start(); !st.ok()) return Fail("trace-demo", st.ToString());
  if (Status st = demo.DrainUntilStuck(); !st.ok()) return Fail("trace-demo", st.message());
  const bool all_accounted = demo.PrintTally();
  if (Status st = demo.DumpTheStuckRank(); !st.ok()) return Fail("trace-demo", st.message());
  return all_accounted ? 0 : 1;
}

}  // namespace megascope::cli
