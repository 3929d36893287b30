// Exporters that stop: monitoring gaps, a machine's sources stopping together (impl.h).
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "impl.h"
#include "megascope/tracer/format.h"

namespace megascope::detector {

uint32_t Detector::Impl::StoppedWithJob(size_t m, uint32_t alone,
                                        const std::vector<Hit>& hits) const {
  // A GPU that falls off the bus stops its exporter, and the job stops at its next collective,
  // within a step: every trainer stops, so the machine's own trainer never stopped alone (its
  // peers never reported a step after it). A source that stopped alone as the job's trainers
  // stopped is its failure. Not when the machine is otherwise like its peers: an exporter that
  // restarts as a checkpoint begins stops alone as the job stops too, and leaves the host as it
  // was.
  const MachineState& s = machines[m];
  const int job = static_cast<int>(MetricSource::kTrainer);
  const int64_t job_last = s.source_last[job];
  if (job_last == kNever || pauses[static_cast<size_t>(s.group)].stepping) return 0;
  const auto every = std::max<int64_t>(1, std::llround(s.source_interval[job]));
  uint32_t found = 0;
  for (int src = 0; src < kMetricSources; ++src) {
    if (src == job || !(alone >> src & 1u)) continue;
    const int64_t last = s.source_last[src];
    // The peers' trainers stepped until about then (one step before it at most) and not after.
    if (std::llabs(job_last - last) <= cfg.together_ticks + every &&
        SourceContinued(s.group, job, last - cfg.together_ticks - every) &&
        !SourceContinued(s.group, job, last + cfg.together_ticks))
      found |= 1u << src;
  }
  if (found == 0) return 0;
  for (const Hit& h : hits) {
    if (h.metric >= 0 && !h.silent && !h.company &&
        !(found >> static_cast<int>(source[h.metric]) & 1u) &&
        static_cast<int>(source[h.metric]) != job)
      return found | 1u << job;
  }
  return 0;
}

void Detector::Impl::NoteSources(int64_t now, std::vector<std::vector<Hit>>* hits, const Frame& f,
                                 const Registry& reg, std::vector<Verdict>* out) {
  for (size_t m = 0; m < machines.size(); ++m) {
    MachineState& s = machines[m];
    if (s.outside || QuietWithReform(s, now)) continue;
    if (s.last_tick == kNever || now - s.last_tick >= cfg.silence_ticks) continue;  // all silent
    uint32_t gaps = 0, alone = 0;
    for (int src = 0; src < kMetricSources; ++src) {
      const int64_t last = s.source_last[src];
      const int run = std::exchange(s.gap_run[src], 0);
      if (!source_present[src] || (last != kNever && now - last > cfg.forget_ticks)) continue;
      const int64_t every = std::max<int64_t>(1, std::llround(s.source_interval[src]));
      if (last != kNever && now - last == 2 * every && s.stop_seen[src] != last) {
        // Two of its intervals after its last report (a lost scrape is one): did its peers
        // report it since, a whole interval later? (At a checkpoint every trainer stops.)
        s.stop_seen[src] = last;
        s.stop_alone[src] = SourceContinued(s.group, src, last + every - 1);
      }
      const int64_t quiet =
          std::max<int64_t>(cfg.silence_ticks, std::llround(3 * s.source_interval[src]));
      if (last != kNever && now - last < quiet) {
        s.gap_named &= ~(1u << src);  // reporting
        continue;
      }
      if (last == kNever && now - s.first_tick < cfg.silence_ticks) continue;
      if (last != kNever && s.stop_seen[src] == last && s.stop_alone[src]) alone |= 1u << src;
      if (SourceActive(s.group, src, now)) {
        gaps |= 1u << src;
        s.gap_run[src] = run + 1;
      }
    }
    if (gaps == 0) continue;
    if (const uint32_t with_job = StoppedWithJob(m, alone, (*hits)[m]); with_job != 0) {
      s.stopped_together = with_job;
      (*hits)[m].push_back({kStoppedWithJob, 0, true});
      continue;
    }
    // Two sources that each stopped while the peers went on, within seconds: the machine failed.
    uint32_t together = 0;
    for (int a = 0; a < kMetricSources; ++a) {
      for (int b = a + 1; b < kMetricSources; ++b) {
        if ((alone >> a & 1u) && (alone >> b & 1u) &&
            std::llabs(s.source_last[a] - s.source_last[b]) <= cfg.together_ticks)
          together |= (1u << a) | (1u << b);
      }
    }
    if (together != 0) {
      s.stopped_together = together;
      (*hits)[m].push_back({-2, 0, true});
      continue;
    }
    // A machine that stands out otherwise: the gap is part of what is wrong with it, not a
    // monitoring problem.
    if (s.named > 0 || s.recent.Count() > cfg.rearm_fraction * cfg.continuity) continue;
    for (int src = 0; src < kMetricSources; ++src) {
      if (!(gaps >> src & 1u) || (s.gap_named >> src & 1u) || s.gap_run[src] < cfg.gap_report_ticks)
        continue;
      const int64_t since = now - s.gap_run[src] + 1;  // since its peers report it
      s.gap_named |= 1u << src;
      Verdict v;
      v.kind = VerdictKind::kMonitoringGap;
      v.cause = megascope::Name(Cause::kSourceSilent);
      v.root_nodes = {reg.machine_name(static_cast<int>(m))};
      v.detected_at_ns = static_cast<int64_t>(f.end_s * 1e9);
      v.onset_at_ns = static_cast<int64_t>(static_cast<double>(since) * cfg.tick_s * 1e9);
      v.confidence = 0.9;
      const char* name = MetricSourceName(static_cast<MetricSource>(src));
      v.evidence.emplace_back(name);
      std::string buf = tracer::Format(
          "%s's %s sent nothing for %d s (%s) while its other sources and its "
          "peers' %s report: a monitoring gap (an exporter restarting or not deployed), "
          "not evidence against the machine",
          reg.machine_name(static_cast<int>(m)).c_str(), name, s.gap_run[src],
          s.source_last[src] == kNever ? "never since it joined" : "it stopped", name);
      v.explanation = buf;
      out->push_back(std::move(v));
    }
  }
}

}  // namespace megascope::detector
