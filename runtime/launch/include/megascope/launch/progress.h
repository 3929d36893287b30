// The job's progress stream RUN_DIR/progress.jsonl: one JSON object per line, appended by the
// workers. Step lines {"step", "loss", "tokens_per_s", "step_time_s", "lr", "grad_norm", "attempt"}
// come from the rank that reports; event lines {"event": "fault" | "resumed", ...} from any rank
// (each line is one short O_APPEND write, so lines never interleave). ProgressReader follows the
// file as it grows and never returns a line still being written.
#pragma once

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace megascope::launch {

class ProgressReader {
 public:
  explicit ProgressReader(std::string path) : path_(std::move(path)) {}
  // Complete lines appended since the last call (lines that are not JSON are skipped).
  std::vector<nlohmann::json> Poll();

 private:
  std::string path_;
  std::ifstream in_;
  std::string partial_;
};

// Appends one line to the progress stream in a single write.
void AppendProgress(const std::string& path, const nlohmann::json& line);

// "step   12/40 | loss 2.5123 | ..." for a step line.
std::string FormatStepLine(const nlohmann::json& line, long long steps);

}  // namespace megascope::launch
