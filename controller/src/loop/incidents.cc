// Incidents: online verdicts (detector, stragglers) through the policy, the diagnosis of a crash or
// a hang, eviction with a self-checked spare, the restart from the newest state.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <set>

#include "impl.h"
#include "megascope/tracer/file_util.h"

namespace megascope::controller {
namespace {

// The last non-empty line of a worker's log (what it said before it ended), "" if none.
std::string LastLogLine(const std::string& path) {
  const std::string text = tracer::ReadFile(path).value_or("");
  size_t end = text.find_last_not_of("\n \t");
  if (end == std::string::npos) return "";
  const size_t begin = text.rfind('\n', end);
  return text.substr(begin == std::string::npos ? 0 : begin + 1,
                     end - (begin == std::string::npos ? 0 : begin + 1) + 1);
}

// A rank that failed of its own accord, not because of a peer (launch::PeersFailure) nor cleanly.
bool OwnFailure(const launch::RankExit& e) {
  return !e.status.success() && !(e.status.exited() && launch::PeersFailure(e.status.code()));
}

// `s` with every run of digits as one '#': two failures that differ only in a rank, a pid or a
// node's number read the same.
std::string MaskDigits(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (std::isdigit(static_cast<unsigned char>(c)) == 0)
      out += c;
    else if (out.empty() || out.back() != '#')
      out += '#';
  }
  return out;
}

// What a node that passed its self-check is cleared of: the verdict's cause, with compute and comm
// stragglers one cause (one streak names a node both ways; the policy's StragglerStreaks).
std::string ClearedKey(const std::string& node, const Verdict& v) {
  return node + "|" + (IsStraggler(ParseCause(v.cause)) ? std::string("straggler") : v.cause);
}

}  // namespace

bool Controller::Impl::Online(const Trigger& t) {
  return t.cause == TriggerCause::kDetector || t.cause == TriggerCause::kStraggler;
}

// A verdict of the job's own error: nothing is evicted for it (policy.h).
Verdict Controller::Impl::JobError(const std::string& cause, int rank, const std::string& node,
                                   const std::string& explanation, const launch::RankExit& origin) {
  Verdict v;
  v.kind = VerdictKind::kJobError;
  v.cause = cause;
  v.root_ranks = {rank};
  v.root_nodes = {node};
  v.detected_at_ns = clock.WallNs();
  v.confidence = 1.0;
  v.explanation = explanation;
  v.evidence = {"exit: " + origin.status.Describe(), "log: " + layout.worker_log(rank)};
  return v;
}

// The thresholds an incident's hang analysis decides with: a wait counts from half the hang
// trigger's threshold (at most the analyzer's 10 s); so does a heartbeat's silence (at least
// 2 s: a worker beats every 100 ms from a thread of its own, so a rank whose heartbeat is that
// far behind its peers' while its process exists is frozen, not slow).
analyzer::HangOptions Controller::Impl::IncidentHangOptions() const {
  analyzer::HangOptions ho;
  ho.min_wait_s = std::min(10.0, HangThreshold() / 2);
  ho.stale_heartbeat_s = std::clamp(HangThreshold() / 2, 2.0, ho.stale_heartbeat_s);
  return ho;
}

std::vector<Verdict> Controller::Impl::Diagnose(const Trigger& t) {
  std::vector<Verdict> verdicts;
  if (t.cause == TriggerCause::kCrash) {
    verdicts = DiagnoseCrash(t);
  } else if (t.cause == TriggerCause::kHang) {
    auto in = fleet->LiveHangInput(active, attempt, agent_token);
    if (in.ok()) {
      for (const std::string& w : in->warnings) Log("warning: " + w);
      verdicts = analyzer::AnalyzeHang(*in, IncidentHangOptions());
    } else {
      Log("hang analysis could not read the agents: " + in.status().ToString());
    }
  }
  PlaceRootRanks(&verdicts);
  if (verdicts.empty() || (verdicts.size() == 1 && verdicts[0].kind == VerdictKind::kHealthy)) {
    Verdict v;
    v.kind = VerdictKind::kHang;
    v.cause = Name(Cause::kUnknown);
    v.detected_at_ns = clock.WallNs();
    v.explanation =
        "the job stopped (" + t.detail + ") but no rank could be blamed from the evidence";
    verdicts = {v};
  }
  return verdicts;
}

void Controller::Impl::PlaceRootRanks(std::vector<Verdict>* verdicts) const {
  for (Verdict& v : *verdicts) {
    std::erase(v.root_nodes, std::string("?"));  // the analyzer's "no dump, no node"
    std::vector<std::string> placed;
    for (const int rank : v.root_ranks) {
      const std::string node = fleet->NodeOfRank(rank);
      if (node.empty() ||
          std::find(v.root_nodes.begin(), v.root_nodes.end(), node) != v.root_nodes.end())
        continue;
      v.root_nodes.push_back(node);
      placed.push_back(node);
    }
    if (!placed.empty())
      v.explanation += " (" + Join(placed) +
                       ": where this attempt placed ranks the evidence has no node for; a node "
                       "whose agent answers nothing left no flight recorder)";
  }
}

std::vector<Verdict> Controller::Impl::DiagnoseCrash(const Trigger& t) {
  std::vector<launch::RankExit> others;
  const launch::RankExit origin = fleet->FindOrigin(t.failures, std::chrono::seconds(2), &others);
  const std::string log_line = LastLogLine(layout.worker_log(origin.rank));
  const std::string node = fleet->NodeOfRank(origin.rank);
  if (origin.status.exited() && origin.status.code() == launch::kExitJobError) {
    return {JobError("bad_input", origin.rank, node,
                     "rank " + std::to_string(origin.rank) + " (" + node +
                         ") could not start the job: " + log_line,
                     origin)};
  }
  // Failed as before, at the same step, on the node that replaced the one evicted for it.
  const std::string how = MaskDigits(origin.status.Describe() + ": " + log_line);
  if (!last_failure.evicted.empty() && how == last_failure.how &&
      last_step_done == last_failure.step && node != last_failure.evicted) {
    return {JobError("repeated_failure", origin.rank, node,
                     "rank " + std::to_string(origin.rank) + " failed on " + node + " at step " +
                         std::to_string(last_step_done) + " as it did on " + last_failure.evicted +
                         ", evicted for it: the failure follows the job, not the machine (" +
                         origin.status.Describe() + ": " + log_line + ")",
                     origin)};
  }
  if (OwnFailure(origin)) {
    if (auto everywhere = SameFailureEverywhere(origin, others, how, log_line))
      return {*everywhere};
    last_failure = {how, last_step_done, node};
    std::vector<Verdict> hung = HungSurvivors(origin, &others);
    std::vector<Verdict> verdicts = DeadRanks(origin, others);
    verdicts.insert(verdicts.end(), hung.begin(), hung.end());
    return verdicts;
  }
  if (auto v = ConnectFailed(origin, others)) return {*v};
  // Every failure was a peer's timeout: the cause is in the flight recorders.
  fleet->CollectDumps(std::chrono::seconds(3));
  auto in = analyzer::LoadDumpDirectory(layout.dumps(attempt));
  if (!in.ok()) return {};
  for (const std::string& w : in->warnings) Log("warning: " + w);
  auto verdicts = analyzer::AnalyzeHang(*in, IncidentHangOptions());
  PlaceRootRanks(&verdicts);
  return verdicts;
}

std::vector<Verdict> Controller::Impl::HungSurvivors(const launch::RankExit& origin,
                                                     std::vector<launch::RankExit>* others) {
  // Before the attempt's first step its ranks meet and load: one not yet in a collective is at
  // work, not stuck, and the start-up grace is too long to wait in an incident.
  if (!attempt_stepped) return {};
  std::set<int> running;
  for (int r = 0; r < opt.world; ++r) running.insert(r);
  running.erase(origin.rank);
  for (const launch::RankExit& e : *others) running.erase(e.rank);
  // A healthy rank fails its next collective within a step of the crash (a peer is gone) and
  // exits; one still out of its peers' collective after the hang threshold (what names a hang
  // without a crash: max(--hang-after, 8 median steps)) is stuck on its own. The wait ends as soon
  // as every rank has exited, so a crash alone costs nothing more.
  const analyzer::HangOptions ho = IncidentHangOptions();
  const double wait_s = HangThreshold();
  const auto since = clock.Now();
  const auto tick = std::chrono::duration<double>(std::min(opt.tick_s, ho.min_wait_s));
  while (!running.empty() && Since(since) < wait_s) {
    clock.Sleep(tick);
    for (const launch::RankExit& e : fleet->PollRanks()) {
      running.erase(e.rank);
      if (!e.status.success()) others->push_back(e);
    }
  }
  if (running.empty()) return {};
  auto in = fleet->LiveHangInput(active, attempt, agent_token);
  if (!in.ok()) {
    Log("the ranks still running after the crash could not be read: " + in.status().ToString());
    return {};
  }
  std::vector<Verdict> out;
  for (Verdict& v : analyzer::AnalyzeHang(*in, ho)) {
    if (v.kind != VerdictKind::kHang) continue;
    // Only what names a rank still running is news: the ranks that exited are the crash's.
    std::vector<int32_t> roots;
    for (const int32_t r : v.root_ranks) {
      if (running.count(r)) roots.push_back(r);
    }
    if (roots.empty()) continue;
    std::string which;
    std::vector<std::string> nodes;
    for (const int32_t r : roots) {
      which += (which.empty() ? "" : ",") + std::to_string(r);
      const std::string n = fleet->NodeOfRank(r);
      if (!n.empty() && std::find(nodes.begin(), nodes.end(), n) == nodes.end()) nodes.push_back(n);
    }
    v.root_ranks = roots;
    v.root_nodes = nodes;
    v.explanation += " -- a second fault beside the crash of rank " + std::to_string(origin.rank) +
                     ": rank " + which + " still ran " + std::to_string(Since(since)).substr(0, 4) +
                     " s later, out of the collective its peers had entered";
    out.push_back(std::move(v));
  }
  return out;
}

std::optional<Verdict> Controller::Impl::ConnectFailed(
    const launch::RankExit& origin, const std::vector<launch::RankExit>& others) {
  std::map<std::string, std::set<std::string>> failed_with;  // node -> the nodes it failed with
  std::map<int, std::string> ranks;                          // rank -> its node
  std::vector<std::string> evidence;
  auto note = [&](const launch::RankExit& e) {
    if (!e.status.exited() || e.status.code() != launch::kExitUnreachable) return;
    const std::string line = LastLogLine(layout.worker_log(e.rank));
    const std::string node = fleet->NodeOfRank(e.rank);
    const int peer = launch::CannotReachPeer(line);
    const std::string far = peer >= 0 ? fleet->NodeOfRank(peer) : "";
    failed_with[node];
    ranks[e.rank] = node;
    if (!far.empty() && far != node) {  // ranks of one node reach each other without the network
      failed_with[node].insert(far);
      failed_with[far].insert(node);
      ranks[peer] = far;
    }
    evidence.push_back("rank " + std::to_string(e.rank) + " (" + node + "): " + line);
  };
  note(origin);
  for (const launch::RankExit& e : others) note(e);
  if (evidence.empty()) return std::nullopt;
  size_t most = 0;
  for (const auto& [node, with] : failed_with) most = std::max(most, with.size());
  Verdict v;
  v.kind = VerdictKind::kHang;
  v.cause = Name(Cause::kConnectFailed);
  for (const auto& [node, with] : failed_with) {
    if (with.size() == most) v.root_nodes.push_back(node);
  }
  for (const auto& [rank, node] : ranks) {
    if (std::find(v.root_nodes.begin(), v.root_nodes.end(), node) != v.root_nodes.end())
      v.root_ranks.push_back(rank);
  }
  v.detected_at_ns = clock.WallNs();
  v.confidence = 0.5;  // the node, its link or the far end: the self-check decides
  v.explanation = std::to_string(evidence.size()) + " ranks could not reach their peers at the " +
                  "start of attempt " + std::to_string(attempt) +
                  "; the failed connections meet at " + Join(v.root_nodes) +
                  (most > 0 ? " (each with " + std::to_string(most) + " other nodes)" : "") +
                  ": its network end, its link or the node itself";
  v.evidence = std::move(evidence);
  return v;
}

std::optional<Verdict> Controller::Impl::SameFailureEverywhere(
    const launch::RankExit& origin, const std::vector<launch::RankExit>& others,
    const std::string& how, const std::string& log_line) {
  if (active.size() < 2) return std::nullopt;
  std::set<std::string> nodes;
  int ranks = 0;
  auto note = [&](const launch::RankExit& e) {
    if (!OwnFailure(e) ||
        MaskDigits(e.status.Describe() + ": " + LastLogLine(layout.worker_log(e.rank))) != how)
      return;
    nodes.insert(fleet->NodeOfRank(e.rank));
    ++ranks;
  };
  note(origin);
  for (const launch::RankExit& e : others) note(e);
  for (const std::string& n : active) {
    if (!nodes.count(n)) return std::nullopt;
  }
  const std::string node = fleet->NodeOfRank(origin.rank);
  return JobError("same_failure_everywhere", origin.rank, node,
                  std::to_string(ranks) + " ranks on all " + std::to_string(nodes.size()) +
                      " nodes failed at once in the same words (rank " +
                      std::to_string(origin.rank) + " on " + node + ": " +
                      origin.status.Describe() + ": " + log_line +
                      "): no machine causes that, and a spare would fail the same way",
                  origin);
}

std::vector<Verdict> Controller::Impl::DeadRanks(const launch::RankExit& origin,
                                                 const std::vector<launch::RankExit>& others) {
  std::vector<Verdict> verdicts;
  Verdict v;
  v.kind = VerdictKind::kHang;
  v.cause = Name(Cause::kRankDead);
  v.root_ranks = {origin.rank};
  v.root_nodes = {fleet->NodeOfRank(origin.rank)};
  v.detected_at_ns = clock.WallNs();
  v.confidence = 1.0;
  v.explanation = "rank " + std::to_string(origin.rank) + " (" + v.root_nodes[0] + ") " +
                  origin.status.Describe() + "; its peers then failed their collectives";
  v.evidence = {"exit: " + origin.status.Describe(), "log: " + layout.worker_log(origin.rank)};
  verdicts.push_back(v);
  // Another rank that died of its own failure at the same time, on another node, is a second
  // root: both machines are acted on in this incident.
  std::set<std::string> named = {v.root_nodes[0]};
  for (const launch::RankExit& o : others) {
    const std::string o_node = fleet->NodeOfRank(o.rank);
    if (!OwnFailure(o) || !named.insert(o_node).second) continue;
    Verdict w = v;
    w.root_ranks = {o.rank};
    w.root_nodes = {o_node};
    w.explanation = "rank " + std::to_string(o.rank) + " (" + o_node + ") " + o.status.Describe() +
                    " too, at the same time";
    w.evidence = {"exit: " + o.status.Describe(), "log: " + layout.worker_log(o.rank)};
    verdicts.push_back(w);
  }
  return verdicts;
}

void Controller::Impl::RecordDecision(const Verdict& v, const Decision& d, const Streak& streak) {
  Record(EventKind::kDecision, d.nodes.empty() ? "" : d.nodes[0],
         v.root_ranks.empty() ? -1 : v.root_ranks[0],
         {{"action", Name(d.action)},
          {"reason", d.reason},
          {"repeats", streak.repeats},
          {"repeats_by_compute", streak.by_compute},
          {"compute_confidence", streak.compute_confidence},
          {"nodes", d.nodes},
          {"verdict", VerdictToJsonValue(v)}});
}

// An online verdict (detector, straggler): recorded with the policy's decision; an alert is
// reported once per attempt, anything more opens an incident. False: the controller paused.
bool Controller::Impl::Act(TriggerCause source, const Verdict& v, const Streak& streak) {
  bool in_job = v.root_nodes.empty();
  for (const std::string& n : v.root_nodes)
    in_job |= std::find(active.begin(), active.end(), n) != active.end();
  if (!in_job) return true;  // an evicted node's silence, or a node that left meanwhile
  bool passed_before = false;
  for (const std::string& n : v.root_nodes) passed_before |= cleared.count(ClearedKey(n, v)) > 0;
  const Decision d = Decide(v, streak, opt.policy, passed_before);
  std::string key = std::string(Name(d.action)) + "|" + std::string(Name(v.kind)) + "|" + v.cause;
  for (const std::string& n : v.root_nodes) key += "|" + n;
  if (d.action == Action::kAlert && !alerted.insert(key).second) return true;
  Log(std::string(Name(source)) + " verdict: " + std::string(Name(v.kind)) + " " + v.cause +
      " on " + (v.root_nodes.empty() ? std::string("-") : Join(v.root_nodes)) + ": " +
      v.explanation);
  Log("policy: " + std::string(Name(d.action)) + " (" + d.reason + ")");
  if (d.action == Action::kAlert || d.action == Action::kRestartInPlace) {
    Record(EventKind::kVerdict, v.root_nodes.empty() ? "" : v.root_nodes[0],
           v.root_ranks.empty() ? -1 : v.root_ranks[0], VerdictToJsonValue(v));
    RecordDecision(v, d, streak);
    return true;
  }  // an incident records the verdict and the decision after its trigger
  Trigger t{source, std::string(Name(v.kind)) + " " + v.cause + " on " + Join(v.root_nodes),
            {},     "",
            {v},    streak};
  return Incident(std::move(t));
}

// The online evidence of this tick; false: the controller paused.
bool Controller::Impl::Watch() {
  if (online && Since(last_scrape) >= opt.detector_tick_s) {
    last_scrape = clock.Now();
    std::map<std::string, std::string> pages;
    std::vector<Result<std::string>> got =
        fleet->AgentGetAll(active, "/metrics", 1000, agent_token);
    for (size_t i = 0; i < active.size(); ++i) {
      if (got[i].ok()) pages[active[i]] = std::move(*got[i]);
    }
    const MetricsRound round = ParseMetricsRound(pages, static_cast<double>(clock.WallNs()) / 1e9);
    for (const std::string& e : round.errors) Log("metrics: " + e);
    for (const Verdict& v : online->Add(round)) {
      if (!Act(TriggerCause::kDetector, v, {})) return false;
    }
  }
  if (opt.straggler_every > 0 && attempt_stepped &&
      last_step_done - straggler_from >= opt.straggler_every) {
    // Windows of straggler_every steps (0-based), each read once every rank's end of it is
    // stored; a window still incomplete when the job is a whole window past it is read as it
    // is (a rank's agent may be gone; the hang and crash paths see to that).
    const int64_t first = straggler_from, last = first + opt.straggler_every - 1;
    const bool anyway = last_step_done - 1 >= last + opt.straggler_every;
    analyzer::SlowOptions so;
    so.compute_ratio = opt.straggler_ratio;
    so.min_cost_s = opt.straggler_min_cost_s;
    so.min_peers = 2;  // with one peer, shared-machine noise alone can make either look slow
    auto found = stragglers.Analyze(*fleet, active, agent_token, layout.dir(), attempt, first, last,
                                    opt.world, anyway, so);
    const std::string steps =
        "straggler analysis of steps " + std::to_string(first) + ".." + std::to_string(last);
    if (found.ok() && !*found) return true;  // not stored yet: the next poll looks again
    straggler_from = last + 1;
    for (const std::string& m : stragglers.missing()) Log(steps + ": without " + m);
    if (found.ok() && stragglers.from_store()) Log(steps + ": read from the store");
    if (!found.ok()) {
      Log(steps + ": " + found.status().ToString());
      return true;
    }
    if ((*found)->empty())
      Log(steps + ": no straggler" +
          (anyway ? " (read before every rank's steps were stored)" : ""));
    for (const StragglerWatch::Finding& f : **found) {
      if (!Act(TriggerCause::kStraggler, f.verdict, f.streak)) return false;
      if (ParseCause(f.verdict.cause) != Cause::kStageImbalance && !attempt_stepped)
        break;  // restarted
    }
  }
  return true;
}

void Controller::Impl::Pause(const std::string& reason) {
  Log("PAUSED: " + reason);
  std::fprintf(stderr,
               "[launch] paused: %s\n[launch] the job is stopped; nothing more is evicted "
               "without a person. "
               "Fix the cause and start 'megascope launch' again in the same run directory to "
               "resume from the newest state.\n",
               reason.c_str());
  Record(EventKind::kPaused, "", -1, {{"reason", reason}});
}

// Evicts `node` (stops its agent, drops its memory) and fills its slot; false: paused.
bool Controller::Impl::Evict(const std::string& node, const std::string& reason,
                             const json& verdict) {
  const auto now = clock.Now();
  std::erase_if(eviction_times, [&](Clock::time_point t) {
    return std::chrono::duration<double>(now - t).count() > opt.eviction_window_s;
  });
  if (static_cast<int>(eviction_times.size()) >= opt.max_evictions) {
    Pause("evicting " + node + " would make " + std::to_string(eviction_times.size() + 1) +
          " evictions within " + std::to_string(static_cast<int>(opt.eviction_window_s)) +
          " s (--max-evictions " + std::to_string(opt.max_evictions) +
          "): more faults than a healthy fleet has; a person should look");
    return false;
  }
  eviction_times.push_back(now);
  fleet->StopAgent(node, /*wait=*/false);  // it drains its last records while the spare is checked
  std::error_code ec;
  fs::remove_all(NodeMemoryDir(opt.supervisor.shm_dir, opt.supervisor.job, node),
                 ec);  // its memory is gone with it
  evicted[node] = now;
  Log("evicted " + node + " (" + reason + ")");
  Record(EventKind::kEviction, node, -1, {{"reason", reason}, {"verdict", verdict}});
  const auto slot = std::find(active.begin(), active.end(), node);
  *slot = "";
  // Re-admission: an evicted node may stand by again after readmit_after_s, and passes a
  // self-check like any spare.
  if (opt.readmit_after_s > 0) {
    for (auto& [n, when] : evicted) {
      if (n != node && std::chrono::duration<double>(now - when).count() > opt.readmit_after_s &&
          std::find(spares.begin(), spares.end(), n) == spares.end() &&
          std::find(active.begin(), active.end(), n) == active.end()) {
        spares.push_back(n);
      }
    }
  }
  std::set<std::string> avoid(active.begin(), active.end());
  while (!spares.empty()) {
    const std::string spare = spares.front();
    spares.pop_front();
    auto checked = spares_checked.find(spare);
    if (checked != spares_checked.end()
            ? checked->second
            : SelfCheck(spare, HealthyPartner({node}), "spare for " + node)) {
      *slot = spare;
      Log(spare + " joins in place of " + node);
      return true;
    }
  }
  Pause("no spare node left to replace " + node + ": add a healthy node (--spares) or fix " + node);
  return false;
}

void Controller::Impl::StopForIncident(const Trigger& t) {
  const auto stop0 = clock.Now();
  // A job that is still running has no hang to explain: its flight recorders are not needed.
  const std::vector<int> no_dump =
      Online(t) ? std::vector<int>{} : fleet->CollectDumps(std::chrono::seconds(3));
  // Beside the dumps, why they were taken: `megascope analyze hang` on them decides as this
  // incident did (FORMATS: the run directory).
  if (!Online(t)) {
    if (Status st =
            analyzer::WriteIncidentThresholds(layout.dumps(attempt), std::string(Name(t.cause)),
                                              t.detail, attempt, IncidentHangOptions());
        !st.ok())
      Log("warning: " + st.message());
  }
  fleet->StopRanks();
  Record(EventKind::kStopped, "", -1, {{"seconds", Since(stop0)}, {"ranks_without_dump", no_dump}});
}

void Controller::Impl::ConfirmBySelfCheck(const Verdict& v, const Decision& d,
                                          std::map<std::string, bool>* checked_now,
                                          std::vector<ToEvict>* to_evict) {
  const json vj = VerdictToJsonValue(v);
  std::set<std::string> suspects(d.nodes.begin(), d.nodes.end());
  std::vector<NodeCheck> todo;
  for (const std::string& n : suspects) {
    const std::string partner = HealthyPartner(suspects);
    // Several verdicts of one incident often name the same node (both directions of a stalled
    // link): it is checked once.
    if (checked_now->count(n)) continue;
    todo.push_back({n, partner.empty() ? n : partner,
                    v.kind == VerdictKind::kFaultyMachine      ? "suspect of the detector"
                    : ParseCause(v.cause) == Cause::kLinkStall ? "end of a stalled link"
                    : ParseCause(v.cause) == Cause::kConnectFailed
                        ? "where the failed connections meet"
                        : "suspect: " + v.cause});
  }
  // The spares that would replace them, checked in the same round once the suspects' pairs are
  // done: an eviction then waits for no check of its own (a round watches the error counters for
  // 2 s at least, and the measurements take a fraction of that).
  const size_t suspects_checked = todo.size();
  const std::string partner = HealthyPartner(suspects);
  for (const std::string& spare : spares) {
    if (todo.size() >= 2 * suspects_checked) break;
    if (spares_checked.count(spare)) continue;
    todo.push_back({spare, partner.empty() ? spare : partner,
                    "spare, checked beside the suspects of " + v.cause, true});
  }
  const std::vector<CheckResult> results = SelfCheckAll(todo);  // every one at once
  for (size_t i = suspects_checked; i < todo.size(); ++i)
    spares_checked[todo[i].node] = results[i].passed;
  for (size_t i = 0; i < suspects_checked; ++i) {
    const std::string& n = todo[i].node;
    const CheckResult r = results[i];
    (*checked_now)[n] = r.passed;
    // A straggler's failed check names its cause: its GEMM, its compute; else its bandwidth.
    std::string cause = v.cause;
    const bool straggler = IsStraggler(ParseCause(v.cause));
    if (straggler && !r.passed)
      cause = Name(r.compute_ok ? Cause::kCommStraggler : Cause::kComputeStraggler);
    const std::string reason =
        r.passed    ? "passed its self-check: the verdict is not confirmed"
        : straggler ? (r.compute_ok ? "failed its bandwidth self-check: a communication straggler"
                                    : "failed its GEMM self-check: a compute straggler")
                    : "failed its self-check: the verdict is confirmed";
    Record(EventKind::kDecision, n, -1,
           {{"action", r.passed ? "keep" : "evict"},
            {"confirmed", !r.passed},
            {"reason", reason},
            {"verdict", vj}});
    if (!r.passed) to_evict->push_back({n, cause, vj});
    if (r.passed) cleared.insert(ClearedKey(n, v));
  }
}

// Handles one incident; false when the controller paused.
bool Controller::Impl::Incident(Trigger t) {
  // An attempt that failed before completing a step, three times in a row, is a loop, not bad
  // luck.
  fruitless_attempts = attempt_stepped ? 0 : fruitless_attempts + 1;
  spares_checked.clear();
  const int64_t trigger_ns = clock.WallNs();
  incident_start_ns = trigger_ns;
  Log("trigger: " + std::string(Name(t.cause)) + (t.detail.empty() ? "" : " (" + t.detail + ")"));
  Record(EventKind::kTrigger, t.manual_node, -1, {{"cause", Name(t.cause)}, {"detail", t.detail}},
         trigger_ns);
  std::vector<Verdict> verdicts = t.verdicts;
  if (t.cause != TriggerCause::kManual && !Online(t)) verdicts = Diagnose(t);
  incident_step = last_step_done;
  incident_ranks.clear();
  for (const Verdict& v : verdicts) {
    incident_ranks.insert(incident_ranks.end(), v.root_ranks.begin(), v.root_ranks.end());
    Log("verdict: " + v.cause + " " + v.explanation);
    Record(EventKind::kVerdict, v.root_nodes.empty() ? "" : v.root_nodes[0],
           v.root_ranks.empty() ? -1 : v.root_ranks[0], VerdictToJsonValue(v));
  }
  StopForIncident(t);
  const int64_t lost = last_step_done;
  // The policy (policy.h) decides per verdict; the controller carries it out.
  std::vector<ToEvict> to_evict;
  std::map<std::string, bool> checked_now;  // node -> passed its self-check in this incident
  std::string restart_cause(Name(t.cause));
  if (t.cause == TriggerCause::kManual)
    to_evict.push_back({t.manual_node, "manual", json{{"kind", "manual"}}});
  for (const Verdict& v : verdicts) {
    const json vj = VerdictToJsonValue(v);
    restart_cause = v.cause;
    const Streak streak = Online(t) ? t.streak : Streak{};
    const Decision d = Decide(v, streak, opt.policy);
    RecordDecision(v, d, streak);
    if (d.action == Action::kStop) {
      Pause("the job's own error, not a machine's: " + v.explanation + " (" + d.reason +
            "; log: " + layout.worker_log(v.root_ranks.empty() ? 0 : v.root_ranks[0]) + ")");
      return false;
    }
    if (d.action == Action::kEvict) {
      const std::string reason =
          !d.evict_as.empty() ? d.evict_as : vj.value("cause", std::string(Name(t.cause)));
      for (const std::string& n : d.nodes) to_evict.push_back({n, reason, vj});
    } else if (d.action == Action::kSelfCheck) {
      ConfirmBySelfCheck(v, d, &checked_now, &to_evict);
      if (to_evict.empty())
        Log("every suspect passed its self-check (the verdict is not confirmed): restarting in "
            "place");
    } else {
      Log("verdict " + v.cause + ": " + d.reason + ": restarting in place");
    }
  }
  std::set<std::string> done;
  for (const ToEvict& e : to_evict) {
    if (e.node.empty() || !done.insert(e.node).second) continue;
    if (std::find(active.begin(), active.end(), e.node) == active.end()) continue;
    if (!Evict(e.node, e.reason, e.verdict)) return false;
  }
  if (fruitless_attempts >= 3) {
    Pause(std::to_string(fruitless_attempts) +
          " attempts in a row failed before completing a step (last: " + restart_cause +
          "); restarting again would loop");
    return false;
  }
  CorruptIfInjected();
  return Restart(restart_cause, lost);
}

// Starts the next attempt on the active nodes from the newest state (a memory snapshot, else a
// disk checkpoint); `lost`: the steps done before the stop. False when the controller paused.
bool Controller::Impl::Restart(const std::string& restart_cause, int64_t lost) {
  launch::ResumePoint resume = launch::FindResumePoint(layout, MemoryDirs(), opt.world);
  if (!resume.log.empty()) std::printf("%s", resume.log.c_str());
  ++attempt;
  const int64_t resume_step = std::max<int64_t>(resume.step, 0);
  Log("restart: attempt " + std::to_string(attempt) + " on " + Join(active) +
      ", resuming after step " + std::to_string(resume_step) + " (" + resume.source + "), " +
      std::to_string(std::max<int64_t>(0, lost - resume_step)) + " step(s) to redo");
  Record(EventKind::kRestart, "", -1,
         {{"cause", restart_cause},
          {"nodes", active},
          {"resume_step", resume_step},
          {"source", resume.source},
          {"steps_lost", std::max<int64_t>(0, lost - resume_step)},
          {"last_step_done", lost}});
  last_step_done = resume_step;
  if (Status st = StartAttempt(&resume); !st.ok()) {
    Pause("attempt " + std::to_string(attempt) + " could not start: " + st.ToString());
    return false;
  }
  return true;
}

void Controller::Impl::CorruptIfInjected() {
  for (Injection& in : opt.injections) {
    if (in.fired || in.kind != FaultKind::kCorruptCheckpoint) continue;
    in.fired = true;
    const std::vector<std::string> memory = MemoryDirs();
    std::vector<std::string> victims;
    const launch::ResumePoint mem = launch::FindMemorySnapshot(memory, opt.world);
    if (mem.step >= 0) {
      for (const std::string& dir : memory) {
        const std::string f = dir + "/" + launch::MemoryShardName(0, mem.step);
        if (fs::exists(f)) victims.push_back(f);
      }
    }
    const launch::ResumePoint disk = launch::FindDiskCheckpoint(layout, opt.world);
    if (disk.step >= 0) victims.push_back(disk.files[0]);
    for (const std::string& f : victims) {
      std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
      io.seekp(40);
      io.put('\x5a');
    }
    Log("fault fired: corrupt-checkpoint (" + std::to_string(victims.size()) +
        " newest shard file(s) of rank 0)");
    Record(EventKind::kFaultInjected, "", 0,
           {{"kind", "corrupt-checkpoint"},
            {"files", victims},
            {"memory_step", mem.step},
            {"disk_step", disk.step}});
  }
}

std::string Controller::Impl::Join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
  return s;
}

}  // namespace megascope::controller
