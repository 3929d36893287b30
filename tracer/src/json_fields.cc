#include "megascope/tracer/json_fields.h"

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>

namespace megascope::tracer {

Status JsonFields::Bad(const char* key, const std::string& what) const {
  return InvalidArgument(where_ + ": field '" + key + "' " + what);
}

Result<const JsonFields::json*> JsonFields::Get(const char* key, json::value_t type,
                                                bool nullable) const {
  if (!obj_.is_object()) return InvalidArgument(where_ + ": should be an object");
  auto it = obj_.find(key);
  if (it == obj_.end()) return InvalidArgument(where_ + ": missing field '" + key + "'");
  if (nullable && it->is_null()) return &*it;
  const bool integer =
      type == json::value_t::number_integer || type == json::value_t::number_unsigned;
  const bool number = type == json::value_t::number_float;
  const bool ok = integer  ? it->is_number_integer()  // signed or unsigned
                  : number ? it->is_number()
                           : it->type() == type;
  if (!ok) return Bad(key, "should be " + TypeName(type) + ", not " + it->type_name());
  return &*it;
}

Result<int64_t> JsonFields::Int(const char* key) const {
  ASSIGN_OR_RETURN(const json* v, Get(key, json::value_t::number_integer));
  if (v->is_number_unsigned() &&
      v->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    return Bad(key, "is out of range");
  return v->get<int64_t>();
}

Result<int64_t> JsonFields::IntIn(const char* key, int64_t lo, int64_t hi) const {
  ASSIGN_OR_RETURN(int64_t v, Int(key));
  if (v < lo || v > hi)
    return Bad(key, "is " + std::to_string(v) + ", outside [" + std::to_string(lo) + ", " +
                        std::to_string(hi) + "]");
  return v;
}

Result<int64_t> JsonFields::IntOrNull(const char* key, int64_t null_value) const {
  ASSIGN_OR_RETURN(const json* v, Get(key, json::value_t::number_integer, true));
  if (v->is_null()) return null_value;
  return Int(key);
}

Result<double> JsonFields::Number(const char* key, bool as_float) const {
  ASSIGN_OR_RETURN(const json* v, Get(key, json::value_t::number_float));
  const double d = v->get<double>();
  if (!std::isfinite(d) || (as_float && std::fabs(d) > FLT_MAX)) return Bad(key, "is out of range");
  return d;
}

Result<std::string> JsonFields::Str(const char* key) const {
  ASSIGN_OR_RETURN(const json* v, Get(key, json::value_t::string));
  return v->get<std::string>();
}

Result<bool> JsonFields::Bool(const char* key) const {
  ASSIGN_OR_RETURN(const json* v, Get(key, json::value_t::boolean));
  return v->get<bool>();
}

Result<JsonFields> JsonFields::Sub(const char* key) const {
  ASSIGN_OR_RETURN(const json* v, Object(key));
  return JsonFields(*v, where_ + ": " + key);
}

std::string JsonFields::TypeName(json::value_t t) {
  switch (t) {
    case json::value_t::string:
      return "a string";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return "an integer";
    case json::value_t::number_float:
      return "a number";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::object:
      return "an object";
    case json::value_t::array:
      return "an array";
    default:
      return "something else";
  }
}

}  // namespace megascope::tracer
