#include "megascope/detector/detector.h"

#include <algorithm>
#include <cmath>

#include "impl.h"

namespace megascope::detector {

Detector::Detector(DetectorConfig config) : impl_(std::make_unique<Impl>()) {
  impl_->cfg = std::move(config);
}
Detector::~Detector() = default;

bool Detector::SetPeerGroup(const std::string& machine, const std::string& group) {
  auto it = impl_->cfg.groups.find(machine);
  if (it != impl_->cfg.groups.end() && it->second == group) return true;
  if (impl_->seen.count(machine)) return false;
  impl_->cfg.groups[machine] = group;
  return true;
}

void Detector::Impl::Ingest(const Frame& f) {
  const int64_t now = f.tick;
  for (const Frame::Cell& c : f.cells) {
    series[c.metric][c.machine].Add(now, c.value);
    MachineState& m = machines[c.machine];
    if (m.first_tick == kNever) m.first_tick = now;
    m.last_tick = now;
    const int src = static_cast<int>(source[c.metric]);
    if (m.source_last[src] != kNever && now > m.source_last[src]) {
      m.source_interval[src] +=
          (std::min(60.0, static_cast<double>(now - m.source_last[src])) - m.source_interval[src]) /
          8;
    }
    m.source_last[src] = now;
    if (source[c.metric] == MetricSource::kTrainer) m.trainer_last = now;
  }
  // Membership (docs/formats.md section 3): only machines doing the job's work are peers. Where
  // the job's trainers report, a machine whose trainer never did is outside the job; it joins as
  // soon as its trainer reports (a replacement under a new name). A member stays one: a machine
  // that left at a scale-down is not yet told apart from one whose trainer died.
  bool trainers = false;
  for (const MachineState& m : machines) trainers = trainers || m.trainer_last != kNever;
  for (MachineState& m : machines) {
    if (m.left != kNever && m.trainer_last > m.left) m.left = kNever;  // back in the job
    if (m.left == kNever && trainers && Left(m, now)) m.left = now;
    m.outside = trainers && (m.trainer_last == kNever || m.left != kNever);
    m.idle = false;
  }
}

void Detector::OnFrame(const Frame& f, const Registry& reg, std::vector<Verdict>* out) {
  Impl& d = *impl_;
  d.Grow(reg);
  d.Ingest(f);
  const int64_t now = f.tick;
  const int nmach = static_cast<int>(d.machines.size());
  // Per tick: which machines stand out, and why.
  std::vector<std::vector<Impl::Hit>> hits(nmach);
  last_scores_.assign(nmach, 0);
  std::vector<double> denoised(nmach);
  for (int k = 0; k < static_cast<int>(d.series.size()); ++k) {
    d.Denoise(k, now, &denoised);
    if (d.duration[k]) d.NotePace(k, now, denoised);
    for (int g = 0; g < static_cast<int>(d.group_ids.size()); ++g)
      d.ScoreGroup(k, g, now, denoised, &hits, &last_scores_);
    d.NoteSilences(k, now, &hits);
  }
  d.NoteSilences(-1, now, &hits);
  d.NoteSiblings(&hits);
  d.NotePauses(now);
  d.NoteSources(now, &hits, f, reg, out);
  d.GroupCohorts(now, &hits, f, reg, out);
  d.Conclude(now, hits, f, reg, out);
}

double Detector::Confidence(const std::vector<EvidenceItem>& evidence, int continuity) {
  // Noisy-OR over metric families: each family's evidence is a chance the machine is faulty,
  // weighted by its kind and by how long it held. Adding evidence never lowers the result.
  std::map<MetricFamily, double> best;
  for (const EvidenceItem& e : evidence) {
    const double weight = e.silent || (IsStrong(e.family) && !e.aside) ? 0.9 : 0.5;
    const double p = weight * std::min(1.0, static_cast<double>(e.ticks) / std::max(1, continuity));
    double& b = best[e.silent ? MetricFamily::kErrors : e.family];
    b = std::max(b, p);
  }
  double miss = 1;
  for (const auto& [fam, p] : best) miss *= 1 - p;
  return std::min(0.99, 1 - miss);
}

}  // namespace megascope::detector
