#include "megascope/tracer/verdict.h"

#include <array>
#include <nlohmann/json.hpp>
#include <utility>

#include "megascope/tracer/enum_names.h"

namespace megascope {

namespace {

// In enum order (verdict.h); kOther, past the table, is "other".
constexpr std::array<std::string_view, 7> kKindNames = {
    "healthy", "hang", "slow", "faulty_machine", "job_error", "monitoring_gap", "shared_component"};
constexpr std::array<std::string_view, 19> kCauseNames = {
    "rank_dead",         "rank_not_joined",   "op_mismatch",
    "link_stall",        "order_mismatch",    "unknown",
    "compute_straggler", "comm_straggler",    "link_slow",
    "stage_imbalance",   "metric_outlier",    "machine_silent",
    "bad_input",         "repeated_failure",  "same_failure_everywhere",
    "source_silent",     "component_outlier", "simultaneous_onset",
    "connect_failed"};
constexpr std::array<std::string_view, 2> kLevelNames = {"faulty", "suspect"};
static_assert(kKindNames.size() == static_cast<size_t>(VerdictKind::kOther));
static_assert(kCauseNames.size() == static_cast<size_t>(Cause::kOther));

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

std::string_view Name(VerdictKind k) { return tracer::NameFrom(kKindNames, k, "other"); }
VerdictKind ParseVerdictKind(std::string_view kind) {
  return tracer::ParseFrom<VerdictKind>(kKindNames, kind).value_or(VerdictKind::kOther);
}
std::string_view Name(Cause c) { return tracer::NameFrom(kCauseNames, c, "other"); }
Cause ParseCause(std::string_view cause) {
  return tracer::ParseFrom<Cause>(kCauseNames, cause).value_or(Cause::kOther);
}
std::string_view Name(VerdictLevel l) { return tracer::NameFrom(kLevelNames, l); }
VerdictLevel ParseVerdictLevel(std::string_view level) {
  return tracer::ParseFrom<VerdictLevel>(kLevelNames, level).value_or(VerdictLevel::kFaulty);
}

std::string VerdictToJson(const Verdict& v) { return Build<nlohmann::ordered_json>(v).dump(); }

nlohmann::json VerdictToJsonValue(const Verdict& v) { return Build<nlohmann::json>(v); }

}  // namespace megascope
