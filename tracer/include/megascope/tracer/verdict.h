// The verdict of docs/formats.md section 2 ("megascope-verdict", version 1): what the analyzer and
// the detector conclude and the controller records. One JSON object per line when streamed.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace megascope {

struct Verdict {
  std::string kind;   // hang, slow, faulty_machine, healthy
  std::string cause;  // e.g. rank_not_joined; for faulty_machine the leading metric
  std::vector<int32_t> root_ranks;
  std::vector<std::string> root_nodes;
  std::string group;  // empty: null
  int64_t seq = -1;   // -1: null
  std::string op;     // empty: null
  std::vector<int32_t> waiting_ranks;
  int64_t detected_at_ns = 0;
  int64_t onset_at_ns = 0;  // 0: null
  double confidence = 0;
  std::string explanation;
  std::vector<std::string> evidence;  // short human-readable facts
  // What differs between the members of the collective a hang is at, as PyTorch's Flight Recorder
  // analysis names it (COLLECTIVE_TYPE_MISMATCH, SIZE_OR_SYNTAX_MISMATCH, ...); empty: null.
  std::string mismatch;
  // The numbers that decided it, for a re-analysis to decide the same way (e.g. a straggler's
  // window and ratios: first_step, last_step, attempt, compute_ratio, ...); empty: not written.
  std::map<std::string, double> thresholds;
};

// One line of JSON, no trailing newline.
std::string VerdictToJson(const Verdict& v);
// The same as a JSON value, for a document that embeds it (a control.db event's detail).
nlohmann::json VerdictToJsonValue(const Verdict& v);

}  // namespace megascope
