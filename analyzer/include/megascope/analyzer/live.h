// Live input for the analyzer: pulls /state and /dump/<rank> (or /stacks/<rank>) from running
// agents over HTTP
// (tracer/http_client.h).
#pragma once

#include <string>
#include <vector>

#include "megascope/analyzer/hang.h"

namespace megascope::analyzer {

// Collects every rank's dump from the agents at `urls` (e.g. http://127.0.0.1:9100); with
// `attempt` >= 0 only that attempt's ranks (an agent also remembers ranks of earlier attempts).
// `token`: the run's token, for agents that listen beyond loopback. With `stacks`, each live rank
// is asked for its own dump with every thread's stack (/stacks/<rank>; its ring's dump, without,
// when it does not answer).
Result<HangInput> LoadFromAgents(const std::vector<std::string>& urls, int attempt = -1,
                                 const std::string& token = "", bool stacks = false);

}  // namespace megascope::analyzer
