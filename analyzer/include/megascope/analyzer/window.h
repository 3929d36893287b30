// A straggler window computed where its data is: each node's agent answers
//   GET /window?attempt=A&from=F&to=T[&anyway=1]
// over its own trace.db with its ranks' part of the analysis input (SlowInput), and whoever
// analyses the window (the controller's straggler watch) merges the parts instead of opening every
// node's database. docs/formats.md section 4 describes the answer.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

#include "megascope/analyzer/slow.h"
#include "megascope/tracer/status.h"

namespace megascope::analyzer {

struct WindowQuery {
  int attempt = 0;
  int64_t first_step = 0, last_step = 0;
  // The rows stored so far, even before every rank's end of the window is stored (a rank that
  // stays behind: its agent may be gone).
  bool anyway = false;
};
// "attempt=0&from=10&to=19[&anyway=1]" (a URL's query string); an error names the bad field.
Result<WindowQuery> ParseWindowQuery(std::string_view query);
std::string WindowPath(const WindowQuery& q);  // "/window?attempt=...&from=...&to=..."

struct WindowPart {
  static constexpr int kVersion = 1;
  std::string node;
  // Each of the node's ranks of the attempt with spans stored: the newest step stored.
  std::map<int, int64_t> through;
  // Whether `input` holds the window's rows: once every rank of `through` is through the window's
  // last step, or when asked anyway (otherwise only `through` is sent: the asker comes back).
  bool has_rows = false;
  SlowInput input;
};
std::string WindowPartJson(const WindowPart& part);
// An unknown version is an error; so is a malformed part (naming what is wrong).
Result<WindowPart> ParseWindowPart(std::string_view json);

// Ranks of `attempt` through step `last` summed over parts (the window is complete when it is the
// job's world size).
int RanksThrough(const std::map<std::string, WindowPart>& parts, int64_t last);

// Answers one node's /window over RUN_DIR/nodes/NODE/trace.db, read-only. How far each rank is
// stored is kept between calls (StoredSteps: each call reads only the rows stored since the last),
// so a watcher polling for a window costs what was stored since, until the window is complete.
// Thread-safe: an agent's HTTP threads share one.
class WindowServer {
 public:
  WindowServer(std::string run_dir, std::string node);
  Result<WindowPart> Part(const WindowQuery& q);
  // (HTTP status, body) for a URL's query string: 200 and the part's JSON, 400 and the reason for
  // a bad query, 503 when the database cannot be read (JSON {"error": ...}).
  std::pair<int, std::string> Serve(std::string_view query);

 private:
  std::mutex mu_;
  std::string run_dir_, node_;
  StoredSteps stored_;
};

}  // namespace megascope::analyzer
