#include "net_fault.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <tuple>
#include <vector>

#include "megascope/launch/process.h"
#include "megascope/tracer/format.h"

namespace megascope::controller {
namespace {

// Runs `argv` inside the host's network namespace (or `netns`); errors carry the tool's message.
Status Run(const launch::Host& host, std::vector<std::string> argv, bool must_succeed = true,
           const std::string& netns = "") {
  auto out = launch::RunTool(std::move(argv), netns.empty() ? host.netns : netns);
  if (!out.ok() && (must_succeed || out.status().code() != StatusCode::kInternal))
    return out.status().WithContext("on " + host.name);
  return Status::Ok();
}

std::string Kbit(double rate_mbps) {  // MB/s -> tc's kbit
  return std::to_string(static_cast<long long>(rate_mbps * 8000)) + "kbit";
}

}  // namespace

namespace {

Status Apply(const launch::Host& host, LinkFaultKind kind, double rate_mbps, double loss_pct) {
  const std::string dev = kBackendLink;
  switch (kind) {
    case LinkFaultKind::kSlow: {
      const std::string rate = Kbit(rate_mbps);
      // Bursts of ~10 ms at the rate (at least 16 KB): shaped, not stalled.
      const std::string burst =
          std::to_string(static_cast<long long>(std::max(16000.0, rate_mbps * 1e6 / 100)));
      // Out of the host on its own end of the link; into it on the switch's end (shaping the
      // switch port's egress needs no ingress policer, which not every kernel has).
      RETURN_IF_ERROR(Run(host, {"tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate,
                                 "burst", burst, "latency", "200ms"}));
      if (host.switch_port.empty()) return Status::Ok();
      return Run(host,
                 {"tc", "qdisc", "replace", "dev", host.switch_port, "root", "tbf", "rate", rate,
                  "burst", burst, "latency", "200ms"},
                 true, host.switch_netns);
    }
    case LinkFaultKind::kLoss: {
      std::string share = tracer::Format("%d", static_cast<int>(loss_pct * 100));  // of 10,000
      RETURN_IF_ERROR(Run(host, {"nft", "add", "table", "inet", "megascope_fault"}));
      for (const auto& [chain, hook, dir] :
           {std::tuple<const char*, const char*, const char*>{"out", "output", "oifname"},
            {"in", "input", "iifname"}}) {
        RETURN_IF_ERROR(Run(host, {"nft", "add", "chain", "inet", "megascope_fault", chain, "{",
                                   "type", "filter", "hook", hook, "priority", "0", ";", "}"}));
        std::vector<std::string> rule = {"nft", "add", "rule", "inet", "megascope_fault",
                                         chain, dir,   dev};
        if (loss_pct < 100) {
          for (const char* w : {"numgen", "random", "mod", "10000", "<"}) rule.emplace_back(w);
          rule.emplace_back(share);
        }
        rule.emplace_back("drop");
        RETURN_IF_ERROR(Run(host, rule));
      }
      return Status::Ok();
    }
    case LinkFaultKind::kDown:
      return Run(host, {"ip", "link", "set", dev, "down"});
  }
  return InvalidArgument("unknown link fault");
}

}  // namespace

Status ApplyLinkFault(const launch::Host& host, LinkFaultKind kind, double rate_mbps,
                      double loss_pct) {
  if (host.netns.empty())
    return FailedPrecondition("node " + host.name + " has no host of its own: no real link");
  RETURN_IF_ERROR(ClearLinkFault(host));
  Status st = Apply(host, kind, rate_mbps, loss_pct);
  if (!st.ok()) (void)ClearLinkFault(host);  // nothing half-applied stays
  return st;
}

Status ClearLinkFault(const launch::Host& host) {
  if (host.netns.empty()) return Status::Ok();
  const std::string dev = kBackendLink;
  // What is not there to remove is fine: only the final state matters.
  RETURN_IF_ERROR(Run(host, {"tc", "qdisc", "del", "dev", dev, "root"}, false));
  if (!host.switch_port.empty()) {
    RETURN_IF_ERROR(Run(host, {"tc", "qdisc", "del", "dev", host.switch_port, "root"}, false,
                        host.switch_netns));
  }
  if (launch::FindTool("nft").ok())
    RETURN_IF_ERROR(Run(host, {"nft", "delete", "table", "inet", "megascope_fault"}, false));
  return Run(host, {"ip", "link", "set", dev, "up"});
}

}  // namespace megascope::controller
