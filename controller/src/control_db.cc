#include "megascope/controller/control_db.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <array>

namespace megascope::controller {
namespace {

constexpr std::array<std::pair<EventKind, std::string_view>, 14> kKinds = {{
    {EventKind::kFaultInjected, "fault_injected"},
    {EventKind::kTrigger, "trigger"},
    {EventKind::kVerdict, "verdict"},
    {EventKind::kStopped, "stopped"},
    {EventKind::kEviction, "eviction"},
    {EventKind::kSelfCheck, "self_check"},
    {EventKind::kRestart, "restart"},
    {EventKind::kCheckpointSaved, "checkpoint_saved"},
    {EventKind::kCheckpointLoaded, "checkpoint_loaded"},
    {EventKind::kResumed, "resumed"},
    {EventKind::kAgentRestarted, "agent_restarted"},
    {EventKind::kPaused, "paused"},
    {EventKind::kJobFinished, "job_finished"},
    {EventKind::kDecision, "decision"},
}};

struct Stmt {
  sqlite3_stmt* s = nullptr;
  ~Stmt() { sqlite3_finalize(s); }
};

}  // namespace

std::string_view Name(EventKind kind) {
  for (const auto& [k, n] : kKinds) {
    if (k == kind) return n;
  }
  return "unknown";
}

std::optional<EventKind> ParseEventKind(std::string_view name) {
  for (const auto& [k, n] : kKinds) {
    if (n == name) return k;
  }
  return std::nullopt;
}

Result<std::unique_ptr<ControlDb>> ControlDb::Open(const std::string& path, bool read_only) {
  if (!read_only) {
    if (const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600); fd >= 0)
      ::close(fd);
  } else if (::access(path.c_str(), R_OK) != 0) {
    return NotFound(path + " does not exist (was the run started with 'megascope launch'?)");
  }
  std::unique_ptr<ControlDb> db(new ControlDb());
  db->path_ = path;
  const int flags = read_only ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE;
  if (sqlite3_open_v2(path.c_str(), &db->db_, flags, nullptr) != SQLITE_OK) {
    return IoError("[control] cannot open " + path + ": " + sqlite3_errmsg(db->db_));
  }
  sqlite3_busy_timeout(db->db_, 5000);
  if (!read_only) {
    char* err = nullptr;
    const char* schema =
        "PRAGMA journal_mode=WAL;"
        "CREATE TABLE IF NOT EXISTS events(ts_ns INTEGER, attempt INTEGER, kind TEXT, node TEXT, "
        "rank INTEGER, "
        "detail_json TEXT);";
    if (sqlite3_exec(db->db_, schema, nullptr, nullptr, &err) != SQLITE_OK) {
      std::string msg = err ? err : "unknown error";
      sqlite3_free(err);
      return IoError("[control] " + path + ": " + msg);
    }
  }
  return db;
}

ControlDb::~ControlDb() { sqlite3_close(db_); }

Status ControlDb::Record(const Event& e) {
  Stmt st;
  if (sqlite3_prepare_v2(db_, "INSERT INTO events VALUES(?,?,?,?,?,?)", -1, &st.s, nullptr) !=
      SQLITE_OK) {
    return IoError("[control] " + path_ + ": " + sqlite3_errmsg(db_));
  }
  const std::string kind(Name(e.kind)), detail = e.detail.dump();
  sqlite3_bind_int64(st.s, 1, e.ts_ns);
  sqlite3_bind_int(st.s, 2, e.attempt);
  sqlite3_bind_text(st.s, 3, kind.c_str(), -1, SQLITE_TRANSIENT);
  if (e.node.empty())
    sqlite3_bind_null(st.s, 4);
  else
    sqlite3_bind_text(st.s, 4, e.node.c_str(), -1, SQLITE_TRANSIENT);
  if (e.rank < 0)
    sqlite3_bind_null(st.s, 5);
  else
    sqlite3_bind_int(st.s, 5, e.rank);
  sqlite3_bind_text(st.s, 6, detail.c_str(), -1, SQLITE_TRANSIENT);
  if (sqlite3_step(st.s) != SQLITE_DONE)
    return IoError("[control] " + path_ + ": " + sqlite3_errmsg(db_));
  return Status::Ok();
}

Result<std::vector<Event>> ControlDb::Events() {
  Stmt st;
  if (sqlite3_prepare_v2(
          db_,
          "SELECT ts_ns, attempt, kind, node, rank, detail_json FROM events ORDER BY ts_ns, rowid",
          -1, &st.s, nullptr) != SQLITE_OK) {
    return IoError("[control] " + path_ + ": " + sqlite3_errmsg(db_));
  }
  std::vector<Event> out;
  int rc;
  while ((rc = sqlite3_step(st.s)) == SQLITE_ROW) {
    Event e;
    e.ts_ns = sqlite3_column_int64(st.s, 0);
    e.attempt = sqlite3_column_int(st.s, 1);
    const auto* k = reinterpret_cast<const char*>(sqlite3_column_text(st.s, 2));
    e.kind_name = k ? k : "";
    e.kind = ParseEventKind(e.kind_name).value_or(EventKind::kTrigger);
    const auto* n = reinterpret_cast<const char*>(sqlite3_column_text(st.s, 3));
    e.node = n ? n : "";
    e.rank = sqlite3_column_type(st.s, 4) == SQLITE_NULL ? -1 : sqlite3_column_int(st.s, 4);
    const auto* d = reinterpret_cast<const char*>(sqlite3_column_text(st.s, 5));
    e.detail = nlohmann::json::parse(d ? d : "{}", nullptr, /*allow_exceptions=*/false);
    if (e.detail.is_discarded()) e.detail = nlohmann::json::object();
    out.push_back(std::move(e));
  }
  if (rc != SQLITE_DONE) return IoError("[control] " + path_ + ": " + sqlite3_errmsg(db_));
  return out;
}

Result<std::vector<std::pair<std::string, int64_t>>> ControlDb::CountBy(EventKind kind,
                                                                        const std::string& field) {
  ASSIGN_OR_RETURN(std::vector<Event> events, Events());
  std::vector<std::pair<std::string, int64_t>> out;
  for (const Event& e : events) {
    if (e.kind_name != Name(kind)) continue;
    const std::string v = e.detail.value(field, std::string("unknown"));
    auto it = std::find_if(out.begin(), out.end(), [&](const auto& p) { return p.first == v; });
    if (it == out.end())
      out.emplace_back(v, 1);
    else
      ++it->second;
  }
  return out;
}

}  // namespace megascope::controller
