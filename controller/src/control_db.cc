#include "megascope/controller/control_db.h"

#include <unistd.h>

#include <algorithm>
#include <array>

#include "megascope/tracer/enum_names.h"

namespace megascope::controller {
namespace {

// In enum order (control_db.h).
constexpr std::array<std::string_view, 15> kKindNames = {
    "fault_injected",  "trigger", "verdict",          "stopped",           "eviction",
    "self_check",      "restart", "checkpoint_saved", "checkpoint_loaded", "resumed",
    "agent_restarted", "paused",  "job_finished",     "decision",          "slurm_steps"};
constexpr std::array<std::string_view, 5> kCauseNames = {"crash", "hang", "manual", "detector",
                                                         "straggler"};

}  // namespace

std::string_view Name(EventKind kind) { return tracer::NameFrom(kKindNames, kind); }

std::string_view Name(TriggerCause cause) { return tracer::NameFrom(kCauseNames, cause); }

std::optional<EventKind> ParseEventKind(std::string_view name) {
  return tracer::ParseFrom<EventKind>(kKindNames, name);
}

Result<std::unique_ptr<ControlDb>> ControlDb::Open(const std::string& path, bool read_only) {
  using Mode = tracer::sql::Database::Mode;
  if (read_only && ::access(path.c_str(), R_OK) != 0)
    return NotFound(path + " does not exist (was the run started with 'megascope launch'?)");
  std::unique_ptr<ControlDb> db(new ControlDb());
  ASSIGN_OR_RETURN(db->db_, tracer::sql::Database::Open(
                                path, read_only ? Mode::kReadOnly : Mode::kReadWrite, "[control]"));
  if (read_only) {  // a corrupt or foreign file is said as such, not as a query's error
    if (!db->db_.Prepare("SELECT COUNT(*) FROM events").ok()) {
      return DataLoss(path + " is not a readable megascope control database (" +
                      db->db_.LastMessage() + ")");
    }
  } else {
    RETURN_IF_ERROR(db->db_.Exec(
        "PRAGMA journal_mode=WAL;"
        "CREATE TABLE IF NOT EXISTS events(ts_ns INTEGER, attempt INTEGER, kind TEXT, node TEXT, "
        "rank INTEGER, detail_json TEXT);"));
  }
  return db;
}

Status ControlDb::Record(const Event& e) {
  ASSIGN_OR_RETURN(tracer::sql::Statement st,
                   db_.Prepare("INSERT INTO events VALUES(?,?,?,?,?,?)"));
  const std::string detail = e.detail.dump();
  st.Bind(1, e.ts_ns).Bind(2, e.attempt).Bind(3, Name(e.kind));
  if (e.node.empty())
    st.BindNull(4);
  else
    st.Bind(4, e.node);
  if (e.rank < 0)
    st.BindNull(5);
  else
    st.Bind(5, e.rank);
  st.Bind(6, detail);
  return st.Run();
}

Result<std::vector<Event>> ControlDb::Events() {
  ASSIGN_OR_RETURN(tracer::sql::Statement st,
                   db_.Prepare("SELECT ts_ns, attempt, kind, node, rank, detail_json FROM events "
                               "ORDER BY ts_ns, rowid"));
  std::vector<Event> out;
  for (;;) {
    ASSIGN_OR_RETURN(bool row, st.Step());
    if (!row) break;
    Event e;
    e.ts_ns = st.Int(0);
    e.attempt = static_cast<int>(st.Int(1));
    e.kind_name = std::string(st.Text(2));
    e.kind = ParseEventKind(e.kind_name).value_or(EventKind::kTrigger);
    e.node = std::string(st.Text(3));
    e.rank = st.IsNull(4) ? -1 : static_cast<int>(st.Int(4));
    const std::string_view d = st.Text(5);
    e.detail = nlohmann::json::parse(d.empty() ? std::string_view("{}") : d, nullptr,
                                     /*allow_exceptions=*/false);
    if (e.detail.is_discarded()) e.detail = nlohmann::json::object();
    out.push_back(std::move(e));
  }
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

int64_t VerdictId(const nlohmann::json& verdict) {
  return verdict.value("detected_at_ns", int64_t{0});
}

std::set<int64_t> ActedOnVerdicts(const std::vector<Event>& events) {
  std::set<int64_t> out;
  for (const Event& e : events) {
    const std::optional<EventKind> k = ParseEventKind(e.kind_name);
    const bool acts = k == EventKind::kEviction ||
                      (k == EventKind::kDecision && e.detail.value("action", "") != "alert");
    if (acts && e.detail.contains("verdict")) out.insert(VerdictId(e.detail["verdict"]));
  }
  return out;
}

}  // namespace megascope::controller
