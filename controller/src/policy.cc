#include "megascope/controller/policy.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <utility>

#include "megascope/tracer/enum_names.h"
#include "megascope/tracer/format.h"

namespace megascope::controller {

namespace {

std::string Fmt2(double x) { return tracer::Format("%.2f", x); }

// The detector's findings: only a faulty machine is acted on (a self-check confirms it first).
Decision DecideDetector(const Verdict& v, const std::string& conf, bool confident, Decision d) {
  if (v.kind == VerdictKind::kMonitoringGap) {
    d.reason = "a monitoring source of the machine stopped (" + v.cause +
               ") while the machine works on: the exporter is at fault, not the machine";
  } else if (v.kind == VerdictKind::kSharedComponent) {
    d.reason = "machines stand out together (" + (v.group.empty() ? v.cause : v.group) +
               "): a shared rack, switch or PDU, not one machine; nothing is evicted";
  } else if (v.level == VerdictLevel::kSuspect) {
    d.reason = "the detector only suspects the machine (" + conf +
               "): no hard error, no harm to the job, no lasting agreement of two metric "
               "families; reported only";
  } else if (confident) {
    d.action = Action::kSelfCheck;
    d.reason =
        "the detector names the machine (" + conf + "): a self-check confirms before it is evicted";
  } else {
    d.reason = "the detector's evidence is weak: " + conf;
  }
  return d;
}

// A stopped job: evict the node of a dead rank, self-check the nodes a link or a connection
// names, restart in place on a cause that names no machine.
Decision DecideHang(const Verdict& v, Cause cause, Decision d) {
  if (cause == Cause::kRankDead || cause == Cause::kRankNotJoined) {
    d.action = Action::kEvict;
    d.reason = "a rank of the node is gone or never joined";
  } else if (cause == Cause::kLinkStall) {
    d.action = Action::kSelfCheck;
    d.reason = "data stopped between two nodes: both ends are self-checked";
  } else if (cause == Cause::kConnectFailed) {
    d.action = Action::kSelfCheck;
    d.reason =
        "ranks could not reach their peers at the start: the nodes where the failed "
        "connections meet are self-checked";
  } else {
    d.action = Action::kRestartInPlace;
    d.reason = "hang cause " + v.cause + " names no machine";
    d.nodes.clear();
  }
  return d;
}

Decision DecideFresh(const Verdict& v, const Streak& streak, const PolicyOptions& o) {
  std::string conf =
      tracer::Format("confidence %.2f (acting at %.2f)", v.confidence, o.check_confidence);
  const bool confident = v.confidence >= o.check_confidence;
  const bool persistent = streak.repeats >= o.straggler_windows;
  const std::string held = "named in " + std::to_string(streak.repeats) +
                           " analyses in a row, acting at " + std::to_string(o.straggler_windows);
  Decision d;
  d.nodes = v.root_nodes;
  const Cause cause = ParseCause(v.cause);
  switch (v.kind) {
    case VerdictKind::kHang:
      return DecideHang(v, cause, std::move(d));
    case VerdictKind::kSlow:
      if (cause == Cause::kStageImbalance) {
        d.reason = "every replica of the stage is slow: a model or layout imbalance, not a machine";
      } else if (IsStraggler(cause) || cause == Cause::kLinkSlow) {
        // Named both ways in a row (a mixed streak): the self-check decides which it is.
        const bool mixed = cause != Cause::kLinkSlow && streak.by_compute > 0 && streak.by_comm > 0;
        const int strong = StrongComputeRun(streak, o.convict_confidence);
        const bool convicted = cause != Cause::kLinkSlow && strong >= o.straggler_windows;
        if (!confident) {
          d.reason = std::string("straggler below the acting confidence: ") + conf;
        } else if (!persistent) {
          d.reason = "straggler " + held + ": waiting for it to persist";
        } else if (convicted) {
          d.action = Action::kEvict;
          if (cause != Cause::kComputeStraggler) d.evict_as = Name(Cause::kComputeStraggler);
          d.reason = "a persistent compute straggler (" + held + ", named by its compute at " +
                     "confidence >= " + Fmt2(o.convict_confidence) + " in " +
                     std::to_string(strong) + " of them): its own step measurements convict it";
        } else if (mixed) {
          d.action = Action::kSelfCheck;
          d.reason = "a persistent straggler (" + held + ", " + std::to_string(streak.by_compute) +
                     " of them by its compute, " + std::to_string(streak.by_comm) +
                     " by its lateness): the self-check decides the cause -- a failed GEMM, a "
                     "compute straggler; a failed bandwidth test, a communication straggler; "
                     "passed, it stays until its compute convicts it";
        } else if (cause == Cause::kComputeStraggler) {
          d.action = Action::kSelfCheck;
          d.reason = "a persistent compute straggler (" + held + ", " + conf +
                     "), slow in too few of its steps to convict it (below " +
                     Fmt2(o.convict_confidence) +
                     "): the self-check decides; a node that passes stays until its compute "
                     "convicts it";
        } else {
          d.action = Action::kSelfCheck;
          d.reason =
              std::string(cause == Cause::kLinkSlow ? "a persistently slow link ("
                                                    : "a persistent communication straggler (") +
              held + "): the bandwidth self-check decides";
        }
      } else {
        d.reason = "unknown slowdown cause '" + v.cause + "': reported only";
      }
      return d;
    case VerdictKind::kFaultyMachine:
    case VerdictKind::kMonitoringGap:
    case VerdictKind::kSharedComponent:
      return DecideDetector(v, conf, confident, std::move(d));
    case VerdictKind::kJobError:
      d.action = Action::kStop;
      d.reason = "the job's own error (" + v.cause +
                 "): every machine would fail the same way; nothing is evicted";
      d.nodes.clear();
      return d;
    case VerdictKind::kHealthy:
      d.reason = "healthy";
      d.nodes.clear();
      return d;
    case VerdictKind::kOther:
      break;
  }
  d.reason = "unknown verdict kind '" + std::string(Name(v.kind)) + "': reported only";
  return d;
}

}  // namespace

std::string_view Name(Action a) {
  static constexpr std::array<std::string_view, 5> kNames = {"alert", "restart_in_place",
                                                             "self_check", "evict", "stop"};
  return tracer::NameFrom(kNames, a);
}

std::vector<Streak> StragglerStreaks::Next(const std::vector<Verdict>& verdicts) {
  // One analysis may name a node twice (two of its ranks, one by compute and one by lateness):
  // that is one more analysis in its streak.
  std::vector<std::string> keys;
  std::map<std::string, Streak> next;
  for (const Verdict& v : verdicts) {
    const Cause cause = ParseCause(v.cause);
    const bool by_compute = cause == Cause::kComputeStraggler;
    const bool by_comm = cause == Cause::kCommStraggler;
    std::string key = IsStraggler(cause) ? "straggler" : v.cause;
    for (const std::string& n : v.root_nodes) key += "|" + n;
    const auto it = streaks_.find(key);
    const Streak last = it == streaks_.end() ? Streak{0, 0, 0} : it->second;
    const auto at = next.try_emplace(key, Streak{last.repeats + 1, last.by_compute, last.by_comm,
                                                 last.compute_confidence})
                        .first;
    if (by_compute && at->second.by_compute == last.by_compute) {
      at->second.by_compute = last.by_compute + 1;
      at->second.compute_confidence.push_back(v.confidence);
      if (at->second.compute_confidence.size() > 64)
        at->second.compute_confidence.erase(at->second.compute_confidence.begin());
    } else if (by_compute) {  // a second rank of the node in the same analysis: the stronger
      double& newest = at->second.compute_confidence.back();
      newest = std::max(newest, v.confidence);
    }
    if (by_comm) at->second.by_comm = last.by_comm + 1;
    keys.push_back(std::move(key));
  }
  std::vector<Streak> out;
  out.reserve(keys.size());
  for (const std::string& key : keys) out.push_back(next.at(key));
  streaks_ = std::move(next);
  return out;
}

int StrongComputeRun(const Streak& streak, double bar) {
  const std::vector<double>& c = streak.compute_confidence;
  int n = 0;
  for (auto it = c.rbegin(); it != c.rend() && *it >= bar; ++it) ++n;
  return n;
}

Decision Decide(const Verdict& v, const Streak& streak, const PolicyOptions& o,
                bool passed_before) {
  Decision d = DecideFresh(v, streak, o);
  if (passed_before && d.action == Action::kSelfCheck && v.kind != VerdictKind::kHang) {
    d.action = Action::kAlert;
    d.reason = "the suspect passed its self-check for " +
               (v.cause.empty() ? std::string(Name(v.kind)) : v.cause) +
               " earlier in this run: it stays";
  }
  return d;
}

}  // namespace megascope::controller
