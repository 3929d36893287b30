// The job's pace and pauses, and membership: who left a re-formed job (impl.h).
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "impl.h"

namespace megascope::detector {

void Detector::Impl::NotePace(int k, int64_t now, const std::vector<double>& denoised) {
  vals.clear();
  for (double x : denoised) {
    if (!std::isnan(x)) vals.push_back(x);
  }
  if (static_cast<int>(vals.size()) < cfg.min_peers) {
    pace_moved[k] = kNever;  // the job does not step now: no pace to compare
    return;
  }
  const double median = MedianInPlace(vals);
  double& usual = pace_usual[k];
  if (std::isnan(usual)) usual = median;
  // Slower: a duration (the step, the peers' wait) longer than usual. While it is, the usual level
  // holds still; back within half the bar the change is over, and one held past the long weak
  // window is the job's new pace. Otherwise the usual level follows a drift over a minute.
  const double slower = (median - usual) / std::max(std::fabs(usual), 1e-12);
  if (slower > (pace_moved[k] == kNever ? cfg.pace_change : cfg.pace_change / 2)) {
    if (pace_moved[k] == kNever) pace_moved[k] = now;
    if (now - pace_moved[k] <= cfg.weak_long_window) return;
    usual = median;
  }
  pace_moved[k] = kNever;
  usual += (median - usual) / 60;
}

int Detector::Impl::PaceLeader(int64_t now, const std::vector<std::vector<Hit>>& hits,
                               bool* by_links) const {
  int64_t pace_since = kNever;  // the earliest change of the job's pace still on
  for (int64_t moved : pace_moved) {
    if (moved != kNever && (pace_since == kNever || moved < pace_since)) pace_since = moved;
  }
  if (pace_since == kNever) return -1;
  int leader = -1;
  for (size_t m = 0; m < machines.size(); ++m) {
    // What a step is made of must be off its peers, by itself: its GPU (it computes slower) or its
    // links (it moves the job's data slower: a NIC on a downgraded PCIe link stalls its peers with
    // pause frames). A cron job's CPU does not set the job's pace, nor a switch's pause frames,
    // which move several machines together.
    bool gpu = false, links = false;
    for (const Hit& h : hits[m]) {
      if (h.metric < 0 || h.company) continue;
      const MetricFamily fam = family[h.metric];
      gpu = gpu || fam == MetricFamily::kGpu;
      links = links || fam == MetricFamily::kNvlink || fam == MetricFamily::kNetwork;
    }
    if (!gpu && !links) continue;
    const MachineState& s = machines[m];
    int64_t onset = kNever;  // where its deviation began: its earliest run still on
    for (int fi = 0; fi < kFamilies; ++fi) {
      if (s.run_last[fi] != kNever && now - s.run_last[fi] <= kRunGap &&
          (onset == kNever || s.run_start[fi] < onset))
        onset = s.run_start[fi];
    }
    if (onset == kNever || std::llabs(onset - pace_since) > cfg.pace_onset_ticks) continue;
    if (leader >= 0) return -1;  // two began with it: no one machine is to blame
    leader = static_cast<int>(m);
    *by_links = !gpu;
  }
  return leader;
}

void Detector::Impl::NotePauses(int64_t now) {
  pauses.resize(group_ids.size());
  for (size_t g = 0; g < pauses.size(); ++g) {
    JobPause& p = pauses[g];
    const bool stepping =
        SourceActive(static_cast<int>(g), static_cast<int>(MetricSource::kTrainer), now);
    if (p.stepping && !stepping) {
      p.paused = now;
      p.reformed = false;
    }
    if (!p.stepping && stepping) p.resumed = now;
    p.stepping = stepping;
    if (!stepping && p.paused != kNever && p.work_votes > 0 && 2 * p.idle_votes > p.work_votes)
      p.reformed = true;
    p.idle_votes = p.work_votes = 0;
  }
}

int64_t Detector::Impl::Rejoin(const MachineState& m) const {
  const auto trainer = static_cast<size_t>(MetricSource::kTrainer);
  return std::max<int64_t>(cfg.silence_ticks, std::llround(3 * m.source_interval[trainer]));
}

bool Detector::Impl::Left(const MachineState& m, int64_t now) const {
  // Its job re-formed (its GPUs idle: the processes restarted) and resumed without it: its trainer
  // did not come back, and it does no work -- it is silent, or its GPUs idle while its peers'
  // work. A machine whose trainer is merely late, its GPUs busy, is still a member; so is one
  // named faulty, whose absence is its fault's course (it comes back named, not anew).
  if (static_cast<size_t>(m.group) >= pauses.size() || m.named >= 2) return false;
  const JobPause& p = pauses[static_cast<size_t>(m.group)];
  if (!p.reformed || !p.stepping || p.resumed <= p.paused || m.trainer_last >= p.resumed ||
      now - p.resumed < Rejoin(m))
    return false;
  return now - m.last_tick >= cfg.silence_ticks || m.idle;
}

bool Detector::Impl::QuietWithReform(const MachineState& m, int64_t now) const {
  // Gone as its job re-forms: wait for the job to resume (Left decides then) -- unless the job
  // hangs on it, its peers' GPUs spinning, which is no re-forming.
  // Only a machine gone wholly: every source it had is late (one that still reports -- a host
  // whose GPU fell off the bus -- is judged as ever).
  if (static_cast<size_t>(m.group) >= pauses.size() || m.last_tick == kNever) return false;
  for (int src = 0; src < kMetricSources; ++src) {
    const auto i = static_cast<size_t>(src);
    if (m.source_last[i] != kNever &&
        static_cast<double>(now - m.source_last[i]) <= 2 * m.source_interval[i])
      return false;
  }
  const JobPause& p = pauses[static_cast<size_t>(m.group)];
  if (!p.reformed || m.last_tick < p.paused - 2 * int64_t{cfg.together_ticks}) return false;
  if (!p.stepping) return now - p.paused < kReformTicks;  // longer: the job hangs on it
  return now - p.resumed < Rejoin(m);
}

}  // namespace megascope::detector
