#include "megascope/analyzer/hang.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include "hang/analysis.h"
#include "megascope/analyzer/stacks.h"
#include "megascope/tracer/enum_names.h"
#include "megascope/tracer/file_util.h"
#include "megascope/tracer/parallel.h"
#include "megascope/tracer/run_layout.h"

namespace megascope::analyzer {
namespace {

namespace fs = std::filesystem;

}  // namespace

std::string_view Name(MismatchKind k) {
  static constexpr std::array<std::string_view, 4> kNames = {
      "COLLECTIVE_TYPE_MISMATCH", "SIZE_OR_SYNTAX_MISMATCH", "COLLECTIVE_DTYPE_MISMATCH",
      "COLLECTIVE_STATE_MISMATCH"};
  return tracer::NameFrom(kNames, k);
}

namespace {

// `path` itself, or for a run directory its newest dumps/attempt_*.
Result<std::string> DumpDirectoryOf(const std::string& path) {
  if (!fs::is_directory(path)) return NotFound(path + " is not a directory");
  const RunLayout layout(path);
  if (!fs::is_directory(layout.dumps_root())) return path;
  int best = -1;
  for (const auto& e : fs::directory_iterator(layout.dumps_root())) {
    const std::string n = e.path().filename().string();
    if (n.rfind("attempt_", 0) == 0) best = std::max(best, std::atoi(n.c_str() + 8));
  }
  if (best < 0) return NotFound(layout.dumps_root() + " holds no attempt_* directory");
  return layout.dumps(best);
}

}  // namespace

Result<std::optional<IncidentThresholds>> ReadIncidentThresholds(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string dir, DumpDirectoryOf(path));
  const std::string file = dir + "/" + kIncidentFile;
  if (!fs::exists(file)) return std::optional<IncidentThresholds>();
  ASSIGN_OR_RETURN(const std::string text, tracer::ReadFile(file));
  const auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || j.value("format", "") != "megascope-incident")
    return InvalidArgument(file + ": not a megascope incident file");
  if (!j.contains("version") || !j["version"].is_number_integer() || j["version"] != 1)
    return InvalidArgument(file + ": incident file version " +
                           (j.contains("version") ? j["version"].dump() : "(none)") +
                           " is not one this build knows (1)");
  IncidentThresholds t;
  t.source = file;
  t.trigger = j.value("trigger", "");
  auto seconds = [&](const char* key, double fallback) {
    return j.contains(key) && j[key].is_number() && j[key].get<double>() > 0 ? j[key].get<double>()
                                                                             : fallback;
  };
  t.options.min_wait_s = seconds("min_wait_s", t.options.min_wait_s);
  t.options.stale_heartbeat_s = seconds("stale_heartbeat_s", t.options.stale_heartbeat_s);
  return std::optional<IncidentThresholds>(std::move(t));
}

Status WriteIncidentThresholds(const std::string& dir, const std::string& trigger,
                               const std::string& detail, int attempt, const HangOptions& options) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  const nlohmann::ordered_json j = {{"format", "megascope-incident"},
                                    {"version", 1},
                                    {"trigger", trigger},
                                    {"detail", detail},
                                    {"attempt", attempt},
                                    {"min_wait_s", options.min_wait_s},
                                    {"stale_heartbeat_s", options.stale_heartbeat_s}};
  return tracer::WriteFileAtomic(dir + "/" + kIncidentFile, j.dump(1) + "\n");
}

Result<HangInput> LoadDumpDirectory(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string dir, DumpDirectoryOf(path));
  std::vector<std::pair<std::string, tracer::Dump>> dumps;
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() == ".json" && e.path().filename() != kIncidentFile)
      files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) return NotFound("no flight-recorder dumps (*.json) in " + dir);
  // Read and parsed on every core: a 12,288-rank job's directory is about a gigabyte.
  std::vector<std::optional<Result<tracer::Dump>>> read(files.size());
  tracer::ParallelFor(files.size(), std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 8),
                      [&](size_t i) { read[i] = tracer::ReadDumpFile(files[i]); });
  dumps.reserve(files.size());
  // A bad file (cut short, malformed, not JSON) is named and skipped: its rank counts as one that
  // left no dump, and the others are analysed. A dump of another format or a newer version is an
  // error (another reader or a newer megascope reads it), and so is a directory with none readable.
  std::vector<std::string> skipped;
  for (size_t i = 0; i < files.size(); ++i) {
    if (!read[i]->ok() && read[i]->status().code() == StatusCode::kFailedPrecondition)
      return read[i]->status();
    if (!read[i]->ok()) {
      skipped.push_back(read[i]->status().message() + ": skipped, its rank counts as one that " +
                        "left no dump");
      continue;
    }
    dumps.emplace_back(std::move(files[i]), std::move(*read[i]).value());
  }
  if (dumps.empty()) {
    return read.front()->status().WithContext("no dump of " + dir + " could be read (" +
                                              std::to_string(files.size()) + " file(s))");
  }
  ASSIGN_OR_RETURN(HangInput in, MakeHangInput(std::move(dumps)));
  in.warnings.insert(in.warnings.begin(), skipped.begin(), skipped.end());
  return in;
}

std::vector<Verdict> AnalyzeHang(const HangInput& in, const HangOptions& opt,
                                 std::vector<WaitEdge>* wait_for) {
  hang::HangAnalysis a(in, opt);
  hang::LoadRanks(a);
  hang::BuildWaitGraph(a);
  hang::NameOpMismatches(a);  // 1.
  hang::NameStalledLinks(a);  // 2.
  hang::NameRoots(a);         // 3.
  hang::NameCycle(a);         // 4. and 5.
  hang::Conclude(a);
  if (wait_for != nullptr) *wait_for = std::move(a.waits);
  return std::move(a.out);
}

std::string FormatHangReport(const std::vector<Verdict>& verdicts) {
  std::string out;
  for (const Verdict& v : verdicts) {
    if (v.kind == VerdictKind::kHealthy) {
      out += "healthy: " + v.explanation + "\n";
      continue;
    }
    std::string roots;
    for (size_t i = 0; i < v.root_ranks.size(); ++i) {
      roots += (i ? ", " : "") + std::to_string(v.root_ranks[i]) + " (" + v.root_nodes[i] + ")";
    }
    out += "HANG  cause: " + v.cause + (roots.empty() ? "" : "   root: rank " + roots) + "\n";
    if (!v.group.empty())
      out += "  at: " + v.op + " #" + std::to_string(v.seq) + " in " + v.group + "\n";
    out += "  " + v.explanation + "\n";
    if (!v.waiting_ranks.empty())
      out += "  ranks waiting behind it: " + std::to_string(v.waiting_ranks.size()) + "\n";
    if (!v.mismatch.empty()) out += "  mismatch: " + v.mismatch + "\n";
    for (const std::string& e : v.evidence) {
      if (e.rfind("stacks: ", 0) == 0) out += "  " + e + "\n";
      if (e.rfind("pytorch: ", 0) == 0) out += "  " + e.substr(9) + "\n";  // as PyTorch says it
    }
  }
  return out;
}

}  // namespace megascope::analyzer
