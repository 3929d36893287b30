#include "megascope/tracer/agent/agent.h"

#include <CivetServer.h>
#include <poll.h>
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>
#include <sched.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include "megascope/tracer/agent/host_metrics.h"
#include "megascope/tracer/agent/store_sink.h"
#include "megascope/tracer/dump.h"
#include "megascope/tracer/enum_names.h"
#include "megascope/tracer/file_util.h"
#include "megascope/tracer/http_serve.h"
#include "megascope/tracer/metric_names.h"
#include "megascope/tracer/ring.h"
#include "megascope/tracer/run_layout.h"
#include "megascope/tracer/sqlite.h"
#include "megascope/tracer/trace_store.h"

namespace megascope::tracer::agent {
namespace {

// Whether two snapshots of one rank's flight recorder hold the same ops in the same states.
bool SameOps(const RankSnapshot& a, const RankSnapshot& b) {
  if (a.entries.size() != b.entries.size()) return false;
  auto group = [](const RankSnapshot& s, int32_t g) -> std::string_view {
    if (g >= 0 && static_cast<size_t>(g) < s.groups.size()) return s.groups[g].name;
    return "?";
  };
  for (size_t i = 0; i < a.entries.size(); ++i) {
    const FlightEntry &x = a.entries[i], &y = b.entries[i];
    if (x.seq != y.seq || x.op != y.op || x.state != y.state || x.peer != y.peer ||
        group(a, x.group) != group(b, y.group))
      return false;
  }
  return true;
}

namespace fs = std::filesystem;
using prometheus::Counter;
using prometheus::Gauge;
using prometheus::Histogram;

const Histogram::BucketBoundaries kStepBuckets = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                                  1,    2.5,   5,    10,  30,   60};
const Histogram::BucketBoundaries kCollBuckets = {1e-5, 1e-4, 5e-4, 1e-3, 5e-3, 0.01,
                                                  0.05, 0.1,  0.5,  1,    5,    30};

void Log(const std::string& node, const std::string& msg) {
  std::fprintf(stderr, "[agent %s] %s\n", node.c_str(), msg.c_str());
  std::fflush(stderr);
}

}  // namespace

struct Agent::Impl {
  AgentOptions opt;
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
  std::chrono::steady_clock::time_point last_discovery{};
  // The last retention pass (none yet: the first Poll prunes what an earlier agent left).
  std::chrono::steady_clock::time_point last_prune{};
  int wake_fd = -1;  // an eventfd: Stop() writes it to end Run()'s wait between passes
  std::unique_ptr<StoreLoop> shipper;  // with a store: ships trace.db's rows beside the drain

  ~Impl() {
    if (wake_fd >= 0) ::close(wake_fd);
  }

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
  void BuildFamilies() {
    namespace m = metrics;
    auto& r = *registry;
    auto gauge = [&](const m::Def& d) { return &Family(prometheus::BuildGauge(), d, r); };
    auto counter = [&](const m::Def& d) { return &Family(prometheus::BuildCounter(), d, r); };
    auto histogram = [&](const m::Def& d) { return &Family(prometheus::BuildHistogram(), d, r); };
    f_step = gauge(m::kStep);
    f_step_seconds = gauge(m::kStepSeconds);
    f_step_compute = gauge(m::kStepCompute);
    f_step_comm = gauge(m::kStepCommWait);
    f_tokens = gauge(m::kTokensPerSecond);
    f_hb_age = gauge(m::kHeartbeatAge);
    f_step_duration = histogram(m::kStepDuration);
    f_coll = histogram(m::kCollectiveDuration);
    f_compute = counter(m::kCompute);
    f_comm = counter(m::kCommWait);
    f_records = counter(m::kTraceRecords);
    f_dropped = counter(m::kTraceDropped);
    f_cpu = gauge(m::kNodeCpu);
    f_mem = gauge(m::kNodeMemory);
    f_net_rx = counter(m::kNodeNetRx);
    f_net_tx = counter(m::kNodeNetTx);
    f_net_rx_err = counter(m::kNodeNetRxErrors);
    f_net_tx_err = counter(m::kNodeNetTxErrors);
    f_disk_r = counter(m::kNodeDiskRead);
    f_disk_w = counter(m::kNodeDiskWritten);
    f_gpu_util = gauge(m::kGpuUtil);
    f_gpu_power = gauge(m::kGpuPower);
    f_gpu_temp = gauge(m::kGpuTemp);
    f_gpu_mem = gauge(m::kGpuMemory);
    f_rows = counter(m::kAgentRows);
    f_db_errors = counter(m::kAgentDbErrors);
    f_rows->Add(NodeLabels());  // node series exist from the start, at zero
    f_db_errors->Add(NodeLabels());
  }

  std::map<std::string, std::string> Labels(const RankInfo& i) const {
    return {{"job", opt.job},
            {"node", opt.node},
            {"rank", std::to_string(i.rank)},
            {"dp", std::to_string(i.coords.dp)},
            {"pp", std::to_string(i.coords.pp)},
            {"tp", std::to_string(i.coords.tp)}};
  }
  std::map<std::string, std::string> NodeLabels() const {
    return {{"job", opt.job}, {"node", opt.node}};
  }

  // Finds rings of our job and node, including those of later attempts.
  void Discover() {
    std::error_code ec;
    const std::string prefix = RingFilePrefix(opt.job);
    for (const auto& e : fs::directory_iterator(opt.shm_dir, ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind(prefix, 0) != 0 || name.find(".init.") != std::string::npos ||
          ranks.count(name))
        continue;
      auto peek = RingReader::Attach(e.path().string(), RingReader::Mode::kSnapshotOnly);
      if (!peek.ok() || (*peek)->info().node != opt.node) continue;
      auto reader = RingReader::Attach(e.path().string(), RingReader::Mode::kConsume);
      if (!reader.ok()) {
        Log(opt.node, "cannot drain " + name + ": " + reader.status().message());
        continue;
      }
      // Resume where the database is: a batch committed there but not yet in the ring is skipped.
      const std::string key = (*reader)->Incarnation();
      auto cursors = store->Cursors(key);
      if (cursors.ok() && !cursors->empty()) {
        ReadBatch b;
        b.lane_tails = *cursors;
        (*reader)->Commit(b);
      }
      RankState st;
      st.ring = name;
      st.cursor_key = key;
      st.info = (*reader)->info();
      st.reader = std::move(reader).value();
      const auto labels = Labels(st.info);
      st.step = &f_step->Add(labels);
      st.step_seconds = &f_step_seconds->Add(labels);
      st.step_compute = &f_step_compute->Add(labels);
      st.step_comm = &f_step_comm->Add(labels);
      st.tokens = &f_tokens->Add(labels);
      st.hb_age = &f_hb_age->Add(labels);
      st.step_duration = &f_step_duration->Add(labels, kStepBuckets);
      st.compute = &f_compute->Add(labels);
      st.comm = &f_comm->Add(labels);
      st.records = &f_records->Add(labels);
      st.dropped = &f_dropped->Add(labels);
      if (Status s = store->UpsertRank(st.info); !s.ok()) Log(opt.node, s.message());
      Log(opt.node, "draining " + name + " (rank " + std::to_string(st.info.rank) + ", attempt " +
                        std::to_string(st.info.attempt) + ")");
      std::lock_guard<std::mutex> lock(mu);
      ranks.emplace(name, std::move(st));
    }
  }

  // Live metrics from a drained batch.
  void Observe(RankState& st, std::span<const Record> recs, const ClockCalibration& cal) {
    double comm = 0, compute = 0;  // summed here since the last step boundary in this batch
    double comm_done = 0, compute_done = 0;  // ... and before it (added to the counters once)
    for (const Record& r : recs) {
      if (r.type == RecordType::kSpan) {
        const double secs =
            static_cast<double>(r.span.end_ticks - r.span.start_ticks) * cal.ns_per_tick / 1e9;
        if (secs < 0) continue;
        if (r.span.kind == SpanKind::kComm)
          comm += secs;
        else if (r.span.kind == SpanKind::kForward || r.span.kind == SpanKind::kBackward ||
                 r.span.kind == SpanKind::kOptimizer || r.span.kind == SpanKind::kCompute)
          compute += secs;
      } else if (r.type == RecordType::kCollective) {
        const CollectiveRecord& c = r.collective;
        const bool known = c.group < st.snap.groups.size();
        const uint32_t key =
            (known ? uint32_t{c.group} : kUnknownGroup) << 8 | static_cast<uint32_t>(c.op);
        auto it = st.coll.find(key);
        if (it == st.coll.end()) {
          auto labels = Labels(st.info);
          labels["op"] = std::string(Name(c.op));
          labels["group_kind"] = known ? st.snap.groups[c.group].kind : "unknown";
          it = st.coll.emplace(key, &f_coll->Add(labels, kCollBuckets)).first;
        }
        it->second->Observe(
            static_cast<double>(cal.ToNs(c.completed_ticks) - cal.ToNs(c.enqueued_ticks)) / 1e9);
        if (c.state == OpState::kCompleted && c.started_ticks != 0)  // also a comm span
          comm += static_cast<double>(c.completed_ticks - c.started_ticks) * cal.ns_per_tick / 1e9;
      } else if (r.type == RecordType::kMetric) {
        const std::string& name = r.metric.name < st.names.size() ? st.names[r.metric.name] : "";
        if (name == "step") {  // the step's last record: its spans are in
          st.step->Set(r.metric.value);
          st.last_step = static_cast<int64_t>(r.metric.value);
          st.step_compute->Set(st.compute_in_step + compute);
          st.step_comm->Set(st.comm_in_step + comm);
          st.compute_in_step = st.comm_in_step = 0;
          compute_done += compute, comm_done += comm;
          compute = comm = 0;
        } else if (name == metrics::kStepSeconds.name) {
          st.step_duration->Observe(r.metric.value);
          st.step_seconds->Set(r.metric.value);
        } else if (name == metrics::kTokensPerSecond.name) {
          st.tokens->Set(r.metric.value);
        }
      }
    }
    st.compute_in_step += compute;
    st.comm_in_step += comm;
    if (compute + compute_done > 0) st.compute->Increment(compute + compute_done);
    if (comm + comm_done > 0) st.comm->Increment(comm + comm_done);
  }

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
                std::vector<RingRows>& rows_out) {
    if (refresh || st.snap.info.pid == 0) TakeSnapshot(st);
    while (st.names.size() < 65536) {  // pick up newly interned names
      const std::string n = st.reader->NameOf(static_cast<NameId>(st.names.size()));
      if (!n.empty() && n[0] == '?') break;
      st.names.push_back(n);
    }
    Pending p{&st, {}, {}, st.reader->Calibration()};
    const std::span<Record> room(arena.data() + used, arena.size() - used);
    const size_t n = room.empty() ? 0 : st.reader->Read(room, &p.batch);
    for (size_t i = 0; i < n; ++i) {  // a group registered since the last snapshot: refresh now
      if (room[i].type == RecordType::kCollective &&
          room[i].collective.group >= st.snap.groups.size()) {
        TakeSnapshot(st);
        break;
      }
    }
    const uint64_t dropped = st.reader->Dropped();
    if (dropped > st.dropped_seen) {
      drops.push_back({st.info.rank, now_ns, static_cast<int64_t>(dropped)});
      st.dropped->Increment(static_cast<double>(dropped - st.dropped_seen));
      st.dropped_seen = dropped;
    }
    if (n == 0) return;
    p.records = room.first(n);
    used += n;
    rows_out.push_back({&st.info, p.cal, &st.names, &st.snap.groups, p.records, st.cursor_key,
                        p.batch.lane_tails});
    pending.push_back(std::move(p));
  }

  // A rank whose process is gone: its flight recorder kept in the run's dumps, unless it left a
  // dump of its own that says as much (it was alive then: that says more). Its own dump says as
  // much when it was written since the rank's last heartbeat, or when its flight recorder has not
  // moved since: a rank an incident collected the dump of and then stopped, its heartbeat
  // beating on while it hung, stays alive in the incident's dumps.
  void KeepRecorderOfGone(RankState& st, int64_t now_ns) {
    st.dead = true;
    const RankSnapshot& snap = st.snap;
    const std::string path = RunLayout(opt.run_dir).dump(st.info.attempt, st.info.rank);
    const std::string who =
        "rank " + std::to_string(st.info.rank) + " (pid " + std::to_string(st.info.pid) + ")";
    auto own = ReadDumpFile(path);
    if (own.ok() && (own->dumped_at_ns + 1'000'000'000 >= snap.heartbeat.updated_at_ns ||
                     SameOps(own->snapshot, snap))) {
      Log(opt.node, who + " is gone; it left its own flight-recorder dump in " + path);
      return;
    }
    Status d = WriteFileAtomic(path, DumpToJson(Dump{snap, false, now_ns, {}, {}}));
    Log(opt.node, who + " is gone; its flight recorder " +
                      (d.ok() ? "is in " + path : "could not be written: " + d.message()));
  }

  // Heartbeat ages updated; gone ranks' recorders kept, and once drained for good, their ring
  // files and live series retired.
  void RetireGone(bool refresh, int64_t now_ns, const std::vector<Pending>& pending, size_t used) {
    std::vector<std::string> to_remove;
    for (auto& [name, st] : ranks) {
      if (st.hb_age != nullptr)
        st.hb_age->Set(
            std::max(0.0, static_cast<double>(now_ns - st.snap.heartbeat.updated_at_ns) / 1e9));
      const bool gone = refresh && !st.reader->WriterAlive();
      if (gone && !st.reader->Closed() && !st.dead) KeepRecorderOfGone(st, now_ns);
      const RankState* self = &st;
      const bool drained = std::none_of(pending.begin(), pending.end(),
                                        [self](const Pending& p) { return p.st == self; }) &&
                           used < arena.size();
      if (gone && drained) {  // drained for good: the ring file can go, and its live series
        to_remove.push_back(name);
        RetireSeries(st);
      }
    }
    for (const std::string& name : to_remove) {
      ::unlink((opt.shm_dir + "/" + name).c_str());
    }
  }

  // One pass over every ring: read what is new into one arena, write it all in one transaction,
  // then consume it from the rings (exactly once: the cursors are in the same transaction).
  Result<size_t> Drain(bool sample) {
    if (arena.size() != opt.batch_records) arena.resize(opt.batch_records);  // once, reused
    std::vector<DropRow> drops;
    std::vector<MetricRow> metrics;
    const int64_t now_ns = WallNowNs();
    if (sample) SampleHost(now_ns, &metrics);
    // Flight-recorder snapshots (for /state and /dump) once per sampling period: copying every
    // ring's recorder is the agent's largest fixed cost, and hang analysis works in seconds.
    const bool refresh = sample || now_ns - last_snapshot_ns >= kSnapshotPeriodNs;
    if (refresh) last_snapshot_ns = now_ns;
    std::vector<Pending> pending;
    std::vector<RingRows> rows_out;
    size_t used = 0;
    for (auto& [name, st] : ranks) ReadRing(st, refresh, now_ns, used, drops, pending, rows_out);
    size_t written = 0;
    if (!rows_out.empty() || !metrics.empty() || !drops.empty()) {
      if (Status s = store->Write(rows_out, metrics, drops); !s.ok()) {
        ++db_errors;
        f_db_errors->Add(NodeLabels()).Increment();
        Log(opt.node, s.message() + " (records stay in the rings)");
        return s;
      }
      for (Pending& p : pending) {
        p.st->reader->Commit(p.batch);
        Observe(*p.st, p.records, p.cal);
        p.st->records->Increment(static_cast<double>(p.records.size()));
        written += p.records.size();
      }
    }
    if (refresh) WriteOpenOps(now_ns);
    RetireGone(refresh, now_ns, pending, used);
    rows += written;
    if (written > 0) f_rows->Add(NodeLabels()).Increment(static_cast<double>(written));
    return written;
  }

  // What each live rank's flight recorder holds open (enqueued or started) goes to open_ops, so
  // the views see a hang while it lasts, not only the ops that completed. A rank that died keeps
  // its last rows: the ops it died in.
  void WriteOpenOps(int64_t now_ns) {
    std::vector<OpenOps> open;
    for (auto& [name, st] : ranks) {
      if (st.dead || !st.reader->WriterAlive()) continue;
      OpenOps o{st.info.rank, st.info.attempt, now_ns, &st.snap.groups, {}};
      for (const FlightEntry& e : st.snap.entries) {
        if (e.state == OpState::kEnqueued || e.state == OpState::kStarted) o.entries.push_back(e);
      }
      if (o.entries.empty() && !st.had_open) continue;
      st.had_open = !o.entries.empty();
      open.push_back(std::move(o));
    }
    if (Status s = store->ReplaceOpenOps(open); !s.ok()) {
      ++db_errors;
      f_db_errors->Add(NodeLabels()).Increment();
      Log(opt.node, s.message() + " (open ops not recorded this time)");
    }
  }

  void TakeSnapshot(RankState& st) {
    RankSnapshot snap = st.reader->Snapshot();
    std::lock_guard<std::mutex> lock(mu);
    st.snap = std::move(snap);
    st.info.clock_offset_ns = st.snap.info.clock_offset_ns;
  }

  // A rank whose process is gone and whose ring is drained leaves /metrics: its last values would
  // otherwise be averaged with its next incarnation's by whoever reads the node's series.
  // The next attempt's incarnation of the same rank has the same labels, so Family::Add gave it
  // the same series objects: those stay while any other rank state holds them (removing them
  // would free what it still writes to).
  void RetireSeries(RankState& st) {
    if (st.step == nullptr) return;
    std::set<const void*> in_use;
    for (const auto& [name, other] : ranks) {
      if (&other == &st || other.step == nullptr) continue;
      in_use.insert({other.step, other.step_seconds, other.step_compute, other.step_comm,
                     other.tokens, other.hb_age, other.step_duration});
      for (const auto& [key, h] : other.coll) in_use.insert(h);
    }
    auto remove = [&](auto* family, auto* metric) {
      if (!in_use.count(metric)) family->Remove(metric);
    };
    remove(f_step, st.step);
    remove(f_step_seconds, st.step_seconds);
    remove(f_step_compute, st.step_compute);
    remove(f_step_comm, st.step_comm);
    remove(f_tokens, st.tokens);
    remove(f_hb_age, st.hb_age);
    remove(f_step_duration, st.step_duration);
    std::set<Histogram*> colls;  // groups of one kind share a series: remove it once
    for (auto& [key, h] : st.coll) colls.insert(h);
    for (Histogram* h : colls) remove(f_coll, h);
    st.coll.clear();
    st.step = st.step_seconds = st.step_compute = st.step_comm = st.tokens = st.hb_age = nullptr;
    st.step_duration = nullptr;
  }

  void SampleHost(int64_t now_ns, std::vector<MetricRow>* out) {
    auto h = host.Sample();
    if (!h.ok()) {
      Log(opt.node, h.status().message());
      return;
    }
    const auto nl = NodeLabels();
    f_cpu->Add(nl).Set(h->cpu_utilization);
    f_mem->Add(nl).Set(h->memory_used_bytes);
    auto bump = [&](prometheus::Family<Counter>* f, double now, double before) {
      if (now > before && have_last_host)
        f->Add(nl).Increment(now - before);
      else
        f->Add(nl);
    };
    bump(f_net_rx, h->network_receive_bytes, last_host.network_receive_bytes);
    bump(f_net_tx, h->network_transmit_bytes, last_host.network_transmit_bytes);
    bump(f_net_rx_err, h->network_receive_errors, last_host.network_receive_errors);
    bump(f_net_tx_err, h->network_transmit_errors, last_host.network_transmit_errors);
    bump(f_disk_r, h->disk_read_bytes, last_host.disk_read_bytes);
    bump(f_disk_w, h->disk_write_bytes, last_host.disk_write_bytes);
    last_host = *h;
    have_last_host = true;
    namespace m = metrics;
    for (auto [def, v] : {std::pair<const m::Def*, double>{&m::kNodeCpu, h->cpu_utilization},
                          {&m::kNodeMemory, h->memory_used_bytes},
                          {&m::kNodeNetRx, h->network_receive_bytes},
                          {&m::kNodeNetTx, h->network_transmit_bytes},
                          {&m::kNodeNetRxErrors, h->network_receive_errors},
                          {&m::kNodeNetTxErrors, h->network_transmit_errors},
                          {&m::kNodeDiskRead, h->disk_read_bytes},
                          {&m::kNodeDiskWritten, h->disk_write_bytes}}) {
      out->push_back({opt.node, now_ns, std::string(def->name), v});
    }
    for (const GpuSample& g : nvml->Sample()) {
      auto gl = nl;
      gl["gpu"] = std::to_string(g.index);
      f_gpu_util->Add(gl).Set(g.utilization);
      f_gpu_power->Add(gl).Set(g.power_watts);
      f_gpu_temp->Add(gl).Set(g.temperature_celsius);
      f_gpu_mem->Add(gl).Set(g.memory_used_bytes);
      const std::string p = "gpu" + std::to_string(g.index) + ".";
      out->push_back({opt.node, now_ns, p + std::string(metrics::kGpuUtil.name), g.utilization});
      out->push_back({opt.node, now_ns, p + std::string(metrics::kGpuPower.name), g.power_watts});
      out->push_back(
          {opt.node, now_ns, p + std::string(metrics::kGpuTemp.name), g.temperature_celsius});
      out->push_back(
          {opt.node, now_ns, p + std::string(metrics::kGpuMemory.name), g.memory_used_bytes});
    }
  }

  std::string State() {
    std::lock_guard<std::mutex> lock(mu);
    nlohmann::ordered_json ranks_j = nlohmann::ordered_json::array();
    const int64_t now = WallNowNs();
    for (const auto& [name, st] : ranks) {
      nlohmann::ordered_json open = nlohmann::ordered_json::array();
      for (const FlightEntry& e : st.snap.entries) {
        if (e.state != OpState::kEnqueued && e.state != OpState::kStarted) continue;
        open.push_back(
            {{"group", e.group < static_cast<int>(st.snap.groups.size())
                           ? st.snap.groups[e.group].name
                           : "?"},
             {"seq", e.seq},
             {"op", Name(e.op)},
             {"peer",
              e.peer < 0 ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(e.peer)},
             {"bytes", e.bytes},
             {"state", Name(e.state)},
             {"enqueued_at_ns", e.enqueued_at_ns},
             {"bytes_sent", e.bytes_sent < 0 ? nlohmann::ordered_json(nullptr)
                                             : nlohmann::ordered_json(e.bytes_sent)},
             {"bytes_received", e.bytes_received < 0 ? nlohmann::ordered_json(nullptr)
                                                     : nlohmann::ordered_json(e.bytes_received)}});
      }
      const auto& hb = st.snap.heartbeat;
      ranks_j.push_back(
          {{"rank", st.info.rank},
           {"attempt", st.info.attempt},
           {"node", st.info.node},
           {"pid", st.info.pid},
           {"coords",
            {{"dp", st.info.coords.dp}, {"pp", st.info.coords.pp}, {"tp", st.info.coords.tp}}},
           {"alive", !st.dead},
           {"closed", st.reader->Closed()},
           {"heartbeat",
            {{"step", hb.step},
             {"phase", Name(hb.phase)},
             {"updated_at_ns", hb.updated_at_ns},
             {"age_s", static_cast<double>(now - hb.updated_at_ns) / 1e9}}},
           {"open_entries", open},
           {"records_total", st.snap.records_total},
           {"dropped_records", st.snap.dropped_total}});
    }
    nlohmann::ordered_json j = {{"format", "megascope-agent-state"},
                                {"version", 1},
                                {"job", opt.job},
                                {"node", opt.node},
                                {"now_ns", now},
                                {"rows_written", rows.load()},
                                {"db_errors", db_errors.load()},
                                {"ranks", ranks_j}};
    return j.dump() + "\n";
  }

  // The rank's state in its latest attempt on this node. Called with `mu` held.
  Result<const RankState*> Latest(int rank) const {
    const RankState* best = nullptr;
    for (const auto& [name, st] : ranks) {
      if (st.info.rank == rank && (best == nullptr || st.info.attempt > best->info.attempt))
        best = &st;
    }
    if (best == nullptr)
      return NotFound("rank " + std::to_string(rank) + " is not on node " + opt.node);
    return best;
  }

  Result<std::string> RankDump(int rank) {
    std::lock_guard<std::mutex> lock(mu);
    ASSIGN_OR_RETURN(const RankState* best, Latest(rank));
    return DumpToJson(Dump{
        best->reader->Snapshot(), !best->dead && best->reader->WriterAlive(), WallNowNs(), {}, {}});
  }

  // Every rank's dump (of `attempt`, or each rank's latest) to `sink` as each is written: JSON, one
  // a line, or the binary dump stream (its header first). Each rank's snapshot is taken under the
  // lock and written outside it: a node's answer never holds up its drain, no answer is held whole,
  // and one rank's snapshot at a time is held (a node of 1,000 ranks would otherwise first-touch
  // 25 MB of them at every answer).
  void AllDumps(int attempt, bool binary, const std::function<void(std::string_view)>& sink) {
    std::vector<std::string> chosen;  // ring names, by rank
    {
      std::lock_guard<std::mutex> lock(mu);
      std::map<int, decltype(ranks)::const_iterator> best;
      for (auto r = ranks.cbegin(); r != ranks.cend(); ++r) {
        if (attempt >= 0 && r->second.info.attempt != attempt) continue;
        auto [it, fresh] = best.emplace(r->second.info.rank, r);
        if (!fresh && r->second.info.attempt > it->second->second.info.attempt) it->second = r;
      }
      chosen.reserve(best.size());
      for (const auto& [rank, r] : best) chosen.push_back(r->first);
    }
    std::string out;  // one buffer for every rank's
    if (binary) {
      AppendDumpStreamHeader(&out);
      sink(out);
    }
    const int64_t now = WallNowNs();
    for (const std::string& ring : chosen) {
      Dump d;
      {
        std::lock_guard<std::mutex> lock(mu);
        auto it = ranks.find(ring);
        if (it == ranks.end()) continue;  // its ring went away meanwhile
        d = Dump{it->second.reader->Snapshot(),
                 !it->second.dead && it->second.reader->WriterAlive(),
                 now,
                 {},
                 {}};
      }
      out.clear();
      if (binary)
        AppendDumpFrame(d, &out);
      else
        AppendDumpJson(d, &out, /*one_line=*/true);
      sink(out);
    }
  }

  Result<std::string> RankStacks(int rank, std::chrono::milliseconds wait) {
    int pid = 0;
    std::string path;
    {
      std::lock_guard<std::mutex> lock(mu);
      ASSIGN_OR_RETURN(const RankState* best, Latest(rank));
      if (best->dead || !best->reader->WriterAlive())
        return FailedPrecondition("rank " + std::to_string(rank) + " is gone: no stacks to take");
      pid = best->info.pid;
      path = RunLayout(opt.run_dir).dump(best->info.attempt, rank);
    }
    const int64_t asked = WallNowNs();
    if (::kill(pid, SIGUSR1) != 0)
      return ErrnoError("cannot signal rank " + std::to_string(rank), errno);
    const auto deadline = std::chrono::steady_clock::now() + wait;
    while (std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      auto text = ReadFile(path);  // written atomically by the rank
      if (!text.ok()) continue;
      auto d = ParseDump(*text, path);
      if (d.ok() && d->dumped_at_ns >= asked && !d->stacks.empty()) return *text;
    }
    return Status(StatusCode::kUnavailable, "rank " + std::to_string(rank) + " (pid " +
                                                std::to_string(pid) + ") wrote no dump within " +
                                                std::to_string(wait.count()) + " ms");
  }
};

namespace {

// Every endpoint: the token checked (403 without it), then the answer.
class Handler : public CivetHandler {
 public:
  explicit Handler(std::string token) : token_(std::move(token)) {}
  bool handleGet(CivetServer*, mg_connection* conn) override {
    const mg_request_info* info = mg_get_request_info(conn);
    if (!HttpAuthorized(conn, token_)) {
      Reply(conn, 403, "text/plain", "missing or wrong token (the run's RUN_DIR/control.token)\n");
      return true;
    }
    Serve(conn, info->local_uri ? info->local_uri : "",
          info->query_string ? info->query_string : "");
    return true;
  }

 protected:
  virtual void Serve(mg_connection* conn, const std::string& uri, const std::string& query) = 0;
  static void Reply(mg_connection* conn, int code, const char* type, const std::string& body) {
    HttpReply(conn, code, type, body);
  }

 private:
  std::string token_;  // "": open
};

// An answer computed whole: (code, body) from the URI.
class TextHandler : public Handler {
 public:
  using Fn = std::function<std::pair<int, std::string>(const std::string& uri)>;
  TextHandler(Fn fn, const char* type, const std::string& token)
      : Handler(token), fn_(std::move(fn)), type_(type) {}

 private:
  void Serve(mg_connection* conn, const std::string& uri, const std::string&) override {
    auto [code, body] = fn_(uri);
    Reply(conn, code, type_, body);
  }
  Fn fn_;
  const char* type_;
};

// An answer computed whole from the URL's query string (GET /window?..., GET /query?...).
class QueryHandler : public Handler {
 public:
  using Fn = std::function<std::pair<int, std::string>(std::string_view query)>;
  QueryHandler(Fn fn, const std::string& token) : Handler(token), fn_(std::move(fn)) {}

 private:
  void Serve(mg_connection* conn, const std::string&, const std::string& query) override {
    auto [code, body] = fn_(query);
    Reply(conn, code, "application/json", body);
  }
  Fn fn_;
};

// GET /dumps[?attempt=A][&form=json|binary], streamed in chunks (HTTP/1.1 chunked transfer): a
// node of 1,000 ranks answers 70 MB of JSON (17 MB binary), written and sent a rank at a time.
class DumpsHandler : public Handler {
 public:
  DumpsHandler(Agent* agent, const std::string& token) : Handler(token), agent_(agent) {}

 private:
  void Serve(mg_connection* conn, const std::string& uri, const std::string& query) override {
    long attempt = -1;
    bool binary = false;
    bool ok = uri == "/dumps";
    for (size_t at = 0; ok && at < query.size();) {  // attempt=<n>, form=json|binary
      size_t end = query.find('&', at);
      if (end == std::string::npos) end = query.size();
      const std::string p = query.substr(at, end - at);
      at = end + 1;
      if (p == "form=binary" || p == "form=json") {
        binary = p == "form=binary";
      } else if (p.starts_with("attempt=") && p.size() > 8) {
        char* tail = nullptr;
        attempt = std::strtol(p.c_str() + 8, &tail, 10);
        ok = *tail == '\0' && attempt >= 0 && attempt <= INT32_MAX;
      } else {
        ok = false;
      }
    }
    if (!ok) {
      Reply(conn, 404, "application/json",
            "{\"error\":\"use /dumps[?attempt=<attempt>][&form=json|binary]\"}\n");
      return;
    }
    mg_printf(conn,
              "HTTP/1.1 200 OK\r\nContent-Type: %s\r\n"
              "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
              binary ? "application/octet-stream" : "application/x-ndjson");
    agent_->StreamDumps(static_cast<int>(attempt), binary, [conn](std::string_view data) {
      mg_send_chunk(conn, data.data(), static_cast<unsigned>(data.size()));
    });
    mg_send_chunk(conn, "", 0);
  }
  Agent* agent_;
};

}  // namespace

Agent::Agent(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<Agent>> Agent::Create(const AgentOptions& o) {
  if (o.run_dir.empty()) return InvalidArgument("the agent needs a run directory");
  auto impl = std::make_unique<Impl>();
  impl->opt = o;
  impl->wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (impl->wake_fd < 0)
    return Internal(std::string("cannot create the agent's eventfd: ") + std::strerror(errno));
  impl->host = HostSampler(o.proc_root);
  impl->nvml = Nvml::Load();
  ASSIGN_OR_RETURN(impl->store,
                   TraceStore::Open(RunLayout(o.run_dir).trace_db(o.node), o.max_db_mb << 20));
  if (o.write_hook) impl->store->set_write_hook(o.write_hook);
  impl->BuildFamilies();
  if (!o.store.empty()) {
    ASSIGN_OR_RETURN(auto so, StoreSinkOptions::Of(o.store, o.job, o.node, impl->store->path()));
    ASSIGN_OR_RETURN(impl->shipper, StoreLoop::Start({so}, o.store_interval_s,
                                                     [node = o.node](const std::string& line) {
                                                       Log(node, line);
                                                     }));
  }
  std::unique_ptr<Agent> agent(new Agent(std::move(impl)));
  Impl* im = agent->impl_.get();
  try {
    std::vector<std::string> opts = {"listening_ports", o.listen, "num_threads", "4"};
    CivetCallbacks callbacks;
    KeepStartErrors(&callbacks);
    im->http = std::make_unique<CivetServer>(opts, &callbacks);
  } catch (const std::exception& e) {
    return Status(StatusCode::kUnavailable,
                  "cannot listen on " + o.listen + ": " + e.what() + StartError());
  }
  Agent* a = agent.get();
  im->handlers.push_back(std::make_unique<TextHandler>(
      [a](const std::string&) { return std::pair<int, std::string>(200, a->MetricsText()); },
      "text/plain; version=0.0.4; charset=utf-8", o.token));
  im->http->addHandler("/metrics", im->handlers.back().get());
  im->handlers.push_back(std::make_unique<TextHandler>(
      [a](const std::string&) { return std::pair<int, std::string>(200, a->StateJson()); },
      "application/json", o.token));
  im->http->addHandler("/state", im->handlers.back().get());
  // GET /dumps[?attempt=A][&form=binary]: every rank's dump in one answer, one a JSON line (or the
  // binary dump stream, what live hang analysis reads), sent as each is written: one request a
  // node instead of one a rank.
  im->handlers.push_back(std::make_unique<DumpsHandler>(a, o.token));
  im->http->addHandler("/dumps", im->handlers.back().get());
  // GET <prefix><rank>: one rank's dump, from its ring (/dump/) or asked of it with stacks.
  auto per_rank = [&](const std::string& prefix,
                      const std::function<Result<std::string>(int)>& fn) {
    im->handlers.push_back(std::make_unique<TextHandler>(
        [prefix, fn](const std::string& uri) {
          const std::string rank = uri.substr(uri.rfind('/') + 1);
          char* end = nullptr;
          const long r = std::strtol(rank.c_str(), &end, 10);
          if (rank.empty() || *end != '\0')
            return std::pair<int, std::string>(404, "{\"error\":\"use " + prefix + "<rank>\"}\n");
          auto d = fn(static_cast<int>(r));
          return d.ok() ? std::pair<int, std::string>(200, *d)
                        : std::pair<int, std::string>(
                              404, "{\"error\":\"" + d.status().message() + "\"}\n");
        },
        "application/json", o.token));
    im->http->addHandler(prefix, im->handlers.back().get());
  };
  if (o.window) {
    im->handlers.push_back(std::make_unique<QueryHandler>(o.window, o.token));
    im->http->addHandler("/window", im->handlers.back().get());
  }
  if (o.query) {
    im->handlers.push_back(std::make_unique<QueryHandler>(o.query, o.token));
    im->http->addHandler("/query", im->handlers.back().get());
  }
  per_rank("/dump/", [a](int r) { return a->DumpJson(r); });
  per_rank("/stacks/", [a](int r) { return a->StacksJson(r); });
  return agent;
}

Agent::~Agent() {
  if (!impl_->http) return;
  // (an eviction, a restart and every `train` wait for the agent to exit)
  const size_t colon = impl_->opt.listen.rfind(':');
  tracer::StopServerPromptly(colon == std::string::npos ? "" : impl_->opt.listen.substr(0, colon),
                             port(), [this] { impl_->http->close(); });
}

int Agent::port() const {
  auto ports = impl_->http->getListeningPorts();
  return ports.empty() ? 0 : ports.front();
}

Result<size_t> Agent::Poll(bool sample) {
  const auto now = std::chrono::steady_clock::now();
  if (now - impl_->last_discovery > std::chrono::milliseconds(500) || impl_->ranks.empty()) {
    impl_->last_discovery = now;
    impl_->Discover();
  }
  const AgentOptions& o = impl_->opt;
  if (o.retain_hours > 0 &&
      now - impl_->last_prune > std::chrono::duration<double>(o.retain_every_s)) {
    impl_->last_prune = now;
    const int64_t wall = WallNowNs();
    const auto window_ns = static_cast<int64_t>(o.retain_hours * 3600e9);
    const int64_t rollups_before = o.retain_rollup_hours > 0
                                       ? wall - static_cast<int64_t>(o.retain_rollup_hours * 3600e9)
                                       : std::numeric_limits<int64_t>::min();
    auto dropped = impl_->store->Prune(wall - window_ns, rollups_before);
    if (!dropped.ok())
      Log(o.node, "retention: " + dropped.status().message() + " (tried again later)");
  }
  return impl_->Drain(sample);
}

namespace {

constexpr std::array<std::string_view, 3> kDrainPriorityNames = {"normal", "batch", "idle"};

// Gives the calling thread `p`'s scheduling policy (sched(7)); a failure leaves the drain's policy
// as it was and says so.
void ApplyDrainPriority(const std::string& node, DrainPriority p) {
  constexpr std::array<int, kDrainPriorityNames.size()> kPolicies = {SCHED_OTHER, SCHED_BATCH,
                                                                     SCHED_IDLE};
  const int policy = kPolicies.at(static_cast<size_t>(p));
  const sched_param param{};
  if (::sched_setscheduler(0, policy, &param) != 0)
    Log(node, "cannot give the drain the " + std::string(Name(p)) +
                  " scheduling policy: " + std::strerror(errno) + " (it stays as it was)");
}

}  // namespace

std::string_view Name(DrainPriority p) { return NameFrom(kDrainPriorityNames, p); }

std::optional<DrainPriority> ParseDrainPriority(std::string_view s) {
  return ParseFrom<DrainPriority>(kDrainPriorityNames, s);
}

void Agent::Stop() {
  stop_ = true;
  const uint64_t one = 1;
  (void)!::write(impl_->wake_fd, &one, sizeof(one));
}

void Agent::Run() {
  ApplyDrainPriority(impl_->opt.node, impl_->opt.drain_priority);
  // At least 1 ms: an interval under half a millisecond must not become a busy loop.
  const int wait_ms =
      static_cast<int>(std::max<long>(1, std::lround(impl_->opt.drain_interval_s * 1000)));
  auto next_sample = std::chrono::steady_clock::now();
  while (!stop_) {
    const auto now = std::chrono::steady_clock::now();
    const bool sample = now >= next_sample;
    if (sample)
      next_sample = now + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(impl_->opt.sample_interval_s));
    auto n = Poll(sample);
    if (n.ok() && *n >= impl_->opt.batch_records / 2) continue;  // more waiting: no pause
    pollfd wake{impl_->wake_fd, POLLIN, 0};
    (void)::poll(&wake, 1, wait_ms);
  }
  for (int i = 0; i < 100; ++i) {  // final drain; the first pass also checks for dead ranks
    auto n = Poll(i == 0);
    if (!n.ok() || *n == 0) break;
  }
  if (impl_->shipper) impl_->shipper->Finish();  // what the final drain wrote goes too
}

namespace {

// Restarts, evictions and verdicts of the run, read from the controller's control.db
// (docs/formats.md section 4) when one exists: "restart" events by detail.cause (the job's start
// excluded), "eviction" events by detail.reason, "verdict" events by detail.kind and detail.cause.
// Every agent serves the run's counts (with its own node label): aggregate them with max, not sum.
void AppendControlCounters(const AgentOptions& o, std::ostream& out) {
  auto db = sql::Database::Open(RunLayout(o.run_dir).control_db(), sql::Database::Mode::kReadOnly,
                                "[agent]", /*busy_timeout_ms=*/200);
  if (!db.ok()) return;  // no controller: no families
  struct Family {
    std::string name;
    std::string_view help;
    const char* kind;
    std::vector<const char*> fields;  // detail fields, each a label
  };
  for (const Family& f : {Family{metrics::PrometheusName(metrics::kRestarts),
                                 metrics::kRestarts.help,
                                 "restart",
                                 {"cause"}},
                          Family{metrics::PrometheusName(metrics::kEvictions),
                                 metrics::kEvictions.help,
                                 "eviction",
                                 {"reason"}},
                          Family{metrics::PrometheusName(metrics::kVerdicts),
                                 metrics::kVerdicts.help,
                                 "verdict",
                                 {"kind", "cause"}}}) {
    out << "# HELP " << f.name << " " << f.help << "\n# TYPE " << f.name << " counter\n";
    std::string cols, groups;
    for (size_t i = 0; i < f.fields.size(); ++i) {
      cols += std::string(i ? ", " : "") + "COALESCE(json_extract(detail_json, '$." + f.fields[i] +
              "'), 'unknown')";
      groups += (i ? ", " : "") + std::to_string(i + 1);
    }
    const std::string sql = "SELECT " + cols +
                            ", COUNT(*) FROM events WHERE kind = ?1 AND "
                            "COALESCE(json_extract(detail_json, '$.cause'), '') != 'start' "
                            "GROUP BY " +
                            groups;
    auto st = db->Prepare(sql);
    if (!st.ok()) continue;
    st->Bind(1, f.kind);
    const int n = static_cast<int>(f.fields.size());
    while (st->Step().value_or(false)) {
      out << f.name << "{job=\"" << o.job << "\",node=\"" << o.node << "\"";
      for (int i = 0; i < n; ++i) {
        std::string label(st->Text(i));
        std::erase_if(label, [](char c) { return c == '"' || c == '\\' || c == '\n'; });
        out << "," << f.fields[static_cast<size_t>(i)] << "=\"" << label << "\"";
      }
      out << "} " << st->Int(n) << "\n";
    }
  }
}

}  // namespace

std::string Agent::MetricsText() {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, impl_->registry->Collect());
  AppendControlCounters(impl_->opt, out);
  if (impl_->shipper)
    out << impl_->shipper->MetricsText("job=\"" + impl_->opt.job + "\",node=\"" + impl_->opt.node +
                                       "\"");
  return out.str();
}
std::string Agent::StateJson() { return impl_->State(); }
Result<std::string> Agent::DumpJson(int rank) { return impl_->RankDump(rank); }
void Agent::StreamDumps(int attempt, bool binary,
                        const std::function<void(std::string_view)>& sink) {
  impl_->AllDumps(attempt, binary, sink);
}
Result<std::string> Agent::StacksJson(int rank, std::chrono::milliseconds wait) {
  return impl_->RankStacks(rank, wait);
}
uint64_t Agent::rows_written() const { return impl_->rows.load(); }
uint64_t Agent::db_errors() const { return impl_->db_errors.load(); }

}  // namespace megascope::tracer::agent
