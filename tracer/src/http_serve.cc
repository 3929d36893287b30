#include "megascope/tracer/http_serve.h"

#include <civetweb.h>

namespace megascope::tracer {
namespace {

const char* Reason(int code) {
  switch (code) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 503:
      return "Service Unavailable";
    default:
      return code < 400 ? "OK" : "Error";
  }
}

}  // namespace

void HttpReply(mg_connection* conn, int code, std::string_view type, std::string_view body) {
  mg_printf(conn,
            "HTTP/1.1 %d %s\r\nContent-Type: %.*s\r\nContent-Length: %zu\r\nConnection: "
            "close\r\n\r\n",
            code, Reason(code), static_cast<int>(type.size()), type.data(), body.size());
  mg_write(conn, body.data(), body.size());
}

bool HttpAuthorized(const mg_connection* conn, const std::string& token) {
  if (token.empty()) return true;
  const char* auth = mg_get_header(conn, "Authorization");
  return auth != nullptr && std::string_view(auth) == "Bearer " + token;
}

}  // namespace megascope::tracer
