// A run directory short of space: the job waits with its state in memory; and what the run could
// not keep, said at its end.
#include <algorithm>
#include <cstdio>

#include "impl.h"
#include "megascope/tracer/file_util.h"

namespace megascope::controller {

// Takes a stop request out of the control queue (other commands wait for the job to run).
bool Controller::Impl::StopRequested() {
  std::lock_guard<std::mutex> lock(mu);
  auto it = std::find_if(commands.begin(), commands.end(),
                         [](const Command& c) { return c.what == "stop"; });
  if (it == commands.end()) return false;
  commands.erase(it);
  return true;
}

// The run directory is short of space: the ranks stop (their newest state stays in the memory
// snapshots, which are not on that disk), nothing is judged or evicted, and once space is back
// and control.db takes its events again, training resumes in place from that state. A pause
// for space waits as long as it must. The launch's exit code when it ends here (a person
// stopped it, or the restart paused), else nullopt.
std::optional<int> Controller::Impl::WaitForSpace(const std::string& why) {
  Log("PAUSED: " + why);
  Log("the ranks stop now and keep their newest state in memory; training resumes by itself "
      "once space is back ('megascope stop --run-dir " +
      layout.dir() + "' ends it)");
  incident_start_ns = clock.WallNs();
  Record(EventKind::kPaused, "", -1,
         {{"reason", why}, {"cause", "disk_full"}, {"resumes_by_itself", true}});
  fleet->StopRanks();
  PumpProgress();  // the steps done before the stop
  const int64_t lost = last_step_done;
  const auto tick = std::chrono::duration<double>(opt.tick_s);
  for (std::string still;;) {
    if (!disk.Short(&still) && FlushRecords()) break;
    clock.Sleep(tick);
    if (g_interrupted || StopRequested()) {
      Log(std::string(g_interrupted ? "interrupted" : "stop requested") +
          " while paused for space: stopping");
      return kLaunchStopped;
    }
  }
  auto free = opt.free_space(layout.dir());
  Log("space is back" + (free.ok() ? " (" + FormatMegabytes(*free) + " free)" : std::string()) +
      ": resuming");
  if (!Restart("disk_full", lost)) return kLaunchPaused;
  return std::nullopt;
}

// What the run could not keep: lines missing from the progress stream, events not in control.db,
// files not written. Empty: nothing was lost.
std::string Controller::Impl::LostRecords() {
  std::vector<std::string> lost;
  const int64_t lines = progress.damaged() + (progress.unterminated() > 0 ? 1 : 0);
  if (lines > 0 || missing_steps > 0) {
    lost.push_back(layout.progress() + ": " + std::to_string(missing_steps) + " step line(s) " +
                   "missing, " + std::to_string(lines) + " damaged");
  }
  if (!unrecorded.empty())
    lost.push_back(layout.control_db() + ": " + std::to_string(unrecorded.size()) + " event(s)");
  for (const std::string& f : unwritten) lost.push_back(f);
  std::string s;
  for (const std::string& l : lost) s += (s.empty() ? "" : "; ") + l;
  return s;
}

// Writes one of the launch's own files; a failure is said and counted as lost.
void Controller::Impl::WriteOwnFile(const std::string& path, const Result<std::string>& text,
                                    const std::string& said) {
  Status st = text.ok() ? tracer::WriteFileAtomic(path, *text) : text.status();
  if (st.ok()) {
    Log(said);
    return;
  }
  Log("cannot write " + path + ": " + st.ToString());
  unwritten.push_back(path);
}

}  // namespace megascope::controller
