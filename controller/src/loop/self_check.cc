// Self-checks: a node and a healthy partner run `megascope self-check` together (through the
// fleet), judged against the launch's healthy figures while its error counters are watched.
#include <algorithm>
#include <cstdio>

#include "impl.h"
#include "megascope/tracer/format.h"

namespace megascope::controller {

// Runs the self-check pair (a, b); returns the figures of a and b.
std::pair<SelfCheckFigures, SelfCheckFigures> Controller::Impl::SelfCheckPair(
    const std::string& a, const std::string& b) {
  return fleet->SelfCheckPairs({{a, b}}, 0).at(0);
}

// The node's error counters (XID, ECC, NIC errors) from its agent; empty without an agent.
std::map<std::string, double> Controller::Impl::NodeErrorCounters(const std::string& node) {
  auto page = fleet->AgentGet(node, "/metrics", 1000, agent_token);
  return page.ok() ? ErrorCounters(*page) : std::map<std::string, double>{};
}

bool Controller::Impl::SelfCheck(const std::string& node, const std::string& partner,
                                 const std::string& why) {
  return SelfCheckAll({{node, partner, why}}).at(0).passed;
}

// Several at once (both ends of a stalled link): each pair runs beside the others, so a dead
// end's check costs no more than its own, not its peer's too.
std::vector<Controller::Impl::CheckResult> Controller::Impl::SelfCheckAll(
    const std::vector<NodeCheck>& todo) {
  const auto t0 = clock.Now();
  std::vector<std::map<std::string, double>> errors_before;
  errors_before.reserve(todo.size());
  for (const NodeCheck& c : todo) errors_before.push_back(NodeErrorCounters(c.node));
  std::vector<std::pair<SelfCheckFigures, SelfCheckFigures>> figures(todo.size());
  for (const bool after : {false, true}) {
    std::vector<std::pair<std::string, std::string>> pairs;
    std::vector<size_t> index;
    for (size_t i = 0; i < todo.size(); ++i) {
      if (todo[i].after != after) continue;
      pairs.emplace_back(todo[i].node, todo[i].partner);
      index.push_back(i);
    }
    if (pairs.empty()) continue;
    // What Judge will accept, so a link that crawls fails at once instead of at its deadline.
    const auto measured = fleet->SelfCheckPairs(pairs, opt.min_bandwidth_ratio * baseline_bw);
    for (size_t k = 0; k < index.size(); ++k) figures[index[k]] = measured.at(k);
  }
  std::vector<CheckResult> passed;
  for (size_t i = 0; i < todo.size(); ++i) {
    const SelfCheckFigures& node = figures.at(i).first;
    // What the node is measured against now: its partner's figures; a node checked with itself
    // (both ends of a stalled link are suspects, no healthy node is left to pair with) is measured
    // against the fastest other node of the same round, so a load that slows every check at once
    // fails none of them (CI saw both ends of a link at a sixth of the launch's figure).
    SelfCheckFigures now;
    if (todo[i].partner != todo[i].node) now = figures[i].second;
    for (size_t j = 0; j < todo.size() && todo[i].partner == todo[i].node; ++j) {
      const SelfCheckFigures& other = figures[j].first;
      if (todo[j].after == todo[i].after && todo[j].node != todo[i].node && other.ok &&
          other.gemm_gflops > now.gemm_gflops)
        now = other;
    }
    passed.push_back(Judge(todo[i], node, now, errors_before[i], t0));
  }
  return passed;
}

// The node's GEMM is judged against its healthy partner's, measured at the same time on the same
// machines (capped by the launch's healthy figure): a load that slows both -- other jobs, two
// shared cores -- is no fault of the node, and a node slower than its partner is (CI saw a
// healthy spare measure 1/8 of the launch's figure while its partner was as slow).
Controller::Impl::CheckResult Controller::Impl::Judge(
    const NodeCheck& c, const SelfCheckFigures& f, const SelfCheckFigures& partner_now,
    const std::map<std::string, double>& errors_before, Clock::time_point t0) {
  const std::string& node = c.node;
  const std::string& partner = c.partner;
  const std::string& why = c.why;
  std::string errors_rose;
  if (!errors_before.empty()) {
    // The agent samples its host every second: watch at least two samples.
    const double left = 2.2 - Since(t0);
    if (left > 0) clock.Sleep(std::chrono::duration<double>(left));
    for (const auto& [name, after] : NodeErrorCounters(node)) {
      auto it = errors_before.find(name);
      const double before = it == errors_before.end() ? 0 : it->second;
      if (after > before) {
        errors_rose += (errors_rose.empty() ? "" : ", ") + name + " +" +
                       std::to_string(static_cast<int64_t>(after - before));
      }
    }
  }
  // The partner's GEMM counts even where its check then failed on the link between them: it was
  // measured beside the node's, under the same load.
  const double gemm_ref = partner_now.gemm_gflops > 0
                              ? std::min(baseline_gemm, partner_now.gemm_gflops)
                              : baseline_gemm;
  // A check that failed on its link has still measured its GEMM.
  const bool gemm_ok = f.gemm_gflops > 0 && f.gemm_gflops >= opt.min_gemm_ratio * gemm_ref;
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
  std::string line = tracer::Format(
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
  return {pass, gemm_ok};
}

Status Controller::Impl::Baseline() {
  const std::string a = active.at(0), b = active.size() > 1 ? active[1] : active[0];
  auto [fa, fb] = SelfCheckPair(a, b);
  if (!fa.ok) return Internal("the baseline self-check on " + a + " failed: " + fa.error);
  baseline_gemm = fb.ok && a != b ? std::max(fa.gemm_gflops, fb.gemm_gflops) : fa.gemm_gflops;
  baseline_bw = fa.allreduce_gbps;
  std::string line =
      tracer::Format("healthy figures (%s, %s): GEMM %.2f GFLOP/s, all-reduce %.3f GB/s", a.c_str(),
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

}  // namespace megascope::controller
