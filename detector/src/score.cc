// Scoring a metric among peers: denoising, robust z, outliers, work stops, background errors,
// silences and siblings (impl.h).
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "impl.h"

namespace megascope::detector {

void Detector::Impl::Denoise(int k, int64_t now, std::vector<double>* denoised) {
  for (size_t m = 0; m < machines.size(); ++m) {
    (*denoised)[m] = series[k][m].Denoised(now, scratch);
    series[k][m].denoised_now = (*denoised)[m];
  }
}

int Detector::Impl::SiblingGroup(const std::string& name, int id) {
  SeriesName s = ParseSeries(name);
  const size_t before = s.labels.size();
  std::erase_if(s.labels, [](const auto& l) {
    return l.first == "gpu" || l.first == "device" || l.first == "port";
  });
  if (s.labels.size() == before) return -1;
  auto [it, added] = sibling_ids.try_emplace(s.Key(), static_cast<int>(siblings.size()));
  if (added) siblings.emplace_back();
  siblings[static_cast<size_t>(it->second)].push_back(id);
  return it->second;
}

void Detector::Impl::NoteSiblings(std::vector<std::vector<Hit>>* hits) {
  for (size_t m = 0; m < machines.size(); ++m) {
    for (Hit& h : (*hits)[m]) {
      if (h.metric < 0 || h.silent || h.company || sibling_group[h.metric] < 0) continue;
      const std::vector<int>& group = siblings[static_cast<size_t>(sibling_group[h.metric])];
      const double x = series[h.metric][m].denoised_now;
      vals.clear();
      for (int j : group) {
        const double v = series[static_cast<size_t>(j)][m].denoised_now;
        if (std::isfinite(v)) vals.push_back(v);
      }
      if (!std::isfinite(x) || static_cast<int>(vals.size()) < cfg.min_peers) continue;
      sorted.assign(vals.begin(), vals.end());
      const double med = MedianInPlace(vals);
      for (double& v : vals) v = std::fabs(v - med);
      const double scale =
          std::max({1.4826 * MedianInPlace(vals), cfg.relative_floor * std::fabs(med), 1e-9});
      if (std::fabs(x - med) / scale <= thresholds[h.metric]) continue;
      // Alone among them: most of its siblings sit near the median, not near it.
      const auto near = std::count_if(sorted.begin(), sorted.end(), [&](double v) {
        return std::fabs(v - x) <= thresholds[h.metric] * scale;
      });
      h.sibling = 2 * near < static_cast<long>(sorted.size());
    }
  }
}

void Detector::Impl::ScoreGroup(int k, int g, int64_t now, std::vector<double>& denoised,
                                std::vector<std::vector<Hit>>* hits_out,
                                std::vector<double>* scores) {
  const int nmach = static_cast<int>(machines.size());
  std::vector<std::vector<Hit>>& hits = *hits_out;
  std::vector<double>& last_scores = *scores;
  members.clear();
  vals.clear();
  for (int m = 0; m < nmach; ++m) {
    if (machines[m].group == g && !machines[m].outside && std::isfinite(denoised[m])) {
      denoised[m] -= series[k][m].bias;
      members.push_back(m);
      vals.push_back(denoised[m]);
    }
  }
  const int n = static_cast<int>(members.size());
  if (n < cfg.min_peers) return;
  const double med = MedianInPlace(vals);
  for (int i = 0; i < n; ++i) vals[i] = std::fabs(denoised[members[i]] - med);
  const double spread = 1.4826 * MedianInPlace(vals);
  // The spread never counts as much below what the peers usually show: while the whole job is
  // idle, stalled or loading every machine looks alike, and a near-zero spread would turn noise
  // into huge z-scores. The usual spread learns fast from normal ticks and only slowly from
  // collapsed ones; the usual level keeps the relative floor while the median sits near zero.
  double& typical = spread_ewma[k];
  if (typical == 0) {
    typical = spread;
  } else {
    typical += (spread - typical) / (spread >= 0.5 * typical ? 600.0 : 7200.0);
  }
  double& level = level_ewma[k];
  level += (std::fabs(med) - level) / (level == 0 ? 1.0 : 600.0);
  const double usual = work[k] ? UsualWork(k, g, med) : 0;
  if (work[k] && family[k] == MetricFamily::kGpu && usual > 0 &&
      static_cast<size_t>(g) < pauses.size()) {
    ++pauses[static_cast<size_t>(g)].work_votes;
    pauses[static_cast<size_t>(g)].idle_votes += med < kStoppedShare * 10 * usual ? 1 : 0;
  }
  const double scale = std::max({spread, cfg.spread_floor * typical,
                                 cfg.relative_floor * std::max(std::fabs(med), 0.5 * level),
                                 background[k] ? BackgroundSpread(k, g, denoised) : 0.0, 1e-6});
  // An outlier is a machine off its peers and alone there: when at least `min_peers` machines
  // sit together off the median (another GPU generation, a pipeline stage with a lighter load),
  // they are a sub-population doing other work, not a fault.
  const double thr = thresholds[k];
  auto alone = [&](const std::vector<double>& sorted, double x) {
    const double tol = thr * scale;
    const auto lo = std::lower_bound(sorted.begin(), sorted.end(), x - tol);
    const auto hi = std::upper_bound(sorted.begin(), sorted.end(), x + tol);
    return hi - lo < cfg.min_peers;
  };
  sorted.clear();
  for (int m : members) sorted.push_back(denoised[m]);
  std::sort(sorted.begin(), sorted.end());
  int outliers = 0, together = 0;
  lone.assign(nmach, 0);
  for (int m : members) {
    if (std::fabs(denoised[m] - med) / scale <= thr) continue;
    // A training metric off only against its own usual offset, its value among its peers': back
    // in the pack (an offset learned while its job warmed up), and no machine among its peers
    // holds the job back; it learns its place again.
    if (family[k] == MetricFamily::kTraining &&
        std::fabs(denoised[m] + series[k][m].bias - med) / scale <= thr)
      continue;
    if (alone(sorted, denoised[m])) {
      lone[m] = 1;
      ++outliers;
    } else {
      lone[m] = 2;
      ++together;
    }
  }
  if (outliers > std::max(1.0, cfg.job_wide_fraction * n)) return;  // the job moved
  const bool few = outliers + together <= cfg.job_wide_fraction * n;
  for (int m : members) {
    if (lone[m] == 2 && few && Learned(k, m))
      hits[m].push_back({k, (denoised[m] - med) / scale, false, false, true});
    const size_t before = hits[m].size();
    Judge(k, m, now, denoised[m] - med, scale, thr, lone[m] == 1, &hits[m], &last_scores[m]);
    if (work[k] && med > 0) NoteWork(k, m, now, med, usual, hits[m].size() > before, &hits[m]);
  }
}

void Detector::Impl::NoteWork(int k, int m, int64_t now, double med, double usual, bool hit,
                              std::vector<Hit>* hits) {
  // A work metric (utilisation, traffic) at nothing while the peers' is busy: the machine stopped
  // working and the job waits on it -- as hard as an error counter.
  // Its latest sample decides (a flapping link is at nothing only while it is down).
  Series& sm = series[k][m];
  const bool busy = med >= 0.5 * usual;  // its peers at their usual work
  const bool at_nothing = sm.Latest() <= kStoppedShare * med;
  if (family[k] == MetricFamily::kGpu && busy && at_nothing) machines[m].idle = true;
  if (hit && now - sm.last_tick <= std::llround(sm.interval) && at_nothing) {
    hits->back().stopped = true;
    NoteStop(&sm, now, busy, true, at_nothing);
    return;
  }
  NoteStop(&sm, now, busy, false, at_nothing);
  // Stopped three times within the long window (a link going down and up): it stays stopped
  // through the spells between, as long as the last one lasted.
  if (!hit && Flapping(sm, now)) hits->push_back({k, sm.last_z, false, true});
}

double Detector::Impl::BackgroundSpread(int k, int g, const std::vector<double>& denoised) {
  // Healthy hardware shows a few corrected errors (an NVLink CRC retry, a symbol error): their
  // count over the denoising window is about Poisson, so a healthy machine's rate sits within a
  // few sqrt(rate / window) of the usual rate -- and a fault multiplies it. With no background
  // (no peer ever shows one) this is 0, and one machine's errors stand out as before.
  std::vector<double>& rates = error_rate[static_cast<size_t>(k)];
  if (rates.size() <= static_cast<size_t>(g)) rates.resize(static_cast<size_t>(g) + 1, -1);
  scratch.clear();
  for (int m : members) scratch.push_back(std::max(0.0, denoised[m]));
  std::sort(scratch.begin(), scratch.end());
  const size_t keep = std::max<size_t>(1, scratch.size() * 9 / 10);
  double sum = 0;
  for (size_t i = 0; i < keep && i < scratch.size(); ++i) sum += scratch[i];
  const double now_rate = scratch.empty() ? 0 : sum / static_cast<double>(keep);
  double& usual = rates[static_cast<size_t>(g)];
  auto& seen = error_ticks[static_cast<size_t>(k)];
  if (seen.size() <= static_cast<size_t>(g)) seen.resize(static_cast<size_t>(g) + 1, 0);
  const double n = std::min(kBackgroundTicks, static_cast<double>(++seen[static_cast<size_t>(g)]));
  usual = usual < 0 ? now_rate : usual + (now_rate - usual) / n;
  return std::sqrt(usual / cfg.denoise_window) + usual;
}

double Detector::Impl::UsualWork(int k, int g, double med) {
  std::vector<double>& levels = work_level[static_cast<size_t>(k)];
  if (levels.size() <= static_cast<size_t>(g)) levels.resize(static_cast<size_t>(g) + 1, 0);
  double& usual = levels[static_cast<size_t>(g)];
  usual += (std::fabs(med) - usual) / (usual == 0 ? 1.0 : 600.0);
  return usual;
}

void Detector::Impl::NoteStop(Series* s, int64_t now, bool busy, bool stopped,
                              bool at_nothing) const {
  if (!busy) {
    s->busy_since = kNever;
    return;
  }
  if (s->busy_since == kNever) s->busy_since = now;
  if (stopped) {
    if (s->last_stop != now - 1) s->stop_start = now;
    s->last_stop = now;
    return;
  }
  if (s->last_stop != now - 1 || at_nothing) return;  // no run just ended, or not back at work
  if (s->last_stop - s->stop_start + 1 >= kStopRun &&
      s->busy_since <= s->stop_start - cfg.denoise_window)
    s->stop_runs = {s->stop_start, s->stop_runs[0], s->stop_runs[1]};
}

void Detector::Impl::Judge(int k, int m, int64_t now, double offset, double scale, double thr,
                           bool lone, std::vector<Hit>* hits, double* score) {
  const double z = offset / scale;
  Series& s = series[k][m];
  if (s.learned < cfg.warmup_ticks) {
    // A machine's first ticks on a metric only teach its usual offset: the median of its
    // deviations, so a transient (one XID event) does not become its baseline. A machine
    // that differs in level from the start (another GPU generation, the only machine of its
    // pipeline stage) is healthy character as far as its levels can tell; but errors while
    // its peers have none are never anyone's character: a machine faulty from its first
    // sample is named by them.
    s.warm.push_back(offset);
    if (++s.learned == cfg.warmup_ticks) {
      const double bias = MedianInPlace(s.warm);
      std::vector<double>().swap(s.warm);
      const bool errors_alone = family[k] == MetricFamily::kErrors && std::fabs(bias) / scale > thr;
      s.bias = errors_alone ? 0 : bias;
    }
    return;
  }
  *score = std::max(*score, std::fabs(z));
  if (lone) {
    hits->push_back({k, z, false});
    if (s.last_hit != now - 1) {  // a new burst
      s.third_burst = s.prev_burst < kNever ? kNever : s.prev_burst;
      s.prev_burst = s.last_burst;
      s.last_burst = now;
    }
    s.last_hit = now;
    s.last_z = z;
  } else if (family[k] == MetricFamily::kErrors && !InBackground(k, machines[m].group) &&
             RepeatingErrors(k, s, now)) {
    // Errors that repeat with quiet seconds between (ECC corrections; a flapping link going down
    // every minute: three bursts within the long window) stay evidence through the quiet spell,
    // as long as the last one between bursts; a single burst never does, nor two a minute apart
    // (a healthy card corrects an error now and then).
    hits->push_back({k, s.last_z, false});
  } else if (family[k] != MetricFamily::kErrors && machines[m].named < 2) {
    // Errors are never anyone's usual place.
    // Not alone: wherever it sits is its usual place among its peers, so its offset follows
    // it. Offsets are thus learned in every regime: an older GPU generation runs cooler
    // under load but idles like everyone, and all of its machines move together when the
    // job changes regime (a sub-population, never alone). A machine that moves by itself --
    // a throttled GPU landing on the older generation's levels -- is alone against its own
    // usual place, and does not learn while it is. Nor does a machine named faulty: a fault that
    // moves one metric less than the threshold (the slowest machine waits least in the all-reduce)
    // would otherwise become its usual place, and once the fault is over its healthy level would
    // stand out for good.
    s.bias += offset / cfg.bias_ticks;
  }
}

void Detector::Impl::NoteSilences(int k, int64_t now, std::vector<std::vector<Hit>>* hits) {
  const int nmach = static_cast<int>(machines.size());
  if (k < 0) {  // the whole machine
    for (int m = 0; m < nmach; ++m) {
      const MachineState& s = machines[m];
      if (s.outside || QuietWithReform(s, now) || s.last_tick == kNever ||
          now - s.last_tick < cfg.silence_ticks || now - s.last_tick > cfg.forget_ticks)
        continue;
      if (PeersActive(s.group, -1, now)) (*hits)[m].push_back({-1, 0, true});
    }
    return;
  }
  // A machine that stopped reporting this metric while its peers still do.
  for (int m = 0; m < nmach; ++m) {
    const int64_t last = series[k][m].last_tick;
    if (machines[m].outside || last == kNever ||
        now - last < series[k][m].Quiet(cfg.silence_ticks) || now - last > cfg.forget_ticks)
      continue;
    if (machines[m].last_tick < now - cfg.silence_ticks) continue;  // whole machine silent
    const int src = static_cast<int>(source[k]);
    if (machines[m].source_last[src] < now - series[k][m].Quiet(cfg.silence_ticks))
      continue;  // the whole source: NoteSources'
    if (PeersActive(machines[m].group, k, now)) (*hits)[m].push_back({k, 0, true});
  }
}

}  // namespace megascope::detector
