// The online loop's records and public API (controller.h); its steps are in loop/ (loop/impl.h).
#include "megascope/controller/controller.h"

#include <cstdio>

#include "loop/control_endpoint.h"
#include "loop/impl.h"
#include "megascope/tracer/clickhouse.h"
#include "megascope/tracer/file_util.h"
#include "megascope/tracer/http_client.h"
#include "megascope/tracer/http_serve.h"
#include "net_fault.h"

namespace megascope::controller {

bool Controller::Impl::HasOwnHost(const std::string& node) const {
  const launch::Host* h = fleet->HostOf(node);
  return h != nullptr && !h->netns.empty();
}

// Undoes every real link fault still applied (at the end of the launch).
void Controller::Impl::ClearNetFaults() {
  for (const auto& [node, until] : net_faults) {
    if (Status st = ClearLinkFault(*fleet->HostOf(node)); !st.ok())
      Log("cannot clear the link fault on " + node + ": " + st.ToString());
  }
  net_faults.clear();
}

Controller::Impl::Impl(ControllerOptions o, std::unique_ptr<Fleet> f, LoopClock& c)
    : opt(std::move(o)),
      fleet(f ? std::move(f) : MakeSupervisorFleet(opt.supervisor)),
      clock(c),
      layout(opt.supervisor.run_dir),
      progress(layout.progress()),
      disk(layout.dir(), opt.min_free_bytes, opt.free_space) {
  launch_start = clock.Now();
  if (opt.detector_tick_s > 0) {
    detector::DetectorConfig dc;
    dc.tick_s = opt.detector_tick_s;
    dc.warmup_ticks = opt.detector_warmup_ticks;
    dc.min_peers = opt.detector_min_peers;
    online = std::make_unique<OnlineDetector>(dc);
  }
}

double Controller::Impl::Since(Clock::time_point t) {
  return std::chrono::duration<double>(clock.Now() - t).count();
}

void Controller::Impl::Log(const std::string& line) {
  std::printf("[launch] %s\n", line.c_str());
  std::fflush(stdout);
}

void Controller::Impl::Record(EventKind kind, const std::string& node, int rank, json detail,
                              int64_t ts_ns) {
  Event e;
  e.ts_ns = ts_ns ? ts_ns : clock.WallNs();
  e.attempt = attempt;
  e.kind = kind;
  e.node = node;
  e.rank = rank;
  e.detail = std::move(detail);
  unrecorded.push_back(std::move(e));
  FlushRecords();
}

// Writes the events kept in memory, in order. One that cannot be written (a full disk) stays,
// with every later one, for the next try, and tells the disk guard; false then.
bool Controller::Impl::FlushRecords() {
  while (!unrecorded.empty()) {
    if (Status st = db->Record(unrecorded.front()); !st.ok()) {
      if (!record_failing) {
        Log("cannot record in control.db: " + st.ToString() +
            " (the events stay in memory and are written when it can be)");
      }
      record_failing = true;
      disk.NoteFailedWrite(st.message());
      return false;
    }
    unrecorded.pop_front();
  }
  if (record_failing) Log("control.db is written again, with the events kept meanwhile");
  record_failing = false;
  return true;
}

Controller::Impl::~Impl() {
  if (!http) return;
  const std::vector<int> ports = http->getListeningPorts();
  tracer::StopServerPromptly(opt.allow_remote ? "0.0.0.0" : "127.0.0.1",
                             ports.empty() ? 0 : ports[0], [this] { http.reset(); });
}

Controller::Controller(ControllerOptions options, std::unique_ptr<Fleet> fleet, LoopClock* clock)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(fleet),
                                   clock ? *clock : RealLoopClock())) {
  if (!impl_->opt.store.empty()) {
    if (auto url = tracer::StoreUrl::Parse(impl_->opt.store); url.ok())
      impl_->stragglers.UseStore(*url, impl_->opt.supervisor.job);
  }
}
Controller::~Controller() = default;
int Controller::Run() { return impl_->Run(); }

Status SendControlCommand(const std::string& run_dir, const std::string& command,
                          const std::string& node) {
  RunLayout layout(run_dir);
  auto token = tracer::ReadToken(layout.token());
  if (!token.ok()) {
    return PermissionDenied(token.status().message() +
                            " (control actions need it: run as the user who started the launch)");
  }
  json where = json::parse(tracer::ReadFile(layout.controller_json()).value_or(""), nullptr, false);
  if (where.is_discarded() || !where.contains("url")) {
    return NotFound("no controller is listed in " + layout.controller_json() +
                    " (is 'megascope launch' running there?)");
  }
  const std::string url =
      where["url"].get<std::string>() + "/" + command + (node.empty() ? "" : "?node=" + node);
  auto r = tracer::HttpRequest("POST", url, {"Authorization: Bearer " + *token}, 5000);
  if (!r.ok()) return r.status();
  return Status::Ok();
}

}  // namespace megascope::controller
