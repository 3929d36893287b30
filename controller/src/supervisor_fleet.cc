// The real fleet: launch::Supervisor's processes, the agents' HTTP endpoints and `megascope
// self-check` pairs (fleet.h).
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <vector>

#include "megascope/analyzer/live.h"
#include "megascope/controller/fleet.h"
#include "megascope/tracer/clock.h"
#include "megascope/tracer/file_util.h"
#include "megascope/tracer/http_client.h"
#include "megascope/tracer/parallel.h"

namespace megascope::controller {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// The self-check's rendezvous and collective timeout; a pair gets three of them in all (a rank
// whose link is dead can block in connect() past its own rendezvous timeout).
constexpr int kSelfCheckTimeoutMs = 10000;

class SupervisorFleet final : public Fleet {
 public:
  explicit SupervisorFleet(const launch::SupervisorOptions& options) : sup_(options) {}

  Result<int> StartAgent(const std::string& node) override { return sup_.StartAgent(node); }
  std::optional<int> AgentPort(const std::string& node) const override {
    return sup_.AgentPort(node);
  }
  void StopAgent(const std::string& node, bool wait) override { sup_.StopAgent(node, wait); }
  void StopAgents() override { sup_.StopAgents(); }
  std::vector<launch::AgentExit> PollAgents() override { return sup_.PollAgents(); }
  bool SignalAgent(const std::string& node, int sig) override {
    return sup_.SignalAgent(node, sig);
  }
  Result<std::string> AgentGet(const std::string& node, const std::string& path, int timeout_ms,
                               const std::string& token) override {
    const std::string url = sup_.AgentUrl(node);
    if (url.empty()) return NotFound(node + " has no agent running");
    return tracer::HttpGet(url + path, timeout_ms, token);
  }
  std::vector<Result<std::string>> AgentGetAll(const std::vector<std::string>& nodes,
                                               const std::string& path, int timeout_ms,
                                               const std::string& token) override {
    std::vector<std::string> urls;  // read here: the supervisor is driven by this thread only
    urls.reserve(nodes.size());
    for (const std::string& n : nodes) urls.push_back(sup_.AgentUrl(n));
    return AskAgents(nodes, urls, path, timeout_ms, token);
  }
  Result<analyzer::HangInput> LiveHangInput(const std::vector<std::string>& nodes, int attempt,
                                            const std::string& token) override {
    std::vector<std::string> urls;
    for (const std::string& n : nodes) {
      if (std::string url = sup_.AgentUrl(n); !url.empty()) urls.push_back(std::move(url));
    }
    return analyzer::LoadFromAgents(urls, attempt, token);
  }

  Status StartRanks(const launch::AttemptPlan& plan, int world) override {
    return sup_.StartRanks(plan.attempt, plan.nodes, world);  // the ranks read run.json
  }
  std::vector<launch::RankExit> PollRanks() override { return sup_.PollRanks(); }
  launch::RankExit FindOrigin(const std::vector<launch::RankExit>& failures,
                              std::chrono::milliseconds window,
                              std::vector<launch::RankExit>* others) override {
    return sup_.FindOrigin(failures, window, others);
  }
  std::vector<int> CollectDumps(std::chrono::milliseconds timeout) override {
    return sup_.CollectDumps(timeout);
  }
  void StopRanks() override { sup_.StopRanks(); }
  bool SignalRank(int rank, int sig) override { return sup_.SignalRank(rank, sig); }
  std::string NodeOfRank(int rank) const override { return sup_.NodeOfRank(rank); }

  std::vector<std::pair<SelfCheckFigures, SelfCheckFigures>> SelfCheckPairs(
      const std::vector<std::pair<std::string, std::string>>& pairs,
      double min_allreduce_gbps) override {
    std::vector<PairCheck> running;
    running.reserve(pairs.size());
    for (const auto& [a, b] : pairs) running.push_back(StartPair(a, b, min_allreduce_gbps));
    std::vector<std::pair<SelfCheckFigures, SelfCheckFigures>> out;
    out.reserve(running.size());
    for (PairCheck& c : running) out.push_back(FinishPair(c));
    return out;
  }

  void AddNodeEnv(const std::string& node, const std::string& key,
                  const std::string& value) override {
    auto env = sup_.NodeEnv(node);
    env.emplace_back(key, value);
    sup_.SetNodeEnv(node, env);
  }
  const launch::Host* HostOf(const std::string& node) const override { return sup_.HostOf(node); }

 private:
  // A self-check pair in flight: its two processes, and the one deadline for both.
  struct PairCheck {
    std::vector<std::unique_ptr<launch::Process>> procs;
    Clock::time_point deadline;
    std::string error;  // the pair could not start
  };
  PairCheck StartPair(const std::string& a, const std::string& b, double min_gbps) {
    const std::string dir = sup_.layout().self_check_dir("check_" + std::to_string(checks_++));
    std::error_code ec;
    fs::remove_all(dir, ec);
    fs::create_directories(dir + "/store", ec);
    PairCheck c;
    const std::string nodes[2] = {a, b};
    for (int r = 0; r < 2; ++r) {
      auto p = launch::Process::Spawn(sup_.NodeProcess(
          nodes[r], "self-check",
          {sup_.options().self_exe, "self-check", "--dir", dir + "/store", "--rank",
           std::to_string(r), "--timeout", std::to_string(kSelfCheckTimeoutMs), "--min-gbps",
           std::to_string(min_gbps)},
          dir + "/rank_" + std::to_string(r) + ".log"));
      if (!p.ok()) {
        c.error = p.status().ToString();
        return c;
      }
      c.procs.push_back(std::move(p).value());
    }
    c.deadline = Clock::now() + std::chrono::milliseconds(3 * kSelfCheckTimeoutMs);
    return c;
  }
  // Waits for a pair; the figures of its first and second node. Once one side has failed the
  // other is stopped: it waits for a partner that is gone (a dead link fails at once on one end
  // while the other waits out its timeout: 15 s of a link fault's recovery), and its figures
  // would not be used.
  static std::pair<SelfCheckFigures, SelfCheckFigures> FinishPair(PairCheck& c) {
    std::pair<SelfCheckFigures, SelfCheckFigures> out;
    if (!c.error.empty()) {
      out.first.error = c.error;
      out.second.error = c.error;
      return out;
    }
    std::vector<std::optional<launch::ExitStatus>> ends(c.procs.size());
    bool failed = false, all = false;
    while (!all && !failed && Clock::now() < c.deadline) {
      all = true;
      for (size_t r = 0; r < c.procs.size(); ++r) {
        if (!ends[r]) ends[r] = c.procs[r]->WaitFor(std::chrono::milliseconds(0));
        all = all && ends[r].has_value();
        failed = failed || (ends[r] && !ends[r]->success());
      }
      if (!all && !failed) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::string first_error;  // of the end that failed
    for (size_t r = 0; r < c.procs.size(); ++r) {
      if (ends[r] && !ends[r]->success())
        first_error = ReadSelfCheckLog(tracer::ReadFile(c.procs[r]->log_path()).value_or(""),
                                       "self-check " + ends[r]->Describe())
                          .error;
    }
    for (size_t r = 0; r < c.procs.size(); ++r) {
      SelfCheckFigures& f = r == 0 ? out.first : out.second;
      std::string ended;
      if (!ends[r]) {
        c.procs[r]->Stop(std::chrono::milliseconds(0));
        ended = failed ? "stopped: its partner's self-check failed (" + first_error + ")"
                       : "self-check did not finish in " +
                             std::to_string(3 * kSelfCheckTimeoutMs / 1000) + " s";
      } else if (!ends[r]->success()) {
        ended = "self-check " + ends[r]->Describe();
      }
      f = ReadSelfCheckLog(tracer::ReadFile(c.procs[r]->log_path()).value_or(""), ended);
    }
    return out;
  }

  launch::Supervisor sup_;
  int checks_ = 0;
};

}  // namespace

SelfCheckFigures ReadSelfCheckLog(const std::string& text, const std::string& ended) {
  SelfCheckFigures f;
  const auto brace = text.rfind('{');
  const auto j =
      nlohmann::json::parse(brace == std::string::npos ? "" : text.substr(brace), nullptr, false);
  if (ended.empty() && !j.is_discarded() && j.contains("allreduce_gbps")) {
    f.ok = true;
    f.gemm_gflops = j.value("gemm_gflops", 0.0);
    f.allreduce_gbps = j.value("allreduce_gbps", 0.0);
    return f;
  }
  std::string said = text;
  if (text.starts_with('{')) {  // the GEMM's line, then what ended the check
    const size_t eol = std::min(text.find('\n'), text.size());
    const auto gemm = nlohmann::json::parse(text.substr(0, eol), nullptr, false);
    if (!gemm.is_discarded() && gemm.value("gemm_gflops", 0.0) > 0)
      f.gemm_gflops = gemm.value("gemm_gflops", 0.0);
    said = text.substr(std::min(eol + 1, text.size()));
  }
  while (!said.empty() && (said.back() == '\n' || said.back() == ' ')) said.pop_back();
  f.error = (ended.empty() ? std::string("self-check gave no figures") : ended) +
            (said.empty() ? "" : ": " + said.substr(0, 300));
  return f;
}

std::vector<Result<std::string>> Fleet::AgentGetAll(const std::vector<std::string>& nodes,
                                                    const std::string& path, int timeout_ms,
                                                    const std::string& token) {
  return AskInTurn(nodes, timeout_ms, RealLoopClock(),
                   [&](const std::string& n, int ms) { return AgentGet(n, path, ms, token); });
}

std::vector<Result<std::string>> AskInTurn(
    const std::vector<std::string>& nodes, int timeout_ms, tracer::LoopClock& clock,
    const std::function<Result<std::string>(const std::string& node, int ms)>& ask) {
  const auto deadline = clock.Now() + std::chrono::milliseconds(timeout_ms);
  std::vector<Result<std::string>> out;
  out.reserve(nodes.size());
  for (const std::string& n : nodes) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock.Now()).count();
    if (left <= 0) {
      out.emplace_back(Status(StatusCode::kDeadlineExceeded,
                              "the agent of " + n + " was not asked: the tick's " +
                                  std::to_string(timeout_ms) + " ms were spent"));
      continue;
    }
    out.push_back(ask(n, static_cast<int>(left)));
  }
  return out;
}

std::vector<Result<std::string>> AskAgents(const std::vector<std::string>& nodes,
                                           const std::vector<std::string>& urls,
                                           const std::string& path, int timeout_ms,
                                           const std::string& token) {
  // Side by side, as many at once as the machine's sockets comfortably take; the ones not started
  // by the deadline are not asked.
  constexpr size_t kPollWorkers = 64;
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  std::vector<Result<std::string>> out(nodes.size(), Status(StatusCode::kInternal, "not asked"));
  tracer::ParallelFor(nodes.size(), kPollWorkers, [&](size_t i) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (urls[i].empty()) {
      out[i] = NotFound(nodes[i] + " has no agent running");
    } else if (left <= 0) {
      out[i] = Status(StatusCode::kDeadlineExceeded, nodes[i] + ": not asked before the deadline");
    } else {
      out[i] = tracer::HttpGet(urls[i] + path, static_cast<int>(left), token);
    }
  });
  return out;
}

std::unique_ptr<Fleet> MakeSupervisorFleet(const launch::SupervisorOptions& options) {
  return std::make_unique<SupervisorFleet>(options);
}

}  // namespace megascope::controller
