// The answers of megascope's HTTP servers (the agent's endpoints, the controller's control
// endpoint), over civetweb: one response framing and one token check for both.
#pragma once

#include <functional>
#include <string>
#include <string_view>

struct mg_connection;
struct mg_callbacks;

namespace megascope::tracer {

// A whole response: status line, Content-Type, Content-Length, "Connection: close", the body.
void HttpReply(mg_connection* conn, int code, std::string_view type, std::string_view body);

// Whether the request may be served: an empty `token` admits every request; otherwise it must
// carry "Authorization: Bearer <token>" (the run's RUN_DIR/control.token).
bool HttpAuthorized(const mg_connection* conn, const std::string& token);

// Runs `stop` (a civetweb server's close) promptly. civetweb's stop waits for its master thread,
// which polls the listening socket with a 2-s timeout: every agent and controller took up to 2 s
// to exit. A connection wakes that poll, so one is made to `ip`:`port` (the server's listening
// address; 0.0.0.0 is reached on 127.0.0.1) every few milliseconds until `stop` returns. An address
// that is not IPv4 is left to the timeout.
void StopServerPromptly(std::string ip, int port, const std::function<void()>& stop);

// civetweb says why a server did not start only through its log callback (its C++ constructor
// throws "null context ... Possible problem binding to port" whatever the cause): this sets
// `callbacks`' log_message to keep the messages of the calling thread, and StartError() returns
// (and forgets) them, to add to the error. Use both on the thread that constructs the server.
void KeepStartErrors(mg_callbacks* callbacks);
std::string StartError();

}  // namespace megascope::tracer
