// Reading JSON that came from a file: every field by name and type, with errors that say where
// (file, object, field) and what was expected. Numbers are range-checked before they are
// converted (a float into an integer field, or 1e300 into a float, is an error, never undefined
// behaviour). The readers of docs/formats.md files (dumps, run.json) go through it.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "megascope/tracer/status.h"

namespace megascope::tracer {

class JsonFields {
 public:
  using json = nlohmann::json;
  // `where` names the object in errors ("run.json: layout").
  JsonFields(const json& obj, std::string where) : obj_(obj), where_(std::move(where)) {}

  // The field, checked to be of `type` (integers of either signedness count as integers).
  Result<const json*> Get(const char* key, json::value_t type, bool nullable = false) const;
  bool Has(const char* key) const { return obj_.is_object() && obj_.contains(key); }
  Result<int64_t> Int(const char* key) const;
  // An integer in [lo, hi].
  Result<int64_t> IntIn(const char* key, int64_t lo, int64_t hi) const;
  // `null_value` for null.
  Result<int64_t> IntOrNull(const char* key, int64_t null_value) const;
  // Any finite number; with `as_float`, also within float's range.
  Result<double> Number(const char* key, bool as_float = false) const;
  Result<std::string> Str(const char* key) const;
  Result<bool> Bool(const char* key) const;
  // A nested object or array, and the JsonFields of an object.
  Result<const json*> Object(const char* key) const { return Get(key, json::value_t::object); }
  Result<const json*> Array(const char* key) const { return Get(key, json::value_t::array); }
  Result<JsonFields> Sub(const char* key) const;
  const std::string& where() const { return where_; }

 private:
  static std::string TypeName(json::value_t t);
  Status Bad(const char* key, const std::string& what) const;
  const json& obj_;
  std::string where_;
};

}  // namespace megascope::tracer
