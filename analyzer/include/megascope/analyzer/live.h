// Live input for the analyzer: pulls /state and /dump/<rank> from running agents over HTTP.
#pragma once

#include <string>
#include <vector>

#include "megascope/analyzer/hang.h"

namespace megascope::analyzer {

// GET http://host:port/path (loopback or any address the caller gives); the body on 200.
Result<std::string> HttpGet(const std::string& url, int timeout_ms = 5000);

// Collects every rank's dump from the agents at `urls` (e.g. http://127.0.0.1:9100).
Result<HangInput> LoadFromAgents(const std::vector<std::string>& urls);

}  // namespace megascope::analyzer
