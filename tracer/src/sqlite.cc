#include "megascope/tracer/sqlite.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <unistd.h>

#include <utility>

namespace megascope::tracer::sql {

Statement::Statement(Statement&& o) noexcept : st_(std::exchange(o.st_, nullptr)) {}

Statement& Statement::operator=(Statement&& o) noexcept {
  if (this != &o) {
    sqlite3_finalize(st_);
    st_ = std::exchange(o.st_, nullptr);
  }
  return *this;
}

Statement::~Statement() { sqlite3_finalize(st_); }

Statement& Statement::Bind(int i, int64_t v) {
  sqlite3_bind_int64(st_, i, v);
  return *this;
}
Statement& Statement::Bind(int i, double v) {
  sqlite3_bind_double(st_, i, v);
  return *this;
}
Statement& Statement::Bind(int i, std::string_view v) {
  // A non-null pointer even for "": SQLite binds NULL for a null pointer.
  sqlite3_bind_text(st_, i, v.empty() ? "" : v.data(), static_cast<int>(v.size()), SQLITE_STATIC);
  return *this;
}
Statement& Statement::BindNull(int i) {
  sqlite3_bind_null(st_, i);
  return *this;
}

Result<bool> Statement::Step() {
  const int rc = sqlite3_step(st_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  return Error("a statement failed");
}

Status Statement::Run() {
  const int rc = sqlite3_step(st_);
  Status st = rc == SQLITE_DONE || rc == SQLITE_ROW ? Status::Ok() : Error("a write failed");
  sqlite3_reset(st_);
  return st;
}

void Statement::Reset() { sqlite3_reset(st_); }

Status Statement::Error(std::string_view what) const {
  sqlite3* db = sqlite3_db_handle(st_);
  const char* file = sqlite3_db_filename(db, "main");
  return IoError(std::string(what) + " on " + (file && *file ? file : ":memory:") + ": " +
                 sqlite3_errmsg(db));
}

int64_t Statement::Int(int c) const { return sqlite3_column_int64(st_, c); }
double Statement::Double(int c) const { return sqlite3_column_double(st_, c); }
std::string_view Statement::Text(int c) const {
  const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(st_, c));
  return p == nullptr ? std::string_view()
                      : std::string_view(p, static_cast<size_t>(sqlite3_column_bytes(st_, c)));
}
bool Statement::IsNull(int c) const { return sqlite3_column_type(st_, c) == SQLITE_NULL; }
int Statement::columns() const { return sqlite3_column_count(st_); }
std::string Statement::ColumnName(int c) const {
  const char* n = sqlite3_column_name(st_, c);
  return n ? n : "";
}
bool Statement::read_only() const { return sqlite3_stmt_readonly(st_) != 0; }

Result<Database> Database::Open(const std::string& path, Mode mode, const std::string& label,
                                int busy_timeout_ms) {
  Database db;
  db.label_ = label.empty() ? "" : label + " ";
  db.path_ = mode == Mode::kMemory ? ":memory:" : path;
  int flags = SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_URI;
  switch (mode) {
    case Mode::kReadOnly:
      if (::access(path.c_str(), R_OK) != 0)
        return NotFound(db.label_ + path + " does not exist or cannot be read");
      flags |= SQLITE_OPEN_READONLY;
      break;
    case Mode::kReadWrite:
      if (const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600); fd >= 0)
        ::close(fd);
      flags |= SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE;
      break;
    case Mode::kMemory:
      flags |= SQLITE_OPEN_READWRITE | SQLITE_OPEN_MEMORY;
      break;
  }
  if (sqlite3_open_v2(db.path_.c_str(), &db.db_, flags, nullptr) != SQLITE_OK)
    return db.Error("cannot open");
  sqlite3_busy_timeout(db.db_, busy_timeout_ms);
  return db;
}

Database::Database(Database&& o) noexcept
    : db_(std::exchange(o.db_, nullptr)),
      path_(std::move(o.path_)),
      label_(std::move(o.label_)),
      stop_(std::move(o.stop_)) {}

Database& Database::operator=(Database&& o) noexcept {
  if (this != &o) {
    sqlite3_close(db_);
    db_ = std::exchange(o.db_, nullptr);
    path_ = std::move(o.path_);
    label_ = std::move(o.label_);
    stop_ = std::move(o.stop_);
  }
  return *this;
}

Database::~Database() { sqlite3_close(db_); }

Status Database::Exec(std::string_view sql) {
  char* err = nullptr;
  const std::string text(sql);
  if (sqlite3_exec(db_, text.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
    const std::string msg = err ? err : LastMessage();
    sqlite3_free(err);
    return IoError(label_ + path_ + ": " + msg);
  }
  return Status::Ok();
}

Result<Statement> Database::Prepare(std::string_view sql, bool persistent,
                                    std::string_view* tail) const {
  sqlite3_stmt* st = nullptr;
  const char* rest = nullptr;
  if (sqlite3_prepare_v3(db_, sql.data(), static_cast<int>(sql.size()),
                         persistent ? SQLITE_PREPARE_PERSISTENT : 0, &st, &rest) != SQLITE_OK) {
    sqlite3_finalize(st);
    return InvalidArgument(label_ + "bad SQL on " + path_ + ": " + LastMessage());
  }
  if (tail != nullptr)
    *tail =
        rest == nullptr ? std::string_view() : sql.substr(static_cast<size_t>(rest - sql.data()));
  if (st == nullptr) return InvalidArgument(label_ + "empty SQL");
  return Statement(st);
}

Result<int64_t> Database::QueryInt(std::string_view sql) const {
  ASSIGN_OR_RETURN(Statement st, Prepare(sql));
  ASSIGN_OR_RETURN(bool row, st.Step());
  return row ? st.Int(0) : 0;
}

int Database::attach_limit() const { return sqlite3_limit(db_, SQLITE_LIMIT_ATTACHED, -1); }

namespace {
int ReadOnlyAuthorizer(void*, int action, const char*, const char*, const char*, const char*) {
  switch (action) {
    case SQLITE_SELECT:
    case SQLITE_READ:
    case SQLITE_FUNCTION:
    case SQLITE_RECURSIVE:
      return SQLITE_OK;
    default:
      return SQLITE_DENY;
  }
}
}  // namespace

void Database::StopAt(std::chrono::steady_clock::time_point deadline) {
  stop_ = std::make_unique<Stop>(Stop{deadline, false});
  // Every 10,000 virtual-machine instructions: well under a millisecond.
  sqlite3_progress_handler(
      db_, 10000,
      [](void* p) {
        auto* stop = static_cast<Stop*>(p);
        stop->hit = std::chrono::steady_clock::now() >= stop->deadline;
        return stop->hit ? 1 : 0;
      },
      stop_.get());
}

void Database::DenyWrites() { sqlite3_set_authorizer(db_, &ReadOnlyAuthorizer, nullptr); }

std::string Database::LastMessage() const {
  return db_ == nullptr ? "out of memory" : sqlite3_errmsg(db_);
}

Status Database::Error(std::string_view what) const {
  return IoError(label_ + std::string(what) + " on " + path_ + ": " + LastMessage());
}

}  // namespace megascope::tracer::sql
