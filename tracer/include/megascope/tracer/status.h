// Errors as values: Status (a code and a message) and Result<T> (a value or a Status), with
// RETURN_IF_ERROR / ASSIGN_OR_RETURN macros. Every module boundary in megascope returns these;
// exceptions from third-party code are caught at the boundary and turned into a Status.
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace megascope {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,
  kNotFound,
  kAlreadyExists,
  kPermissionDenied,
  kFailedPrecondition,
  kDataLoss,
  kUnavailable,
  kDeadlineExceeded,
  kAborted,
  kIoError,
  kInternal,
};

const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return {}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "<CodeName>: <message>", or "OK".
  std::string ToString() const;
  // Returns a copy whose message is "<context>: <message>" (adds context as an error travels up).
  Status WithContext(const std::string& context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) {
  return {StatusCode::kInvalidArgument, std::move(m)};
}
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status AlreadyExists(std::string m) { return {StatusCode::kAlreadyExists, std::move(m)}; }
inline Status PermissionDenied(std::string m) {
  return {StatusCode::kPermissionDenied, std::move(m)};
}
inline Status FailedPrecondition(std::string m) {
  return {StatusCode::kFailedPrecondition, std::move(m)};
}
inline Status DataLoss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status IoError(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
// An IoError whose message ends with strerror(err).
Status ErrnoError(const std::string& what, int err);

// Holds either a T or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}         // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {}  // NOLINT(google-explicit-constructor)

  bool ok() const { return std::holds_alternative<T>(v_); }
  Status status() const { return ok() ? Status::Ok() : std::get<Status>(v_); }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  // The value, or `fallback` when there is none (for reads where absence is an answer).
  T value_or(T fallback) const& { return ok() ? value() : std::move(fallback); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace megascope

#define MEGASCOPE_CONCAT_INNER(a, b) a##b
#define MEGASCOPE_CONCAT(a, b) MEGASCOPE_CONCAT_INNER(a, b)

#define RETURN_IF_ERROR(expr)         \
  do {                                \
    ::megascope::Status _st = (expr); \
    if (!_st.ok()) return _st;        \
  } while (0)

#define ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                          \
  if (!tmp.ok()) return tmp.status();         \
  lhs = std::move(tmp).value()

#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL(MEGASCOPE_CONCAT(_result_, __LINE__), lhs, expr)
