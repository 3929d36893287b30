#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "agent_impl.h"
#include "megascope/tracer/file_util.h"
#include "megascope/tracer/run_layout.h"

namespace megascope::tracer::agent {
namespace {

namespace fs = std::filesystem;

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

const Histogram::BucketBoundaries kStepBuckets = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                                  1,    2.5,   5,    10,  30,   60};
const Histogram::BucketBoundaries kCollBuckets = {1e-5, 1e-4, 5e-4, 1e-3, 5e-3, 0.01,
                                                  0.05, 0.1,  0.5,  1,    5,    30};

}  // namespace

void Agent::Impl::Discover() {
  std::error_code ec;
  const std::string prefix = RingFilePrefix(opt.job);
  for (const auto& e : fs::directory_iterator(opt.shm_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0 || name.find(".init.") != std::string::npos || ranks.count(name))
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

void Agent::Impl::Observe(RankState& st, std::span<const Record> recs,
                          const ClockCalibration& cal) {
  double comm = 0, compute = 0;            // summed here since the last step boundary in this batch
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

void Agent::Impl::ReadRing(RankState& st, bool refresh, int64_t now_ns, size_t& used,
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
  rows_out.push_back(
      {&st.info, p.cal, &st.names, &st.snap.groups, p.records, st.cursor_key, p.batch.lane_tails});
  pending.push_back(std::move(p));
}

void Agent::Impl::KeepRecorderOfGone(RankState& st, int64_t now_ns) {
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

void Agent::Impl::RetireGone(bool refresh, int64_t now_ns, const std::vector<Pending>& pending,
                             size_t used) {
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

Result<size_t> Agent::Impl::Drain(bool sample) {
  if (arena.size() != opt.batch_records) arena.resize(opt.batch_records);  // once, reused
  std::vector<DropRow> drops;
  std::vector<MetricRow> metrics;
  const int64_t now_ns = clock.WallNs();
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

void Agent::Impl::WriteOpenOps(int64_t now_ns) {
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

void Agent::Impl::TakeSnapshot(RankState& st) {
  RankSnapshot snap = st.reader->Snapshot();
  std::lock_guard<std::mutex> lock(mu);
  st.snap = std::move(snap);
  st.info.clock_offset_ns = st.snap.info.clock_offset_ns;
}

}  // namespace megascope::tracer::agent
