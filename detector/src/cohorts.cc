// Machines that move together for one cause: cohorts and shared_component verdicts (impl.h).
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "impl.h"

namespace megascope::detector {

void Detector::Impl::FindCohorts(std::vector<int> ms, MetricFamily fam, int component, int min,
                                 int window) {
  const int fi = static_cast<int>(fam);
  std::sort(ms.begin(), ms.end(),
            [&](int a, int b) { return machines[a].run_start[fi] < machines[b].run_start[fi]; });
  size_t i = 0;
  while (i < ms.size()) {
    size_t j = i;
    const int64_t first = machines[ms[i]].run_start[fi];
    while (j < ms.size() && machines[ms[j]].run_start[fi] - first <= window) ++j;
    if (static_cast<int>(j - i) < min) {
      ++i;
      continue;
    }
    cohorts.push_back(
        {component, fam,
         std::vector<int>(ms.begin() + static_cast<long>(i), ms.begin() + static_cast<long>(j)),
         first});
    i = j;
  }
}

void Detector::Impl::GroupCohorts(int64_t now, std::vector<std::vector<Hit>>* hits_io,
                                  const Frame& f, const Registry& reg, std::vector<Verdict>* out) {
  std::vector<std::vector<Hit>>& hits = *hits_io;
  const int nmach = static_cast<int>(machines.size());
  FindAllCohorts(now, hits);
  std::vector<uint32_t> explained(nmach, 0);
  std::vector<uint8_t> grouped(nmach, 0);
  for (const Cohort& c : cohorts) {
    for (int m : c.members) {
      explained[m] |= Bit(c.family);
      grouped[m] = grouped[m] || c.component >= 0;
    }
  }
  NameCohorts(now, hits, explained, grouped, f, reg, out);
  for (int m = 0; m < nmach; ++m) {
    auto& h = hits[m];
    h.erase(std::remove_if(h.begin(), h.end(),
                           [&](const Hit& x) {
                             return x.company || (x.metric >= 0 && !x.stopped &&
                                                  (explained[m] & Bit(family[x.metric])) != 0);
                           }),
            h.end());
  }
}

void Detector::Impl::FindAllCohorts(int64_t now, const std::vector<std::vector<Hit>>& hits) {
  const int nmach = static_cast<int>(machines.size());
  // A deviation that ceased only while the whole job paused and came back as it resumed is the
  // same deviation: its onset stays where it began. Else every machine still faulty after a
  // checkpoint would begin again at the same tick, a cohort by onset, and be explained away.
  // (The trainers' pause is seen up to two steps late; the deviation may return a step before
  // they report again.)
  const int64_t slack = kRunGap + cfg.cohort_ticks;
  auto across_pause = [&](const MachineState& s, int fi) {
    const JobPause& p = pauses[static_cast<size_t>(s.group)];
    return p.paused != kNever && s.run_last[fi] != kNever && s.run_last[fi] >= p.paused - slack &&
           (!p.stepping || (p.resumed > p.paused && now - p.resumed <= slack));
  };
  std::array<std::vector<int>, kFamilies> on;  // machines standing out on each family now
  for (int m = 0; m < nmach; ++m) {
    uint32_t fams = 0;
    for (const Hit& h : hits[m]) {
      if (h.metric >= 0 && !h.stopped && family[h.metric] != MetricFamily::kErrors)
        fams |= Bit(family[h.metric]);
    }

    MachineState& s = machines[m];
    for (int fi = 0; fi < kFamilies; ++fi) {
      if (!(fams >> fi & 1u)) continue;
      if (now - s.run_last[fi] > kRunGap && !across_pause(s, fi)) s.run_start[fi] = now;
      s.run_last[fi] = now;
      on[fi].push_back(m);
    }
  }
  cohorts.clear();
  for (int fi = 0; fi < kFamilies; ++fi) {
    if (on[fi].size() < 2) continue;
    const auto fam = static_cast<MetricFamily>(fi);
    FindCohorts(on[fi], fam, -1, cfg.cohort_min, cfg.cohort_ticks);
    std::map<int, std::vector<int>> by_component;
    for (int m : on[fi]) {
      for (int c : machines[m].components) by_component[c].push_back(m);
    }
    // At least two of the component's machines, and a quarter of them (a row of 32 racks' worth
    // of machines is no cohort because two of them deviate).
    for (auto& [c, ms] : by_component) {
      const int need = std::max(2, (component_size[c] + 3) / 4);
      if (static_cast<int>(ms.size()) >= need)
        FindCohorts(std::move(ms), fam, c, need, cfg.component_ticks);
    }
  }
}

void Detector::Impl::NameCohorts(int64_t now, const std::vector<std::vector<Hit>>& hits,
                                 const std::vector<uint32_t>& explained,
                                 const std::vector<uint8_t>& grouped, const Frame& f,
                                 const Registry& reg, std::vector<Verdict>* out) {
  const int nmach = static_cast<int>(machines.size());
  const int need = static_cast<int>(std::ceil(cfg.continuity_fraction * cfg.continuity));
  for (int m = 0; m < nmach; ++m) {
    // Explained away: evidence (not mere company) of a family its cohort moved on.
    bool lone = false;
    for (const Hit& h : hits[m]) {
      lone = lone || (h.metric >= 0 && !h.company && !h.stopped &&
                      (explained[m] & Bit(family[h.metric])) != 0);
    }
    machines[m].explained.Push(now, lone);
    machines[m].grouped.Push(now, grouped[m] != 0);
    machines[m].cohort.Push(now, explained[m] != 0);
  }
  // Named once it held for most of the continuity window: a cohort by onset alone only when it
  // explained evidence away (machines that merely keep company -- another GPU generation at a
  // change of regime -- are a sub-population, never named); one the topology knows always.
  for (const Cohort& c : cohorts) {
    bool due = false, fresh = false;
    for (int m : c.members) {
      const MachineState& s = machines[m];
      due = due || (c.component >= 0 ? s.grouped : s.explained).Count() >= need;
      fresh = fresh || !s.component_named;
    }
    if (!due || !fresh) continue;
    for (int m : c.members) machines[m].component_named = true;
    out->push_back(ComponentVerdict(c, hits, f, reg));
  }
  // Re-armed once out of every cohort for most of the window (not while a member that just
  // joined has few cohort ticks yet: that named the same cohort again every tick).
  for (int m = 0; m < nmach; ++m) {
    MachineState& s = machines[m];
    if (explained[m] == 0 && s.cohort.Count() <= cfg.rearm_fraction * cfg.continuity)
      s.component_named = false;
  }
}

Verdict Detector::Impl::ComponentVerdict(const Cohort& c, const std::vector<std::vector<Hit>>& hits,
                                         const Frame& f, const Registry& reg) const {
  Verdict v;
  v.kind = VerdictKind::kSharedComponent;
  v.cause =
      megascope::Name(c.component >= 0 ? Cause::kComponentOutlier : Cause::kSimultaneousOnset);
  if (c.component >= 0) v.group = component_names[c.component];
  std::set<std::string> metrics;
  std::string names;
  for (int m : c.members) {
    v.root_nodes.push_back(reg.machine_name(m));
    names += (names.empty() ? "" : ", ") + reg.machine_name(m);
    for (const Hit& h : hits[m]) {
      if (h.metric >= 0 && family[h.metric] == c.family) metrics.insert(reg.metric_name(h.metric));
    }
  }
  v.evidence.assign(metrics.begin(), metrics.end());
  v.detected_at_ns = static_cast<int64_t>(f.end_s * 1e9);
  v.onset_at_ns = static_cast<int64_t>(static_cast<double>(c.onset) * cfg.tick_s * 1e9);
  v.confidence = c.component >= 0 ? 0.9 : 0.7;
  const std::string where = c.component >= 0
                                ? "sharing " + v.group
                                : "their deviations beginning within " +
                                      std::to_string(cfg.cohort_ticks) + " s of each other";
  v.explanation = std::to_string(c.members.size()) + " machines (" + names +
                  ") stand out together on " + MetricFamilyName(c.family) + " metrics, " + where +
                  ": one shared cause (a switch, a rack's cooling or power), not " +
                  std::to_string(c.members.size()) +
                  " faulty machines; none is blamed for that evidence";
  return v;
}

}  // namespace megascope::detector
