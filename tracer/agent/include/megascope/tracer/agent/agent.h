// The node agent (docs/architecture.md section 5): drains every ring of its job on this node into
// RUN_DIR/nodes/<node>/trace.db, samples host (and GPU) metrics, keeps each rank's live state, and
// serves GET /metrics (Prometheus text), GET /state (JSON), GET /dump/<rank> (docs/formats.md
// section 1) and GET /dumps (every rank's, one a line). A rank whose process is gone is marked
// dead and dumped to RUN_DIR/dumps/attempt_<A>/rank_<r>.json. Killed and restarted, it resumes from
// the database's ring cursors: nothing lost, nothing written twice. Database errors are logged and
// counted; the rings simply keep the records (and count drops when full) -- training never waits
// for the agent.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "megascope/tracer/loop_clock.h"
#include "megascope/tracer/status.h"
#include "megascope/tracer/trace_store.h"

namespace megascope::tracer::agent {

// The CPU scheduling policy of the agent's drain (the thread that calls Run()). Spelled "normal",
// "batch", "idle" (megascope agent --drain-priority).
//  kNormal: SCHED_OTHER, competing with the ranks as an equal;
//  kBatch:  SCHED_BATCH (the default), the same share of the CPU, but a drain that wakes up never
//           preempts a running rank (a preempted rank delays every peer waiting on it);
//  kIdle:   SCHED_IDLE, runs only on a core no rank wants. Where the ranks keep every core busy
//           the drain stalls: the trace database (and the straggler watch that reads it) falls
//           behind by as much as the whole run, and the rings count drops once full (training
//           never waits for it). For nodes with cores to spare.
// HTTP threads (/state, /dumps, /stacks) keep the normal policy, so they answer promptly. Linux
// lets an unprivileged thread lower its policy but not raise it back (CAP_SYS_NICE or
// RLIMIT_NICE): Run() sets it once, for good.
enum class DrainPriority : uint8_t { kNormal = 0, kBatch, kIdle };
std::string_view Name(DrainPriority p);
std::optional<DrainPriority> ParseDrainPriority(std::string_view s);

struct AgentOptions {
  std::string node = "node0";
  std::string run_dir;
  std::string job = "train";
  std::string shm_dir = "/dev/shm";
  std::string listen = "127.0.0.1:0";  // host:port; port 0 picks a free one
  // When set, every request must carry "Authorization: Bearer <token>" (403 otherwise): an agent
  // reachable from other hosts serves the job's state only to whoever holds the run's token.
  std::string token;
  std::string proc_root = "/proc";
  double sample_interval_s = 1.0;
  size_t batch_records = 65536;  // records per drain pass (one transaction over every ring)
  // Seconds between drain passes (a pass that reads half a batch or more goes again at once).
  // Each pass is one transaction, and a transaction rewrites the last, partly filled page of
  // every table and index it touches: at 50 ms the traced (2,2,2) demo spent most of its drain
  // on those rewrites. Rows reach trace.db this much later; the rings hold seconds of records.
  double drain_interval_s = 0.2;
  int64_t max_db_mb = 0;  // cap on trace.db; 0: none (past it, writes fail as on a full disk)
  // Retention: trace.db keeps this many hours of rows (older ones are summed per step into
  // step_rollups, then dropped, every retain_every_s); 0: keeps everything.
  double retain_hours = 24;
  // The per-step rollups are kept this many hours (0: for ever), at least the window above.
  double retain_rollup_hours = 24 * 7;
  double retain_every_s = 60;
  DrainPriority drain_priority = DrainPriority::kBatch;
  // The fleet's ClickHouse store (clickhouse://..., docs/formats.md section 4b; "": none): what the
  // agent commits to trace.db is shipped there too, every store_interval_s, from its own thread.
  std::string store;
  double store_interval_s = 1.0;
  WriteHook write_hook;  // the store's fault seam (trace_store.h); tests only
  // What the agent's time is (loop_clock.h): when discovery, retention and host samples are due
  // (monotonic), and the wall time of its rows, heartbeat ages and retention cutoffs. Null: the
  // real clocks. Tests pass a fake and call Poll().
  LoopClock* clock = nullptr;
  // GET /window?<query>: a straggler window's part computed over this node's trace.db, answered
  // by this function as (HTTP status, JSON body); unset: /window is not served. The analyzer owns
  // the answer (analyzer::WindowServer), a floor above the agent: whoever starts the agent (the
  // `megascope agent` command) passes it in.
  std::function<std::pair<int, std::string>(std::string_view query)> window;
  // GET /query?<query>: an SRE query's part over this node's trace.db (analyzer::QueryServer,
  // passed in the same way); unset: /query is not served.
  std::function<std::pair<int, std::string>(std::string_view query)> query;
};

class Agent {
 public:
  // Opens the database and the HTTP endpoint; Run() or Poll() does the work.
  static Result<std::unique_ptr<Agent>> Create(const AgentOptions& options);
  ~Agent();

  // Drains, samples and checks ranks until Stop(); a final drain happens before it returns. The
  // calling thread takes (and keeps) options.drain_priority's scheduling policy.
  void Run();
  // Ends Run() at once, even mid-wait (async-signal-safe: a signal handler may call it).
  void Stop();
  // One cycle: discover rings, drain each (one transaction per ring batch), detect dead ranks,
  // and sample host metrics when `sample` is set. Returns the rows written.
  Result<size_t> Poll(bool sample);

  int port() const;
  std::string MetricsText();
  std::string StateJson();
  Result<std::string> DumpJson(int rank);
  // Every rank's dump (GET /dumps[?attempt=A][&form=binary]), one JSON line each or the binary
  // dump stream (dump.h), handed to `sink` as each is written; each rank's latest attempt when
  // `attempt` < 0.
  void StreamDumps(int attempt, bool binary, const std::function<void(std::string_view)>& sink);
  // Asks a live rank for its own dump with every thread's stack (SIGUSR1; GET /stacks/<rank>) and
  // returns it once written, within `wait`. Errors: the rank is not here, is gone, or did not
  // answer in time (then /dump/<rank>, from its ring, still says what it was doing).
  Result<std::string> StacksJson(int rank,
                                 std::chrono::milliseconds wait = std::chrono::seconds(5));
  uint64_t rows_written() const;
  uint64_t db_errors() const;

 private:
  struct Impl;
  explicit Agent(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  std::atomic<bool> stop_{false};
};

}  // namespace megascope::tracer::agent
