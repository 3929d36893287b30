// What the agents' computed answers (GET /window, GET /query) share: integer fields of a URL's
// query string, and a versioned JSON answer read back.
#pragma once

#include <charconv>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "megascope/tracer/status.h"

namespace megascope::analyzer::answer {

// The fields of a URL's query string ("a=1&b=2"), in order, as (key, value) as sent.
inline std::vector<std::pair<std::string_view, std::string_view>> Fields(std::string_view query) {
  std::vector<std::pair<std::string_view, std::string_view>> out;
  while (!query.empty()) {
    const size_t amp = query.find('&');
    const std::string_view pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    const size_t eq = pair.find('=');
    out.emplace_back(pair.substr(0, eq),
                     eq == std::string_view::npos ? std::string_view() : pair.substr(eq + 1));
  }
  return out;
}

// The body of an answer that is an error: {"error": message}.
inline std::string ErrorJson(const std::string& message) {
  return nlohmann::json{{"error", message}}.dump() + "\n";
}

// `key`'s value as an integer; the error names `what` ("window query") and the field.
inline Result<int64_t> Integer(std::string_view what, std::string_view key, std::string_view text) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size())
    return InvalidArgument(std::string(what) + ": " + std::string(key) + " is not an integer: '" +
                           std::string(text) + "'");
  return v;
}

// The JSON object of an answer to `path` ("/window") of format `version`: another version, or
// something that is not such an object, is an error saying so.
inline Result<nlohmann::json> ReadVersioned(std::string_view text, std::string_view path,
                                            int version) {
  const std::string what = "a " + std::string(path) + " answer";
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return DataLoss(what + " is not a JSON object");
  const auto v = j.find("version");
  if (v == j.end() || !v->is_number_integer()) return DataLoss(what + " has no version");
  if (*v != version)
    return InvalidArgument(what + " of format version " + v->dump() +
                           ", this megascope reads version " + std::to_string(version));
  return j;
}

}  // namespace megascope::analyzer::answer
