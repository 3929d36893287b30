// The answers of megascope's HTTP servers (the agent's endpoints, the controller's control
// endpoint), over civetweb: one response framing and one token check for both.
#pragma once

#include <string>
#include <string_view>

struct mg_connection;

namespace megascope::tracer {

// A whole response: status line, Content-Type, Content-Length, "Connection: close", the body.
void HttpReply(mg_connection* conn, int code, std::string_view type, std::string_view body);

// Whether the request may be served: an empty `token` admits every request; otherwise it must
// carry "Authorization: Bearer <token>" (the run's RUN_DIR/control.token).
bool HttpAuthorized(const mg_connection* conn, const std::string& token);

}  // namespace megascope::tracer
