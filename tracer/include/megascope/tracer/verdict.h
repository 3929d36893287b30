// The verdict of docs/formats.md section 2 ("megascope-verdict", version 1): what the analyzer and
// the detector conclude and the controller records. One JSON object per line when streamed.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace megascope {

// docs/formats.md section 2's kinds, spelled there (one table, verdict.cc). kOther: a kind this
// build does not know (ParseVerdictKind of a newer writer's); no verdict made here has it.
// kMonitoringGap (a machine's metric source stopped while the machine and its peers go on) and
// kSharedComponent (machines that stand out together: their rack, switch or PDU) name no faulty
// machine: they are alerts, never evictions, and never count as a machine's fault.
enum class VerdictKind : uint8_t {
  kHealthy,
  kHang,
  kSlow,
  kFaultyMachine,
  kJobError,
  kMonitoringGap,
  kSharedComponent,
  kOther
};
std::string_view Name(VerdictKind k);  // kOther: "other"
VerdictKind ParseVerdictKind(std::string_view kind);

// The causes of section 2 a program decides on (the policy, the controller), spelled there. A
// verdict keeps its cause as written (Verdict::cause): a newer analyzer's cause, or a detector
// baseline's method, reads as kOther here and is still recorded and shown as it is.
enum class Cause : uint8_t {
  kRankDead,
  kRankNotJoined,
  kOpMismatch,
  kLinkStall,
  kOrderMismatch,
  kUnknown,
  kComputeStraggler,
  kCommStraggler,
  kLinkSlow,
  kStageImbalance,
  kMetricOutlier,
  kMachineSilent,
  kBadInput,
  kRepeatedFailure,
  kSameFailureEverywhere,
  kSourceSilent,
  kComponentOutlier,
  kSimultaneousOnset,
  kConnectFailed,
  kOther,
};
std::string_view Name(Cause c);  // kOther: "other"
Cause ParseCause(std::string_view cause);

// How sure a faulty_machine verdict is that the machine is broken (formats.md section 2's `level`):
// kFaulty (a hard error signal, silence, the job hurt, or two families agreeing longer than any
// benign excursion: the policy acts) or kSuspect (worth a look: the policy alerts only).
enum class VerdictLevel : uint8_t { kFaulty, kSuspect };
std::string_view Name(VerdictLevel l);
VerdictLevel ParseVerdictLevel(std::string_view level);  // anything but "suspect": kFaulty

struct Verdict {
  VerdictKind kind = VerdictKind::kHealthy;
  VerdictLevel level = VerdictLevel::kFaulty;  // written for faulty_machine verdicts only
  std::string cause;  // Name(Cause) of what this build knows, e.g. rank_not_joined
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
