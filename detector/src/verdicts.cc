// Concluding: continuity windows, levels, re-arming, a second fault, and the verdicts themselves
// (impl.h).
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "impl.h"
#include "megascope/tracer/format.h"

namespace megascope::detector {

void Detector::Impl::Conclude(int64_t now, const std::vector<std::vector<Hit>>& hits,
                              const Frame& f, const Registry& reg, std::vector<Verdict>* out) {
  const int nmach = static_cast<int>(machines.size());
  // Continuity: the same machine must stand out for most of a window. Hard evidence (silence, two
  // sources stopping together, an error counter, a training metric: the job is hurt) names it
  // faulty over the short window; two families agreeing (or three metrics of one) only over the
  // weak window, longer than any benign excursion -- over the short one they make it a suspect,
  // as one family alone does over the weak window. A machine that flaps (a NIC going up and down)
  // stands out only part of the time: the long windows catch it at half.
  auto need = [](double fraction, int window) {
    return static_cast<int>(std::ceil(fraction * window));
  };
  const int strong_need = need(cfg.continuity_fraction, cfg.continuity);
  const int strong_long_need = need(cfg.long_fraction, cfg.long_window);
  const int weak_need = need(cfg.weak_fraction, cfg.weak_continuity);
  const int weak_long_need = need(cfg.long_fraction, cfg.weak_long_window);
  const int two_need = need(cfg.continuity_fraction, cfg.corroborated_continuity);
  auto held = [&](const Rolling& a, const Rolling& b, int na, int nb) -> const Rolling* {
    if (a.Count() >= na) return &a;
    return b.Count() >= nb ? &b : nullptr;
  };
  // The job slowed with it: hard when its GPU is off its peers; with only its links off them, the
  // job's pace is a second family agreeing, held over the weak window -- an incast burst that
  // happens to begin as the job slows lasts a minute at most.
  bool by_links = false;
  const int leader = PaceLeader(now, hits, &by_links);
  for (int m = 0; m < nmach; ++m) {
    MachineState& s = machines[m];
    // Outside the job it is not judged: its windows and verdicts wait, unchanged, for its return
    // (a machine that left named faulty comes back named, not cleared by its absence).
    if (s.outside) continue;
    bool hard = m == leader && !by_links;
    uint32_t families = 0;
    std::array<int, kFamilies> metrics{};
    for (const Hit& h : hits[m]) {
      // The whole machine silent is hard; one metric missing (its ranks between steps while
      // their peers finish one) only counts for its family.
      const MetricFamily fam = h.metric < 0 ? MetricFamily::kErrors : family[h.metric];
      hard = hard || h.metric < 0 || h.stopped || (!h.silent && IsStrong(fam) && !Aside(h));
      families |= Bit(fam);
      if (!h.silent) ++metrics[static_cast<int>(fam)];
    }
    // Corroborated: two families agree, or three sensors of one device (a GPU's utilisation,
    // power and memory all off its peers); the benign excursions move one metric, two at most.
    const bool two = (families & (families - 1)) != 0;
    // Background errors above their peers' (a magnitude) count as a corroborated signal: a
    // suspect over the short window, faulty once they outlast a benign spell (the weak window).
    const bool lasting_errors = std::any_of(hits[m].begin(), hits[m].end(), [&](const Hit& h) {
      return h.metric >= 0 && !h.silent && InBackground(h.metric);
    });
    // One GPU or port off its siblings as well as off its peers: two comparisons agreeing.
    const bool by_siblings =
        std::any_of(hits[m].begin(), hits[m].end(), [](const Hit& h) { return h.sibling; });
    const bool corr = two || m == leader || lasting_errors || by_siblings ||
                      *std::max_element(metrics.begin(), metrics.end()) >= 3;
    const bool any = !hits[m].empty();
    s.recent.Push(now, any);
    Rearm(now, &s);
    if (s.named >= 2) NoteFresh(now, m, hits[m], m == leader && !by_links);
    Remember(now, hits[m], hard, corr, two, m == leader, &s);
    int level = 0;
    const Rolling* window = held(s.hard, s.hard_long, strong_need, strong_long_need);
    if (window == nullptr) window = held(s.two, s.two, two_need, two_need);
    if (window == nullptr) window = held(s.corr, s.corr_long, weak_need, weak_long_need);
    if (window != nullptr) {
      level = 2;
    } else {
      window = held(s.strong, s.strong_long, strong_need, strong_long_need);
      if (window == nullptr) window = held(s.weak, s.weak_long, weak_need, weak_long_need);
      if (window != nullptr) level = 1;
    }
    if (level > s.named) {
      out->push_back(Name(m, level, *window, f, reg));
    } else if (s.named >= 2 && s.fresh.Count() >= strong_need) {
      out->push_back(NameAgain(m, f, reg));
    }
  }
}

void Detector::Impl::Remember(int64_t now, const std::vector<Hit>& hits, bool hard, bool corr,
                              bool two, bool leads_pace, MachineState* s) const {
  const bool any = !hits.empty();
  s->hard.Push(now, hard);
  s->hard_long.Push(now, hard);
  s->corr.Push(now, corr);
  s->two.Push(now, two);
  s->corr_long.Push(now, corr);
  s->strong.Push(now, hard || corr);
  s->strong_long.Push(now, hard || corr);
  s->weak.Push(now, any);
  s->weak_long.Push(now, any);
  if (s->weak_long.Count() == 0) {
    s->evidence.clear();
    s->stopped.clear();
  }
  for (const Hit& h : hits) {
    if (h.stopped) s->stopped.insert(h.metric);
    auto& e = s->evidence[h.metric];
    ++e.first;
    if (std::fabs(h.z) > std::fabs(e.second)) e.second = h.z;
  }
  if (leads_pace) ++s->evidence[kPaceLed].first;
}

// A hard signal of a machine named faulty that its verdicts did not give: a second fault that
// began before the first ended (a repaired machine back with a new one). An error it had not shown
// -- a counter, or a code (XID 74 after XID 48) -- is news at once; the job hurt by it (longer
// steps, the job's pace) only once what it was named for is over, as the first fault's course
// hurts the job too. Its going silent or stopping work once named is that course, never news.
void Detector::Impl::NoteFresh(int64_t now, int m, const std::vector<Hit>& hits, bool leads_pace) {
  MachineState& s = machines[static_cast<size_t>(m)];
  bool error = false, hurt = leads_pace && s.named_for.count(kPaceLed) == 0, former = false;
  for (const Hit& h : hits) {
    former = former || s.named_for.count(h.metric) > 0;
    if (h.metric < 0 || h.silent || !IsStrong(family[h.metric]) || Aside(h)) continue;
    const bool is_error = family[h.metric] == MetricFamily::kErrors;
    if (s.named_for.count(h.metric) > 0 && !NewCode(h.metric, m)) continue;
    if (error_code[h.metric] && series[h.metric][m].Latest() == 0) continue;  // no code now
    (is_error ? error : hurt) = true;
  }
  s.former.Push(now, former);
  s.fresh.Push(now, error || (hurt && s.former.Count() == 0));
}

// Whether error code metric k of machine m shows a code its verdicts have not given.
bool Detector::Impl::NewCode(int k, int m) const {
  if (!error_code[k]) return false;
  const double code = series[k][m].Latest();
  return code != 0 && machines[static_cast<size_t>(m)].named_codes.count({k, code}) == 0;
}

// What a faulty verdict on machine m gave: its evidence's metrics and the error codes they show.
void Detector::Impl::NoteNamed(int m) {
  MachineState& s = machines[static_cast<size_t>(m)];
  for (const auto& e : s.evidence) {
    s.named_for.insert(e.first);
    if (e.first >= 0 && error_code[e.first]) {
      const double code = series[e.first][m].Latest();
      if (code != 0) s.named_codes.insert({e.first, code});
    }
  }
}

// Named at `level` over `window` (a suspect, or faulty).
Verdict Detector::Impl::Name(int m, int level, const Rolling& window, const Frame& f,
                             const Registry& reg) {
  machines[static_cast<size_t>(m)].named = level;
  Verdict v = MakeVerdict(m, window, f, reg);
  if (level >= 2) NoteNamed(m);
  return v;
}

// Named faulty again on what is new: the evidence its earlier verdicts gave is left out, so the
// verdict says what the second fault shows, and its window is the one the new signal held over.
Verdict Detector::Impl::NameAgain(int m, const Frame& f, const Registry& reg) {
  MachineState& s = machines[static_cast<size_t>(m)];
  for (int k : s.named_for) {
    if (k < 0 || !NewCode(k, m)) s.evidence.erase(k);
  }
  Verdict v = MakeVerdict(m, s.fresh, f, reg);
  NoteNamed(m);
  s.fresh.Clear();
  return v;
}

// Re-armed once it no longer stands out while its job steps (the fault is over, or was never one;
// a checkpoint idles every machine, and the fault is back as the job resumes). Its windows still
// hold the old fault's evidence -- the long ones for minutes after it ended -- so they are emptied,
// with the evidence they gathered: a new fault soon after is judged, explained and weighed on its
// own evidence, not hidden behind the verdict given.
void Detector::Impl::Rearm(int64_t now, MachineState* s) const {
  const JobPause& job = pauses[static_cast<size_t>(s->group)];
  const bool stepped =
      job.paused == kNever || (job.stepping && now - job.resumed >= cfg.continuity);
  if (s->named == 0 || !stepped || s->recent.Count() > cfg.rearm_fraction * cfg.continuity) return;
  s->named = 0;
  s->named_for.clear();
  s->named_codes.clear();
  for (Rolling* r : {&s->hard, &s->hard_long, &s->corr, &s->two, &s->corr_long, &s->strong,
                     &s->strong_long, &s->weak, &s->weak_long, &s->fresh, &s->former})
    r->Clear();
  s->evidence.clear();
  s->stopped.clear();
}

std::string Detector::Impl::Fact(int m, int metric, int ticks, double z, const char* sep,
                                 const std::string& name) const {
  const MachineState& s = machines[m];
  std::string buf;
  if (metric == -1) {
    buf = tracer::Format("%ssent no samples for %d s", sep, ticks);
  } else if (metric == kPaceLed) {
    buf = tracer::Format(
        "%sits deviation began within %d s of the job's pace changing by over %.0f%% "
        "(its step time, or its peers' wait), and no other machine's did (%d ticks)",
        sep, cfg.pace_onset_ticks, 100 * cfg.pace_change, ticks);
  } else if (metric == -2 || metric == kStoppedWithJob) {
    std::string which;
    for (int src = 0; src < kMetricSources; ++src) {
      if (s.stopped_together >> src & 1u)
        which += (which.empty() ? "" : " and ") +
                 std::string(MetricSourceName(static_cast<MetricSource>(src)));
    }
    if (metric == -2) {
      buf = tracer::Format(
          "%sits %s stopped within %d s of each other while its peers' went on (%d ticks)", sep,
          which.c_str(), cfg.together_ticks, ticks);
    } else {
      buf = tracer::Format(
          "%sits %s stopped as the whole job's trainers did (within %d s), the "
          "exporter's alone while its peers' went on, and its other metrics stand out: "
          "the job stopped with it (%d ticks)",
          sep, which.c_str(), cfg.together_ticks, ticks);
    }
  } else if (s.stopped.count(metric) > 0) {
    buf = tracer::Format("%s%s [%s] at nothing while its peers work (%d ticks)", sep, name.c_str(),
                         MetricFamilyName(family[metric]), ticks);
  } else if (z == 0) {
    buf = tracer::Format("%s%s missing while peers report it (%d ticks)", sep, name.c_str(), ticks);
  } else if (z > 1000) {  // the peers are flat (an event counter at zero)
    buf = tracer::Format("%s%s nonzero while its peers stay flat (%d ticks)", sep, name.c_str(),
                         ticks);
  } else {
    buf = tracer::Format("%s%s [%s] off its peers by up to %.1f robust sd%s (%d ticks)", sep,
                         name.c_str(), MetricFamilyName(family[metric]), std::fabs(z),
                         Aside(metric, z) && !InBackground(metric)
                             ? ", held back by them"
                             : (InBackground(metric) ? ", above the errors its peers correct" : ""),
                         ticks);
  }
  return buf;
}

Verdict Detector::Impl::MakeVerdict(int m, const Rolling& window, const Frame& f,
                                    const Registry& reg) const {
  const Impl& d = *this;
  const Impl::MachineState& s = d.machines[m];
  const int64_t onset = window.Onset();
  // Evidence in priority order: strong signals first, then metrics that made the machine stand out
  // for most ticks, then Minder's order.
  std::vector<std::pair<int, std::pair<int, double>>> ev(s.evidence.begin(), s.evidence.end());
  const int half = window.Size() / 2;
  auto rank = [&](int metric) { return metric < 0 ? metric : d.priority_rank[metric]; };
  auto strong = [&](const auto& e) {
    return e.first < 0 || (IsStrong(d.family[e.first]) && !d.Aside(e.first, e.second.second));
  };
  std::sort(ev.begin(), ev.end(), [&](const auto& a, const auto& b) {
    const bool a_major = a.second.first >= half, b_major = b.second.first >= half;
    if (a_major != b_major) return a_major;
    if (strong(a) != strong(b)) return strong(a);
    if (rank(a.first) != rank(b.first)) return rank(a.first) < rank(b.first);
    return a.first < b.first;
  });
  std::vector<EvidenceItem> items;
  items.reserve(ev.size());
  for (const auto& [metric, stat] : ev) {
    items.push_back({metric < 0 ? MetricFamily::kOther : d.family[metric],
                     metric < 0 || s.stopped.count(metric) > 0, stat.first,
                     d.Aside(metric, stat.second)});
  }
  Verdict v;
  v.kind = VerdictKind::kFaultyMachine;
  v.level = s.named >= 2 ? VerdictLevel::kFaulty : VerdictLevel::kSuspect;
  v.root_nodes = {reg.machine_name(m)};
  v.detected_at_ns = static_cast<int64_t>(f.end_s * 1e9);
  v.onset_at_ns = static_cast<int64_t>(static_cast<double>(onset) * cfg.tick_s * 1e9);
  // Held as long as a verdict needs: full weight (a hard signal at 0.9 when it is named).
  v.confidence =
      Confidence(items, static_cast<int>(std::ceil(cfg.continuity_fraction * cfg.continuity)));
  const bool silent = !ev.empty() && ev.front().first == -1;
  v.cause = megascope::Name(silent ? Cause::kMachineSilent : Cause::kMetricOutlier);
  std::string facts;
  for (const auto& [metric, stat] : ev) {
    std::string name = metric == -1                ? "no_samples"
                       : metric == -2              ? "sources_stopped"
                       : metric == kPaceLed        ? "job_slowed_with_it"
                       : metric == kStoppedWithJob ? "stopped_with_job"
                                                   : reg.metric_name(metric);
    v.evidence.push_back(name);
    if (facts.size() >= 240) continue;
    facts += Fact(m, metric, stat.first, stat.second, facts.empty() ? "" : "; ", name);
  }
  std::string head = tracer::Format(
      " stood out from its peers for %d of the last %d ticks (%s, confidence %.2f): ",
      window.Count(), window.Size(),
      s.named >= 2 ? "faulty: a hard signal, or two families agreeing for longer than "
                     "a benign excursion lasts"
                   : "suspect: corroborated only briefly, or one family alone",
      v.confidence);
  v.explanation = reg.machine_name(m) + head + facts;
  return v;
}

}  // namespace megascope::detector
