// The `link` fault on a node with its own host (inject.h, launch::Host): the host's backend link
// really fails, by the kernel's own tools run inside the host's network namespace:
//   slow   tc: a token-bucket filter at the rate on both ends of the link (the host's eth0 and,
//          where the hosts file names it, the switch port facing the host), so TCP delivers at
//          about that rate in each direction
//   loss   nft: a table megascope_fault dropping that share of the packets in and out of the link
//          (numgen random), as a flapping optic or a congested, lossy fabric would
//   down   ip link set eth0 down: nothing crosses it
// Clear() undoes whichever is applied. scripts/testbed.sh up also clears every fault, so a crashed
// launch leaves none behind once the testbed is brought up again.
#pragma once

#include <string>

#include "megascope/controller/inject.h"
#include "megascope/launch/supervisor.h"
#include "megascope/tracer/status.h"

namespace megascope::controller {

inline constexpr const char* kBackendLink = "eth0";  // the host's backend interface (testbed.sh)

Status ApplyLinkFault(const launch::Host& host, LinkFaultKind kind, double rate_mbps,
                      double loss_pct);
Status ClearLinkFault(const launch::Host& host);

}  // namespace megascope::controller
