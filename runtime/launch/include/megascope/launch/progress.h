// The job's progress stream RUN_DIR/progress.jsonl: one JSON object per line, appended by the
// workers. Step lines {"step", "loss", "tokens_per_s", "step_time_s", "lr", "grad_norm", "attempt"}
// come from the rank that reports; event lines {"event": "fault" | "resumed", ...} from any rank
// (each line is one short O_APPEND write, so lines never interleave). ProgressReader follows the
// file as it grows and never returns a line still being written.
//
// A write that fails (a full disk) is refused whole where the filesystem can reserve the room
// first; ProgressWriter keeps such lines and writes them, in order, once a write succeeds again.
// One cut short leaves a torn fragment. The reader counts the damage it sees (`damaged`), so the
// launcher can say records were lost.
#pragma once

#include <cstdint>
#include <deque>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "megascope/tracer/status.h"

namespace megascope::launch {

class ProgressReader {
 public:
  explicit ProgressReader(std::string path) : path_(std::move(path)) {}
  // Complete lines appended since the last call (lines that are not JSON are skipped and counted).
  std::vector<nlohmann::json> Poll();
  // Skips what the file holds now (an earlier launch's lines): Poll returns what comes after.
  void SkipExisting();
  // Lines seen so far that were not JSON (torn by a failed write, or foreign).
  int64_t damaged() const { return damaged_; }
  // Bytes after the last newline: a line still being written, or torn when its writer is gone.
  size_t unterminated() const { return partial_.size(); }

 private:
  std::string path_;
  std::ifstream in_;
  std::string partial_;
  int64_t damaged_ = 0;
};

// Appends one line to the progress stream in a single write. On failure (the path, why) the line
// is lost; after a write cut short, the next line starts on a fresh line so the fragment stays
// one damaged line instead of spoiling the next record.
Status AppendProgress(const std::string& path, const nlohmann::json& line);

// A writer's progress lines, none lost to a full disk that frees up again: a line that cannot be
// written is kept (up to `max_pending`, the oldest dropped past that and counted) and written
// before the next one, in order, once the disk takes writes again.
class ProgressWriter {
 public:
  using AppendFn = std::function<Status(const std::string& path, const nlohmann::json& line)>;
  explicit ProgressWriter(std::string path, size_t max_pending = 4096,
                          AppendFn append = AppendProgress)
      : path_(std::move(path)), max_pending_(max_pending), append_(std::move(append)) {}
  // Writes what is pending, then `line`: OK once everything is written; else why not (`line`
  // kept).
  Status Append(const nlohmann::json& line);
  size_t pending() const { return pending_.size(); }
  int64_t dropped() const { return dropped_; }

 private:
  std::string path_;
  size_t max_pending_;
  AppendFn append_;
  std::deque<nlohmann::json> pending_;
  int64_t dropped_ = 0;
};

// "step   12/40 | loss 2.5123 | ..." for a step line.
std::string FormatStepLine(const nlohmann::json& line, long long steps);

}  // namespace megascope::launch
