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

// What the analysis reads of one rank's flight recorder, indexed once from its dump's entries. A
// 100,000-rank job's entries are 2 GB; this is a third of that, so the live input keeps only this
// (28 bytes a collective). Groups are the rank's own indices into its dump's groups; of two groups
// of one name the later is the one (its ops are indexed under it).
struct RankOps {
  // The index's large arrays: in the arena IndexOps is given (huge pages, faulted in ahead), else
  // on the heap.
  template <typename T>
  using Array = std::vector<T, tracer::ArenaAllocator<T>>;
  struct Collective {  // 24 bytes
    int64_t seq = 0;
    uint64_t bytes = 0;
    tracer::OpType op = tracer::OpType::kUnknown;
    tracer::DType dtype = tracer::DType::kUnknown;
    tracer::OpState state = tracer::OpState::kUnknown;
    int32_t sent = kSentUnknown;  // bytes_sent: kSentUnknown, kSentAll (`bytes`), or a partial_sent
  };
  static constexpr int32_t kSentUnknown = -1, kSentAll = -2;
  struct Transfer {
    int32_t group = 0, peer = 0;
    int64_t seq = 0;
    uint64_t bytes = 0;
    int64_t moved = -1;  // bytes_sent of a send, bytes_received of a recv; -1 unknown
    bool open = false;   // not completed
  };

  std::vector<int32_t> by_name;    // group indices sorted by name, one a name
  std::vector<int64_t> last_coll;  // group -> max collective seq issued (-1: none)
  // The collectives by group, then by seq (of a seq recorded twice, the newest); group g's are
  // colls[coll_start[g] .. coll_start[g + 1]).
  Array<Collective> colls;
  std::vector<uint32_t> coll_start;
  std::vector<int64_t> partial_sent;  // bytes_sent other than none or all, by Collective::sent
  Array<Transfer> sends, recvs;       // sorted by (group, peer, seq), one a seq (the newest)
  Array<int32_t> history;             // group indices of collectives, in issue order
  // Where the rank's thread waits: its newest open op, or behind a device queue (NCCL) the oldest
  // open one, which everything after it waits for.
  std::optional<tracer::FlightEntry> blocking;
  int32_t blocking_group = -1;
  size_t history_at_blocking = 0;             // the collectives issued up to it
  std::optional<tracer::FlightEntry> newest;  // the newest entry
  bool in_op = false;                         // an entry enqueued or started

  int64_t BytesSent(const Collective& c) const {
    return c.sent >= 0 ? partial_sent[c.sent]
                       : (c.sent == kSentAll ? static_cast<int64_t>(c.bytes) : -1);
  }
};
// Indexes `dump`'s entries, its large arrays in `arena` when given (one thread at a time).
RankOps IndexOps(const tracer::Dump& dump, const std::shared_ptr<tracer::Arena>& arena = nullptr);

// One rank's view: its dump and the index of its ops, or nothing (missing). `dump`'s entries may
// be dropped once `ops` holds them (the live input does).
struct RankView {
  bool present = false;
  std::string source;  // file or URL it came from
  tracer::Dump dump;
  RankOps ops;
};

struct HangInput {
  int world_size = 0;
  std::vector<RankView> ranks;  // index = rank
  // Things the reader met and went on past, one line per kind (an unknown value of a known field,
  // with how many dumps carry it and the first place): callers print them as warnings.
  std::vector<std::string> warnings;
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
// Builds the input from parsed dumps (checks membership agrees across ranks), indexing each.
Result<HangInput> MakeHangInput(std::vector<std::pair<std::string, tracer::Dump>> dumps);

// Builds the input from ranks' views as they arrive, from any thread, each moved into its rank's
// place once (a 100,000-rank job's views are 80 MB).
class HangInputBuilder {
 public:
  // `view`: `source`, `dump` and `ops` set. An error if its world size is not the others'; of two
  // views of one rank, the newer dump is kept.
  Status Add(RankView view);
  // Checks that every group has the same members in every rank's dump, and says once per field
  // and value which unknown values the dumps hold.
  Result<HangInput> Finish() &&;

 private:
  std::mutex mu_;
  HangInput in_;
};

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
