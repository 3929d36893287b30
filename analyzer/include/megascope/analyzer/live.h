// Live input for the analyzer: pulls /state and /dump/<rank> from running agents over HTTP.
#pragma once

#include <string>
#include <vector>

#include "megascope/analyzer/hang.h"

namespace megascope::analyzer {

// METHOD http://host:port/path with extra header lines ("Name: value"); the body on 200, else an
// error carrying the status code and the body (the server's reason).
Result<std::string> HttpRequest(const std::string& method, const std::string& url,
                                const std::vector<std::string>& headers = {},
                                int timeout_ms = 5000);
// GET http://host:port/path (loopback or any address the caller gives); the body on 200.
Result<std::string> HttpGet(const std::string& url, int timeout_ms = 5000);

// Collects every rank's dump from the agents at `urls` (e.g. http://127.0.0.1:9100); with
// `attempt` >= 0 only that attempt's ranks (an agent also remembers ranks of earlier attempts).
Result<HangInput> LoadFromAgents(const std::vector<std::string>& urls, int attempt = -1);

}  // namespace megascope::analyzer
