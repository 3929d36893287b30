#include "megascope/tracer/verdict.h"

#include <nlohmann/json.hpp>

namespace megascope {

namespace {

// The verdict as `J` (ordered_json keeps formats.md's key order in text; json is what documents
// that embed it use).
template <typename J>
J Build(const Verdict& v) {
  using ojson = J;
  auto or_null = [](const std::string& s) { return s.empty() ? ojson(nullptr) : ojson(s); };
  ojson j;
  j["format"] = "megascope-verdict";
  j["version"] = 1;
  j["kind"] = v.kind;
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

std::string VerdictToJson(const Verdict& v) { return Build<nlohmann::ordered_json>(v).dump(); }

nlohmann::json VerdictToJsonValue(const Verdict& v) { return Build<nlohmann::json>(v); }

}  // namespace megascope
