// Hang root cause (docs/architecture.md section 6; Mycroft's dependency idea over Flight-Recorder
// state). From every rank's open flight-recorder entries, build the wait-for graph: a rank inside
// collective (group G, seq k) waits for the members of G that have not issued seq k; a recv waits
// for the matching send (docs/formats.md sequence rules) and a send for its recv. Follow the edges
// to the ranks nobody can explain -- gone, never joined, or issuing something else -- and name them
// with the evidence. Joined-but-stalled point-to-point transfers name the link; ranks waiting on
// each other in a cycle name the rank whose collective order departs from its own history.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "megascope/analyzer/hang_input.h"
#include "megascope/tracer/arena.h"
#include "megascope/tracer/dump.h"
#include "megascope/tracer/status.h"
#include "megascope/tracer/verdict.h"

namespace megascope::analyzer {

// What differs between the members of one collective, spelled as PyTorch's Flight Recorder
// analysis names it (torch/distributed/flight_recorder/components/types.py, MatchState).
enum class MismatchKind : uint8_t { kType = 0, kSize, kDtype, kState };
std::string_view Name(MismatchKind k);

// How the members of one collective (a group and sequence number) compare.
struct MemberComparison {
  std::vector<int> odd;  // the ranks whose op departs from the others' (empty: they agree)
  MismatchKind kind = MismatchKind::kType;
  std::string expected, found;  // what the others issued, what the odd ones issued (readable)
  // False where the writer's own rules do not compare the members' states (PyTorch matches a
  // coalesced block's closing entry by type only): a member that completed the op then shows it
  // moving, not a stalled link, and the members still in it are not waiting.
  bool states_compared = true;
};
// Compares what `members` (each issued `seq` in `group`) issued there. Called from AnalyzeHang's
// thread, once per collective someone waits in.
using MemberMatcher = std::function<MemberComparison(std::string_view group, int64_t seq,
                                                     const std::vector<int>& members)>;

struct HangOptions {
  // An op open for less than this is work in progress, not a hang.
  double min_wait_s = 10;
  // A heartbeat this much older than its freshest peers' marks the rank dead.
  double stale_heartbeat_s = 60;
  // A rank without a dump is gone, so an op that waits on one is a hang however young it is. True
  // for writers that dump from every live rank on a timeout or an error (PyTorch's recorder after
  // an NCCL error, seconds after a peer exited); our own agent writes a dead rank's dump itself.
  bool absent_is_gone = false;
  // A rank without a dump is one whose dump was not collected (PyTorch's fr_trace
  // --allow-incomplete-ranks: best-effort analysis of a partial set), not a gone one: it is never
  // named dead for its silence, and a wait that ends at it is undecided -- an unknown verdict that
  // names the ranks whose dumps are missing. Overrides absent_is_gone.
  bool absent_not_collected = false;
  // Compares the members of a collective; unset: megascope's rule (op, size and dtype must agree;
  // the ranks outside the largest agreeing set depart, ties broken by who departs from its own
  // previous op in the group).
  MemberMatcher matcher;
};

// Reads every *.json dump of `dir` (a directory of dumps, or a run directory: its newest
// dumps/attempt_*). Errors name the file. The directory's incident.json (kIncidentFile) is not a
// dump: it says why the dumps were taken.
Result<HangInput> LoadDumpDirectory(const std::string& dir);

// What `megascope launch` writes beside the dumps it collects for an incident
// ({"format": "megascope-incident", "version": 1, "trigger", "detail", "attempt",
// "min_wait_s", "stale_heartbeat_s"}), so that a re-analysis decides with the thresholds the
// incident was decided with.
inline constexpr const char* kIncidentFile = "incident.json";
struct IncidentThresholds {
  HangOptions options;
  std::string source;   // the incident file read
  std::string trigger;  // what started the incident (crash, hang, ...)
};
// The incident file of `dir` (a dump directory, or a run directory's newest dumps/attempt_*), if
// there is one; an error if it is there but unreadable or of a newer version.
Result<std::optional<IncidentThresholds>> ReadIncidentThresholds(const std::string& dir);
// Writes `dir`/incident.json for an incident decided with `options`.
Status WriteIncidentThresholds(const std::string& dir, const std::string& trigger,
                               const std::string& detail, int attempt, const HangOptions& options);
// Reads PyTorch Flight Recorder dumps (the JSON form: version, pg_config, entries with
// collective_seq_id, profiling_name, state, ...) from `dir`, one file per rank (the rank comes from
// a top-level "rank" field or the digits ending the file name), converted to megascope dumps.
Result<HangInput> LoadPyTorchDumps(const std::string& dir);
// One PyTorch dump's JSON text as a megascope dump (`rank_hint` when the text has no "rank").
// `world_hint`: the job's size where the dump does not say (the first recorder's form, a bare
// list of entries, has no pg_config: its default group is taken as ranks 0..world_hint-1).
Result<tracer::Dump> ParsePyTorchDump(std::string_view text, const std::string& source,
                                      int rank_hint = -1, int world_hint = -1);
// One edge of the wait-for graph: rank `from` waits in `what` ("allreduce #24 in dp.0.0") for
// rank `to`, and has for `seconds`.
struct WaitEdge {
  int from = 0, to = 0;
  std::string what;
  double seconds = 0;
};

// Verdicts: one per independent cause (kind "hang"), or one of kind "healthy". `wait_for`
// (optional) receives the wait-for graph the verdicts were followed through (the report draws it).
std::vector<Verdict> AnalyzeHang(const HangInput& in, const HangOptions& options = {},
                                 std::vector<WaitEdge>* wait_for = nullptr);

// A readable explanation of the verdicts for a tired SRE.
std::string FormatHangReport(const std::vector<Verdict>& verdicts);

}  // namespace megascope::analyzer
