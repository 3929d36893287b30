#include "evidence.h"

#include <filesystem>
#include <set>
#include <sstream>

#include "megascope/analyzer/query.h"
#include "megascope/analyzer/store_views.h"
#include "megascope/detector/prometheus_text.h"
#include "megascope/tracer/metric_names.h"
#include "megascope/tracer/run_layout.h"

namespace megascope::controller {
namespace {

// The value of label `key` in a Prometheus series line, or "".
std::string LabelOf(std::string_view line, std::string_view key) {
  const std::string needle = std::string(key) + "=\"";
  for (size_t at = line.find(needle); at != std::string_view::npos;
       at = line.find(needle, at + 1)) {
    if (at > 0 && line[at - 1] != '{' && line[at - 1] != ',') continue;
    const size_t start = at + needle.size(), end = line.find('"', start);
    if (end == std::string_view::npos) return "";
    return std::string(line.substr(start, end - start));
  }
  return "";
}

}  // namespace

MetricsRound ParseMetricsRound(const std::map<std::string, std::string>& pages, double now_s) {
  MetricsRound round;
  const std::string step_series = tracer::metrics::PrometheusName(tracer::metrics::kStep) + "{";
  for (const auto& [node, text] : pages) {
    auto samples = detector::ParsePrometheusText(text, now_s);
    if (!samples.ok()) {
      round.errors.push_back(node + ": " + samples.status().message());
      continue;
    }
    for (detector::Sample& s : *samples) {
      const tracer::metrics::Def* d = tracer::metrics::Find(s.metric);
      if (d == nullptr || d->detector_priority < 0) continue;
      s.machine = node;  // the page's node, whatever its labels say
      round.samples.push_back(std::move(s));
    }
    std::set<std::string> stages;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
      if (line.rfind(step_series, 0) == 0) stages.insert(LabelOf(line, "pp"));
    }
    if (!stages.empty()) {
      std::string g = "pp=";
      for (const std::string& s : stages) g += (g.size() > 3 ? "," : "") + s;
      round.peer_group[node] = g;
    }
  }
  return round;
}

std::map<std::string, double> ErrorCounters(const std::string& page) {
  std::map<std::string, double> out;
  auto samples = detector::ParsePrometheusText(page, 0);
  if (!samples.ok()) return out;
  for (const detector::Sample& s : *samples) {
    if (detector::ClassifyMetric(s.metric) == detector::MetricFamily::kErrors &&
        detector::IsCumulativeCounter(s.metric)) {
      out[s.metric] += s.value;
    }
  }
  return out;
}

OnlineDetector::OnlineDetector(const detector::DetectorConfig& config)
    : det_(config), stream_(&det_, config.tick_s, 2 * config.tick_s) {}

std::vector<Verdict> OnlineDetector::Add(const MetricsRound& round) {
  std::set<std::string> grouped;
  for (const auto& [node, group] : round.peer_group) {
    // A node is judged among the nodes doing its work, so it is fed once its stage is known (a
    // node keeps the group it was first seen in).
    det_.SetPeerGroup(node, group);
    grouped.insert(node);
  }
  for (const detector::Sample& s : round.samples) {
    if (grouped.count(s.machine)) stream_.Add(s);
  }
  return stream_.TakeVerdicts();
}

void StragglerWatch::UseStore(const tracer::StoreUrl& url, std::string job) {
  // Short: a window is asked for again at the next poll; a slow store must not hold up a tick.
  store_ = std::make_unique<tracer::ClickHouse>(url, 2000);
  job_ = std::move(job);
}

bool StragglerWatch::Gather(Fleet& fleet, const std::vector<std::string>& nodes,
                            const std::string& token, const std::string& run_dir,
                            const analyzer::WindowQuery& q,
                            std::map<std::string, analyzer::WindowPart>* parts) {
  // As for /state and /metrics: a tick waits this long at most for a stuck agent (its part then
  // comes from its database, where this machine has it).
  constexpr int kTimeoutMs = 1000;
  missing_.clear();
  std::vector<Result<std::string>> answers =
      fleet.AgentGetAll(nodes, analyzer::WindowPath(q), kTimeoutMs, token);
  bool complete = true;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const std::string& node = nodes[i];
    if (node.empty()) continue;  // a slot its evicted node left, not yet filled
    Result<analyzer::WindowPart> part =
        answers[i].ok() ? analyzer::ParseWindowPart(*answers[i]) : answers[i].status();
    if (!part.ok()) {
      // Its agent is gone or cannot answer: its database, where this machine has it.
      const std::string db = RunLayout(run_dir).trace_db(node);
      std::error_code ec;
      if (std::filesystem::exists(db, ec)) {
        auto& server = local_[db];
        if (!server) server = std::make_unique<analyzer::WindowServer>(run_dir, node);
        part = server->Part(q);
      }
    }
    if (!part.ok()) {
      missing_.push_back(node + ": " + part.status().message());
      complete = false;
      continue;
    }
    complete &= part->has_rows;
    (*parts)[node] = std::move(*part);
  }
  return complete;
}

Result<std::optional<std::vector<StragglerWatch::Finding>>> StragglerWatch::Analyze(
    Fleet& fleet, const std::vector<std::string>& nodes, const std::string& token,
    const std::string& run_dir, int attempt, int64_t first, int64_t last, int world, bool anyway,
    analyzer::SlowOptions options) {
  options.attempt = attempt;
  options.first_step = first;
  options.last_step = last;
  analyzer::SlowInput input;
  bool& from_store = from_store_;
  from_store = false;
  missing_.clear();
  if (store_) {
    auto got = analyzer::LoadSlowInputFromStore(*store_, job_, options, world, anyway);
    if (got.ok() && !got->has_value()) return std::optional<std::vector<Finding>>();
    if (got.ok()) {
      input = std::move(**got);
      from_store = true;
    } else {
      missing_.push_back("the store (" + got.status().message() + "): the agents' parts instead");
    }
  }
  if (!from_store) {
    std::vector<std::string> store_said = std::move(missing_);
    std::map<std::string, analyzer::WindowPart> parts;
    const analyzer::WindowQuery q{attempt, first, last, anyway};
    const bool complete = Gather(fleet, nodes, token, run_dir, q, &parts);
    missing_.insert(missing_.begin(), store_said.begin(), store_said.end());
    if (!anyway && (!complete || analyzer::RanksThrough(parts, last) < world))
      return std::optional<std::vector<Finding>>();
    for (auto& [node, part] : parts) input.Merge(std::move(part.input));
  }
  ASSIGN_OR_RETURN(analyzer::SlowReport rep, analyzer::AnalyzeSlow(input, options));
  std::vector<Verdict> slow;
  for (Verdict& v : rep.verdicts) {
    if (v.kind == VerdictKind::kSlow) slow.push_back(std::move(v));
  }
  const std::vector<Streak> streaks = streaks_.Next(slow);
  std::vector<Finding> out;
  out.reserve(slow.size());
  for (size_t i = 0; i < slow.size(); ++i) out.push_back({std::move(slow[i]), streaks[i]});
  return std::optional(std::move(out));
}

}  // namespace megascope::controller
