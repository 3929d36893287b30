#include "megascope/tracer/http_serve.h"

#include <arpa/inet.h>
#include <civetweb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace megascope::tracer {
namespace {

thread_local std::string start_errors;

int KeepLogMessage(const mg_connection*, const char* message) {
  if (message != nullptr) {
    if (!start_errors.empty()) start_errors += "; ";
    start_errors += message;
  }
  return 1;  // kept: civetweb prints nothing itself
}

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

void StopServerPromptly(std::string ip, int port, const std::function<void()>& stop) {
  if (ip.empty() || ip == "0.0.0.0" || ip == "localhost") ip = "127.0.0.1";
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  if (port <= 0 || ::inet_pton(AF_INET, ip.c_str(), &to.sin_addr) != 1) {
    stop();
    return;
  }
  std::atomic<bool> stopped{false};
  std::thread knocker([&] {
    while (!stopped.load()) {
      const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd >= 0) {
        (void)::connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof(to));
        ::close(fd);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  stop();
  stopped.store(true);
  knocker.join();
}

void KeepStartErrors(mg_callbacks* callbacks) {
  start_errors.clear();
  callbacks->log_message = KeepLogMessage;
}

std::string StartError() {
  std::string e = std::move(start_errors);
  start_errors.clear();
  return e.empty() ? e : " (civetweb: " + e + ")";
}

}  // namespace megascope::tracer
