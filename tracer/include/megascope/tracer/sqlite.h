// The one SQLite layer of the tree: a database handle and a prepared statement as RAII values,
// binding by position, typed columns, and every SQLite error turned into a Status that names the
// file and what was being done. trace.db (its writer and the read-only run view), control.db and
// the tests all go through it.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "megascope/tracer/status.h"

struct sqlite3;
struct sqlite3_stmt;

namespace megascope::tracer::sql {

class Database;

// A prepared statement. Text bound with Bind(string_view) must outlive the next Step/Run; a
// statement must not outlive its database.
class Statement {
 public:
  Statement() = default;
  Statement(Statement&& o) noexcept;
  Statement& operator=(Statement&& o) noexcept;
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;
  ~Statement();

  // Parameters are 1-based, as in SQLite.
  Statement& Bind(int i, int64_t v);
  Statement& Bind(int i, int v) { return Bind(i, static_cast<int64_t>(v)); }
  Statement& Bind(int i, double v);
  Statement& Bind(int i, std::string_view v);
  Statement& Bind(int i, const char* v) { return Bind(i, std::string_view(v)); }
  Statement& BindNull(int i);
  // One step: true when a row is ready, false when done; an error otherwise.
  Result<bool> Step();
  // Steps to the end (for writes) and resets for the next use.
  Status Run();
  void Reset();

  // Columns of the current row (0-based).
  int64_t Int(int c) const;
  double Double(int c) const;
  std::string_view Text(int c) const;  // "" for NULL
  bool IsNull(int c) const;
  int columns() const;
  std::string ColumnName(int c) const;
  bool read_only() const;
  bool valid() const { return st_ != nullptr; }

 private:
  friend class Database;
  explicit Statement(sqlite3_stmt* st) : st_(st) {}
  Status Error(std::string_view what) const;
  sqlite3_stmt* st_ = nullptr;
};

class Database {
 public:
  enum class Mode {
    kReadOnly,   // the file must exist
    kReadWrite,  // created when missing (0600: traces and events name hosts and jobs)
    kMemory,     // a private in-memory database (path ignored)
  };
  // `label` prefixes every error message ("[store]", "[control]").
  static Result<Database> Open(const std::string& path, Mode mode, const std::string& label = "",
                               int busy_timeout_ms = 5000);
  Database() = default;
  Database(Database&& o) noexcept;
  Database& operator=(Database&& o) noexcept;
  Database(const Database&) = delete;
  Database& operator=(const Database&) = delete;
  ~Database();

  // One or more statements, no results.
  Status Exec(std::string_view sql);
  // `persistent`: kept for the life of the database (a hint to SQLite). `tail`, when given,
  // receives what follows the first statement.
  Result<Statement> Prepare(std::string_view sql, bool persistent = false,
                            std::string_view* tail = nullptr) const;
  // The first column of the first row of `sql` as an integer (0 when there is no row).
  Result<int64_t> QueryInt(std::string_view sql) const;
  // How many databases one connection can ATTACH.
  int attach_limit() const;
  // From now on every statement that would write (or attach, or change a setting) fails to
  // prepare with "not authorized": for connections that serve untrusted queries.
  void DenyWrites();
  // Statements still running at `deadline` stop (SQLite's progress handler; their step fails and
  // stopped() says why): for connections that serve queries from others.
  void StopAt(std::chrono::steady_clock::time_point deadline);
  bool stopped() const { return stop_ != nullptr && stop_->hit; }
  // "<label> <what> on <path>: <SQLite's message>".
  Status Error(std::string_view what) const;
  std::string LastMessage() const;
  const std::string& path() const { return path_; }

 private:
  struct Stop {
    std::chrono::steady_clock::time_point deadline;
    bool hit = false;
  };
  sqlite3* db_ = nullptr;
  std::string path_, label_;
  std::unique_ptr<Stop> stop_;  // where the progress handler looks (kept in place across moves)
};

}  // namespace megascope::tracer::sql
