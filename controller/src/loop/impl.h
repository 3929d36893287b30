// Controller::Impl, the online loop of `megascope launch` (controller.h): its state, and its steps
// cut along the loop's own sections, one file each --
//   controller.cc     records, the control endpoint, the public API
//   setup.cc          the run directory, the token and endpoint, fault seams, adopting a run
//   self_check.cc     self-check pairs judged against the healthy figures
//   attempts.cc       an attempt's plan and start
//   tick.cc           progress, stalls, the controller's own fault injections
//   incidents.cc      online verdicts, diagnosis, policy, eviction, restart
//   disk_space.cc     pausing for space, what the run could not keep
//   run.cc            start-up, the loop, the end of the run
// Processes and time come through the Fleet and LoopClock seams (fleet.h).
#pragma once

#include <CivetServer.h>
#include <signal.h>

#include <chrono>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "../evidence.h"
#include "../proc_fault.h"
#include "megascope/analyzer/hang.h"
#include "megascope/controller/control_db.h"
#include "megascope/controller/controller.h"
#include "megascope/controller/disk_guard.h"
#include "megascope/controller/fleet.h"
#include "megascope/controller/policy.h"
#include "megascope/launch/progress.h"
#include "megascope/launch/state_files.h"
#include "megascope/tracer/run_layout.h"
#include "megascope/tracer/verdict.h"

namespace megascope::controller {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

// Set by SIGINT and SIGTERM while the controller runs (run.cc).
extern volatile sig_atomic_t g_interrupted;

// A person's command through the control endpoint.
struct Command {
  std::string what;  // stop, evict
  std::string node;
};
class ControlHandler;  // the control endpoint (control_endpoint.h)

struct Controller::Impl {
  ControllerOptions opt;
  std::unique_ptr<Fleet> fleet;
  LoopClock& clock;
  RunLayout layout;
  std::unique_ptr<ControlDb> db;
  std::unique_ptr<CivetServer> http;
  std::unique_ptr<ControlHandler> handler;
  std::mutex mu;
  std::deque<Command> commands;          // GUARDED_BY(mu)
  std::vector<std::string> nodes_known;  // GUARDED_BY(mu): `active` as of the last tick

  int attempt = 0;
  std::vector<std::string> active;  // node of each slot
  std::deque<std::string> spares;
  std::map<std::string, Clock::time_point> evicted;  // node -> when
  std::set<std::string> failed_self_check;
  // Spares self-checked in this incident beside its suspects, ready to replace one that fails
  // (spare -> passed): their check is not run again, nor waited for after the suspects'.
  std::map<std::string, bool> spares_checked;
  std::vector<Clock::time_point> eviction_times;
  double baseline_gemm = 0, baseline_bw = 0;
  int checks = 0;

  // The attempt in progress.
  Clock::time_point launch_start, attempt_start;
  int64_t last_step_done = 0;  // completed steps of the job so far (the newest step line)
  bool attempt_stepped = false;
  // The attempt's ranks met and its reporting rank loaded its state ("ready"), that load's seconds:
  // from then on a restart of a job with a step history is held to its steps' pace, not the
  // start-up grace (a rank that hangs in the first step after a restart is named as fast as later).
  std::optional<double> ready_load_s;
  int fruitless_attempts = 0;  // consecutive attempts that ended before their first step
  bool adopted = false;        // this launch took over an unfinished run of the run directory
  // The run directory holds a finished run and this launch was not asked for a new one: what it
  // says instead of training ("": train).
  std::string finished_before;
  // The last crash blamed on a machine: how it failed, at what step, and the node evicted for it.
  // The same failure at the same step on the node that replaced it is the job's, not a machine's.
  struct Failure {
    std::string how;  // exit and last log line, digits masked
    int64_t step = -1;
    std::string evicted;
  };
  Failure last_failure;
  std::vector<double> step_times;
  std::map<int, int64_t> hb_steps;
  Clock::time_point last_progress;
  int finished_ranks = 0;
  std::optional<int64_t> incident_start_ns;  // for "resumed": the open incident's trigger time
  int64_t incident_step = 0;                 // completed steps when the last incident began
  std::vector<int32_t> incident_ranks;       // its verdicts' root ranks
  launch::ProgressReader progress;
  int64_t missing_steps = 0;  // step lines of an attempt that never reached the progress stream

  // The run directory's space, and what could not be written to it yet.
  DiskGuard disk;
  std::deque<Event> unrecorded;  // control.db events not written yet (a full disk)
  bool record_failing = false;
  std::vector<std::string> unwritten;  // files the launch could not write (reports)

  // Online evidence (faults that do not stop the job).
  std::unique_ptr<OnlineDetector> online;
  StragglerWatch stragglers;
  Clock::time_point last_scrape;
  int64_t straggler_from = 0;     // the next straggler window starts after this step
  std::set<std::string> alerted;  // alerts already reported in this attempt
  std::set<std::string> cleared;  // node|cause: passed a self-check for it in this run
  std::map<std::string, std::unique_ptr<ProcFault>> proc_faults;  // metric faults, by node
  std::map<std::string, std::string> link_seams;                  // link faults: node -> file
  std::string agent_token;  // what the agents require ("" : agents on loopback, open)
  std::map<std::string, Clock::time_point> net_faults;  // real link faults applied: node -> end

  // ---- controller.cc: construction, records, the log
  bool HasOwnHost(const std::string& node) const;
  // Undoes every real link fault still applied (at the end of the launch).
  void ClearNetFaults();

  Impl(ControllerOptions o, std::unique_ptr<Fleet> f, LoopClock& c);

  double Since(Clock::time_point t);

  void Log(const std::string& line);

  void Record(EventKind kind, const std::string& node, int rank, json detail, int64_t ts_ns = 0);
  // Writes the events kept in memory, in order. One that cannot be written (a full disk) stays,
  // with every later one, for the next try, and tells the disk guard; false then.
  bool FlushRecords();

  // ---- setup.cc: the run directory, the control endpoint, fault seams, adopting a run
  Status Setup();

  // A run directory holds the record of every launch in it. When the last one did not finish
  // (its controller was killed, a person stopped it, it paused), this launch adopts it: attempt
  // numbers go on after its last (trace rows and rendezvous stay apart), its evictions stand (the
  // nodes it evicted stay out, the spares it took in stay in) and the first attempt resumes from
  // its newest state (the memory snapshots it left, else a disk checkpoint). Otherwise state in
  // memory under this job name is an earlier launch's and is dropped. When the last one finished,
  // this launch trains again only as a new run (opt.new_run); else it sets finished_before.
  Status AdoptEarlierRun();
  std::vector<std::string> MemoryDirs() const;

  // ---- self_check.cc
  // Runs the self-check pair (a, b); returns the figures of a and b.
  std::pair<SelfCheckFigures, SelfCheckFigures> SelfCheckPair(const std::string& a,
                                                              const std::string& b);

  // The node's error counters (XID, ECC, NIC errors) from its agent; empty without an agent.
  std::map<std::string, double> NodeErrorCounters(const std::string& node);

  // Self-checks `node` with a healthy `partner`: GEMM and all-reduce against the healthy figures,
  // and the node's error counters must not rise meanwhile (as a GPU diagnostic watches XIDs while
  // it runs). Records and returns whether it passed.
  struct NodeCheck {
    std::string node, partner, why;
    // Measured once the other pairs are done (a spare ready for whichever suspect fails): not
    // slowed by them, its error counters watched in the same wait as theirs.
    bool after = false;
  };
  struct CheckResult {
    bool passed = false;
    bool compute_ok = false;  // its GEMM held (a failure was its network or its error counters)
  };
  bool SelfCheck(const std::string& node, const std::string& partner, const std::string& why);
  // Several at once (both ends of a stalled link): each pair runs beside the others, so a dead
  // end's check costs no more than its own, not its peer's too; then the pairs marked `after`.
  std::vector<CheckResult> SelfCheckAll(const std::vector<NodeCheck>& todo);
  // The node's GEMM is judged against its healthy partner's, measured at the same time on the same
  // machines (capped by the launch's healthy figure): a load that slows both -- other jobs, two
  // shared cores -- is no fault of the node, and a node slower than its partner is (CI saw a
  // healthy spare measure 1/8 of the launch's figure while its partner was as slow). `partner_now`:
  // the figures measured beside it (not ok: none).
  CheckResult Judge(const NodeCheck& c, const SelfCheckFigures& f,
                    const SelfCheckFigures& partner_now,
                    const std::map<std::string, double>& errors_before, Clock::time_point t0);

  Status Baseline();

  // ---- attempts.cc
  std::string HealthyPartner(const std::set<std::string>& avoid) const;

  std::string NodeOfSlot(int rank) const;

  int FirstRankOf(const std::string& node) const;

  Status StartAttempt(const launch::ResumePoint* resume);

  // ---- tick.cc
  void PumpProgress();

  // Under Slurm: which steps of the job run the attempt (every rank has started by its first step).
  void RecordSlurmSteps();

  double HangThreshold() const;

  // Reads every agent's /state; true when the job has stalled (no rank's step moved for the
  // threshold) or an op has been open past its budget. `why` says which.
  bool Stalled(std::string* why);

  // RUN_DIR/prometheus_targets.json: the active nodes' agents, for Prometheus' file_sd. A failure
  // is said, not fatal: the job trains on without the file.
  void WriteScrapeTargets();

  // The faults the controller itself carries out (metric, link, kill-agent) whose time has come.
  void FireControllerInjections();
  // Not fired yet, and its time (seconds since the launch) or its step has come.
  bool InjectionDue(const Injection& in);
  void FireMetricFault(Injection& in);
  void FireLinkFault(Injection& in);
  // Clears the real link faults whose time is over.
  void EndLinkFaults();

  // ---- incidents.cc
  struct Trigger {
    TriggerCause cause;
    std::string detail;
    std::vector<launch::RankExit> failures;
    std::string manual_node;
    std::vector<Verdict> verdicts;  // detector, straggler: the verdict that opened the incident
    Streak streak;                  // ... and how many analyses in a row named it
  };
  static bool Online(const Trigger& t);

  // A verdict of the job's own error: nothing is evicted for it (policy.h).
  Verdict JobError(const std::string& cause, int rank, const std::string& node,
                   const std::string& explanation, const launch::RankExit& origin);

  // The thresholds an incident's hang analysis decides with: a wait counts from half the hang
  // trigger's threshold (at most the analyzer's 10 s); so does a heartbeat's silence (at least
  // 2 s: a worker beats every 100 ms from a thread of its own, so a rank whose heartbeat is that
  // far behind its peers' while its process exists is frozen, not slow).
  analyzer::HangOptions IncidentHangOptions() const;

  // The verdicts of a crash or a hang (at least one: hang/unknown when nobody can be blamed).
  std::vector<Verdict> Diagnose(const Trigger& t);
  // A crash: the job's own error (bad input, or the failure that followed it to a fresh node), the
  // ranks that died of their own failure, or -- when every rank failed of a peer's timeout -- the
  // flight recorders' analysis.
  std::vector<Verdict> DiagnoseCrash(const Trigger& t);
  // A second fault hidden by a crash: the ranks still running once the crash's peers have had
  // the hang threshold to fail (each exit then polled joins `others`), analysed live; a hang
  // verdict for each that the analysis names (rank_not_joined: stuck in compute out of the
  // collective its peers entered), its roots the running ranks only. Nothing when every rank
  // exited.
  std::vector<Verdict> HungSurvivors(const launch::RankExit& origin,
                                     std::vector<launch::RankExit>* others);
  // Names the node of every root rank the evidence left without one (a rank whose agent did not
  // answer left no flight recorder: a node that lost power), from where the attempt placed it.
  void PlaceRootRanks(std::vector<Verdict>* verdicts) const;
  // The rank whose failure started the crash, and any other that died of its own at the time on
  // another node: each a rank_dead verdict.
  std::vector<Verdict> DeadRanks(const launch::RankExit& origin,
                                 const std::vector<launch::RankExit>& others);
  // Ranks that could not reach their peers at the attempt's start (kExitUnreachable): a
  // connect_failed verdict naming the nodes where the failed connections meet -- those failing with
  // the most other nodes (both ends when only one pair failed); nothing when no rank exited so.
  std::optional<Verdict> ConnectFailed(const launch::RankExit& origin,
                                       const std::vector<launch::RankExit>& others);
  // When every node of the attempt (two or more) has a rank that failed on its own in the words
  // `how` (exit and last log line, digits masked), the origin's (whose last line is `log_line`): a
  // job_error, since no machine causes that and evicting would only move the failure to a spare.
  // Nothing otherwise.
  std::optional<Verdict> SameFailureEverywhere(const launch::RankExit& origin,
                                               const std::vector<launch::RankExit>& others,
                                               const std::string& how, const std::string& log_line);

  void RecordDecision(const Verdict& v, const Decision& d, const Streak& streak = {});

  // An online verdict (detector, straggler): recorded with the policy's decision; an alert is
  // reported once per attempt, anything more opens an incident. False: the controller paused.
  bool Act(TriggerCause source, const Verdict& v, const Streak& streak);

  // The online evidence of this tick; false: the controller paused.
  bool Watch();

  void Pause(const std::string& reason);

  // Evicts `node` (stops its agent, drops its memory) and fills its slot; false: paused.
  bool Evict(const std::string& node, const std::string& reason, const json& verdict);

  // Handles one incident; false when the controller paused.
  bool Incident(Trigger t);
  // The incident's stop: the survivors' flight recorders (not for an online verdict: the job still
  // runs), why they were taken, then every rank stopped.
  void StopForIncident(const Trigger& t);
  // A node to evict: the cause it is evicted for, and the verdict that named it.
  struct ToEvict {
    std::string node, reason;
    json verdict;
  };
  // Self-checks the suspects `d.nodes` of `v` (each once per incident: `checked_now`); those that
  // fail join `to_evict` (a straggler's under the cause its check names), those that pass are
  // cleared of the verdict's cause for the run (ClearedKey). As many spares as suspects are
  // checked in the same round, measured after them (spares_checked).
  void ConfirmBySelfCheck(const Verdict& v, const Decision& d,
                          std::map<std::string, bool>* checked_now, std::vector<ToEvict>* to_evict);

  // Starts the next attempt on the active nodes from the newest state (a memory snapshot, else a
  // disk checkpoint); `lost`: the steps done before the stop. False when the controller paused.
  bool Restart(const std::string& restart_cause, int64_t lost);

  void CorruptIfInjected();

  static std::string Join(const std::vector<std::string>& v);

  // ---- disk_space.cc
  // Takes a stop request out of the control queue (other commands wait for the job to run).
  bool StopRequested();

  // The run directory is short of space: the ranks stop (their newest state stays in the memory
  // snapshots, which are not on that disk), nothing is judged or evicted, and once space is back
  // and control.db takes its events again, training resumes in place from that state. A pause
  // for space waits as long as it must. The launch's exit code when it ends here (a person
  // stopped it, or the restart paused), else nullopt.
  std::optional<int> WaitForSpace(const std::string& why);

  // What the run could not keep: lines missing from the progress stream, events not in control.db,
  // files not written. Empty: nothing was lost.
  std::string LostRecords();

  // Writes one of the launch's own files; a failure is said and counted as lost.
  void WriteOwnFile(const std::string& path, const Result<std::string>& text,
                    const std::string& said);

  // ---- run.cc
  // Start-up ended by Ctrl-C or SIGTERM (before any step): says so and stops what it started.
  int StartInterrupted(const std::string& during);
  // A start-up phase's failure: the interruption, where there was one (its processes saw it too).
  int StartFailed(const std::string& during, const std::string& error);

  int Run();

  int RunInterruptible();

  // timeline.html: the steps around the last incident (its root ranks highlighted), else the first
  // ones.
  void WriteTimeline();

  int Loop();
  ~Impl();
};

}  // namespace megascope::controller
