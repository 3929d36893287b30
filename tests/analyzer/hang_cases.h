// What the hang tests over recorded cases share: each case's directory (a folder holding
// expected.json), and the check of a case's verdicts against it.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "megascope/analyzer/hang.h"

namespace megascope::analyzer {

using Outcome =
    std::set<std::tuple<std::string, std::string, std::vector<int32_t>>>;  // kind, cause, roots

// The verdicts `analyze` gives against <dir>/expected.json: the same set of (kind, cause, root
// ranks); where a case says, who waits and what mismatched.
inline void ExpectVerdicts(const std::string& dir,
                           const std::function<std::vector<Verdict>(const HangOptions&)>& analyze) {
  std::ifstream f(dir + "/expected.json");
  auto expected = nlohmann::json::parse(f);
  Outcome want, got;
  for (const auto& v : expected["verdicts"]) {
    want.insert({v.value("kind", "hang"), v["cause"].is_null() ? "" : v["cause"].get<std::string>(),
                 v["root_ranks"].get<std::vector<int32_t>>()});
  }
  HangOptions options;  // a case recorded from a job with short thresholds says its own
  options.min_wait_s = expected.value("min_wait_s", options.min_wait_s);
  const auto verdicts = analyze(options);
  std::string text;
  for (const Verdict& v : verdicts) {
    got.insert({std::string(Name(v.kind)), v.cause, v.root_ranks});
    for (const auto& e : expected["verdicts"]) {  // who waits, where a case says
      if (e.contains("waiting_ranks") &&
          e["root_ranks"].get<std::vector<int32_t>>() == v.root_ranks) {
        EXPECT_EQ(v.waiting_ranks, e["waiting_ranks"].get<std::vector<int32_t>>());
      }
      if (e.contains("mismatch") && e["root_ranks"].get<std::vector<int32_t>>() == v.root_ranks &&
          e.value("cause", "") == v.cause) {
        EXPECT_EQ(v.mismatch, e["mismatch"].get<std::string>()) << VerdictToJson(v);
      }
    }
    text += VerdictToJson(v) + "\n";
    auto j = nlohmann::json::parse(VerdictToJson(v));  // the docs/formats.md section 2 shape
    for (const char* key : {"format", "version", "kind", "cause", "root_ranks", "root_nodes",
                            "group", "seq", "op", "waiting_ranks", "detected_at_ns", "onset_at_ns",
                            "confidence", "explanation", "evidence"}) {
      EXPECT_TRUE(j.contains(key)) << key;
    }
    EXPECT_EQ(VerdictToJsonValue(v), j) << "the value a document embeds is the line's";
    EXPECT_EQ(v.root_ranks.size(), v.root_nodes.size());
    if (v.kind == VerdictKind::kHang) {
      EXPECT_FALSE(v.explanation.empty());
    }
  }
  EXPECT_EQ(got, want) << text;
}

inline void ExpectVerdicts(const std::string& dir, const HangInput& in) {
  ExpectVerdicts(dir, [&](const HangOptions& o) { return AnalyzeHang(in, o); });
}

// The live input keeps each rank's index and drops its entries: the analysis reads nothing else.
inline void DropEntries(HangInput* in) {
  for (RankView& v : in->ranks) v.dump.snapshot.entries = {};
}

// The case directories under `root` (each holding an expected.json), in name order.
inline std::vector<std::string> Scenarios(const char* root = MEGASCOPE_TEST_DATA "/hang") {
  std::vector<std::string> dirs;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(root, ec)) {
    if (std::filesystem::exists(e.path() / "expected.json")) dirs.push_back(e.path().string());
  }
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

}  // namespace megascope::analyzer
