// The tree's one ClickHouse client, over ClickHouse's HTTP interface (port 8123) through the HTTP
// client (libcurl). The SQL it is given must run on ClickHouse 18.16 (Debian's) and on current
// releases alike (docs/formats.md section 4b says what that rules out). Rows go in and come out as
// TabSeparated text: NULL is \N, and tab, newline and backslash are escaped.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "megascope/tracer/status.h"

namespace megascope::tracer {

// Where the store is: clickhouse://[USER[:PASSWORD]@]HOST[:PORT][/DATABASE][?cluster=NAME]
// (port 8123, database "megascope" by default). With a cluster, each table is a MergeTree table
// `<name>_local` on every shard under a `Distributed` table `<name>` over them.
struct StoreUrl {
  std::string host;
  int port = 8123;
  std::string database = "megascope";
  std::string user, password;
  std::string cluster;
  // Parses the URL; errors name what is wrong with it.
  static Result<StoreUrl> Parse(std::string_view url);
  // The URL without its password (for logs and errors).
  std::string Redacted() const;
  std::string HttpBase() const;  // http://HOST:PORT/
};

// What a SELECT returned: column names and ClickHouse types, and the rows as text (`null` marks
// NULL cells).
struct StoreRows {
  std::vector<std::string> names, types;
  std::vector<std::vector<std::string>> rows;
  std::vector<std::vector<bool>> null;
};

// One cell of a TabSeparated row, escaped; AppendTsvNull for NULL.
void AppendTsv(std::string& out, std::string_view text);
inline void AppendTsvNull(std::string& out) { out += "\\N"; }

class ClickHouse {
 public:
  explicit ClickHouse(StoreUrl url, int timeout_ms = 10000);
  // A statement that returns nothing (CREATE, ALTER, DROP) in the URL's database. Errors:
  // kUnavailable (cannot connect, or the server failed), kDeadlineExceeded, kPermissionDenied
  // (wrong user or password), kNotFound (no such database or table), kInvalidArgument (the server
  // refused the SQL); each says the store's URL (without password) and the server's message.
  // `in_database`: false runs it in the server's default database (CREATE DATABASE).
  Status Exec(std::string_view sql, bool in_database = true);
  // INSERT INTO `table` (`columns`) FORMAT TabSeparated, `rows` one per line. One INSERT of rows
  // of one partition is atomic in a MergeTree table: all of them are stored, or none.
  Status Insert(std::string_view table, std::string_view columns, std::string_view rows);
  // A SELECT, with its column names and types; `settings` are ClickHouse settings for it
  // ("name=value&name=value").
  Result<StoreRows> Select(std::string_view sql, std::string_view settings = "");
  // The first cell of the first row of a SELECT ("" when there is none).
  Result<std::string> Scalar(std::string_view sql);
  const StoreUrl& url() const { return url_; }
  // A table name qualified by the database (`db`.`name`).
  std::string Table(std::string_view name) const;

 private:
  Result<std::string> Post(std::string_view query_param, std::string_view body,
                           std::string_view settings);
  StoreUrl url_;
  int timeout_ms_;
};

}  // namespace megascope::tracer
