// The agent's inside (agent.h): what its parts share, one struct, each part's code in its own
// file -- the drain of the rings into trace.db (drain.cc), the live Prometheus series (series.cc),
// the HTTP endpoints and /state (endpoints.cc), the flight-recorder dumps (dumps.cc), retention
// and ring discovery when due (retention.cc); the loop itself in agent.cc. Time comes through
// opt.clock (loop_clock.h): the retention and staleness decisions run under a fake in tests.
#pragma once

#include <CivetServer.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "megascope/tracer/agent/agent.h"
#include "megascope/tracer/agent/host_metrics.h"
#include "megascope/tracer/agent/store_sink.h"
#include "megascope/tracer/dump.h"
#include "megascope/tracer/loop_clock.h"
#include "megascope/tracer/metric_names.h"
#include "megascope/tracer/ring.h"
#include "megascope/tracer/trace_store.h"

namespace megascope::tracer::agent {

using prometheus::Counter;
using prometheus::Gauge;
using prometheus::Histogram;

// A line on stderr: "[agent NODE] msg".
void Log(const std::string& node, const std::string& msg);

struct Agent::Impl {
  AgentOptions opt;
  LoopClock& clock;  // opt.clock, or the real one
  std::unique_ptr<TraceStore> store;
  HostSampler host;
  std::unique_ptr<Nvml> nvml;
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  std::unique_ptr<CivetServer> http;
  std::vector<std::unique_ptr<CivetHandler>> handlers;
  std::mutex mu;  // guards ranks (HTTP threads read, the agent thread writes)
  // Written by the agent thread, read by HTTP threads (/state) and owners: atomics, no lock.
  std::atomic<uint64_t> rows{0}, db_errors{0};
  int64_t last_snapshot_ns = 0;
  static constexpr int64_t kSnapshotPeriodNs = 1'000'000'000;
  static constexpr uint32_t kUnknownGroup = 0x10000;  // past any uint16_t group index
  std::vector<Record> arena;  // the records of one drain pass (batch_records), allocated once
  std::optional<LoopClock::TimePoint> last_discovery;
  // The last retention pass (none yet: the first Poll prunes what an earlier agent left).
  std::optional<LoopClock::TimePoint> last_prune;
  int wake_fd = -1;  // an eventfd: Stop() writes it to end Run()'s wait between passes
  std::unique_ptr<StoreLoop> shipper;  // with a store: ships trace.db's rows beside the drain

  explicit Impl(const AgentOptions& o)
      : opt(o), clock(o.clock != nullptr ? *o.clock : RealLoopClock()) {}
  ~Impl() {
    if (wake_fd >= 0) ::close(wake_fd);
  }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  struct RankState {
    std::string ring;
    std::string cursor_key;  // ring_cursors key: this incarnation of the ring
    std::unique_ptr<RingReader> reader;
    RankInfo info;
    std::vector<std::string> names;
    RankSnapshot snap;
    bool dead = false;
    bool had_open = false;  // open_ops held rows of this rank after the last look
    uint64_t dropped_seen = 0;
    int64_t last_step = -1;
    Gauge *step = nullptr, *tokens = nullptr, *hb_age = nullptr;
    Gauge *step_seconds = nullptr, *step_compute = nullptr, *step_comm = nullptr;
    double compute_in_step = 0, comm_in_step = 0;  // since the rank's last finished step
    Histogram* step_duration = nullptr;
    Counter *compute = nullptr, *comm = nullptr, *records = nullptr, *dropped = nullptr;
    // By group index << 8 | op: no string built per record. Groups of one kind share a series.
    std::map<uint32_t, Histogram*> coll;
  };
  std::map<std::string, RankState> ranks;  // by ring file name

  prometheus::Family<Gauge>* f_step;
  prometheus::Family<Gauge>* f_step_seconds;
  prometheus::Family<Gauge>* f_step_compute;
  prometheus::Family<Gauge>* f_step_comm;
  prometheus::Family<Gauge>* f_tokens;
  prometheus::Family<Gauge>* f_hb_age;
  prometheus::Family<Histogram>* f_step_duration;
  prometheus::Family<Histogram>* f_coll;
  prometheus::Family<Counter>* f_compute;
  prometheus::Family<Counter>* f_comm;
  prometheus::Family<Counter>* f_records;
  prometheus::Family<Counter>* f_dropped;
  prometheus::Family<Gauge>* f_cpu;
  prometheus::Family<Gauge>* f_mem;
  prometheus::Family<Counter>* f_net_rx;
  prometheus::Family<Counter>* f_net_tx;
  prometheus::Family<Counter>* f_net_rx_err;
  prometheus::Family<Counter>* f_net_tx_err;
  prometheus::Family<Counter>* f_disk_r;
  prometheus::Family<Counter>* f_disk_w;
  prometheus::Family<Gauge>* f_gpu_util;
  prometheus::Family<Gauge>* f_gpu_power;
  prometheus::Family<Gauge>* f_gpu_temp;
  prometheus::Family<Gauge>* f_gpu_mem;
  prometheus::Family<Counter>* f_rows;
  prometheus::Family<Counter>* f_db_errors;
  HostSample last_host;
  bool have_last_host = false;

  template <typename Builder>
  static auto& Family(Builder b, const metrics::Def& d, prometheus::Registry& r) {
    return b.Name(metrics::PrometheusName(d)).Help(std::string(d.help)).Register(r);
  }
  // ---------------------------------------------------------------- series.cc
  void BuildFamilies();

  std::map<std::string, std::string> Labels(const RankInfo& i) const;
  std::map<std::string, std::string> NodeLabels() const;

  // A rank whose process is gone and whose ring is drained leaves /metrics: its last values would
  // otherwise be averaged with its next incarnation's by whoever reads the node's series.
  // The next attempt's incarnation of the same rank has the same labels, so Family::Add gave it
  // the same series objects: those stay while any other rank state holds them (removing them
  // would free what it still writes to).
  void RetireSeries(RankState& st);

  // The host's (and GPUs') sample into the node series and `out`'s metric rows.
  void SampleHost(int64_t now_ns, std::vector<MetricRow>* out);

  // ---------------------------------------------------------------- drain.cc
  // Finds rings of our job and node, including those of later attempts.
  void Discover();

  // Live metrics from a drained batch.
  void Observe(RankState& st, std::span<const Record> recs, const ClockCalibration& cal);

  // What one pass read of a ring, to be consumed once it is written.
  struct Pending {
    RankState* st;
    std::span<const Record> records;
    ReadBatch batch;
    ClockCalibration cal;
  };

  // Reads what is new in `st`'s ring into the arena from `used` on (which it moves past it),
  // picking up new names and groups and counting drops; what it read joins `pending` and
  // `rows_out`.
  void ReadRing(RankState& st, bool refresh, int64_t now_ns, size_t& used,
                std::vector<DropRow>& drops, std::vector<Pending>& pending,
                std::vector<RingRows>& rows_out);

  // A rank whose process is gone: its flight recorder kept in the run's dumps, unless it left a
  // dump of its own that says as much (it was alive then: that says more). Its own dump says as
  // much when it was written since the rank's last heartbeat, or when its flight recorder has not
  // moved since: a rank an incident collected the dump of and then stopped, its heartbeat
  // beating on while it hung, stays alive in the incident's dumps.
  void KeepRecorderOfGone(RankState& st, int64_t now_ns);

  // Heartbeat ages updated; gone ranks' recorders kept, and once drained for good, their ring
  // files and live series retired.
  void RetireGone(bool refresh, int64_t now_ns, const std::vector<Pending>& pending, size_t used);

  // One pass over every ring: read what is new into one arena, write it all in one transaction,
  // then consume it from the rings (exactly once: the cursors are in the same transaction).
  Result<size_t> Drain(bool sample);

  // What each live rank's flight recorder holds open (enqueued or started) goes to open_ops, so
  // the views see a hang while it lasts, not only the ops that completed. A rank that died keeps
  // its last rows: the ops it died in.
  void WriteOpenOps(int64_t now_ns);

  void TakeSnapshot(RankState& st);

  // ---------------------------------------------------------------- retention.cc
  // trace.db's retention when it is due (every opt.retain_every_s, the first Poll at once): rows
  // older than opt.retain_hours summed into step_rollups and dropped, rollups past
  // opt.retain_rollup_hours too. Returns the rows dropped (0 when none was due or it failed: said).
  int64_t RetainIfDue();
  // Rings looked for when due (every 500 ms, and at once while there are none).
  void DiscoverIfDue();

  // ---------------------------------------------------------------- endpoints.cc
  // The HTTP endpoints (/metrics, /state, /dumps, /dump/<rank>, /stacks/<rank>, /window,
  // /query) of `a`, on opt.listen.
  Status Serve(Agent* a);
  std::string State();
  std::string MetricsText();

  // ---------------------------------------------------------------- dumps.cc
  // The rank's state in its latest attempt on this node. Called with `mu` held.
  Result<const RankState*> Latest(int rank) const;

  Result<std::string> RankDump(int rank);

  // Every rank's dump (of `attempt`, or each rank's latest) to `sink` as each is written: JSON, one
  // a line, or the binary dump stream (its header first). Each rank's snapshot is taken under the
  // lock and written outside it: a node's answer never holds up its drain, no answer is held whole,
  // and one rank's snapshot at a time is held (a node of 1,000 ranks would otherwise first-touch
  // 25 MB of them at every answer).
  void AllDumps(int attempt, bool binary, const std::function<void(std::string_view)>& sink);

  Result<std::string> RankStacks(int rank, std::chrono::milliseconds wait);
};

}  // namespace megascope::tracer::agent
