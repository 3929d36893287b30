// A scripted fleet under a fake clock (controller/fleet.h), for deterministic tests of the
// controller's decisions. The job it plays takes `step_s` fake seconds a step and writes the
// worker's progress lines (ready, steps) to the run directory's real progress stream; machine
// faults are scripted per node and step (a crash, the job's own error, a rank hung in compute, a
// frozen rank, an agent's death), persistent ones fire again in every attempt the node is in, as a
// broken machine stays broken. Its agents answer /state from that model, and its live hang input
// is the flight recorders a real job would show (the hung rank out of the all-reduce its peers
// wait in), analysed by the real analyzer. Self-checks return scripted figures.
#pragma once

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "analyzer/store_run.h"
#include "megascope/analyzer/window.h"
#include "megascope/controller/controller.h"
#include "megascope/controller/fleet.h"
#include "megascope/launch/progress.h"
#include "megascope/tracer/file_util.h"
#include "megascope/tracer/run_layout.h"

namespace megascope::controller::testing {

class FakeClock final : public LoopClock {
 public:
  explicit FakeClock(int64_t wall_start_ns = 1'790'000'000'000'000'000) : wall_ns_(wall_start_ns) {}
  TimePoint Now() override { return now_; }
  int64_t WallNs() override { return wall_ns_ + (now_ - TimePoint{}).count(); }
  // Advances time, then lets the world move (the fleet's job, a test's script).
  void Sleep(std::chrono::duration<double> d) override {
    now_ += std::chrono::duration_cast<std::chrono::steady_clock::duration>(d);
    for (const auto& f : on_sleep_) f();
  }
  void OnSleep(std::function<void()> f) { on_sleep_.push_back(std::move(f)); }

 private:
  TimePoint now_{};
  int64_t wall_ns_;
  std::vector<std::function<void()>> on_sleep_;
};

// What goes wrong on `node` once the job has done `at_step` steps.
struct FakeFault {
  enum Kind {
    kCrash,      // its first rank dies (exit_raw), with `log` as its last line; its peers then fail
                 // their collectives (kExitCommFailure)
    kJobError,   // its first rank exits kExitJobError (bad input) with `log`
    kHang,       // its first rank stops in compute: out of the collective its peers wait in
    kFreeze,     // its first rank's process is stopped whole (its heartbeat too)
    kKillAgent,  // its agent dies
    kStallLink,  // its first rank's send to `peer`'s first rank stops moving (both posted)
    kSlow,       // its ranks compute `factor` times their peers' time in every step after
                 // `at_step`, in every attempt it is in (a machine that stays slow; traced steps)
    kSlowNet,    // its ranks compute as fast as their peers but reach every all-reduce `late_s`
                 // late in every step after `at_step`, in every attempt it is in (a slow NIC or
                 // link; traced steps with collectives)
    kPowerOff,   // the node goes silent: its agent answers nothing, its ranks stop where they are
                 // (no exit status reaches anyone), its peers wait in their next all-reduce
    kEveryRank,  // every rank of the job, on every node, exits `exit_raw` with `log` (what no
                 // machine causes: a directory the job needs is missing, a shared input is bad)
    kUnreachable  // nobody reaches the node at the start of an attempt that begins at `at_step`:
                  // every rank exits kExitUnreachable, the other nodes' naming its first rank as
                  // the peer they could not reach, its own naming the next node's first rank
  };
  Kind kind = kCrash;
  std::string node;
  int64_t at_step = 0;
  bool persistent = false;  // fires in every attempt the node is in (one-shot otherwise)
  int exit_raw = 9;         // waitpid status: killed by SIGKILL
  std::string log = "Segmentation fault (core dumped)";
  std::string peer{};  // kStallLink: the node at the far end
  double factor = 1;   // kSlow
  double late_s = 0;   // kSlowNet
  bool fired = false;
  int fired_attempt = -1;
  int64_t fired_at_ns = 0;  // the clock's wall time when it last fired
};

class FakeFleet final : public Fleet {
 public:
  // A job of `steps` steps of `step_s` fake seconds each.
  FakeFleet(const std::string& run_dir, FakeClock* clock, int64_t steps, double step_s = 0.5)
      : layout_(run_dir), clock_(clock), steps_(steps), step_s_(step_s) {
    clock_->OnSleep([this] { Advance(); });
  }

  // --- the script
  void Break(FakeFault f) { faults_.push_back(std::move(f)); }
  void SetSelfCheck(const std::string& node, SelfCheckFigures f) { self_check_[node] = f; }
  // Runs `f` while self-checks are measured (before their figures are returned).
  void OnSelfCheck(std::function<void()> f) { on_self_check_ = std::move(f); }
  int agents_running() const { return static_cast<int>(agents_.size()); }
  // What each agent's /metrics serves: `page(node, seconds since the clock's start)`; "" without.
  void ServeMetrics(std::function<std::string(const std::string&, double)> page) {
    metrics_ = std::move(page);
  }
  // Each step the job takes is traced into its nodes' trace.db (the real store): every rank's
  // forward span of `compute_s` (times a kSlow fault's factor on a slow node), as its agent would
  // have drained it -- what the controller's straggler watch reads.
  // `stages`: the job's pipeline stages, each rank's coordinates read as pp = rank / (world /
  // stages) and dp = rank % (world / stages) (a node then holds whole stages).
  // `collectives`: every rank then also all-reduces in the world group at the end of each step,
  // the op completing 1 ms after the last rank reached it (what the comm-straggler analysis reads).
  void TraceSteps(double compute_s, int stages = 1, bool collectives = false) {
    compute_s_ = compute_s;
    stages_ = stages;
    collectives_ = collectives;
  }
  // The agents' /window answers made from the script instead of read from trace.db (TraceSteps
  // writes every rank's steps there, which a fleet of thousands of nodes cannot afford here): each
  // rank computes `compute_s` (times a kSlow fault's factor) in every step it has done, in the
  // pipeline stage TraceSteps would give it. No collectives: the compute-straggler analysis.
  void SynthesizeWindows(double compute_s, int stages = 1) {
    compute_s_ = compute_s;
    stages_ = stages;
    synthesize_windows_ = true;
  }
  // The nodes keep their trace.db on their own disks (under `root`, laid out as a run directory),
  // as on a cluster without a shared run directory: only their agents' /window reads them.
  void KeepTracesOnNodes(const std::string& root) { trace_root_ = root; }
  // Given the controller's options: where each attempt resumes (run.json's resume point).

  // --- what it saw
  int agent_starts(const std::string& node) const {
    auto it = agent_starts_.find(node);
    return it == agent_starts_.end() ? 0 : it->second;
  }
  const std::vector<std::pair<std::string, std::string>>& checked_pairs() const {
    return checked_pairs_;
  }
  // The bandwidth floor of each round of self-checks (SelfCheckPairs' min_allreduce_gbps).
  const std::vector<double>& check_floors() const { return check_floors_; }
  const std::vector<std::vector<std::string>>& attempts() const { return attempts_; }
  const std::vector<AttemptPlan>& plans() const { return plans_; }  // each attempt's
  int64_t done() const { return done_; }
  const std::vector<FakeFault>& faults() const { return faults_; }

  // --- Fleet
  Result<int> StartAgent(const std::string& node) override {
    ++agent_starts_[node];
    agents_[node] = 40000 + static_cast<int>(agents_.size());
    return agents_[node];
  }
  std::optional<int> AgentPort(const std::string& node) const override {
    auto it = agents_.find(node);
    return it == agents_.end() ? std::nullopt : std::optional<int>(it->second);
  }
  void StopAgent(const std::string& node, bool) override { agents_.erase(node); }
  void StopAgents() override { agents_.clear(); }
  std::vector<launch::AgentExit> PollAgents() override { return std::exchange(agent_exits_, {}); }
  bool SignalAgent(const std::string&, int) override { return false; }
  Result<std::string> AgentGet(const std::string& node, const std::string& path, int,
                               const std::string&) override {
    if (!agents_.count(node))
      return Status(StatusCode::kUnavailable, node + "'s agent does not answer");
    if (silent_.count(node))
      return Status(StatusCode::kDeadlineExceeded, node + ": no answer before the deadline");
    if (path.starts_with("/window?") && synthesize_windows_)
      return SynthesizedWindow(node, path.substr(path.find('?') + 1));
    if (path.starts_with("/window?")) {  // the agent's own answer, over the node's trace.db
      auto& server = windows_[node];
      if (!server) server = std::make_unique<analyzer::WindowServer>(TraceRoot(), node);
      auto [code, body] = server->Serve(path.substr(path.find('?') + 1));
      if (code != 200) return Status(StatusCode::kUnavailable, body);
      return body;
    }
    if (path == "/metrics") {
      if (!metrics_) return std::string();
      return metrics_(
          node, std::chrono::duration<double>(clock_->Now() - LoopClock::TimePoint{}).count());
    }
    nlohmann::json ranks = nlohmann::json::array();
    const int first = FirstRankOf(node);
    for (int r = first; first >= 0 && r < world_ && NodeOfRank(r) == node; ++r) {
      ranks.push_back({{"attempt", attempt_},
                       {"rank", r},
                       {"heartbeat", {{"step", done_}}},
                       {"open_entries", nlohmann::json::array()}});
    }
    return nlohmann::json{{"ranks", ranks}}.dump();
  }
  Result<analyzer::HangInput> LiveHangInput(const std::vector<std::string>&, int attempt,
                                            const std::string&) override {
    std::vector<std::pair<std::string, tracer::Dump>> dumps;
    const tracer::RankList world = WorldGroup();
    for (int r = 0; r < world_; ++r) {
      if (silent_.count(NodeOfRank(r))) continue;  // nobody answers for its ranks
      dumps.emplace_back("fake://rank_" + std::to_string(r), RankDump(r, attempt, world));
    }
    return analyzer::MakeHangInput(std::move(dumps));
  }
  // What `node`'s agent answers for its ranks' flight recorders now (an agent's /dumps); nothing
  // for a silent node.
  std::vector<tracer::Dump> NodeDumps(const std::string& node, int attempt) const {
    std::vector<tracer::Dump> out;
    const tracer::RankList world = WorldGroup();
    const int first = FirstRankOf(node);
    for (int r = first; first >= 0 && !silent_.count(node) && r < world_ && NodeOfRank(r) == node;
         ++r)
      out.push_back(RankDump(r, attempt, world));
    return out;
  }
  // Rank `r`'s flight recorder now: the last step's all-reduce done, the next one open (or, for
  // the stuck rank, none; for a stalled link's ends, the send and the receive).
  tracer::RankList WorldGroup() const {
    std::vector<int32_t> all(static_cast<size_t>(world_));
    for (int k = 0; k < world_; ++k) all[static_cast<size_t>(k)] = k;
    return tracer::RankList(all.begin(), all.end());
  }
  tracer::Dump RankDump(int r, int attempt, const tracer::RankList& world) const {
    const int64_t now = clock_->WallNs();
    tracer::Dump d;
    d.dumped_at_ns = now;
    auto& s = d.snapshot;
    s.info.job = "fake";
    s.info.node = NodeOfRank(r);
    s.info.rank = r;
    s.info.world_size = world_;
    s.info.attempt = attempt;
    s.info.pid = 1000 + r;
    s.groups.push_back({"0", "world", world});
    const bool stuck = r == stuck_rank_ && stall_peer_ < 0;
    s.heartbeat.step = done_;
    s.heartbeat.phase = stuck ? tracer::Phase::kForward : tracer::Phase::kBackward;
    s.heartbeat.updated_at_ns = stuck && frozen_ ? stuck_at_ns_ : now;
    tracer::FlightEntry last;  // the all-reduce of the last step, done everywhere
    last.id = 1;
    last.seq = static_cast<uint64_t>(done_);
    last.bytes = 4096;
    last.enqueued_at_ns = last.started_at_ns = stuck_at_ns_ - 2'000'000;
    last.completed_at_ns = stuck_at_ns_ - 1'000'000;
    last.state = tracer::OpState::kCompleted;
    s.entries.push_back(last);
    tracer::FlightEntry open = last;  // where it waits now
    open.id = 2;
    open.enqueued_at_ns = open.started_at_ns = stuck_at_ns_;
    open.completed_at_ns = 0;
    open.state = tracer::OpState::kStarted;
    if (stall_peer_ >= 0 && (r == stuck_rank_ || r == stall_peer_)) {
      // The two ends of the stalled transfer: both posted, 64 KiB of 1 MiB across.
      const bool sender = r == stuck_rank_;
      open.seq = 0;
      open.op = sender ? tracer::OpType::kSend : tracer::OpType::kRecv;
      open.peer = sender ? stall_peer_ : stuck_rank_;
      open.bytes = 1 << 20;
      (sender ? open.bytes_sent : open.bytes_received) = 65536;
      s.entries.push_back(open);
    } else if (!stuck) {  // its peers wait in the next all-reduce
      open.seq = last.seq + 1;
      s.entries.push_back(open);
    }
    return d;
  }

  Status StartRanks(const AttemptPlan& plan, int world) override {
    plans_.push_back(plan);
    resume_step_ = plan.resume_set ? plan.resume.step : -1;
    attempt_ = plan.attempt;
    nodes_ = plan.nodes;
    world_ = world;
    attempts_.push_back(plan.nodes);
    done_ = std::max<int64_t>(0, resume_step_);
    attempt_from_ = done_;
    running_ = true;
    ready_ = false;
    stuck_rank_ = stall_peer_ = -1;
    frozen_ = false;
    return Status::Ok();
  }
  std::vector<launch::RankExit> PollRanks() override { return std::exchange(rank_exits_, {}); }
  launch::RankExit FindOrigin(const std::vector<launch::RankExit>& failures,
                              std::chrono::milliseconds,
                              std::vector<launch::RankExit>* others) override {
    auto origin = std::find_if(failures.begin(), failures.end(), [](const launch::RankExit& e) {
      return !(e.status.exited() && launch::PeersFailure(e.status.code()));
    });
    if (origin == failures.end()) origin = failures.begin();
    for (auto it = failures.begin(); it != failures.end(); ++it) {
      if (it != origin) others->push_back(*it);
    }
    return *origin;
  }
  std::vector<int> CollectDumps(std::chrono::milliseconds) override { return {}; }
  void StopRanks() override {
    running_ = false;
    rank_exits_.clear();
  }
  bool SignalRank(int, int) override { return false; }
  std::string NodeOfRank(int rank) const override {
    if (nodes_.empty() || world_ == 0) return "";
    return nodes_.at(static_cast<size_t>(rank / (world_ / static_cast<int>(nodes_.size()))));
  }
  std::vector<std::pair<SelfCheckFigures, SelfCheckFigures>> SelfCheckPairs(
      const std::vector<std::pair<std::string, std::string>>& pairs,
      double min_allreduce_gbps) override {
    std::vector<std::pair<SelfCheckFigures, SelfCheckFigures>> out;
    if (on_self_check_) on_self_check_();
    check_floors_.push_back(min_allreduce_gbps);
    for (const auto& [a, b] : pairs) {
      checked_pairs_.emplace_back(a, b);
      out.emplace_back(Figures(a), Figures(b));
    }
    return out;
  }
  void AddNodeEnv(const std::string& node, const std::string& key,
                  const std::string& value) override {
    env_[node].emplace_back(key, value);
  }
  const launch::Host* HostOf(const std::string&) const override { return nullptr; }

 private:
  SelfCheckFigures Figures(const std::string& node) const {
    auto it = self_check_.find(node);
    if (it != self_check_.end()) return it->second;
    SelfCheckFigures f;
    f.ok = true;
    f.gemm_gflops = 100;
    f.allreduce_gbps = 1;
    return f;
  }
  int FirstRankOf(const std::string& node) const {  // a node's ranks follow it
    const auto it = std::find(nodes_.begin(), nodes_.end(), node);
    if (it == nodes_.end() || world_ == 0) return -1;
    return static_cast<int>(it - nodes_.begin()) * (world_ / static_cast<int>(nodes_.size()));
  }
  void Append(const nlohmann::json& line) {
    ASSERT_TRUE(launch::AppendProgress(layout_.progress(), line).ok());
  }
  // A fault due now on a node of this attempt, marked fired; nullptr when none. `at_start`: one
  // of those that strike as the ranks connect (kUnreachable), else one of those between steps.
  FakeFault* Due(bool at_start = false) {
    for (FakeFault& f : faults_) {
      const bool in_job = std::find(nodes_.begin(), nodes_.end(), f.node) != nodes_.end();
      if (!in_job || f.at_step != done_ || f.fired_attempt == attempt_) continue;
      if ((f.kind == FakeFault::kUnreachable) != at_start) continue;
      if (f.fired && !f.persistent) continue;
      f.fired = true;
      f.fired_attempt = attempt_;
      f.fired_at_ns = clock_->WallNs();
      return &f;
    }
    return nullptr;
  }
  // Ends every rank of the attempt with `raw`, each with `log` as its last line.
  void FailEveryRank(int raw, const std::string& log) {
    for (int r = 0; r < world_; ++r) {
      ASSERT_TRUE(tracer::WriteFileAtomic(layout_.worker_log(r),
                                          "[worker] rank " + std::to_string(r) + "\n" + log + "\n")
                      .ok());
      rank_exits_.push_back({r, {raw}});
    }
    running_ = false;
  }
  // Ends the attempt's ranks: `rank` with `raw`, its peers of a failed collective (not a rank stuck
  // in compute: it never reaches one).
  void Fail(int rank, int raw, const std::string& log) {
    ASSERT_TRUE(
        tracer::WriteFileAtomic(layout_.worker_log(rank),
                                "[worker] step " + std::to_string(done_) + "\n" + log + "\n")
            .ok());
    rank_exits_.push_back({rank, {raw}});
    for (int r = 0; r < world_; ++r) {
      if (r != rank && r != stuck_rank_)
        rank_exits_.push_back({r, {launch::kExitCommFailure << 8}});
    }
    running_ = false;
  }
  // Nobody reaches `node`: every rank fails to connect (kUnreachable).
  void Unreachable(const std::string& node) {
    const int first = FirstRankOf(node), per = world_ / static_cast<int>(nodes_.size());
    for (int r = 0; r < world_; ++r) {
      const int peer = NodeOfRank(r) == node ? (first + per) % world_ : first;
      ASSERT_TRUE(tracer::WriteFileAtomic(
                      layout_.worker_log(r),
                      "[worker] rank " + std::to_string(r) +
                          ": setup failed: [gloo] rendezvous failed: " + launch::CannotReach(peer) +
                          " in world: Connect "
                          "timeout [10.0.0.9]:4100\n")
                      .ok());
      rank_exits_.push_back({r, {launch::kExitUnreachable << 8}});
    }
    running_ = false;
  }
  // The job moves to the clock's time.
  void Advance() {
    if (!running_ || stuck_rank_ >= 0) return;
    if (!ready_) {
      if (FakeFault* f = Due(true)) {
        Unreachable(f->node);
        return;
      }
      ready_ = true;
      next_step_ = clock_->Now() + Step();
      Append({{"event", "ready"},
              {"attempt", attempt_},
              {"step", done_},
              {"source", resume_step_ >= 0 ? "memory" : "none"},
              {"ts_ns", clock_->WallNs()}});
    }
    while (running_ && stuck_rank_ < 0 && clock_->Now() >= next_step_) {
      while (FakeFault* f = Due()) {
        const int rank = FirstRankOf(f->node);
        switch (f->kind) {
          case FakeFault::kCrash:
            Fail(rank, f->exit_raw, f->log);
            break;
          case FakeFault::kJobError:
            Fail(rank, launch::kExitJobError << 8, f->log);
            break;
          case FakeFault::kHang:
          case FakeFault::kFreeze:
            // Stuck in compute, it reaches no collective: a crash at the same step ends its peers
            // (a collective fails), not it.
            std::erase_if(rank_exits_,
                          [rank](const launch::RankExit& e) { return e.rank == rank; });
            stuck_rank_ = rank;
            frozen_ = f->kind == FakeFault::kFreeze;
            stuck_at_ns_ = clock_->WallNs();
            break;
          case FakeFault::kStallLink:
            stuck_rank_ = rank;
            stall_peer_ = FirstRankOf(f->peer);
            stuck_at_ns_ = clock_->WallNs();
            break;
          case FakeFault::kPowerOff:
            silent_.insert(f->node);
            stuck_rank_ = rank;
            stuck_at_ns_ = clock_->WallNs();
            break;
          case FakeFault::kEveryRank:
            FailEveryRank(f->exit_raw, f->log);
            break;
          case FakeFault::kKillAgent:
            agents_.erase(f->node);
            agent_exits_.push_back({f->node, {9}});
            break;
          case FakeFault::kSlow:  // read by Trace, step by step
          case FakeFault::kSlowNet:
          case FakeFault::kUnreachable:  // at the start (Due(true))
            break;
        }
      }
      if (!running_ || stuck_rank_ >= 0) return;
      ++done_;
      if (compute_s_ > 0 && !synthesize_windows_) Trace(done_);
      Append({{"step", done_},
              {"loss", 5.0 - 0.01 * static_cast<double>(done_)},
              {"step_time_s", step_s_},
              {"attempt", attempt_},
              {"ts_ns", clock_->WallNs()}});
      next_step_ += Step();
      if (done_ == steps_) {
        for (int r = 0; r < world_; ++r) rank_exits_.push_back({r, {0}});
        running_ = false;
      }
    }
  }
  // How much slower than its peers `node` computes in step `step` (1: not at all).
  double SlowFactor(const std::string& node, int64_t step) const {
    double factor = 1;
    for (const FakeFault& f : faults_) {
      if (f.kind == FakeFault::kSlow && f.node == node && step > f.at_step) factor = f.factor;
    }
    return factor;
  }
  // How late `node`'s ranks reach the step's all-reduce, in ns (0: on time).
  int64_t LateNs(const std::string& node, int64_t step) const {
    double late = 0;
    for (const FakeFault& f : faults_) {
      if (f.kind == FakeFault::kSlowNet && f.node == node && step > f.at_step) late = f.late_s;
    }
    return static_cast<int64_t>(late * 1e9);
  }
  const std::string& TraceRoot() const { return trace_root_.empty() ? layout_.dir() : trace_root_; }
  // Step `step` of every rank into its node's trace.db.
  void Trace(int64_t step) {
    static const std::vector<std::string> kNames = {"forward"};
    const int64_t start = clock_->WallNs();
    int64_t last_arrival = start;  // of the step's all-reduce
    for (int r = 0; r < world_; ++r) {
      const std::string node = NodeOfRank(r);
      last_arrival = std::max(last_arrival, start + ComputeNs(node, step) + LateNs(node, step));
    }
    for (int r = 0; r < world_; ++r) {
      tracer::RankInfo info;
      info.job = "fake";
      info.rank = r;
      info.world_size = world_;
      info.attempt = attempt_;
      info.node = NodeOfRank(r);
      const int replicas = world_ / stages_;
      info.coords = {r % replicas, r / replicas, 0};
      tracer::Record rec{};
      rec.span.type = tracer::RecordType::kSpan;
      rec.span.kind = tracer::SpanKind::kForward;
      rec.span.microbatch = -1;
      rec.span.step = step;
      rec.span.start_ticks = start;
      rec.span.end_ticks = start + ComputeNs(info.node, step);
      std::vector<tracer::Record> records = {rec};
      if (collectives_) {
        tracer::Record op{};
        op.collective.type = tracer::RecordType::kCollective;
        op.collective.op = tracer::OpType::kAllreduce;
        op.collective.state = tracer::OpState::kCompleted;
        op.collective.dtype = tracer::DType::kF32;
        op.collective.peer = -1;
        op.collective.step = static_cast<int32_t>(step);
        op.collective.seq = static_cast<uint64_t>(step);
        op.collective.bytes = 1 << 20;
        op.collective.enqueued_ticks = rec.span.end_ticks + LateNs(info.node, step);
        op.collective.started_ticks = op.collective.enqueued_ticks;
        op.collective.completed_ticks = last_arrival + 1'000'000;
        op.collective.entry_id = static_cast<uint64_t>(step);
        records.push_back(op);
      }
      analyzer::WriteRankRecords(TraceRoot(), info, kNames, {{"world", "world", {}}}, records);
    }
  }
  // `node`'s /window part for the query string `query`, from the script (SynthesizeWindows).
  Result<std::string> SynthesizedWindow(const std::string& node, std::string_view query) const {
    auto q = analyzer::ParseWindowQuery(query);
    if (!q.ok()) return q.status();
    analyzer::WindowPart part;
    part.node = node;
    const int first = FirstRankOf(node);
    const int per = world_ / static_cast<int>(nodes_.size()), replicas = world_ / stages_;
    for (int r = first; first >= 0 && q->attempt == attempt_ && r < first + per; ++r) {
      part.through[r] = done_;
      part.input.ranks[r] = {node, r % replicas, r / replicas, 0, 0};
    }
    part.has_rows = !part.through.empty() && (done_ >= q->last_step || q->anyway);
    for (const auto& [r, through] : part.through) {
      for (int64_t step = std::max(q->first_step, attempt_from_ + 1);
           part.has_rows && step <= std::min(q->last_step, through); ++step) {
        part.input.steps.push_back(
            {r, attempt_, step, step_s_ * 1e9, static_cast<double>(ComputeNs(node, step)), 0, 0});
      }
    }
    return analyzer::WindowPartJson(part);
  }
  int64_t ComputeNs(const std::string& node, int64_t step) const {
    return static_cast<int64_t>(compute_s_ * 1e9 * SlowFactor(node, step));
  }
  std::chrono::steady_clock::duration Step() const {
    return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(step_s_));
  }

  RunLayout layout_;
  std::map<std::string, std::unique_ptr<analyzer::WindowServer>> windows_;  // the agents' /window
  std::string trace_root_;  // where the nodes' trace.db are ("": the run directory)
  FakeClock* clock_;
  int64_t steps_;
  double step_s_;
  double compute_s_ = 0;  // TraceSteps
  int stages_ = 1;
  bool collectives_ = false;
  bool synthesize_windows_ = false;  // SynthesizeWindows
  int64_t attempt_from_ = 0;         // the steps done when the attempt started
  std::vector<FakeFault> faults_;
  std::map<std::string, SelfCheckFigures> self_check_;
  std::function<std::string(const std::string&, double)> metrics_;
  std::function<void()> on_self_check_;
  std::map<std::string, int> agents_, agent_starts_;
  std::set<std::string> silent_;  // kPowerOff: nodes that answer nothing, for good
  std::vector<launch::AgentExit> agent_exits_;
  std::vector<launch::RankExit> rank_exits_;
  std::vector<std::pair<std::string, std::string>> checked_pairs_;
  std::vector<double> check_floors_;
  std::vector<std::vector<std::string>> attempts_;
  std::vector<AttemptPlan> plans_;
  std::map<std::string, std::vector<std::pair<std::string, std::string>>> env_;
  int attempt_ = 0, world_ = 0;
  std::vector<std::string> nodes_;
  int64_t done_ = 0, resume_step_ = -1;
  bool running_ = false, ready_ = false, frozen_ = false;
  int stuck_rank_ = -1, stall_peer_ = -1;
  int64_t stuck_at_ns_ = 0;
  LoopClock::TimePoint next_step_;
};

}  // namespace megascope::controller::testing
