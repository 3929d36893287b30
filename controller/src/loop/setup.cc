// The loop's setup: the run directory, its token and control endpoint, the fault seams of the
// nodes, and adopting an unfinished run (impl.h).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <optional>

#include "control_endpoint.h"
#include "impl.h"
#include "megascope/launch/link_seam.h"
#include "megascope/tracer/file_util.h"

namespace megascope::controller {
namespace {

std::string RandomToken() {
  std::ifstream in("/dev/urandom", std::ios::binary);
  unsigned char b[24];
  in.read(reinterpret_cast<char*>(b), sizeof(b));
  static const char* kHex = "0123456789abcdef";
  std::string t;
  for (unsigned char c : b) {
    t += kHex[c >> 4];
    t += kHex[c & 15];
  }
  return t;
}

}  // namespace

Status Controller::Impl::Setup() {
  std::error_code ec;
  fs::create_directories(layout.dir(), ec);
  if (std::string why; disk.Short(&why)) {
    return FailedPrecondition(why + ": a job must not start where its checkpoints and records " +
                              "cannot be kept (free space, or lower --min-free-mb)");
  }
  ASSIGN_OR_RETURN(db, ControlDb::Open(layout.control_db()));
  progress.SkipExisting();  // an earlier launch's lines are history, not this launch's progress
  active = opt.nodes;
  spares.assign(opt.spares.begin(), opt.spares.end());
  RETURN_IF_ERROR(AdoptEarlierRun());
  if (!finished_before.empty()) return Status::Ok();  // nothing to start: no token, no endpoint
  const std::string token = RandomToken();
  if (!opt.supervisor.agent_token_file.empty()) agent_token = token;
  {
    const std::string tmp = layout.token() + ".tmp";
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return ErrnoError("cannot write " + tmp, errno);
    const std::string line = token + "\n";
    const bool ok = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
    ::close(fd);
    if (!ok) return IoError("cannot write " + tmp);
    fs::rename(tmp, layout.token(), ec);
    if (ec) return IoError("cannot write " + layout.token() + ": " + ec.message());
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    nodes_known = opt.nodes;  // until the first tick
  }
  handler = std::make_unique<ControlHandler>(token, &mu, &commands, &nodes_known);
  const std::vector<std::string> civet = {
      "listening_ports", (opt.allow_remote ? "0.0.0.0:0" : "127.0.0.1:0"), "num_threads", "2"};
  try {
    CivetCallbacks callbacks;
    tracer::KeepStartErrors(&callbacks);
    http = std::make_unique<CivetServer>(civet, &callbacks);
  } catch (const std::exception& e) {
    return Status(StatusCode::kUnavailable, std::string("cannot start the control endpoint: ") +
                                                e.what() + tracer::StartError());
  }
  http->addHandler("/stop", handler.get());
  http->addHandler("/evict", handler.get());
  const int port = http->getListeningPorts().at(0);
  RETURN_IF_ERROR(tracer::WriteFileAtomic(
      layout.controller_json(),
      json{{"url", "http://127.0.0.1:" + std::to_string(port)}, {"pid", ::getpid()}}.dump() +
          "\n"));
  for (const Injection& in : opt.injections) {
    if (in.kind == FaultKind::kDegrade) {
      fleet->AddNodeEnv(in.node, "MEGASCOPE_INJECT_SLOWDOWN", std::to_string(in.factor));
      Record(EventKind::kFaultInjected, in.node, -1,
             {{"kind", Name(in.kind)}, {"spec", in.spec}, {"factor", in.factor}});
    } else if (in.kind == FaultKind::kMetric && !proc_faults.count(in.node)) {
      // The node's agent samples a /proc of its own from the start; the metric fails when the
      // injection fires.
      auto f = std::make_unique<ProcFault>(layout.dir() + "/inject/proc_" + in.node, in.what,
                                           in.seconds);
      RETURN_IF_ERROR(f->Start());
      fleet->AddNodeEnv(in.node, "MEGASCOPE_PROC_ROOT", f->dir());
      proc_faults[in.node] = std::move(f);
    } else if (in.kind == FaultKind::kLink && !HasOwnHost(in.node) && !link_seams.count(in.node)) {
      // Every process of the node obeys the seam file from the start; it is healthy until the
      // injection fires. (A node on a host of its own gets a real fault instead: net_fault.h.)
      const std::string path = layout.dir() + "/inject/link_" + in.node;
      std::error_code ec;
      fs::create_directories(layout.dir() + "/inject", ec);
      RETURN_IF_ERROR(launch::WriteLinkFault(path, {}));
      fleet->AddNodeEnv(in.node, launch::kLinkSeamEnv, path);
      link_seams[in.node] = path;
    }
  }
  return Status::Ok();
}

// A run directory holds the record of every launch in it. When the last one did not finish
// (its controller was killed, a person stopped it, it paused), this launch adopts it: attempt
// numbers go on after its last (trace rows and rendezvous stay apart), its evictions stand (the
// nodes it evicted stay out, the spares it took in stay in) and the first attempt resumes from
// its newest state (the memory snapshots it left, else a disk checkpoint). Otherwise state in
// memory under this job name is an earlier launch's and is dropped.
Status Controller::Impl::AdoptEarlierRun() {
  ASSIGN_OR_RETURN(std::vector<Event> events, db->Events());
  std::vector<std::string> nodes, gone;
  std::optional<Event> finished;  // the last launch's job_finished, when it finished
  for (const Event& e : events) {
    attempt = std::max(attempt, e.attempt + 1);
    if (e.kind == EventKind::kRestart && e.detail.contains("nodes")) {
      nodes = e.detail["nodes"].get<std::vector<std::string>>();
      finished.reset();
    } else if (e.kind == EventKind::kEviction && !e.node.empty()) {
      gone.push_back(e.node);
    } else if (e.kind == EventKind::kJobFinished) {
      if (e.detail.value("status", "") == "finished")
        finished = e;
      else
        finished.reset();
    }
  }
  if (finished && !opt.new_run) {
    // A relaunch of a finished run (a script run twice, a scheduler's retry) trains nothing and
    // appends nothing: the run's record stays as it ended.
    const auto steps = finished->detail.value("steps", int64_t{0});
    finished_before = "the run in " + layout.dir() + " is finished (" + std::to_string(steps) +
                      " steps, attempt " + std::to_string(finished->attempt) +
                      "): nothing to train. To train it again as a new run in this directory, "
                      "add --new-run (its attempts go on from " +
                      std::to_string(attempt) + "); or use a new run directory";
    return Status::Ok();
  }
  std::error_code ec;
  if (events.empty() || finished || nodes.empty()) {
    fs::remove_all(MemoryRoot(opt.supervisor.shm_dir, opt.supervisor.job), ec);
    if (finished)
      Log("the run directory holds a finished run; as asked (--new-run), this launch starts a new "
          "run at attempt " +
          std::to_string(attempt));
    else if (!events.empty())
      Log("the run directory's last launch never started an attempt: this launch starts at "
          "attempt " +
          std::to_string(attempt));
    return Status::Ok();
  }
  std::set<std::string> known(opt.nodes.begin(), opt.nodes.end());
  known.insert(opt.spares.begin(), opt.spares.end());
  if (nodes.size() != opt.nodes.size() ||
      !std::all_of(nodes.begin(), nodes.end(),
                   [&](const std::string& n) { return known.count(n) > 0; })) {
    return FailedPrecondition("the run directory's last launch (attempt " +
                              std::to_string(attempt - 1) + ") ran on " + Join(nodes) +
                              ", which this launch's --nodes/--spares do not cover: " +
                              "relaunch with the same node options, or use a new run directory");
  }
  active = nodes;
  spares.clear();
  for (const std::string& n : opt.spares) {
    if (std::find(active.begin(), active.end(), n) == active.end() &&
        std::find(gone.begin(), gone.end(), n) == gone.end())
      spares.push_back(n);
  }
  for (const std::string& n : gone) {
    if (std::find(active.begin(), active.end(), n) == active.end()) evicted[n] = clock.Now();
  }
  adopted = true;
  Log("adopting the unfinished run in " + layout.dir() + ": attempt " + std::to_string(attempt) +
      " on " + Join(active) + (gone.empty() ? "" : " (evicted before: " + Join(gone) + ")") +
      ", resuming from its newest state");
  return Status::Ok();
}

std::vector<std::string> Controller::Impl::MemoryDirs() const {
  std::vector<std::string> memory;
  for (const std::string& n : active)
    memory.push_back(NodeMemoryDir(opt.supervisor.shm_dir, opt.supervisor.job, n));
  return memory;
}

}  // namespace megascope::controller
