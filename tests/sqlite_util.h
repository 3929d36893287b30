// Reading an SQLite file from a test through the tree's one SQLite layer (tracer/sqlite.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "megascope/tracer/sqlite.h"

namespace megascope::testing {

// The first row of `sql` over the database at `path`, opened read-only, as integers; empty when
// the file, the statement or the row is missing.
inline std::vector<int64_t> FirstRow(const std::string& path, const std::string& sql) {
  using tracer::sql::Database;
  auto db = Database::Open(path, Database::Mode::kReadOnly);
  if (!db.ok()) return {};
  auto st = db->Prepare(sql);
  if (!st.ok() || !st->Step().value_or(false)) return {};
  std::vector<int64_t> row;
  for (int c = 0; c < st->columns(); ++c) row.push_back(st->Int(c));
  return row;
}

}  // namespace megascope::testing
