// The tree's one HTTP client (libcurl): the analyzer's live input, the controller's scrapes and
// control commands, the tests. Every request has a timeout (connect and whole transfer), ignores
// proxy variables (agents and the controller are reached directly), and returns the body on
// HTTP 200, otherwise an error with the status code and the server's reason.
#pragma once

#include <string>
#include <vector>

#include "megascope/tracer/status.h"

namespace megascope::tracer {

// METHOD http://host:port/path with extra header lines ("Name: value"). Errors: kUnavailable
// (cannot connect), kDeadlineExceeded (no answer in time), kPermissionDenied (403), kNotFound
// (404), kUnavailable (any other status).
Result<std::string> HttpRequest(const std::string& method, const std::string& url,
                                const std::vector<std::string>& headers = {},
                                int timeout_ms = 5000);
// GET http://host:port/path; the body on 200. With `token`, sends "Authorization: Bearer <token>"
// (agents that listen beyond loopback require the run's token).
Result<std::string> HttpGet(const std::string& url, int timeout_ms = 5000,
                            const std::string& token = "");

}  // namespace megascope::tracer
