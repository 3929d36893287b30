#include "megascope/controller/controller.h"

#include <CivetServer.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "evidence.h"
#include "megascope/analyzer/hang.h"
#include "megascope/analyzer/live.h"
#include "megascope/analyzer/query.h"
#include "megascope/analyzer/timeline.h"
#include "megascope/controller/control_db.h"
#include "megascope/controller/disk_guard.h"
#include "megascope/controller/report.h"
#include "megascope/launch/link_seam.h"
#include "megascope/launch/progress.h"
#include "megascope/launch/scrape_targets.h"
#include "megascope/launch/slurm.h"
#include "megascope/tracer/clock.h"
#include "megascope/tracer/dump.h"
#include "megascope/tracer/file_util.h"
#include "megascope/tracer/http_client.h"
#include "megascope/tracer/http_serve.h"
#include "megascope/tracer/verdict.h"
#include "net_fault.h"
#include "proc_fault.h"

namespace megascope::controller {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

volatile sig_atomic_t g_interrupted = 0;
void OnInterrupt(int) { g_interrupted = 1; }

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

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

struct Command {
  std::string what;  // stop, evict
  std::string node;
};

// The last non-empty line of a worker's log (what it said before it ended), "" if none.
std::string LastLogLine(const std::string& path) {
  const std::string text = tracer::ReadFile(path).value_or("");
  size_t end = text.find_last_not_of("\n \t");
  if (end == std::string::npos) return "";
  const size_t begin = text.rfind('\n', end);
  return text.substr(begin == std::string::npos ? 0 : begin + 1,
                     end - (begin == std::string::npos ? 0 : begin + 1) + 1);
}

// `s` with every run of digits as one '#': two failures that differ only in a rank, a pid or a
// node's number read the same.
std::string MaskDigits(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (std::isdigit(static_cast<unsigned char>(c)) == 0)
      out += c;
    else if (out.empty() || out.back() != '#')
      out += '#';
  }
  return out;
}

// The control endpoint: POST /stop and POST /evict?node=N with "Authorization: Bearer <token>".
class ControlHandler : public CivetHandler {
 public:
  // `nodes`: the job's nodes as the controller last saw them, guarded by `mu` like `queue`.
  ControlHandler(std::string token, std::mutex* mu, std::deque<Command>* queue,
                 const std::vector<std::string>* nodes)
      : token_(std::move(token)), mu_(mu), queue_(queue), nodes_(nodes) {}
  bool handlePost(CivetServer*, mg_connection* conn) override {
    const mg_request_info* ri = mg_get_request_info(conn);
    if (token_.empty() || !tracer::HttpAuthorized(conn, token_)) {
      Reply(conn, 403, "missing or wrong token (read it from RUN_DIR/control.token)");
      return true;
    }
    const std::string uri = ri->local_uri ? ri->local_uri : "";
    Command c;
    if (uri == "/stop") {
      c.what = "stop";
    } else if (uri == "/evict") {
      char node[256] = {};
      if (ri->query_string == nullptr || mg_get_var(ri->query_string, std::strlen(ri->query_string),
                                                    "node", node, sizeof(node)) <= 0) {
        Reply(conn, 400, "evict needs ?node=NAME");
        return true;
      }
      c = {"evict", node};
    } else {
      Reply(conn, 404, "use POST /stop or POST /evict?node=NAME");
      return true;
    }
    {
      std::lock_guard<std::mutex> lock(*mu_);
      if (!c.node.empty() && std::find(nodes_->begin(), nodes_->end(), c.node) == nodes_->end()) {
        std::string list;
        for (const std::string& n : *nodes_) list += (list.empty() ? "" : ", ") + n;
        Reply(conn, 404, "no node " + c.node + " in the job (its nodes: " + list + ")");
        return true;
      }
      queue_->push_back(c);
    }
    Reply(conn, 200, "accepted: " + c.what + (c.node.empty() ? "" : " " + c.node));
    return true;
  }

 private:
  static void Reply(mg_connection* conn, int code, const std::string& body) {
    tracer::HttpReply(conn, code, "text/plain", body + "\n");
  }
  std::string token_;
  std::mutex* mu_;
  std::deque<Command>* queue_;
  const std::vector<std::string>* nodes_;
};

// The self-check's rendezvous and collective timeout.
constexpr int kSelfCheckTimeoutMs = 10000;

struct SelfCheckFigures {
  bool ok = false;
  double gemm_gflops = 0, allreduce_gbps = 0;
  std::string error;
};

}  // namespace

struct Controller::Impl {
  ControllerOptions opt;
  launch::Supervisor sup;
  RunLayout layout;
  std::unique_ptr<ControlDb> db;
  std::unique_ptr<CivetServer> http;
  std::unique_ptr<ControlHandler> handler;
  std::mutex mu;
  std::deque<Command> commands;          // GUARDED_BY(mu)
  std::vector<std::string> nodes_known;  // GUARDED_BY(mu): `active` as of the last tick

  int attempt = 0;
  std::vector<std::string> active;  // node of each slot
  std::deque<std::string> spares;
  std::map<std::string, Clock::time_point> evicted;  // node -> when
  std::set<std::string> failed_self_check;
  std::vector<Clock::time_point> eviction_times;
  double baseline_gemm = 0, baseline_bw = 0;
  int checks = 0;

  // The attempt in progress.
  Clock::time_point launch_start = Clock::now(), attempt_start;
  int64_t last_step_done = 0;  // completed steps of the job so far (the newest step line)
  bool attempt_stepped = false;
  int fruitless_attempts = 0;  // consecutive attempts that ended before their first step
  bool adopted = false;        // this launch took over an unfinished run of the run directory
  // The last crash blamed on a machine: how it failed, at what step, and the node evicted for it.
  // The same failure at the same step on the node that replaced it is the job's, not a machine's.
  struct Failure {
    std::string how;  // exit and last log line, digits masked
    int64_t step = -1;
    std::string evicted;
  };
  Failure last_failure;
  std::vector<double> step_times;
  std::map<int, int64_t> hb_steps;
  Clock::time_point last_progress;
  int finished_ranks = 0;
  std::optional<int64_t> incident_start_ns;
  int64_t incident_step = 0;            // completed steps when the last incident began
  std::vector<int32_t> incident_ranks;  // its verdicts' root ranks  // for "resumed": the open
                                        // incident's trigger time
  launch::ProgressReader progress;
  int64_t missing_steps = 0;  // step lines of an attempt that never reached the progress stream

  // The run directory's space, and what could not be written to it yet.
  DiskGuard disk;
  std::deque<Event> unrecorded;  // control.db events not written yet (a full disk)
  bool record_failing = false;
  std::vector<std::string> unwritten;  // files the launch could not write (reports)

  // Online evidence (faults that do not stop the job).
  std::unique_ptr<OnlineDetector> online;
  StragglerWatch stragglers;
  Clock::time_point last_scrape;
  int64_t straggler_from = 0;     // the next straggler window starts after this step
  std::set<std::string> alerted;  // alerts already reported in this attempt
  std::set<std::string> cleared;  // node|cause: passed a self-check for it in this run
  std::map<std::string, std::unique_ptr<ProcFault>> proc_faults;  // metric faults, by node
  std::map<std::string, std::string> link_seams;                  // link faults: node -> file
  std::string agent_token;  // what the agents require ("" : agents on loopback, open)
  std::map<std::string, Clock::time_point> net_faults;  // real link faults applied: node -> end

  bool HasOwnHost(const std::string& node) const {
    const launch::Host* h = sup.HostOf(node);
    return h != nullptr && !h->netns.empty();
  }
  // Undoes every real link fault still applied (at the end of the launch).
  void ClearNetFaults() {
    for (const auto& [node, until] : net_faults) {
      if (Status st = ClearLinkFault(*sup.HostOf(node)); !st.ok())
        Log("cannot clear the link fault on " + node + ": " + st.ToString());
    }
    net_faults.clear();
  }

  explicit Impl(ControllerOptions o)
      : opt(std::move(o)),
        sup(opt.supervisor),
        layout(opt.supervisor.run_dir),
        progress(layout.progress()),
        disk(layout.dir(), opt.min_free_bytes, opt.free_space) {
    if (opt.detector_tick_s > 0) {
      detector::DetectorConfig dc;
      dc.tick_s = opt.detector_tick_s;
      dc.warmup_ticks = opt.detector_warmup_ticks;
      dc.min_peers = opt.detector_min_peers;
      online = std::make_unique<OnlineDetector>(dc);
    }
  }

  void Log(const std::string& line) {
    std::printf("[launch] %s\n", line.c_str());
    std::fflush(stdout);
  }

  void Record(EventKind kind, const std::string& node, int rank, json detail, int64_t ts_ns = 0) {
    Event e;
    e.ts_ns = ts_ns ? ts_ns : tracer::WallNowNs();
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
  bool FlushRecords() {
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

  // ------------------------------------------------------------------ setup

  Status Setup() {
    std::error_code ec;
    fs::create_directories(layout.dir(), ec);
    if (std::string why; disk.Short(&why)) {
      return FailedPrecondition(why + ": a job must not start where its checkpoints and records " +
                                "cannot be kept (free space, or lower --min-free-mb)");
    }
    ASSIGN_OR_RETURN(db, ControlDb::Open(layout.control_db()));
    progress.SkipExisting();  // an earlier launch's lines are history, not this launch's progress
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
      http = std::make_unique<CivetServer>(civet);
    } catch (const std::exception& e) {
      return Status(StatusCode::kUnavailable,
                    std::string("cannot start the control endpoint: ") + e.what());
    }
    http->addHandler("/stop", handler.get());
    http->addHandler("/evict", handler.get());
    const int port = http->getListeningPorts().at(0);
    RETURN_IF_ERROR(tracer::WriteFileAtomic(
        layout.controller_json(),
        json{{"url", "http://127.0.0.1:" + std::to_string(port)}, {"pid", ::getpid()}}.dump() +
            "\n"));
    for (const Injection& in : opt.injections) {
      auto env = sup.NodeEnv(in.node);
      if (in.kind == FaultKind::kDegrade) {
        env.emplace_back("MEGASCOPE_INJECT_SLOWDOWN", std::to_string(in.factor));
        sup.SetNodeEnv(in.node, env);
        Record(EventKind::kFaultInjected, in.node, -1,
               {{"kind", Name(in.kind)}, {"spec", in.spec}, {"factor", in.factor}});
      } else if (in.kind == FaultKind::kMetric && !proc_faults.count(in.node)) {
        // The node's agent samples a /proc of its own from the start; the metric fails when the
        // injection fires.
        auto f = std::make_unique<ProcFault>(layout.dir() + "/inject/proc_" + in.node, in.what,
                                             in.seconds);
        RETURN_IF_ERROR(f->Start());
        env.emplace_back("MEGASCOPE_PROC_ROOT", f->dir());
        sup.SetNodeEnv(in.node, env);
        proc_faults[in.node] = std::move(f);
      } else if (in.kind == FaultKind::kLink && !HasOwnHost(in.node) &&
                 !link_seams.count(in.node)) {
        // Every process of the node obeys the seam file from the start; it is healthy until the
        // injection fires. (A node on a host of its own gets a real fault instead: net_fault.h.)
        const std::string path = layout.dir() + "/inject/link_" + in.node;
        std::error_code ec;
        fs::create_directories(layout.dir() + "/inject", ec);
        RETURN_IF_ERROR(launch::WriteLinkFault(path, {}));
        env.emplace_back(launch::kLinkSeamEnv, path);
        sup.SetNodeEnv(in.node, env);
        link_seams[in.node] = path;
      }
    }
    active = opt.nodes;
    spares.assign(opt.spares.begin(), opt.spares.end());
    return AdoptEarlierRun();
  }

  // A run directory holds the record of every launch in it. When the last one did not finish
  // (its controller was killed, a person stopped it, it paused), this launch adopts it: attempt
  // numbers go on after its last (trace rows and rendezvous stay apart), its evictions stand (the
  // nodes it evicted stay out, the spares it took in stay in) and the first attempt resumes from
  // its newest state (the memory snapshots it left, else a disk checkpoint). Otherwise state in
  // memory under this job name is an earlier launch's and is dropped.
  Status AdoptEarlierRun() {
    ASSIGN_OR_RETURN(std::vector<Event> events, db->Events());
    std::vector<std::string> nodes, gone;
    bool finished = false;
    for (const Event& e : events) {
      attempt = std::max(attempt, e.attempt + 1);
      if (e.kind == EventKind::kRestart && e.detail.contains("nodes")) {
        nodes = e.detail["nodes"].get<std::vector<std::string>>();
        finished = false;
      } else if (e.kind == EventKind::kEviction && !e.node.empty()) {
        gone.push_back(e.node);
      } else if (e.kind == EventKind::kJobFinished) {
        finished = e.detail.value("status", "") == "finished";
      }
    }
    std::error_code ec;
    if (events.empty() || finished || nodes.empty()) {
      fs::remove_all(MemoryRoot(opt.supervisor.shm_dir, opt.supervisor.job), ec);
      if (!events.empty())
        Log("the run directory holds a finished run: this launch starts at attempt " +
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
      if (std::find(active.begin(), active.end(), n) == active.end()) evicted[n] = Clock::now();
    }
    adopted = true;
    Log("adopting the unfinished run in " + layout.dir() + ": attempt " + std::to_string(attempt) +
        " on " + Join(active) + (gone.empty() ? "" : " (evicted before: " + Join(gone) + ")") +
        ", resuming from its newest state");
    return Status::Ok();
  }
  std::vector<std::string> MemoryDirs() const {
    std::vector<std::string> memory;
    for (const std::string& n : active)
      memory.push_back(NodeMemoryDir(opt.supervisor.shm_dir, opt.supervisor.job, n));
    return memory;
  }

  // -------------------------------------------------------------- self-check

  // A self-check pair in flight: its two processes, and the one deadline for both (a rank whose
  // link is dead can block in connect() past its own rendezvous timeout).
  struct PairCheck {
    std::vector<std::unique_ptr<launch::Process>> procs;
    Clock::time_point deadline;
    std::string error;  // the pair could not start
  };
  PairCheck StartPair(const std::string& a, const std::string& b) {
    const std::string dir = layout.self_check_dir("check_" + std::to_string(checks++));
    std::error_code ec;
    fs::remove_all(dir, ec);
    fs::create_directories(dir + "/store", ec);
    PairCheck c;
    const std::string nodes[2] = {a, b};
    for (int r = 0; r < 2; ++r) {
      auto p = launch::Process::Spawn(
          sup.NodeProcess(nodes[r], "self-check",
                          {opt.supervisor.self_exe, "self-check", "--dir", dir + "/store", "--rank",
                           std::to_string(r), "--timeout", std::to_string(kSelfCheckTimeoutMs)},
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
  // Waits for a pair; the figures of its first and second node.
  std::pair<SelfCheckFigures, SelfCheckFigures> FinishPair(PairCheck& c) {
    std::pair<SelfCheckFigures, SelfCheckFigures> out;
    if (!c.error.empty()) {
      out.first.error = c.error;
      return out;
    }
    for (size_t r = 0; r < c.procs.size(); ++r) {
      SelfCheckFigures& f = r == 0 ? out.first : out.second;
      auto e = c.procs[r]->WaitFor(std::chrono::duration_cast<std::chrono::milliseconds>(
          std::max(Clock::duration::zero(), c.deadline - Clock::now())));
      if (!e) {
        c.procs[r]->Stop(std::chrono::milliseconds(0));
        f.error =
            "self-check did not finish in " + std::to_string(3 * kSelfCheckTimeoutMs / 1000) + " s";
        continue;
      }
      const std::string text = tracer::ReadFile(c.procs[r]->log_path()).value_or("");
      const auto brace = text.rfind('{');
      json j = json::parse(brace == std::string::npos ? "" : text.substr(brace), nullptr, false);
      if (!e->success() || j.is_discarded()) {
        f.error = "self-check " + e->Describe() + ": " + text.substr(0, 300);
        continue;
      }
      f.ok = true;
      f.gemm_gflops = j.value("gemm_gflops", 0.0);
      f.allreduce_gbps = j.value("allreduce_gbps", 0.0);
    }
    return out;
  }
  // Runs the self-check pair (a, b); returns the figures of a and b (b's only when b != a).
  std::pair<SelfCheckFigures, SelfCheckFigures> SelfCheckPair(const std::string& a,
                                                              const std::string& b) {
    PairCheck c = StartPair(a, b);
    return FinishPair(c);
  }

  // Self-checks `node` with a healthy `partner`; records and returns whether it passed.
  // The node's error counters (XID, ECC, NIC errors) from its agent; empty without an agent.
  std::map<std::string, double> NodeErrorCounters(const std::string& node) {
    const std::string url = sup.AgentUrl(node);
    if (url.empty()) return {};
    auto page = tracer::HttpGet(url + "/metrics", 1000, agent_token);
    return page.ok() ? ErrorCounters(*page) : std::map<std::string, double>{};
  }

  // Self-checks `node` with a healthy `partner`: GEMM and all-reduce against the healthy figures,
  // and the node's error counters must not rise meanwhile (as a GPU diagnostic watches XIDs while
  // it runs). Records and returns whether it passed.
  struct NodeCheck {
    std::string node, partner, why;
  };
  bool SelfCheck(const std::string& node, const std::string& partner, const std::string& why) {
    return SelfCheckAll({{node, partner, why}}).at(0);
  }
  // Several at once (both ends of a stalled link): each pair runs beside the others, so a dead
  // end's check costs no more than its own, not its peer's too.
  std::vector<bool> SelfCheckAll(const std::vector<NodeCheck>& todo) {
    const auto t0 = Clock::now();
    std::vector<std::map<std::string, double>> errors_before;
    std::vector<PairCheck> running;
    for (const NodeCheck& c : todo) {
      errors_before.push_back(NodeErrorCounters(c.node));
      running.push_back(StartPair(c.node, c.partner));
    }
    std::vector<bool> passed;
    for (size_t i = 0; i < todo.size(); ++i) {
      const auto [node, partner] = FinishPair(running[i]);
      passed.push_back(Judge(todo[i], node, partner, errors_before[i], t0));
    }
    return passed;
  }
  // The node's GEMM is judged against its healthy partner's, measured at the same time on the same
  // machines (capped by the launch's healthy figure): a load that slows both -- other jobs, two
  // shared cores -- is no fault of the node, and a node slower than its partner is (CI saw a
  // healthy spare measure 1/8 of the launch's figure while its partner was as slow).
  bool Judge(const NodeCheck& c, const SelfCheckFigures& f, const SelfCheckFigures& partner_now,
             const std::map<std::string, double>& errors_before, Clock::time_point t0) {
    const std::string& node = c.node;
    const std::string& partner = c.partner;
    const std::string& why = c.why;
    std::string errors_rose;
    if (!errors_before.empty()) {
      // The agent samples its host every second: watch at least two samples.
      const double left = 2.2 - Since(t0);
      if (left > 0) std::this_thread::sleep_for(std::chrono::duration<double>(left));
      for (const auto& [name, after] : NodeErrorCounters(node)) {
        auto it = errors_before.find(name);
        const double before = it == errors_before.end() ? 0 : it->second;
        if (after > before) {
          errors_rose += (errors_rose.empty() ? "" : ", ") + name + " +" +
                         std::to_string(static_cast<int64_t>(after - before));
        }
      }
    }
    const double gemm_ref = partner_now.ok && c.partner != c.node && partner_now.gemm_gflops > 0
                                ? std::min(baseline_gemm, partner_now.gemm_gflops)
                                : baseline_gemm;
    const bool gemm_ok = f.ok && f.gemm_gflops >= opt.min_gemm_ratio * gemm_ref;
    const bool bw_ok = f.ok && f.allreduce_gbps >= opt.min_bandwidth_ratio * baseline_bw;
    const bool pass = gemm_ok && bw_ok && errors_rose.empty();
    std::string verdict = pass ? "passed" : "FAILED";
    if (!f.ok)
      verdict += " (" + f.error + ")";
    else if (!gemm_ok)
      verdict += " (GEMM below " + std::to_string(opt.min_gemm_ratio) +
                 " of the healthy figure, or of its partner's now when lower)";
    else if (!bw_ok)
      verdict += " (all-reduce bandwidth below " + std::to_string(opt.min_bandwidth_ratio) +
                 " of the healthy figure)";
    else if (!errors_rose.empty())
      verdict += " (error counters rose during the check: " + errors_rose + ")";
    char line[512];
    std::snprintf(line, sizeof(line),
                  "self-check %s (with %s, %s): GEMM %.2f GFLOP/s (healthy %.2f, its partner now "
                  "%.2f), all-reduce %.3f GB/s (healthy %.3f): %s",
                  node.c_str(), partner.c_str(), why.c_str(), f.gemm_gflops, baseline_gemm,
                  partner_now.gemm_gflops, f.allreduce_gbps, baseline_bw, verdict.c_str());
    Log(line);
    Record(EventKind::kSelfCheck, node, -1,
           {{"passed", pass},
            {"why", why},
            {"partner", partner},
            {"gemm_gflops", f.gemm_gflops},
            {"allreduce_gbps", f.allreduce_gbps},
            {"healthy_gemm_gflops", baseline_gemm},
            {"partner_gemm_gflops", partner_now.gemm_gflops},
            {"healthy_allreduce_gbps", baseline_bw},
            {"error", f.error},
            {"errors_rose", errors_rose},
            {"seconds", Since(t0)}});
    if (!pass) failed_self_check.insert(node);
    return pass;
  }

  Status Baseline() {
    const std::string a = active.at(0), b = active.size() > 1 ? active[1] : active[0];
    auto [fa, fb] = SelfCheckPair(a, b);
    if (!fa.ok) return Internal("the baseline self-check on " + a + " failed: " + fa.error);
    baseline_gemm = fb.ok && a != b ? std::max(fa.gemm_gflops, fb.gemm_gflops) : fa.gemm_gflops;
    baseline_bw = fa.allreduce_gbps;
    char line[256];
    std::snprintf(line, sizeof(line),
                  "healthy figures (%s, %s): GEMM %.2f GFLOP/s, all-reduce %.3f GB/s", a.c_str(),
                  b.c_str(), baseline_gemm, baseline_bw);
    Log(line);
    Record(EventKind::kSelfCheck, a, -1,
           {{"passed", true},
            {"why", "baseline"},
            {"partner", b},
            {"gemm_gflops", baseline_gemm},
            {"allreduce_gbps", baseline_bw}});
    return Status::Ok();
  }

  // ---------------------------------------------------------------- attempts

  std::string HealthyPartner(const std::set<std::string>& avoid) const {
    for (const std::string& n : active) {
      if (!n.empty() && !avoid.count(n)) return n;
    }
    return "";
  }

  std::string NodeOfSlot(int rank) const {
    const int per = opt.world / static_cast<int>(active.size());
    return active.at(static_cast<size_t>(rank / per));
  }

  int FirstRankOf(const std::string& node) const {
    const int per = opt.world / static_cast<int>(active.size());
    for (size_t k = 0; k < active.size(); ++k) {
      if (active[k] == node) return static_cast<int>(k) * per;
    }
    return -1;
  }

  Status StartAttempt(const launch::ResumePoint* resume) {
    AttemptPlan plan;
    plan.attempt = attempt;
    plan.nodes = active;
    if (resume) {
      plan.resume_set = true;
      plan.resume = *resume;
    }
    for (Injection& in : opt.injections) {
      if (!IsWorkerFault(in.kind) || (in.fired && !in.persist)) continue;
      in.fired = false;  // persistent: the node is still broken in this attempt
      int64_t at = in.at_step;
      if (in.persist && resume != nullptr) at = std::max(at, resume->step);
      std::vector<int> ranks;
      if (in.kind == FaultKind::kSlow && in.rank < 0) {  // every rank of the node or the stage
        for (int r = 0; r < opt.world; ++r) {
          const bool of_stage = in.pp >= 0 && r < static_cast<int>(opt.stage_of_rank.size()) &&
                                opt.stage_of_rank[r] == in.pp;
          if (of_stage || (!in.node.empty() && NodeOfSlot(r) == in.node)) ranks.push_back(r);
        }
      } else {
        ranks.push_back(in.rank >= 0 ? in.rank : FirstRankOf(in.node));
      }
      for (int rank : ranks) {
        if (rank < 0 || rank >= opt.world) continue;  // its node is not in the job (any more)
        if (in.planned_rank < 0 || rank < in.planned_rank) in.planned_rank = rank;
        plan.faults.push_back({std::string(Name(in.kind)), rank, at, in.seconds, in.factor});
      }
    }
    for (const std::string& node : active) {
      if (!sup.AgentPort(node)) {
        auto port = sup.StartAgent(node);
        if (!port.ok()) return port.status();
      }
      plan.agent_ports.emplace_back(node, *sup.AgentPort(node));
      if (const launch::Host* h = sup.HostOf(node)) plan.agent_addrs[node] = h->frontend_addr;
    }
    RETURN_IF_ERROR(opt.write_run_json(plan));
    WriteScrapeTargets();
    attempt_start = last_progress = Clock::now();
    attempt_stepped = false;
    straggler_from = resume ? std::max<int64_t>(0, resume->step) : 0;
    stragglers.Reset();
    alerted.clear();
    hb_steps.clear();
    finished_ranks = 0;
    return sup.StartRanks(attempt, active, opt.world);
  }

  // --------------------------------------------------------------- the tick

  void PumpProgress() {
    for (const json& line : progress.Poll()) {
      const std::string event = line.value("event", "");
      const int line_attempt = line.value("attempt", attempt);
      if (event == "fault") {
        Injection* in =
            line_attempt == attempt
                ? FiredInjection(opt.injections, line.value("kind", ""), line.value("rank", -2),
                                 line.value("step", int64_t{-1}))
                : nullptr;
        if (in != nullptr) in->fired = true;
        Log("fault fired: " + line.value("kind", std::string()) + " on rank " +
            std::to_string(line.value("rank", -1)) + " (" + line.value("node", std::string()) +
            ") at step " + std::to_string(line.value("step", 0)));
        Record(EventKind::kFaultInjected, line.value("node", ""), line.value("rank", -1),
               {{"kind", line.value("kind", "")}, {"step", line.value("step", 0)}},
               line.value("ts_ns", int64_t{0}));
      } else if (event == "ready" && line_attempt == attempt) {
        // Where the attempt starts: a launch in a run directory with a checkpoint (an earlier
        // launch's) starts past step 0, and the steps before are not missing from the stream.
        last_step_done = std::max(last_step_done, line.value("step", int64_t{0}));
        Record(EventKind::kCheckpointLoaded, "", -1,
               {{"step", line.value("step", 0)},
                {"source", line.value("source", "none")},
                {"rendezvous_s", line.value("rendezvous_s", 0.0)},
                {"load_s", line.value("load_s", 0.0)}},
               line.value("ts_ns", int64_t{0}));
      } else if (event.empty() && line.contains("step")) {
        std::printf("%s\n", launch::FormatStepLine(line, opt.steps).c_str());
        std::fflush(stdout);
        const int64_t step = line.value("step", last_step_done);
        if (line_attempt == attempt && attempt_stepped && step > last_step_done + 1)
          missing_steps += step - last_step_done - 1;
        last_step_done = step;
        step_times.push_back(line.value("step_time_s", 0.0));
        last_progress = Clock::now();
        if (line_attempt == attempt && !attempt_stepped) {
          attempt_stepped = true;
          RecordSlurmSteps();
          if (incident_start_ns) {
            const int64_t ts = line.value("ts_ns", tracer::WallNowNs());
            Record(EventKind::kResumed, "", -1,
                   {{"step", last_step_done},
                    {"since_trigger_s", static_cast<double>(ts - *incident_start_ns) / 1e9}},
                   ts);
            Log("training resumed: step " + std::to_string(last_step_done) + " done " +
                std::to_string(static_cast<double>(ts - *incident_start_ns) / 1e9).substr(0, 5) +
                " s after the trigger");
            incident_start_ns.reset();
          }
        }
      }
    }
  }

  // Under Slurm: which steps of the job run the attempt (every rank has started by its first step).
  void RecordSlurmSteps() {
    std::string job;
    for (const auto& [node, host] : opt.supervisor.hosts) {
      if (!host.slurm_job.empty()) job = host.slurm_job;
    }
    if (job.empty()) return;
    auto steps = launch::SlurmSteps(job);
    if (!steps.ok()) {
      Log("slurm: cannot list the steps of job " + job + ": " + steps.status().ToString());
      return;
    }
    Record(EventKind::kSlurmSteps, "", -1, {{"job_id", job}, {"steps", *steps}});
  }

  double HangThreshold() const {
    if (!attempt_stepped) return std::max(opt.startup_grace_s, opt.hang_after_s);
    const auto n = static_cast<std::ptrdiff_t>(std::min<size_t>(step_times.size(), 20));
    std::vector<double> recent(step_times.end() - n, step_times.end());
    double median = 0;
    if (!recent.empty()) {
      std::nth_element(recent.begin(),
                       recent.begin() + static_cast<std::ptrdiff_t>(recent.size() / 2),
                       recent.end());
      median = recent[recent.size() / 2];
    }
    return std::max(opt.hang_after_s, opt.hang_factor * median);
  }

  // Reads every agent's /state; true when the job has stalled (no rank's step moved for the
  // threshold) or an op has been open past its budget. `why` says which.
  bool Stalled(std::string* why) {
    const int64_t now = tracer::WallNowNs();
    double oldest_op_s = 0;
    bool moved = false;
    for (const std::string& node : active) {
      const std::string url = sup.AgentUrl(node);
      if (url.empty()) continue;
      auto body = tracer::HttpGet(url + "/state", 1000, agent_token);
      if (!body.ok()) continue;
      json s = json::parse(*body, nullptr, false);
      if (s.is_discarded()) continue;
      for (const json& r : s.value("ranks", json::array())) {
        if (r.value("attempt", -1) != attempt) continue;
        const int rank = r.value("rank", -1);
        const int64_t step = r["heartbeat"].value("step", int64_t{0});
        auto it = hb_steps.find(rank);
        if (it == hb_steps.end() || it->second != step) {
          moved = moved || it != hb_steps.end();
          hb_steps[rank] = step;
        }
        for (const json& e : r.value("open_entries", json::array())) {
          oldest_op_s = std::max(oldest_op_s,
                                 static_cast<double>(now - e.value("enqueued_at_ns", now)) / 1e9);
        }
      }
    }
    if (moved) last_progress = Clock::now();
    const double threshold = HangThreshold();
    if (Since(last_progress) > threshold) {
      char b[160];
      std::snprintf(b, sizeof(b), "no rank's step advanced for %.1f s (threshold %.1f s)",
                    Since(last_progress), threshold);
      *why = b;
      return true;
    }
    if (oldest_op_s > opt.op_timeout_s) {
      *why = "an op has been open for " + std::to_string(static_cast<int>(oldest_op_s)) + " s";
      return true;
    }
    return false;
  }

  // RUN_DIR/prometheus_targets.json: the active nodes' agents, for Prometheus' file_sd. A failure
  // is said, not fatal: the job trains on without the file.
  void WriteScrapeTargets() {
    std::vector<launch::ScrapeTarget> targets;
    for (const std::string& node : active) {
      const std::optional<int> port = sup.AgentPort(node);
      if (!port) continue;
      const launch::Host* h = sup.HostOf(node);
      targets.push_back({node, h != nullptr ? h->frontend_addr : "127.0.0.1", *port});
    }
    if (Status st = launch::WriteScrapeTargets(layout, targets); !st.ok())
      Log("cannot write the Prometheus targets: " + st.message());
  }

  void FireControllerInjections() {
    for (Injection& in : opt.injections) {
      if (in.fired || in.kind != FaultKind::kMetric) continue;
      const bool due = (in.at_seconds >= 0 && Since(launch_start) >= in.at_seconds) ||
                       (in.at_step >= 0 && last_step_done >= in.at_step);
      if (!due) continue;
      proc_faults.at(in.node)->Fire();
      in.fired = true;
      Log("fault fired: metric " + in.what + " on " + in.node +
          (in.seconds > 0 ? " for " + std::to_string(in.seconds).substr(0, 5) + " s" : ""));
      Record(EventKind::kFaultInjected, in.node, -1,
             {{"kind", "metric"}, {"what", in.what}, {"seconds", in.seconds}, {"spec", in.spec}});
    }
    for (Injection& in : opt.injections) {
      if (in.fired || in.kind != FaultKind::kLink) continue;
      const bool due = (in.at_seconds >= 0 && Since(launch_start) >= in.at_seconds) ||
                       (in.at_step >= 0 && last_step_done >= in.at_step);
      if (!due) continue;
      in.fired = true;
      Status st;
      if (HasOwnHost(in.node)) {
        const launch::Host& host = *sup.HostOf(in.node);
        // The ranks (local processes in their hosts' namespaces) are stopped while tc and nft
        // run: a fault due after step N lands there, not however many steps later the tools are
        // done on a busy machine (CI saw a 12-step job finish before they were).
        std::vector<int> stopped;
        for (int r = 0; r < opt.world; ++r) {
          if (sup.SignalRank(r, SIGSTOP)) stopped.push_back(r);
        }
        st = ApplyLinkFault(host, in.link, in.rate_mbps, in.loss_pct);
        for (int r : stopped) sup.SignalRank(r, SIGCONT);
        last_progress = Clock::now();  // no step could advance while they were stopped
        if (st.ok()) {
          net_faults[in.node] = in.seconds > 0
                                    ? Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                         std::chrono::duration<double>(in.seconds))
                                    : Clock::time_point::max();
        }
      } else {
        launch::LinkFault f{in.rate_mbps, 0};
        if (in.seconds > 0)
          f.until_ns = tracer::WallNowNs() + static_cast<int64_t>(in.seconds * 1e9);
        st = launch::WriteLinkFault(link_seams.at(in.node), f);
      }
      if (!st.ok()) {
        Log("cannot inject " + in.spec + ": " + st.ToString());
        continue;
      }
      std::string what = std::string(Name(in.link));
      if (in.link == LinkFaultKind::kSlow)
        what += " (" + std::to_string(in.rate_mbps).substr(0, 6) + " MB/s)";
      if (in.link == LinkFaultKind::kLoss)
        what += " (" + std::to_string(in.loss_pct).substr(0, 5) + " % of packets)";
      Log("fault fired: link " + what + " on " + in.node +
          (HasOwnHost(in.node) ? " (its host's backend link)" : " (link seam)") +
          (in.seconds > 0 ? " for " + std::to_string(in.seconds).substr(0, 5) + " s" : ""));
      Record(EventKind::kFaultInjected, in.node, -1,
             {{"kind", "link"},
              {"what", Name(in.link)},
              {"rate_mbps", in.rate_mbps},
              {"loss_pct", in.loss_pct},
              {"real", HasOwnHost(in.node)},
              {"seconds", in.seconds},
              {"spec", in.spec}});
    }
    for (auto it = net_faults.begin(); it != net_faults.end();) {
      if (Clock::now() < it->second) {
        ++it;
        continue;
      }
      if (Status st = ClearLinkFault(*sup.HostOf(it->first)); !st.ok())
        Log("cannot clear the link fault on " + it->first + ": " + st.ToString());
      else
        Log("link fault on " + it->first + " ended");
      it = net_faults.erase(it);
    }
    for (Injection& in : opt.injections) {
      if (in.fired || in.kind != FaultKind::kKillAgent) continue;
      const bool due = (in.at_seconds >= 0 && Since(launch_start) >= in.at_seconds) ||
                       (in.at_step >= 0 && last_step_done >= in.at_step);
      if (!due || !sup.AgentPort(in.node)) continue;
      in.fired = sup.SignalAgent(in.node, SIGKILL);
      Log("fault fired: kill-agent on " + in.node);
      Record(EventKind::kFaultInjected, in.node, -1, {{"kind", "kill-agent"}, {"spec", in.spec}});
    }
  }

  // ---------------------------------------------------------------- incidents

  struct Trigger {
    std::string cause;  // crash, hang, manual, detector, straggler
    std::string detail;
    std::vector<launch::RankExit> failures;
    std::string manual_node;
    std::vector<Verdict> verdicts;  // detector, straggler: the verdict that opened the incident
    Streak streak;                  // ... and how many analyses in a row named it
  };
  static bool Online(const Trigger& t) { return t.cause == "detector" || t.cause == "straggler"; }

  // A verdict of the job's own error: nothing is evicted for it (policy.h).
  Verdict JobError(const std::string& cause, int rank, const std::string& node,
                   const std::string& explanation, const launch::RankExit& origin) {
    Verdict v;
    v.kind = "job_error";
    v.cause = cause;
    v.root_ranks = {rank};
    v.root_nodes = {node};
    v.detected_at_ns = tracer::WallNowNs();
    v.confidence = 1.0;
    v.explanation = explanation;
    v.evidence = {"exit: " + origin.status.Describe(), "log: " + layout.worker_log(rank)};
    return v;
  }

  // The thresholds an incident's hang analysis decides with: a wait counts from half the hang
  // trigger's threshold (at most the analyzer's 10 s); so does a heartbeat's silence (at least
  // 2 s: a worker beats every 100 ms from a thread of its own, so a rank whose heartbeat is that
  // far behind its peers' while its process exists is frozen, not slow).
  analyzer::HangOptions IncidentHangOptions() const {
    analyzer::HangOptions ho;
    ho.min_wait_s = std::min(10.0, HangThreshold() / 2);
    ho.stale_heartbeat_s = std::clamp(HangThreshold() / 2, 2.0, ho.stale_heartbeat_s);
    return ho;
  }

  std::vector<Verdict> Diagnose(Trigger& t) {
    std::vector<Verdict> verdicts;
    const analyzer::HangOptions ho = IncidentHangOptions();
    if (t.cause == "crash") {
      std::vector<launch::RankExit> others;
      launch::RankExit origin = sup.FindOrigin(t.failures, std::chrono::seconds(2), &others);
      const std::string log_line = LastLogLine(layout.worker_log(origin.rank));
      const std::string node = sup.NodeOfRank(origin.rank);
      if (origin.status.exited() && origin.status.code() == launch::kExitJobError) {
        verdicts.push_back(JobError("bad_input", origin.rank, node,
                                    "rank " + std::to_string(origin.rank) + " (" + node +
                                        ") could not start the job: " + log_line,
                                    origin));
        return verdicts;
      }
      // Failed as before, at the same step, on the node that replaced the one evicted for it.
      const std::string how = MaskDigits(origin.status.Describe() + ": " + log_line);
      if (!last_failure.evicted.empty() && how == last_failure.how &&
          last_step_done == last_failure.step && node != last_failure.evicted) {
        verdicts.push_back(
            JobError("repeated_failure", origin.rank, node,
                     "rank " + std::to_string(origin.rank) + " failed on " + node + " at step " +
                         std::to_string(last_step_done) + " as it did on " + last_failure.evicted +
                         ", evicted for it: the failure follows the job, not the machine (" +
                         origin.status.Describe() + ": " + log_line + ")",
                     origin));
        return verdicts;
      }
      if (!(origin.status.exited() && origin.status.code() == launch::kExitCommFailure)) {
        last_failure = {how, last_step_done, node};
        Verdict v;
        v.kind = "hang";
        v.cause = "rank_dead";
        v.root_ranks = {origin.rank};
        v.root_nodes = {sup.NodeOfRank(origin.rank)};
        v.detected_at_ns = tracer::WallNowNs();
        v.confidence = 1.0;
        v.explanation = "rank " + std::to_string(origin.rank) + " (" + v.root_nodes[0] + ") " +
                        origin.status.Describe() + "; its peers then failed their collectives";
        v.evidence = {"exit: " + origin.status.Describe(),
                      "log: " + layout.worker_log(origin.rank)};
        verdicts.push_back(v);
        // Another rank that died of its own failure at the same time, on another node, is a
        // second root: both machines are acted on in this incident.
        std::set<std::string> named = {v.root_nodes[0]};
        for (const launch::RankExit& o : others) {
          const bool own = !o.status.success() &&
                           !(o.status.exited() && o.status.code() == launch::kExitCommFailure);
          const std::string o_node = sup.NodeOfRank(o.rank);
          if (!own || !named.insert(o_node).second) continue;
          Verdict w = v;
          w.root_ranks = {o.rank};
          w.root_nodes = {o_node};
          w.explanation = "rank " + std::to_string(o.rank) + " (" + o_node + ") " +
                          o.status.Describe() + " too, at the same time";
          w.evidence = {"exit: " + o.status.Describe(), "log: " + layout.worker_log(o.rank)};
          verdicts.push_back(w);
        }
        return verdicts;
      }
      // Every failure was a peer's timeout: the cause is in the flight recorders.
      sup.CollectDumps(std::chrono::seconds(3));
      auto in = analyzer::LoadDumpDirectory(layout.dumps(attempt));
      if (in.ok()) {
        for (const std::string& w : in->warnings) Log("warning: " + w);
        verdicts = analyzer::AnalyzeHang(*in, ho);
      }
    } else if (t.cause == "hang") {
      std::vector<std::string> urls;
      for (const std::string& n : active) {
        if (!sup.AgentUrl(n).empty()) urls.push_back(sup.AgentUrl(n));
      }
      auto in = analyzer::LoadFromAgents(urls, attempt, agent_token);
      if (in.ok()) {
        for (const std::string& w : in->warnings) Log("warning: " + w);
        verdicts = analyzer::AnalyzeHang(*in, ho);
      } else {
        Log("hang analysis could not read the agents: " + in.status().ToString());
      }
    }
    if (verdicts.empty() || (verdicts.size() == 1 && verdicts[0].kind == "healthy")) {
      Verdict v;
      v.kind = "hang";
      v.cause = "unknown";
      v.detected_at_ns = tracer::WallNowNs();
      v.explanation =
          "the job stopped (" + t.detail + ") but no rank could be blamed from the evidence";
      verdicts = {v};
    }
    return verdicts;
  }

  void RecordDecision(const Verdict& v, const Decision& d, Streak streak = {}) {
    Record(EventKind::kDecision, d.nodes.empty() ? "" : d.nodes[0],
           v.root_ranks.empty() ? -1 : v.root_ranks[0],
           {{"action", Name(d.action)},
            {"reason", d.reason},
            {"repeats", streak.repeats},
            {"repeats_by_compute", streak.by_compute},
            {"nodes", d.nodes},
            {"verdict", VerdictToJsonValue(v)}});
  }

  // An online verdict (detector, straggler): recorded with the policy's decision; an alert is
  // reported once per attempt, anything more opens an incident. False: the controller paused.
  bool Act(const std::string& source, const Verdict& v, Streak streak) {
    bool in_job = v.root_nodes.empty();
    for (const std::string& n : v.root_nodes)
      in_job |= std::find(active.begin(), active.end(), n) != active.end();
    if (!in_job) return true;  // an evicted node's silence, or a node that left meanwhile
    bool passed_before = false;
    for (const std::string& n : v.root_nodes) passed_before |= cleared.count(n + "|" + v.cause) > 0;
    const Decision d = Decide(v, streak, opt.policy, passed_before);
    std::string key = std::string(Name(d.action)) + "|" + v.kind + "|" + v.cause;
    for (const std::string& n : v.root_nodes) key += "|" + n;
    if (d.action == Action::kAlert && !alerted.insert(key).second) return true;
    Log(source + " verdict: " + v.kind + " " + v.cause + " on " +
        (v.root_nodes.empty() ? std::string("-") : Join(v.root_nodes)) + ": " + v.explanation);
    Log("policy: " + std::string(Name(d.action)) + " (" + d.reason + ")");
    if (d.action == Action::kAlert || d.action == Action::kRestartInPlace) {
      Record(EventKind::kVerdict, v.root_nodes.empty() ? "" : v.root_nodes[0],
             v.root_ranks.empty() ? -1 : v.root_ranks[0], VerdictToJsonValue(v));
      RecordDecision(v, d, streak);
      return true;
    }  // an incident records the verdict and the decision after its trigger
    Trigger t{source, v.kind + " " + v.cause + " on " + Join(v.root_nodes), {}, "", {v}, streak};
    return Incident(std::move(t));
  }

  // The online evidence of this tick; false: the controller paused.
  bool Watch() {
    if (online && Since(last_scrape) >= opt.detector_tick_s) {
      last_scrape = Clock::now();
      std::map<std::string, std::string> pages;
      for (const std::string& n : active) {
        const std::string url = sup.AgentUrl(n);
        if (url.empty()) continue;
        auto page = tracer::HttpGet(url + "/metrics", 1000, agent_token);
        if (page.ok()) pages[n] = std::move(*page);
      }
      const MetricsRound round =
          ParseMetricsRound(pages, static_cast<double>(tracer::WallNowNs()) / 1e9);
      for (const std::string& e : round.errors) Log("metrics: " + e);
      for (const Verdict& v : online->Add(round)) {
        if (!Act("detector", v, {})) return false;
      }
    }
    if (opt.straggler_every > 0 && attempt_stepped &&
        last_step_done - straggler_from >= opt.straggler_every) {
      // Windows of straggler_every steps (0-based), each read once every rank's end of it is
      // stored; a window still incomplete when the job is a whole window past it is read as it
      // is (a rank's agent may be gone; the hang and crash paths see to that).
      const int64_t first = straggler_from, last = first + opt.straggler_every - 1;
      const bool anyway = last_step_done - 1 >= last + opt.straggler_every;
      analyzer::SlowOptions so;
      so.compute_ratio = opt.straggler_ratio;
      so.min_cost_s = opt.straggler_min_cost_s;
      so.min_peers = 2;  // with one peer, shared-machine noise alone can make either look slow
      auto found = stragglers.Analyze(layout.dir(), attempt, first, last, opt.world, anyway, so);
      const std::string steps =
          "straggler analysis of steps " + std::to_string(first) + ".." + std::to_string(last);
      if (found.ok() && !*found) return true;  // not stored yet: the next poll looks again
      straggler_from = last + 1;
      if (!found.ok()) {
        Log(steps + ": " + found.status().ToString());
        return true;
      }
      if ((*found)->empty())
        Log(steps + ": no straggler" +
            (anyway ? " (read before every rank's steps were stored)" : ""));
      for (const StragglerWatch::Finding& f : **found) {
        if (!Act("straggler", f.verdict, f.streak)) return false;
        if (f.verdict.cause != "stage_imbalance" && !attempt_stepped) break;  // restarted
      }
    }
    return true;
  }

  void Pause(const std::string& reason) {
    Log("PAUSED: " + reason);
    std::fprintf(stderr,
                 "[launch] paused: %s\n[launch] the job is stopped; nothing more is evicted "
                 "without a person. "
                 "Fix the cause and start 'megascope launch' again in the same run directory to "
                 "resume from the newest state.\n",
                 reason.c_str());
    Record(EventKind::kPaused, "", -1, {{"reason", reason}});
  }

  // Evicts `node` (stops its agent, drops its memory) and fills its slot; false: paused.
  bool Evict(const std::string& node, const std::string& reason, const json& verdict) {
    const auto now = Clock::now();
    std::erase_if(eviction_times, [&](Clock::time_point t) {
      return std::chrono::duration<double>(now - t).count() > opt.eviction_window_s;
    });
    if (static_cast<int>(eviction_times.size()) >= opt.max_evictions) {
      Pause("evicting " + node + " would make " + std::to_string(eviction_times.size() + 1) +
            " evictions within " + std::to_string(static_cast<int>(opt.eviction_window_s)) +
            " s (--max-evictions " + std::to_string(opt.max_evictions) +
            "): more faults than a healthy fleet has; a person should look");
      return false;
    }
    eviction_times.push_back(now);
    sup.StopAgent(node, /*wait=*/false);  // it drains its last records while the spare is checked
    std::error_code ec;
    fs::remove_all(NodeMemoryDir(opt.supervisor.shm_dir, opt.supervisor.job, node),
                   ec);  // its memory is gone with it
    evicted[node] = now;
    Log("evicted " + node + " (" + reason + ")");
    Record(EventKind::kEviction, node, -1, {{"reason", reason}, {"verdict", verdict}});
    const auto slot = std::find(active.begin(), active.end(), node);
    *slot = "";
    // Re-admission: an evicted node may stand by again after readmit_after_s, and passes a
    // self-check like any spare.
    if (opt.readmit_after_s > 0) {
      for (auto& [n, when] : evicted) {
        if (n != node && std::chrono::duration<double>(now - when).count() > opt.readmit_after_s &&
            std::find(spares.begin(), spares.end(), n) == spares.end() &&
            std::find(active.begin(), active.end(), n) == active.end()) {
          spares.push_back(n);
        }
      }
    }
    std::set<std::string> avoid(active.begin(), active.end());
    while (!spares.empty()) {
      const std::string spare = spares.front();
      spares.pop_front();
      if (SelfCheck(spare, HealthyPartner({node}), "spare for " + node)) {
        *slot = spare;
        Log(spare + " joins in place of " + node);
        return true;
      }
    }
    Pause("no spare node left to replace " + node + ": add a healthy node (--spares) or fix " +
          node);
    return false;
  }

  // Handles one incident; false when the controller paused.
  bool Incident(Trigger t) {
    // An attempt that failed before completing a step, three times in a row, is a loop, not bad
    // luck.
    fruitless_attempts = attempt_stepped ? 0 : fruitless_attempts + 1;
    const int64_t trigger_ns = tracer::WallNowNs();
    incident_start_ns = trigger_ns;
    Log("trigger: " + t.cause + (t.detail.empty() ? "" : " (" + t.detail + ")"));
    Record(EventKind::kTrigger, t.manual_node, -1, {{"cause", t.cause}, {"detail", t.detail}},
           trigger_ns);
    std::vector<Verdict> verdicts = t.verdicts;
    if (t.cause != "manual" && !Online(t)) verdicts = Diagnose(t);
    incident_step = last_step_done;
    incident_ranks.clear();
    for (const Verdict& v : verdicts) {
      incident_ranks.insert(incident_ranks.end(), v.root_ranks.begin(), v.root_ranks.end());
      Log("verdict: " + v.cause + " " + v.explanation);
      Record(EventKind::kVerdict, v.root_nodes.empty() ? "" : v.root_nodes[0],
             v.root_ranks.empty() ? -1 : v.root_ranks[0], VerdictToJsonValue(v));
    }
    const auto stop0 = Clock::now();
    // A job that is still running has no hang to explain: its flight recorders are not needed.
    const std::vector<int> no_dump =
        Online(t) ? std::vector<int>{} : sup.CollectDumps(std::chrono::seconds(3));
    // Beside the dumps, why they were taken: `megascope analyze hang` on them decides as this
    // incident did (FORMATS: the run directory).
    if (!Online(t)) {
      if (Status st = analyzer::WriteIncidentThresholds(layout.dumps(attempt), t.cause, t.detail,
                                                        attempt, IncidentHangOptions());
          !st.ok())
        Log("warning: " + st.message());
    }
    sup.StopRanks();
    Record(EventKind::kStopped, "", -1,
           {{"seconds", Since(stop0)}, {"ranks_without_dump", no_dump}});
    const int64_t lost = last_step_done;
    // The policy (policy.h) decides per verdict; the controller carries it out.
    std::vector<std::pair<std::string, json>> to_evict;
    std::map<std::string, bool> checked_now;  // node -> passed its self-check in this incident
    std::string restart_cause = t.cause;
    if (t.cause == "manual") to_evict.emplace_back(t.manual_node, json{{"kind", "manual"}});
    for (const Verdict& v : verdicts) {
      const json vj = VerdictToJsonValue(v);
      restart_cause = v.cause;
      const Streak streak = Online(t) ? t.streak : Streak{};
      const Decision d = Decide(v, streak, opt.policy);
      RecordDecision(v, d, streak);
      if (d.action == Action::kStop) {
        Pause("the job's own error, not a machine's: " + v.explanation + " (" + d.reason +
              "; log: " + layout.worker_log(v.root_ranks.empty() ? 0 : v.root_ranks[0]) + ")");
        return false;
      }
      if (d.action == Action::kEvict) {
        for (const std::string& n : d.nodes) to_evict.emplace_back(n, vj);
      } else if (d.action == Action::kSelfCheck) {
        std::set<std::string> suspects(d.nodes.begin(), d.nodes.end());
        std::vector<NodeCheck> todo;
        for (const std::string& n : suspects) {
          const std::string partner = HealthyPartner(suspects);
          // Several verdicts of one incident often name the same node (both directions of a
          // stalled link): it is checked once.
          if (checked_now.count(n)) continue;
          todo.push_back({n, partner.empty() ? n : partner,
                          v.kind == "faulty_machine" ? "suspect of the detector"
                          : v.cause == "link_stall"  ? "end of a stalled link"
                                                     : "suspect: " + v.cause});
        }
        const std::vector<bool> results = SelfCheckAll(todo);  // every suspect at once
        for (size_t i = 0; i < todo.size(); ++i) {
          const std::string& n = todo[i].node;
          const bool passed = results[i];
          checked_now[n] = passed;
          Record(EventKind::kDecision, n, -1,
                 {{"action", passed ? "keep" : "evict"},
                  {"confirmed", !passed},
                  {"reason", passed ? "passed its self-check: the verdict is not confirmed"
                                    : "failed its self-check: the verdict is confirmed"},
                  {"verdict", vj}});
          if (!passed) to_evict.emplace_back(n, vj);
          if (passed) cleared.insert(n + "|" + v.cause);
        }
        if (to_evict.empty())
          Log("every suspect passed its self-check (the verdict is not confirmed): restarting in "
              "place");
      } else {
        Log("verdict " + v.cause + ": " + d.reason + ": restarting in place");
      }
    }
    std::set<std::string> done;
    for (const auto& [node, vj] : to_evict) {
      if (node.empty() || !done.insert(node).second) continue;
      if (std::find(active.begin(), active.end(), node) == active.end()) continue;
      if (!Evict(node, t.cause == "manual" ? "manual" : vj.value("cause", t.cause), vj))
        return false;
    }
    if (fruitless_attempts >= 3) {
      Pause(std::to_string(fruitless_attempts) +
            " attempts in a row failed before completing a step (last: " + restart_cause +
            "); restarting again would loop");
      return false;
    }
    CorruptIfInjected();
    return Restart(restart_cause, lost);
  }

  // Starts the next attempt on the active nodes from the newest state (a memory snapshot, else a
  // disk checkpoint); `lost`: the steps done before the stop. False when the controller paused.
  bool Restart(const std::string& restart_cause, int64_t lost) {
    launch::ResumePoint resume = launch::FindResumePoint(layout, MemoryDirs(), opt.world);
    if (!resume.log.empty()) std::printf("%s", resume.log.c_str());
    ++attempt;
    const int64_t resume_step = std::max<int64_t>(resume.step, 0);
    Log("restart: attempt " + std::to_string(attempt) + " on " + Join(active) +
        ", resuming after step " + std::to_string(resume_step) + " (" + resume.source + "), " +
        std::to_string(std::max<int64_t>(0, lost - resume_step)) + " step(s) to redo");
    Record(EventKind::kRestart, "", -1,
           {{"cause", restart_cause},
            {"nodes", active},
            {"resume_step", resume_step},
            {"source", resume.source},
            {"steps_lost", std::max<int64_t>(0, lost - resume_step)},
            {"last_step_done", lost}});
    last_step_done = resume_step;
    if (Status st = StartAttempt(&resume); !st.ok()) {
      Pause("attempt " + std::to_string(attempt) + " could not start: " + st.ToString());
      return false;
    }
    return true;
  }

  void CorruptIfInjected() {
    for (Injection& in : opt.injections) {
      if (in.fired || in.kind != FaultKind::kCorruptCheckpoint) continue;
      in.fired = true;
      const std::vector<std::string> memory = MemoryDirs();
      std::vector<std::string> victims;
      const launch::ResumePoint mem = launch::FindMemorySnapshot(memory, opt.world);
      if (mem.step >= 0) {
        for (const std::string& dir : memory) {
          const std::string f = dir + "/" + launch::MemoryShardName(0, mem.step);
          if (fs::exists(f)) victims.push_back(f);
        }
      }
      const launch::ResumePoint disk = launch::FindDiskCheckpoint(layout, opt.world);
      if (disk.step >= 0) victims.push_back(disk.files[0]);
      for (const std::string& f : victims) {
        std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
        io.seekp(40);
        io.put('\x5a');
      }
      Log("fault fired: corrupt-checkpoint (" + std::to_string(victims.size()) +
          " newest shard file(s) of rank 0)");
      Record(EventKind::kFaultInjected, "", 0,
             {{"kind", "corrupt-checkpoint"},
              {"files", victims},
              {"memory_step", mem.step},
              {"disk_step", disk.step}});
    }
  }

  static std::string Join(const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
    return s;
  }

  // --------------------------------------------------------------- disk space

  // Takes a stop request out of the control queue (other commands wait for the job to run).
  bool StopRequested() {
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
  std::optional<int> WaitForSpace(const std::string& why) {
    Log("PAUSED: " + why);
    Log("the ranks stop now and keep their newest state in memory; training resumes by itself "
        "once space is back ('megascope stop --run-dir " +
        layout.dir() + "' ends it)");
    incident_start_ns = tracer::WallNowNs();
    Record(EventKind::kPaused, "", -1,
           {{"reason", why}, {"cause", "disk_full"}, {"resumes_by_itself", true}});
    sup.StopRanks();
    PumpProgress();  // the steps done before the stop
    const int64_t lost = last_step_done;
    const auto tick = std::chrono::duration<double>(opt.tick_s);
    for (std::string still;;) {
      if (!disk.Short(&still) && FlushRecords()) break;
      std::this_thread::sleep_for(tick);
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
  std::string LostRecords() {
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
  void WriteOwnFile(const std::string& path, const Result<std::string>& text,
                    const std::string& said) {
    Status st = text.ok() ? tracer::WriteFileAtomic(path, *text) : text.status();
    if (st.ok()) {
      Log(said);
      return;
    }
    Log("cannot write " + path + ": " + st.ToString());
    unwritten.push_back(path);
  }

  // ------------------------------------------------------------------ run

  // Start-up ended by Ctrl-C or SIGTERM (before any step): says so and stops what it started.
  int StartInterrupted(const std::string& during) {
    Log("interrupted during start-up (" + during + "): stopping every process");
    sup.StopRanks();
    sup.StopAgents();
    ClearNetFaults();
    return kLaunchStopped;
  }
  // A start-up phase's failure: the interruption, where there was one (its processes saw it too).
  int StartFailed(const std::string& during, const std::string& error) {
    if (g_interrupted) return StartInterrupted(during);
    std::fprintf(stderr, "megascope launch: %s\n", error.c_str());
    sup.StopAgents();
    return kLaunchFailed;
  }

  int Run() {
    // From the first moment: an interruption during start-up (the baseline self-check takes
    // seconds) is said and cleaned up like one during training.
    struct sigaction sa {
    }, old_int{}, old_term{};
    sa.sa_handler = &OnInterrupt;
    ::sigaction(SIGINT, &sa, &old_int);
    ::sigaction(SIGTERM, &sa, &old_term);
    const int rc = RunInterruptible();
    ::sigaction(SIGINT, &old_int, nullptr);
    ::sigaction(SIGTERM, &old_term, nullptr);
    return rc;
  }

  int RunInterruptible() {
    if (Status st = Setup(); !st.ok()) return StartFailed("setup", st.ToString());
    for (const std::string& node : active) {
      if (g_interrupted) return StartInterrupted("starting the agents");
      if (auto port = sup.StartAgent(node); !port.ok())
        return StartFailed("starting the agents", port.status().message());
    }
    if (g_interrupted) return StartInterrupted("starting the agents");
    if (Status st = Baseline(); !st.ok())
      return StartFailed("the baseline self-check", st.ToString());
    if (g_interrupted) return StartInterrupted("the baseline self-check");
    Log(std::to_string(opt.world) + " ranks on " + Join(active) +
        (spares.empty() ? "" : "; spares " + Join({spares.begin(), spares.end()})) +
        "; control: megascope evict NODE --run-dir " + layout.dir() +
        " | megascope stop --run-dir " + layout.dir());
    launch::ResumePoint resume;  // a fresh run: from scratch, or the newest disk checkpoint
    if (adopted) {
      resume = launch::FindResumePoint(layout, MemoryDirs(), opt.world);
      if (!resume.log.empty()) std::printf("%s", resume.log.c_str());
      last_step_done = std::max<int64_t>(resume.step, 0);
      Log("adopted: resuming after step " + std::to_string(last_step_done) + " (" + resume.source +
          ")");
    }
    Record(EventKind::kRestart, "", -1,
           {{"cause", adopted ? "adopted" : "start"},
            {"nodes", active},
            {"resume_step", std::max<int64_t>(resume.step, 0)},
            {"source", resume.source}});
    if (Status st = StartAttempt(adopted ? &resume : nullptr); !st.ok())
      return StartFailed("starting the ranks", st.ToString());
    int rc = Loop();
    sup.StopRanks();
    sup.StopAgents();
    ClearNetFaults();
    PumpProgress();
    if (rc == kLaunchFinished || rc == kLaunchPaused || rc == kLaunchStopped) {
      const std::string lost = LostRecords();
      Record(EventKind::kJobFinished, "", -1,
             {{"status", rc == kLaunchFinished ? "finished"
                         : rc == kLaunchPaused ? "paused"
                                               : "stopped"},
              {"steps", last_step_done},
              {"wall_s", Since(launch_start)},
              {"records_lost", lost}});
    }
    WriteOwnFile(layout.report_md(), BuildReport(layout.dir()), "report: " + layout.report_md());
    WriteTimeline();  // before the HTML report, which links it
    WriteOwnFile(layout.dir() + "/report.html", BuildHtmlReport(layout.dir()),
                 "report: " + layout.dir() + "/report.html (megascope report --html)");
    if (const std::string lost = LostRecords(); !lost.empty()) {
      std::fprintf(stderr,
                   "megascope launch: the run could not keep all its records (a full disk?): %s\n",
                   lost.c_str());
      if (rc == kLaunchFinished) rc = kLaunchIncomplete;
    }
    if (rc == kLaunchFinished) {  // the state in memory is only needed to resume
      std::error_code ec;
      fs::remove_all(MemoryRoot(opt.supervisor.shm_dir, opt.supervisor.job), ec);
    }
    return rc;
  }

  // timeline.html: the steps around the last incident (its root ranks highlighted), else the first
  // ones.
  void WriteTimeline() {
    analyzer::TimelineOptions o;
    o.first_step = std::max<int64_t>(0, incident_step - 3);
    o.last_step = incident_step + 3;
    o.highlight_ranks = incident_ranks;
    o.title = "megascope launch " + layout.dir() +
              (incident_ranks.empty() ? "" : ", steps around the last incident");
    auto db = analyzer::RunDatabase::Open(layout.dir());
    if (!db.ok()) return;
    auto j = analyzer::TimelineJson(**db, o);
    if (j.ok()) {
      WriteOwnFile(layout.timeline_html(), analyzer::TimelineHtml(*j, o),
                   "timeline: " + layout.timeline_html());
    }
  }

  int Loop() {
    const auto tick = std::chrono::duration<double>(opt.tick_s);
    for (;;) {
      std::this_thread::sleep_for(tick);
      if (g_interrupted) {
        Log("interrupted: stopping every process");
        return kLaunchStopped;
      }
      PumpProgress();
      if (std::string why; disk.Short(&why)) {
        if (auto rc = WaitForSpace(why)) return *rc;
        continue;
      }
      std::deque<Command> todo;
      {
        std::lock_guard<std::mutex> lock(mu);
        todo.swap(commands);
        nodes_known = active;
      }
      for (const Command& c : todo) {
        if (c.what == "stop") {
          Log("stop requested through the control endpoint");
          PumpProgress();
          return kLaunchStopped;
        }
        if (std::find(active.begin(), active.end(), c.node) == active.end()) {
          Log("evict " + c.node + " ignored: not a node of the job (" + Join(active) + ")");
          continue;
        }
        if (!Incident({"manual", "evict requested for " + c.node, {}, c.node, {}, Streak{}}))
          return kLaunchPaused;
      }
      FireControllerInjections();
      for (const launch::AgentExit& a : sup.PollAgents()) {
        if (std::find(active.begin(), active.end(), a.node) == active.end()) continue;
        auto port =
            sup.StartAgent(a.node);  // its rings wait for it; cursors in trace.db say where it was
        Log("agent of " + a.node + " " + a.status.Describe() + ": restarted" +
            (port.ok() ? "" : " FAILED: " + port.status().message()));
        Record(EventKind::kAgentRestarted, a.node, -1,
               {{"exit", a.status.Describe()}, {"ok", port.ok()}});
        if (port.ok()) WriteScrapeTargets();  // it listens on another port now
      }
      std::vector<launch::RankExit> failures;
      for (const launch::RankExit& e : sup.PollRanks()) {
        if (e.status.success())
          ++finished_ranks;
        else
          failures.push_back(e);
      }
      if (!failures.empty()) {
        const launch::RankExit& f = failures[0];
        if (!Incident({"crash",
                       "rank " + std::to_string(f.rank) + " " + f.status.Describe(),
                       failures,
                       "",
                       {},
                       Streak{}}))
          return kLaunchPaused;
        continue;
      }
      if (finished_ranks == opt.world) {
        PumpProgress();
        if (last_step_done < opt.steps) {  // the ranks ran them; their lines never arrived
          missing_steps += opt.steps - last_step_done;
          Log("every rank finished, but the progress stream stops at step " +
              std::to_string(last_step_done) + " of " + std::to_string(opt.steps));
        }
        Log("done: " + std::to_string(opt.steps) + " steps in " +
            std::to_string(static_cast<int>(Since(launch_start))) + " s");
        last_step_done = opt.steps;
        return kLaunchFinished;
      }
      if (!Watch()) return kLaunchPaused;
      std::string why;
      if (Stalled(&why)) {
        if (!Incident({"hang", why, {}, "", {}, Streak{}})) return kLaunchPaused;
      }
    }
  }
};

Controller::Controller(ControllerOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}
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
