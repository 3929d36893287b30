// The tree's one HTTP client (libcurl): the analyzer's live input, the controller's scrapes and
// control commands, the tests. Every request has a timeout (connect and whole transfer), ignores
// proxy variables (agents and the controller are reached directly), and returns the body on
// HTTP 200, otherwise an error with the status code and the server's reason.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "megascope/tracer/status.h"

namespace megascope::tracer {

// METHOD http://host:port/path with extra header lines ("Name: value"). Errors: kUnavailable
// (cannot connect), kDeadlineExceeded (no answer in time), kPermissionDenied (403), kNotFound
// (404), kUnavailable (any other status).
// With `sink`, a 200 answer's body is handed to it piece by piece as it arrives (and the result is
// empty); an error from the sink stops the transfer and is returned.
using BodySink = std::function<Status(std::string_view data)>;
Result<std::string> HttpRequest(const std::string& method, const std::string& url,
                                const std::vector<std::string>& headers = {}, int timeout_ms = 5000,
                                const BodySink& sink = nullptr);
// POST `body` to http://host:port/path (errors as HttpRequest's; a 500's body is the server's
// message).
Result<std::string> HttpPost(const std::string& url, std::string_view body,
                             const std::vector<std::string>& headers = {}, int timeout_ms = 5000);
// GET http://host:port/path; the body on 200. With `token`, sends "Authorization: Bearer <token>"
// (agents that listen beyond loopback require the run's token).
// RFC 3986 percent-encoding: every byte but letters, digits and -_.~ as %XX.
std::string PercentEncode(std::string_view s);
// Its inverse; `plus_is_space`: a query string's '+' reads as a space. A '%' not followed by two
// hex digits stays as it is.
std::string PercentDecode(std::string_view s, bool plus_is_space = false);

Result<std::string> HttpGet(const std::string& url, int timeout_ms = 5000,
                            const std::string& token = "");
// GET, handing a 200 answer's body to `sink` piece by piece as it arrives (the whole body is
// never held: an agent's /dumps answer is every rank's dump). An error from `sink` stops it.
Status HttpGetStream(const std::string& url, int timeout_ms, const std::string& token,
                     const BodySink& sink);

}  // namespace megascope::tracer
