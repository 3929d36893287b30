#include "megascope/tracer/agent/agent_state.h"

#include <simdjson.h>

#include <algorithm>

namespace megascope::tracer::agent {

bool ReadAgentState(std::string_view body, const std::function<void(const RankBeat&)>& fn) {
  thread_local simdjson::dom::parser parser;
  simdjson::dom::element doc;
  if (parser.parse(body.data(), body.size()).get(doc) != simdjson::SUCCESS) return false;
  simdjson::dom::array ranks;
  if (doc["ranks"].get(ranks) != simdjson::SUCCESS) return false;
  for (simdjson::dom::element r : ranks) {
    RankBeat b;
    int64_t v = 0;
    if (r["rank"].get(v) == simdjson::SUCCESS) b.rank = static_cast<int>(v);
    if (r["attempt"].get(v) == simdjson::SUCCESS) b.attempt = static_cast<int>(v);
    if (r["heartbeat"]["step"].get(v) == simdjson::SUCCESS) b.step = v;
    simdjson::dom::array open;
    if (r["open_entries"].get(open) == simdjson::SUCCESS) {
      for (simdjson::dom::element e : open) {
        if (e["enqueued_at_ns"].get(v) == simdjson::SUCCESS)
          b.oldest_enqueued_ns = std::min(b.oldest_enqueued_ns, v);
      }
    }
    fn(b);
  }
  return true;
}

}  // namespace megascope::tracer::agent
