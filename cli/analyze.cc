// `megascope analyze hang`: the rank at the root of a hang, from flight-recorder dumps.
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "command.h"
#include "megascope/analyzer/hang.h"
#include "megascope/analyzer/live.h"
#include "megascope/analyzer/pytorch.h"
#include "megascope/analyzer/slow.h"
#include "megascope/analyzer/stacks.h"
#include "megascope/controller/control_db.h"
#include "megascope/tracer/file_util.h"
#include "megascope/tracer/format.h"
#include "megascope/tracer/run_layout.h"

namespace megascope::cli {
namespace {

// "3 s", "1.5 s", "0.25 s": a threshold as a person reads it (not 0.29999999999999999).
std::string Seconds(double s) { return tracer::Format("%g s", s); }

}  // namespace

namespace {

struct SlowIncident {
  std::map<std::string, double> thresholds;
  std::string what;  // "compute_straggler rank 2 on node2, steps 8..15 of attempt 0"
};

// The newest slow verdict a launch recorded in RUN_DIR/control.db with its thresholds, if any.
std::optional<SlowIncident> NewestSlowIncident(const std::string& run_dir) {
  const std::string path = RunLayout(run_dir).control_db();
  if (!std::filesystem::exists(path)) return std::nullopt;
  auto db = controller::ControlDb::Open(path, /*read_only=*/true);
  if (!db.ok()) return std::nullopt;
  auto events = (*db)->Events();
  if (!events.ok()) return std::nullopt;
  // The incident is the straggler the controller acted on (a decision other than an alert, or an
  // eviction, carries its verdict), the one it evicted for first of all: a later self-check that
  // cleared a node changed nothing. A run where it only alerted falls back to its newest verdict.
  const std::set<int64_t> acted = controller::ActedOnVerdicts(*events);
  std::set<int64_t> evicted;
  for (const controller::Event& e : *events) {
    if (e.kind == controller::EventKind::kEviction && e.detail.contains("verdict"))
      evicted.insert(controller::VerdictId(e.detail["verdict"]));
  }
  std::optional<SlowIncident> newest, newest_acted, newest_evicted;
  for (const controller::Event& e : *events) {
    if (e.kind != controller::EventKind::kVerdict || e.detail.value("kind", "") != "slow") continue;
    const auto t = e.detail.find("thresholds");
    if (t == e.detail.end() || !t->is_object()) continue;
    SlowIncident in;
    for (const auto& [k, v] : t->items()) {
      if (v.is_number()) in.thresholds[k] = v.get<double>();
    }
    in.what = e.detail.value("cause", "") + (e.rank >= 0 ? " rank " + std::to_string(e.rank) : "") +
              (e.node.empty() ? "" : " on " + e.node) + ", steps " +
              std::to_string(static_cast<int64_t>(in.thresholds["first_step"])) + ".." +
              std::to_string(static_cast<int64_t>(in.thresholds["last_step"])) + " of attempt " +
              std::to_string(static_cast<int64_t>(in.thresholds["attempt"]));
    const int64_t id = controller::VerdictId(e.detail);
    if (evicted.count(id)) newest_evicted = in;
    if (acted.count(id)) newest_acted = in;
    newest = std::move(in);
  }
  if (newest_evicted) return newest_evicted;
  return newest_acted ? newest_acted : newest;
}

// What `analyze` was asked.
struct AnalyzeArgs {
  std::string what, source, agents, pytorch, steps, token_file;
  bool json = false, stacks = false, whole_run = false;
  analyzer::HangOptions ho;
  analyzer::PyTorchLoadOptions torch;
  bool min_wait_given = false, stale_given = false;  // on the command line
};

int RunSlow(const AnalyzeArgs& a) {
  if (a.source.empty()) return Fail("analyze", "analyze slow needs a run directory", kExitUsage);
  analyzer::SlowOptions so;
  if (!a.steps.empty()) {
    std::string why;
    const std::optional<StepRange> range = ParseStepRange(a.steps, &why);
    if (!range) return Fail("analyze", why, kExitUsage);
    so.first_step = range->first;
    so.last_step = range->last;
  }
  // A run whose launch named a straggler is re-analysed as that incident decided (its window and
  // thresholds, recorded with the verdict in control.db) unless steps are given: over the whole
  // run the straggler may be diluted into 'healthy'.
  if (a.steps.empty() && !a.whole_run) {
    if (auto incident = NewestSlowIncident(a.source)) {
      so = analyzer::SlowOptionsFrom(incident->thresholds, so);
      std::fprintf(stderr,
                   "megascope analyze: re-analysing the straggler incident of this run (%s, "
                   "recorded in control.db) with its window and thresholds; --whole-run or "
                   "--steps A:B to look elsewhere\n",
                   incident->what.c_str());
    }
  }
  // Only the window asked for is read (past SQLite's attach limit, only it is copied).
  auto db = analyzer::RunDatabase::Open(a.source, {so.attempt, so.first_step, so.last_step, ""});
  if (!db.ok()) return Fail("analyze", db.status().message());
  Warn("analyze", (*db)->warnings());
  auto rep = analyzer::AnalyzeSlow(**db, so);
  if (!rep.ok()) return Fail("analyze", rep.status().message());
  if (a.json) {
    for (const Verdict& v : rep->verdicts) std::printf("%s\n", VerdictToJson(v).c_str());
  } else {
    std::printf("%s", analyzer::FormatSlowReport(*rep).c_str());
  }
  return 0;
}

// The hang thresholds to decide with, and a line saying where they come from: dumps an incident
// collected are re-analysed as it decided, unless thresholds are given.
Result<std::string> ResolveThresholds(const AnalyzeArgs& a, analyzer::HangOptions& ho) {
  std::string from = "defaults";
  if (!a.source.empty()) {
    ASSIGN_OR_RETURN(auto incident, analyzer::ReadIncidentThresholds(a.source));
    if (incident) {
      if (!a.min_wait_given) ho.min_wait_s = incident->options.min_wait_s;
      if (!a.stale_given) ho.stale_heartbeat_s = incident->options.stale_heartbeat_s;
      from = "the incident (" + incident->trigger + ") that collected these dumps, " +
             incident->source;
    }
  }
  if (a.min_wait_given || a.stale_given) from = "the command line";
  return "thresholds: a wait counts after " + Seconds(ho.min_wait_s) + ", a heartbeat is stale " +
         Seconds(ho.stale_heartbeat_s) + " behind its peers' (from " + from + ")";
}

int RunHang(const AnalyzeArgs& a) {
  if (a.source.empty() + a.agents.empty() + a.pytorch.empty() != 2) {
    return Fail("analyze", "give one of: a dump or run directory, --agents URL,..., --pytorch DIR",
                kExitUsage);
  }
  if (a.torch.ft_group_world_size < 0 || (a.torch.ft_group_world_size > 0 && a.pytorch.empty()))
    return Fail("analyze", "--transform-ft takes a group world size >= 1, with --pytorch",
                kExitUsage);
  std::vector<std::string> urls;
  std::stringstream ss(a.agents);
  for (std::string u; std::getline(ss, u, ',');) {
    if (!u.empty()) urls.push_back(u);
  }
  std::string token;
  if (!a.token_file.empty()) {
    auto t = tracer::ReadToken(a.token_file);
    if (!t.ok()) return Fail("analyze", t.status().message(), kExitUsage);
    token = *t;
  }
  // PyTorch's dumps are read with PyTorch's semantics (analyzer/pytorch.h), the rest as ours.
  std::optional<analyzer::PyTorchInput> torch_in;
  if (!a.pytorch.empty()) {
    auto t = analyzer::LoadPyTorch(a.pytorch, a.torch);
    if (!t.ok()) return Fail("analyze", t.status().message());
    torch_in = std::move(*t);
  }
  analyzer::HangOptions ho = a.ho;
  auto thresholds = ResolveThresholds(a, ho);
  if (!thresholds.ok()) return Fail("analyze", thresholds.status().message());
  Result<analyzer::HangInput> loaded = analyzer::HangInput{};
  if (!torch_in)
    loaded = !urls.empty() ? analyzer::LoadFromAgents(urls, -1, token, a.stacks)
                           : analyzer::LoadDumpDirectory(a.source);
  if (!loaded.ok()) return Fail("analyze", loaded.status().message());
  const analyzer::HangInput* in = torch_in ? &torch_in->hang : &*loaded;
  for (const std::string& w : in->warnings)
    std::fprintf(stderr, "megascope analyze: warning: %s\n", w.c_str());
  auto verdicts =
      torch_in ? analyzer::AnalyzePyTorch(*torch_in, ho) : analyzer::AnalyzeHang(*in, ho);
  for (Verdict& v : verdicts) {
    v.evidence.push_back(*thresholds);  // what decided it
    for (const std::string& w : in->warnings) v.evidence.push_back("input: " + w);
  }
  if (a.json) {
    for (const Verdict& v : verdicts) std::printf("%s\n", VerdictToJson(v).c_str());
  } else {
    std::printf("%s", analyzer::FormatHangReport(verdicts).c_str());
    std::printf("%s\n", thresholds->c_str());
    std::printf("%s", analyzer::FormatStackGroups(analyzer::GroupByStack(*in)).c_str());
  }
  return 0;
}

}  // namespace

int RunAnalyze(const Args& args) {
  AnalyzeArgs a;
  analyzer::HangOptions& ho = a.ho;
  po::options_description opts("Options");
  opts.add_options()("help,h", "show this help")("what", po::value(&a.what)->required(),
                                                 "the analysis (hang or slow)")(
      "steps", po::value(&a.steps), "slow: A:B, the steps to look at")(
      "whole-run", po::bool_switch(&a.whole_run),
      "slow: every step of the run, not the window of its straggler incident")(
      "source", po::value(&a.source),
      "a directory of dumps, or a run directory (its newest dumps/attempt_*)")(
      "agents", po::value(&a.agents),
      "live: comma-separated agent URLs (http://127.0.0.1:PORT,...)")(
      "stacks", po::bool_switch(&a.stacks),
      "live: ask each rank for its own dump with every thread's stack (SIGUSR1 through its agent), "
      "grouped by stack in the report")(
      "token-file", po::value(&a.token_file),
      "live: the run's token (RUN_DIR/control.token), for agents that listen beyond loopback")(
      "pytorch", po::value(&a.pytorch),
      "a directory of PyTorch Flight Recorder dumps, one per rank: the pickle "
      "TORCH_NCCL_DUMP_ON_TIMEOUT writes (nccl_trace_rank_N) or the JSON form, PyTorch 2.2 on")(
      "json", po::bool_switch(&a.json), "verdicts as JSON lines (docs/formats.md section 2)")(
      "allow-incomplete-ranks", po::bool_switch(&ho.absent_not_collected),
      "the dumps are a partial set (PyTorch fr_trace's flag of that name): a rank without a dump "
      "was not collected, not gone -- never named dead for its silence; a wait that ends at it is "
      "an unknown verdict naming the missing dumps. Default: a rank without a dump is gone "
      "(PyTorch dumps from every live rank on a timeout; fr_trace refuses such a set)")(
      "transform-ft", po::value(&a.torch.ft_group_world_size)->default_value(0),
      "--pytorch from torchft: N, the replica group's world size; each replica's default_pg "
      "(members 0..N-1) is moved to its global ranks, rank R in replica R / N (fr_trace "
      "--transform-ft)")("min-wait", po::value(&ho.min_wait_s)->default_value(ho.min_wait_s),
                         "seconds in an op before it counts as a wait")(
      "stale-heartbeat", po::value(&ho.stale_heartbeat_s)->default_value(ho.stale_heartbeat_s),
      "a heartbeat this many seconds older than its peers' marks the rank dead");
  po::positional_options_description pos;
  pos.add("what", 1).add("source", 1);
  po::variables_map vm;
  if (auto rc = ParseArgs(
          "analyze",
          "megascope analyze hang (DIR | RUN_DIR | --agents URL,... | --pytorch DIR) "
          "[--json]\n       megascope analyze slow RUN_DIR [--steps A:B | --whole-run] [--json]",
          args, opts, pos, &vm)) {
    return *rc;
  }
  a.min_wait_given = !vm["min-wait"].defaulted();
  a.stale_given = !vm["stale-heartbeat"].defaulted();
  if (a.what == "slow") return RunSlow(a);
  if (a.what != "hang")
    return Fail("analyze", "unknown analysis '" + a.what + "' (hang, slow)", kExitUsage);
  return RunHang(a);
}

}  // namespace megascope::cli
