// Hang root cause (DESIGN.md section 6; Mycroft's dependency idea over Flight-Recorder state).
// From every rank's open flight-recorder entries, build the wait-for graph: a rank inside
// collective (group G, seq k) waits for the members of G that have not issued seq k; a recv waits
// for the matching send (FORMATS.md sequence rules) and a send for its recv. Follow the edges to
// the ranks nobody can explain -- gone, never joined, or issuing something else -- and name them
// with the evidence. Joined-but-stalled point-to-point transfers name the link; ranks waiting on
// each other in a cycle name the rank whose collective order departs from its own history.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "megascope/tracer/dump.h"
#include "megascope/tracer/status.h"
#include "megascope/tracer/verdict.h"

namespace megascope::analyzer {

struct HangOptions {
  // An op open for less than this is work in progress, not a hang.
  double min_wait_s = 10;
  // A heartbeat this much older than its freshest peers' marks the rank dead.
  double stale_heartbeat_s = 60;
};

// One rank's view: its dump, or nothing (missing).
struct RankView {
  bool present = false;
  std::string source;  // file or URL it came from
  tracer::Dump dump;
};

struct HangInput {
  int world_size = 0;
  std::vector<RankView> ranks;  // index = rank
  // Things the reader met and went on past, one line per kind (an unknown value of a known field,
  // with how many dumps carry it and the first place): callers print them as warnings.
  std::vector<std::string> warnings;
};

// Reads every *.json dump of `dir` (a directory of dumps, or a run directory: its newest
// dumps/attempt_*). Errors name the file.
Result<HangInput> LoadDumpDirectory(const std::string& dir);
// Reads PyTorch Flight Recorder dumps (the JSON form: version, pg_config, entries with
// collective_seq_id, profiling_name, state, ...) from `dir`, one file per rank (the rank comes from
// a top-level "rank" field or the digits ending the file name), converted to megascope dumps.
Result<HangInput> LoadPyTorchDumps(const std::string& dir);
// One PyTorch dump's JSON text as a megascope dump (`rank_hint` when the text has no "rank").
Result<tracer::Dump> ParsePyTorchDump(std::string_view text, const std::string& source,
                                      int rank_hint = -1);
// Builds the input from parsed dumps (checks membership agrees across ranks).
Result<HangInput> MakeHangInput(std::vector<std::pair<std::string, tracer::Dump>> dumps);

// Verdicts: one per independent cause (kind "hang"), or one of kind "healthy".
std::vector<Verdict> AnalyzeHang(const HangInput& in, const HangOptions& options = {});

// A readable explanation of the verdicts for a tired SRE.
std::string FormatHangReport(const std::vector<Verdict>& verdicts);

}  // namespace megascope::analyzer
