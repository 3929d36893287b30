#include "megascope/tracer/verdict.h"

#include <nlohmann/json.hpp>
#include <utility>

namespace megascope {

namespace {

constexpr std::pair<VerdictKind, std::string_view> kKinds[] = {
    {VerdictKind::kHealthy, "healthy"},
    {VerdictKind::kHang, "hang"},
    {VerdictKind::kSlow, "slow"},
    {VerdictKind::kFaultyMachine, "faulty_machine"},
    {VerdictKind::kJobError, "job_error"},
    {VerdictKind::kMonitoringGap, "monitoring_gap"},
    {VerdictKind::kSharedComponent, "shared_component"}};

constexpr std::pair<Cause, std::string_view> kCauses[] = {
    {Cause::kRankDead, "rank_dead"},
    {Cause::kRankNotJoined, "rank_not_joined"},
    {Cause::kOpMismatch, "op_mismatch"},
    {Cause::kLinkStall, "link_stall"},
    {Cause::kOrderMismatch, "order_mismatch"},
    {Cause::kUnknown, "unknown"},
    {Cause::kComputeStraggler, "compute_straggler"},
    {Cause::kCommStraggler, "comm_straggler"},
    {Cause::kLinkSlow, "link_slow"},
    {Cause::kStageImbalance, "stage_imbalance"},
    {Cause::kMetricOutlier, "metric_outlier"},
    {Cause::kMachineSilent, "machine_silent"},
    {Cause::kBadInput, "bad_input"},
    {Cause::kRepeatedFailure, "repeated_failure"},
    {Cause::kSameFailureEverywhere, "same_failure_everywhere"},
    {Cause::kSourceSilent, "source_silent"},
    {Cause::kComponentOutlier, "component_outlier"},
    {Cause::kSimultaneousOnset, "simultaneous_onset"},
    {Cause::kConnectFailed, "connect_failed"}};

template <typename E, size_t N>
std::string_view Spelling(const std::pair<E, std::string_view> (&table)[N], E e) {
  for (const auto& [value, name] : table) {
    if (value == e) return name;
  }
  return "other";
}

template <typename E, size_t N>
E Parse(const std::pair<E, std::string_view> (&table)[N], std::string_view s, E other) {
  for (const auto& [value, name] : table) {
    if (name == s) return value;
  }
  return other;
}

// The verdict as `J` (ordered_json keeps formats.md's key order in text; json is what documents
// that embed it use).
template <typename J>
J Build(const Verdict& v) {
  using ojson = J;
  auto or_null = [](const std::string& s) { return s.empty() ? ojson(nullptr) : ojson(s); };
  ojson j;
  j["format"] = "megascope-verdict";
  j["version"] = 1;
  j["kind"] = Name(v.kind);
  if (v.kind == VerdictKind::kFaultyMachine) j["level"] = Name(v.level);  // added in version 1
  j["cause"] = or_null(v.cause);
  j["root_ranks"] = v.root_ranks;
  j["root_nodes"] = v.root_nodes;
  j["group"] = or_null(v.group);
  j["seq"] = v.seq < 0 ? ojson(nullptr) : ojson(v.seq);
  j["op"] = or_null(v.op);
  j["waiting_ranks"] = v.waiting_ranks;
  j["detected_at_ns"] = v.detected_at_ns;
  j["onset_at_ns"] = v.onset_at_ns == 0 ? ojson(nullptr) : ojson(v.onset_at_ns);
  j["confidence"] = v.confidence;
  j["explanation"] = v.explanation;
  j["evidence"] = v.evidence;
  if (!v.mismatch.empty()) j["mismatch"] = v.mismatch;        // added in version 1: only when known
  if (!v.thresholds.empty()) j["thresholds"] = v.thresholds;  // added in version 1: when given
  return j;
}

}  // namespace

std::string_view Name(VerdictKind k) { return Spelling(kKinds, k); }
VerdictKind ParseVerdictKind(std::string_view kind) {
  return Parse(kKinds, kind, VerdictKind::kOther);
}
std::string_view Name(Cause c) { return Spelling(kCauses, c); }
Cause ParseCause(std::string_view cause) { return Parse(kCauses, cause, Cause::kOther); }
std::string_view Name(VerdictLevel l) { return l == VerdictLevel::kSuspect ? "suspect" : "faulty"; }
VerdictLevel ParseVerdictLevel(std::string_view level) {
  return level == "suspect" ? VerdictLevel::kSuspect : VerdictLevel::kFaulty;
}

std::string VerdictToJson(const Verdict& v) { return Build<nlohmann::ordered_json>(v).dump(); }

nlohmann::json VerdictToJsonValue(const Verdict& v) { return Build<nlohmann::json>(v); }

}  // namespace megascope
