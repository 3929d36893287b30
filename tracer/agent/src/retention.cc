#include <limits>

#include "agent_impl.h"

namespace megascope::tracer::agent {

int64_t Agent::Impl::RetainIfDue() {
  if (opt.retain_hours <= 0) return 0;
  const LoopClock::TimePoint now = clock.Now();
  if (last_prune && now - *last_prune < std::chrono::duration<double>(opt.retain_every_s)) return 0;
  last_prune = now;
  const int64_t wall = clock.WallNs();
  const auto window_ns = static_cast<int64_t>(opt.retain_hours * 3600e9);
  const int64_t rollups_before = opt.retain_rollup_hours > 0
                                     ? wall - static_cast<int64_t>(opt.retain_rollup_hours * 3600e9)
                                     : std::numeric_limits<int64_t>::min();
  auto dropped = store->Prune(wall - window_ns, rollups_before);
  if (!dropped.ok()) {
    Log(opt.node, "retention: " + dropped.status().message() + " (tried again later)");
    return 0;
  }
  return *dropped;
}

void Agent::Impl::DiscoverIfDue() {
  const LoopClock::TimePoint now = clock.Now();
  if (last_discovery && now - *last_discovery <= std::chrono::milliseconds(500) && !ranks.empty())
    return;
  last_discovery = now;
  Discover();
}

}  // namespace megascope::tracer::agent
