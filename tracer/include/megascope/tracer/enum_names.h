// An enum's docs/formats.md spellings as one table indexed by its value: Name and Parse from the
// same table, so the two never disagree. Values past the table are `past` ("unknown" unless the
// format says otherwise). The tree's one way to spell an enum.
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <string_view>

namespace megascope::tracer {

template <typename E, size_t N>
std::string_view NameFrom(const std::array<std::string_view, N>& names, E e,
                          std::string_view past = "unknown") {
  const auto i = static_cast<size_t>(e);
  return i < N ? names[i] : past;
}

template <typename E, size_t N>
std::optional<E> ParseFrom(const std::array<std::string_view, N>& names, std::string_view s) {
  for (size_t i = 0; i < N; ++i) {
    if (names[i] == s) return static_cast<E>(i);
  }
  return std::nullopt;
}

}  // namespace megascope::tracer
