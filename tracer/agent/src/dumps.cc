#include <signal.h>

#include <cerrno>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "agent_impl.h"
#include "megascope/tracer/file_util.h"
#include "megascope/tracer/run_layout.h"

namespace megascope::tracer::agent {

Result<const Agent::Impl::RankState*> Agent::Impl::Latest(int rank) const {
  const RankState* best = nullptr;
  for (const auto& [name, st] : ranks) {
    if (st.info.rank == rank && (best == nullptr || st.info.attempt > best->info.attempt))
      best = &st;
  }
  if (best == nullptr)
    return NotFound("rank " + std::to_string(rank) + " is not on node " + opt.node);
  return best;
}

Result<std::string> Agent::Impl::RankDump(int rank) {
  std::lock_guard<std::mutex> lock(mu);
  ASSIGN_OR_RETURN(const RankState* best, Latest(rank));
  return DumpToJson(Dump{best->reader->Snapshot(),
                         !best->dead && best->reader->WriterAlive(),
                         clock.WallNs(),
                         {},
                         {}});
}

void Agent::Impl::AllDumps(int attempt, bool binary,
                           const std::function<void(std::string_view)>& sink) {
  std::vector<std::string> chosen;  // ring names, by rank
  {
    std::lock_guard<std::mutex> lock(mu);
    std::map<int, decltype(ranks)::const_iterator> best;
    for (auto r = ranks.cbegin(); r != ranks.cend(); ++r) {
      if (attempt >= 0 && r->second.info.attempt != attempt) continue;
      auto [it, fresh] = best.emplace(r->second.info.rank, r);
      if (!fresh && r->second.info.attempt > it->second->second.info.attempt) it->second = r;
    }
    chosen.reserve(best.size());
    for (const auto& [rank, r] : best) chosen.push_back(r->first);
  }
  std::string out;  // one buffer for every rank's
  if (binary) {
    AppendDumpStreamHeader(&out);
    sink(out);
  }
  const int64_t now = clock.WallNs();
  for (const std::string& ring : chosen) {
    Dump d;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = ranks.find(ring);
      if (it == ranks.end()) continue;  // its ring went away meanwhile
      d = Dump{it->second.reader->Snapshot(),
               !it->second.dead && it->second.reader->WriterAlive(),
               now,
               {},
               {}};
    }
    out.clear();
    if (binary)
      AppendDumpFrame(d, &out);
    else
      AppendDumpJson(d, &out, /*one_line=*/true);
    sink(out);
  }
}

Result<std::string> Agent::Impl::RankStacks(int rank, std::chrono::milliseconds wait) {
  int pid = 0;
  std::string path;
  {
    std::lock_guard<std::mutex> lock(mu);
    ASSIGN_OR_RETURN(const RankState* best, Latest(rank));
    if (best->dead || !best->reader->WriterAlive())
      return FailedPrecondition("rank " + std::to_string(rank) + " is gone: no stacks to take");
    pid = best->info.pid;
    path = RunLayout(opt.run_dir).dump(best->info.attempt, rank);
  }
  const int64_t asked = WallNowNs();  // the rank stamps its dump with the real clock
  if (::kill(pid, SIGUSR1) != 0)
    return ErrnoError("cannot signal rank " + std::to_string(rank), errno);
  const auto deadline = std::chrono::steady_clock::now() + wait;
  while (std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    auto text = ReadFile(path);  // written atomically by the rank
    if (!text.ok()) continue;
    auto d = ParseDump(*text, path);
    if (d.ok() && d->dumped_at_ns >= asked && !d->stacks.empty()) return *text;
  }
  return Status(StatusCode::kUnavailable, "rank " + std::to_string(rank) + " (pid " +
                                              std::to_string(pid) + ") wrote no dump within " +
                                              std::to_string(wait.count()) + " ms");
}

}  // namespace megascope::tracer::agent
