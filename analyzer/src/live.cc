#include "megascope/analyzer/live.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <set>

namespace megascope::analyzer {

Result<std::string> HttpGet(const std::string& url, int timeout_ms) {
  return HttpRequest("GET", url, {}, timeout_ms);
}

Result<std::string> HttpRequest(const std::string& method, const std::string& url,
                                const std::vector<std::string>& headers, int timeout_ms) {
  if (url.rfind("http://", 0) != 0)
    return InvalidArgument("only http:// URLs are supported: " + url);
  const std::string rest = url.substr(7);
  const auto slash = rest.find('/');
  const std::string hostport = rest.substr(0, slash),
                    path = slash == std::string::npos ? "/" : rest.substr(slash);
  const auto colon = hostport.rfind(':');
  const std::string host = hostport.substr(0, colon),
                    port = colon == std::string::npos ? "80" : hostport.substr(colon + 1);
  addrinfo hints{}, *res = nullptr;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0 || res == nullptr) {
    return Status(StatusCode::kUnavailable, "cannot resolve " + hostport);
  }
  int fd = ::socket(res->ai_family, res->ai_socktype, res->ai_protocol);
  const int rc = fd < 0 ? -1 : ::connect(fd, res->ai_addr, res->ai_addrlen);
  freeaddrinfo(res);
  if (rc != 0) {
    if (fd >= 0) ::close(fd);
    return Status(StatusCode::kUnavailable,
                  "cannot connect to " + hostport + " (is the agent running?)");
  }
  std::string req = method + " " + path + " HTTP/1.1\r\nHost: " + hostport +
                    "\r\nConnection: close\r\nContent-Length: 0\r\n";
  for (const std::string& h : headers) req += h + "\r\n";
  req += "\r\n";
  if (::write(fd, req.data(), req.size()) < 0) {
    ::close(fd);
    return Status(StatusCode::kUnavailable, "cannot send to " + hostport);
  }
  std::string resp;
  char buf[8192];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) <= 0) {
      ::close(fd);
      return Status(StatusCode::kDeadlineExceeded,
                    url + " did not answer within " + std::to_string(timeout_ms) + " ms");
    }
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    resp.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  const auto head_end = resp.find("\r\n\r\n");
  if (head_end == std::string::npos || resp.rfind("HTTP/1.", 0) != 0)
    return DataLoss(url + ": not an HTTP response");
  const int code = std::atoi(resp.c_str() + 9);
  if (code != 200) {
    std::string body = resp.substr(head_end + 4);
    while (!body.empty() && (body.back() == '\n' || body.back() == '\r')) body.pop_back();
    const std::string msg =
        url + " answered HTTP " + std::to_string(code) + (body.empty() ? "" : ": " + body);
    return code == 403 ? PermissionDenied(msg) : NotFound(msg);
  }
  return resp.substr(head_end + 4);
}

Result<HangInput> LoadFromAgents(const std::vector<std::string>& urls, int attempt) {
  std::vector<std::pair<std::string, tracer::Dump>> dumps;
  for (std::string url : urls) {
    while (!url.empty() && url.back() == '/') url.pop_back();
    ASSIGN_OR_RETURN(std::string state, HttpGet(url + "/state"));
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(state);
    } catch (const std::exception& e) {
      return DataLoss(url + "/state is not JSON: " + e.what());
    }
    std::set<int> seen;
    for (const auto& r : j.value("ranks", nlohmann::json::array())) {
      const int rank = r["rank"];
      if (attempt >= 0 && r.value("attempt", -1) != attempt) continue;
      if (!seen.insert(rank).second) continue;
      const std::string src = url + "/dump/" + std::to_string(rank);
      ASSIGN_OR_RETURN(std::string body, HttpGet(src));
      ASSIGN_OR_RETURN(tracer::Dump d, tracer::ParseDump(body, src));
      dumps.emplace_back(src, std::move(d));
    }
  }
  return MakeHangInput(std::move(dumps));
}

}  // namespace megascope::analyzer
