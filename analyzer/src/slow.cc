#include "megascope/analyzer/slow.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <limits>
#include <map>
#include <set>
#include <type_traits>

#include "format.h"
#include "megascope/tracer/clock.h"
#include "megascope/tracer/records.h"
#include "megascope/tracer/run_layout.h"
#include "megascope/tracer/sqlite.h"
#include "megascope/tracer/trace_schema.h"

namespace megascope::analyzer {
namespace {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + static_cast<long>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

}  // namespace

struct StoredSteps::Node {
  tracer::sql::Database db;
  int64_t rowid[2] = {0, 0};  // the last row read of span_rows, of collective_rows
};

StoredSteps::StoredSteps(std::string run_dir, std::string node)
    : run_dir_(std::move(run_dir)), node_(std::move(node)) {}
StoredSteps::~StoredSteps() = default;
StoredSteps::StoredSteps(StoredSteps&&) noexcept = default;
StoredSteps& StoredSteps::operator=(StoredSteps&&) noexcept = default;

Status StoredSteps::Refresh() {
  namespace fs = std::filesystem;
  std::error_code ec;
  const RunLayout layout(run_dir_);
  std::vector<std::string> nodes;
  if (node_.empty()) {
    for (const auto& e : fs::directory_iterator(layout.nodes(), ec))
      nodes.push_back(e.path().filename().string());
  } else {
    nodes.push_back(node_);
  }
  for (const std::string& node : nodes) {
    const std::string path = layout.trace_db(node);
    auto it = nodes_.find(path);
    if (it == nodes_.end()) {
      if (!fs::exists(path)) continue;
      ASSIGN_OR_RETURN(auto db,
                       tracer::sql::Database::Open(path, tracer::sql::Database::Mode::kReadOnly,
                                                   "[stored steps]"));
      ASSIGN_OR_RETURN(const int64_t version, db.QueryInt("PRAGMA user_version"));
      RETURN_IF_ERROR(tracer::CheckReadableTraceVersion(version, path));
      ASSIGN_OR_RETURN(const int64_t tables,
                       db.QueryInt("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND "
                                   "name IN ('span_rows', 'collective_rows')"));
      if (tables < 2) continue;  // its agent is creating it: read it next time
      it = nodes_.emplace(path, std::make_unique<Node>(Node{std::move(db)})).first;
    }
    Node& n = *it->second;
    // What the `spans` view holds: span rows, and collectives that completed.
    static constexpr const char* kNewRows[2] = {
        "SELECT attempt, rank, MAX(step), MAX(rowid) FROM span_rows WHERE rowid > ?1 "
        "GROUP BY attempt, rank",
        "SELECT attempt, rank, MAX(step), MAX(rowid) FROM collective_rows WHERE rowid > ?1 AND "
        "state = ?2 AND start_after_ns IS NOT NULL GROUP BY attempt, rank"};
    for (int t = 0; t < 2; ++t) {
      ASSIGN_OR_RETURN(auto st, n.db.Prepare(kNewRows[t]));
      st.Bind(1, n.rowid[t]);
      if (t == 1) st.Bind(2, static_cast<int>(tracer::OpState::kCompleted));
      int64_t newest = n.rowid[t];
      for (;;) {
        ASSIGN_OR_RETURN(const bool row, st.Step());
        if (!row) break;
        const std::pair<int, int> key{static_cast<int>(st.Int(0)), static_cast<int>(st.Int(1))};
        auto [at, fresh] = last_step_.try_emplace(key, st.Int(2));
        if (!fresh) at->second = std::max(at->second, st.Int(2));
        newest = std::max(newest, st.Int(3));
      }
      n.rowid[t] = newest;
    }
  }
  return Status::Ok();
}

std::map<int, int64_t> StoredSteps::Through(int attempt) const {
  std::map<int, int64_t> out;
  for (const auto& [key, last] : last_step_) {
    if (key.first == attempt) out[key.second] = last;
  }
  return out;
}

int StoredSteps::RanksThrough(int attempt, int64_t step) const {
  std::set<int> ranks;
  for (const auto& [key, last] : last_step_) {
    if ((attempt < 0 || key.first == attempt) && last >= step) ranks.insert(key.second);
  }
  return static_cast<int>(ranks.size());
}

namespace {

// The window an analysis reads, indexed from its input (Index) for the phases, which only compute
// over it and add their verdicts to the report.
struct Window {
  // Indexed with operator[] by the phases: a rank with spans but no row in `ranks` reads as
  // coordinates 0 on node "".
  std::map<int, SlowInput::Rank> meta;
  // Per rank and step: compute (without nested collectives), comm, wall. A step is (attempt,
  // step): a step run again after a restart is another step.
  using StepKey = std::pair<int64_t, int64_t>;
  std::map<StepKey, std::map<int, double>> compute;  // step -> rank -> s
  std::map<StepKey, double> wall, busy;  // step -> max wall; summed per-rank accounted time
  std::map<StepKey, int> ranks_in_step;
  using Op = SlowInput::Op;
  std::map<int, std::vector<Op>> ops_of;  // rank -> its ops in the window, as enqueued
};

// The input in a fixed order (by step and rank; ops by rank and time), whatever order its parts
// came in: sums come out the same bit for bit from the databases or from the agents.
Window Index(const SlowInput& in) {
  Window w;
  w.meta = in.ranks;
  std::vector<const SlowInput::Step*> steps;
  steps.reserve(in.steps.size());
  for (const SlowInput::Step& s : in.steps) steps.push_back(&s);
  std::sort(steps.begin(), steps.end(), [](const SlowInput::Step* a, const SlowInput::Step* b) {
    return std::tie(a->attempt, a->step, a->rank) < std::tie(b->attempt, b->step, b->rank);
  });
  for (const SlowInput::Step* s : steps) {
    const Window::StepKey step{s->attempt, s->step};
    w.compute[step][s->rank] = s->compute / 1e9;
    w.wall[step] = std::max(w.wall[step], s->wall / 1e9);
    w.busy[step] += (s->compute + s->comm + s->data) / 1e9;
    ++w.ranks_in_step[step];
  }
  for (const SlowInput::Op& op : in.ops) w.ops_of[op.rank].push_back(op);
  for (auto& [rank, ops] : w.ops_of) {
    std::sort(ops.begin(), ops.end(), [](const Window::Op& a, const Window::Op& b) {
      return std::tie(a.enqueued, a.grp, a.seq, a.completed) <
             std::tie(b.enqueued, b.grp, b.seq, b.completed);
    });
  }
  return w;
}

std::string StepRange(const SlowOptions& o) {
  return "step >= " + std::to_string(o.first_step) + " AND step <= " + std::to_string(o.last_step);
}
std::string OfAttempt(const SlowOptions& o) {
  return o.attempt >= 0 ? " AND attempt = " + std::to_string(o.attempt) : "";
}

// The ranks' coordinates and every rank's compute, wall and accounted time per step of the window.
Status LoadSteps(RunDatabase& db, const SlowOptions& o, SlowInput* in) {
  const std::string range = StepRange(o), of_attempt = OfAttempt(o);
  RETURN_IF_ERROR(db.Scan(
      "SELECT rank, node, dp, pp, tp, MAX(clock_offset_ns) FROM ranks" +
          (o.attempt >= 0 ? " WHERE attempt = " + std::to_string(o.attempt) : std::string()) +
          " GROUP BY rank",
      [&](const RunDatabase::Row& r) {
        in->ranks[static_cast<int>(r.Int(0))] = {std::string(r.Text(1)), static_cast<int>(r.Int(2)),
                                                 static_cast<int>(r.Int(3)),
                                                 static_cast<int>(r.Int(4)), r.Int(5)};
      }));
  // Only the window's spans are read (the CTE would otherwise group every span of the run).
  std::string cte = PerRankStepCte();
  for (size_t at = 0; (at = cte.find("FROM spans", at)) != std::string::npos;) {
    const std::string window = "FROM (SELECT * FROM spans WHERE " + range + of_attempt + ")";
    cte.replace(at, 10, window);
    at += window.size();
  }
  const std::string sql =
      cte + "\nSELECT rank, step, wall, compute, comm, data, attempt FROM per_rank WHERE " + range;
  return db.Scan(sql, [&](const RunDatabase::Row& r) {
    in->steps.push_back({static_cast<int>(r.Int(0)), r.Int(6), r.Int(1), r.Double(2), r.Double(3),
                         r.Double(4), r.Double(5)});
  });
}

// Every rank's ops enqueued while its steps of the window ran (a collective's `step` is the step it
// completed in: an asynchronous send issued in one step may complete in the next, so ops are picked
// by time, each rank's by its own clock).
Status LoadOps(RunDatabase& db, const SlowOptions& o, SlowInput* in) {
  const std::string sql =
      "WITH r AS (SELECT attempt, rank, MIN(start_ns) AS lo, MAX(end_ns) AS hi FROM spans WHERE " +
      StepRange(o) + OfAttempt(o) +
      " GROUP BY attempt, rank) "
      "SELECT c.grp, c.seq, c.rank, c.enqueued_ns, c.completed_ns, c.op IN ('send', 'recv'), "
      "c.bytes FROM collectives c JOIN r ON c.attempt = r.attempt AND c.rank = r.rank "
      "WHERE c.enqueued_ns BETWEEN r.lo AND r.hi";
  return db.Scan(sql, [&](const RunDatabase::Row& r) {
    in->ops.push_back({std::string(r.Text(0)), r.Int(1), static_cast<int>(r.Int(2)), r.Int(3),
                       r.Int(4), r.Int(6), r.Int(5) != 0});
  });
}

// The window's steps, their mean time and the pipeline bubble's share.
void Summarize(Window& win, SlowReport* out) {
  SlowReport& rep = *out;
  auto& wall = win.wall;
  auto& busy = win.busy;
  auto& ranks_in_step = win.ranks_in_step;
  double step_sum = 0, bubble_sum = 0;
  for (const auto& [step, w] : wall) {
    step_sum += w;
    const double idle = std::max(0.0, w - busy[step] / std::max(1, ranks_in_step[step]));
    bubble_sum += w > 0 ? idle / w : 0;
  }
  rep.mean_step_s = step_sum / static_cast<double>(rep.steps);
  rep.bubble_share = bubble_sum / static_cast<double>(rep.steps);
}

void FindComputeStragglers(Window& w, const SlowOptions& o, SlowReport* out) {
  SlowReport& rep = *out;
  auto& meta = w.meta;
  auto& compute = w.compute;
  // 1. Compute stragglers: against the median of the peers at the same (pp, tp).
  std::map<int, int> slow_steps;
  std::map<int, double> extra;  // rank -> summed seconds above its peers' median
  for (const auto& [step, per] : compute) {
    // A rank's peers: the others at the same (pp, tp), whose median a straggler cannot drag along.
    // Each group is sorted once: the median of a rank's peers is the group's element at the
    // median's index with the rank left out (linear in the ranks, not quadratic).
    std::map<std::pair<int, int>, std::vector<std::pair<double, int>>> groups;
    for (const auto& [rank, s] : per) groups[{meta[rank].pp, meta[rank].tp}].emplace_back(s, rank);
    for (auto& [key, members] : groups) {
      const size_t peers = members.size() - 1;
      if (peers == 0 || static_cast<int>(peers) < o.min_peers) continue;
      std::sort(members.begin(), members.end());
      const size_t k = peers / 2;  // Median()'s index among the peers
      for (size_t at = 0; at < members.size(); ++at) {
        const auto [s, rank] = members[at];
        const double med = members[k < at ? k : k + 1].first;
        if (med > 0 && s > o.compute_ratio * med) ++slow_steps[rank];
        extra[rank] += std::max(0.0, s - med);
      }
    }
  }
  for (const auto& [rank, n] : slow_steps) {
    const double cost = extra[rank] / static_cast<double>(rep.steps);
    if (n < o.persistent_share * static_cast<double>(rep.steps) || cost < o.min_cost_s) continue;
    Verdict v;
    v.kind = VerdictKind::kSlow;
    v.cause = Name(Cause::kComputeStraggler);
    v.root_ranks = {rank};
    v.root_nodes = {meta[rank].node};
    v.confidence = std::min(1.0, static_cast<double>(n) / static_cast<double>(rep.steps));
    v.detected_at_ns = tracer::WallNowNs();
    v.explanation = "rank " + std::to_string(rank) + " (" + meta[rank].node +
                    ", dp=" + std::to_string(meta[rank].dp) +
                    " pp=" + std::to_string(meta[rank].pp) +
                    " tp=" + std::to_string(meta[rank].tp) + ") computed more than " +
                    Fmt("%.0f", (o.compute_ratio - 1) * 100) +
                    " % longer than its peers at the same (pp, tp) in " + std::to_string(n) +
                    " of " + std::to_string(rep.steps) + " steps, " + Fmt("%.3f", cost) +
                    " s per step; everyone it synchronises with waits that long.";
    v.evidence = {"cost_s_per_step=" + Fmt("%.4f", cost), "slow_steps=" + std::to_string(n)};
    rep.verdicts.push_back(std::move(v));
  }
}

void FindStageImbalance(Window& w, const SlowOptions& o, SlowReport* out) {
  SlowReport& rep = *out;
  auto& meta = w.meta;
  auto& compute = w.compute;
  // 1b. Stage imbalance: a stage whose ranks all compute longer than the other stages' (per step,
  // medians; in a persistent share of the steps). The pipeline runs at its slowest stage's pace.
  std::map<int, int> stage_slow_steps;
  std::map<int, double> stage_extra;
  std::map<int, std::vector<int>> stage_ranks;
  for (const auto& [rank, m] : meta) stage_ranks[m.pp].push_back(rank);
  if (stage_ranks.size() > 1) {
    for (const auto& [step, per] : compute) {
      std::map<int, std::vector<double>> by_stage;
      for (const auto& [rank, s] : per) by_stage[meta[rank].pp].push_back(s);
      std::map<int, double> stage_med;
      for (auto& [pp, v] : by_stage) stage_med[pp] = Median(v);
      for (const auto& [pp, med] : stage_med) {
        std::vector<double> others;
        double lowest_own = std::numeric_limits<double>::max();
        for (const auto& [q, m2] : stage_med) {
          if (q != pp) others.push_back(m2);
        }
        for (double s : by_stage[pp]) lowest_own = std::min(lowest_own, s);
        if (others.empty()) continue;
        const double typical = Median(others);
        // Every replica slow, not one: its fastest rank is slow too.
        if (typical > 0 && lowest_own > o.compute_ratio * typical) ++stage_slow_steps[pp];
        stage_extra[pp] += std::max(0.0, med - typical);
      }
    }
  }
  for (const auto& [pp, n] : stage_slow_steps) {
    const double cost = stage_extra[pp] / static_cast<double>(rep.steps);
    if (n < o.persistent_share * static_cast<double>(rep.steps) || cost < o.min_cost_s) continue;
    Verdict v;
    v.kind = VerdictKind::kSlow;
    v.cause = Name(Cause::kStageImbalance);
    v.root_ranks = stage_ranks[pp];
    for (int r : stage_ranks[pp]) {
      if (std::find(v.root_nodes.begin(), v.root_nodes.end(), meta[r].node) == v.root_nodes.end())
        v.root_nodes.push_back(meta[r].node);
    }
    v.confidence = std::min(1.0, static_cast<double>(n) / static_cast<double>(rep.steps));
    v.detected_at_ns = tracer::WallNowNs();
    v.explanation = "pipeline stage pp=" + std::to_string(pp) + " computed more than " +
                    Fmt("%.0f", (o.compute_ratio - 1) * 100) +
                    " % longer than the other stages on every one of its " +
                    std::to_string(stage_ranks[pp].size()) + " ranks in " + std::to_string(n) +
                    " of " + std::to_string(rep.steps) + " steps, " + Fmt("%.3f", cost) +
                    " s per step: the stage is imbalanced (model split or layout), not a machine; "
                    "no eviction can help.";
    v.evidence = {"cost_s_per_step=" + Fmt("%.4f", cost), "slow_steps=" + std::to_string(n)};
    rep.verdicts.push_back(std::move(v));
  }
}

void FindCommStragglers(Window& w, const SlowOptions& o, SlowReport* out) {
  SlowReport& rep = *out;
  auto& meta = w.meta;
  auto& ops_of = w.ops_of;
  // 2. Communication stragglers: at every collective, the last rank to arrive makes the others
  // wait -- for the part of its lateness it caused itself. A rank that left the previous op late
  // (a ring's last receiver does, every time) and then worked as long as its peers arrives late
  // without being slow: lateness is measured on the gap since each rank's own previous op.
  std::map<int, double> blame;  // rank -> seconds others waited for it
  std::map<int, int64_t> last_count;
  struct Arrival {
    int rank;
    int64_t t;    // arrival, on the common clock
    int64_t gap;  // since the rank's own previous op completed
  };
  std::map<std::pair<std::string, int64_t>, std::vector<Arrival>> by_op;
  for (auto& [rank, ops] : ops_of) {  // each rank's ops in the order it enqueued them
    for (size_t k = 1; k < ops.size(); ++k) {
      const int64_t prev_done = ops[k - 1].completed;
      if (ops[k].p2p || prev_done <= 0 || prev_done > ops[k].enqueued) continue;
      by_op[{ops[k].grp, ops[k].seq}].push_back(
          {rank, ops[k].enqueued - meta[rank].clock_offset_ns, ops[k].enqueued - prev_done});
    }
  }
  for (const auto& [key, arrivals] : by_op) {
    if (arrivals.size() < 2) continue;
    const auto last = std::max_element(arrivals.begin(), arrivals.end(),
                                       [](auto& a, auto& b) { return a.t < b.t; });
    double waited = 0;
    for (const Arrival& a : arrivals) {
      waited +=
          static_cast<double>(std::max<int64_t>(0, std::min(last->t - a.t, last->gap - a.gap))) /
          1e9;
    }
    if (waited <= 0) continue;
    blame[last->rank] += waited;
    ++last_count[last->rank];
  }
  std::vector<double> blames;
  blames.reserve(meta.size());
  for (const auto& [rank, m] : meta) blames.push_back(blame[rank]);
  const double typical = Median(blames);
  for (const auto& [rank, b] : blame) {
    const double cost = b / static_cast<double>(rep.steps);
    bool already = false;  // a compute straggler arrives last because it computes longer
    for (const Verdict& v : rep.verdicts)
      already |= ParseCause(v.cause) == Cause::kComputeStraggler && v.root_ranks[0] == rank;
    if (already || cost < o.min_cost_s || b < 3 * typical) continue;
    Verdict v;
    v.kind = VerdictKind::kSlow;
    v.cause = Name(Cause::kCommStraggler);
    v.root_ranks = {rank};
    v.root_nodes = {meta[rank].node};
    v.confidence = 0.7;
    v.detected_at_ns = tracer::WallNowNs();
    v.explanation = "rank " + std::to_string(rank) + " (" + meta[rank].node + ") arrived last at " +
                    std::to_string(last_count[rank]) + " collectives; its peers waited " +
                    Fmt("%.3f", cost) + " s per step for it (the median rank causes " +
                    Fmt("%.3f", typical / static_cast<double>(rep.steps)) + " s).";
    v.evidence = {"cost_s_per_step=" + Fmt("%.4f", cost)};
    rep.verdicts.push_back(std::move(v));
  }
}

// 3. Slow links (FindSlowLinks): each group's collectives of the window, timed from their last
// arrival to their last completion, by size class of their kind.
struct GroupTiming {
  std::vector<double> transfer;  // s, per collective
  std::set<std::string> hosts;
};
using SizeClass = std::pair<std::string, int64_t>;  // kind, smallest size of the class
using GroupTimings = std::map<SizeClass, std::map<std::string, GroupTiming>>;  // -> group -> ...

GroupTimings TimeGroups(Window& w) {
  auto& meta = w.meta;
  auto& ops_of = w.ops_of;
  using Op = Window::Op;
  auto kind_of = [](const std::string& grp) { return grp.substr(0, grp.find('.')); };
  GroupTimings timing;
  struct Span {
    int64_t arrive = std::numeric_limits<int64_t>::min();
    int64_t done = std::numeric_limits<int64_t>::min();
    int64_t bytes = 0;
    int members = 0;
  };
  std::map<std::pair<std::string, int64_t>, Span> spans;
  std::map<std::string, std::set<int64_t>> sizes;      // kind -> sizes seen
  std::map<std::string, std::set<std::string>> hosts;  // group -> its members' hosts
  for (const auto& [rank, ops] : ops_of) {
    for (const Op& op : ops) {
      if (op.p2p || op.completed <= 0) continue;
      Span& sp = spans[{op.grp, op.seq}];
      sp.arrive = std::max(sp.arrive, op.enqueued - meta[rank].clock_offset_ns);
      sp.done = std::max(sp.done, op.completed - meta[rank].clock_offset_ns);
      sp.bytes = std::max(sp.bytes, op.bytes);
      ++sp.members;
      hosts[op.grp].insert(meta[rank].node);
    }
  }
  for (const auto& [key, sp] : spans) sizes[kind_of(key.first)].insert(sp.bytes);
  std::map<SizeClass, int64_t> class_of;  // (kind, size) -> smallest size of its class
  for (const auto& [kind, of_kind] : sizes) {
    int64_t smallest = -1;
    for (int64_t b : of_kind) {
      if (smallest < 0 || b > 2 * smallest) smallest = b;
      class_of[{kind, b}] = smallest;
    }
  }
  for (const auto& [key, sp] : spans) {
    const std::string kind = kind_of(key.first);
    GroupTiming& t = timing[{kind, class_of[{kind, sp.bytes}]}][key.first];
    if (t.hosts.empty()) t.hosts = hosts[key.first];  // the same in every class
    if (sp.members >= 2)
      t.transfer.push_back(static_cast<double>(std::max<int64_t>(0, sp.done - sp.arrive)) / 1e9);
  }
  return timing;
}

struct SlowGroup {
  std::string name;
  const GroupTiming* timing = nullptr;
  double ratio = 0, cost = 0;      // the largest ratio over its classes; the cost summed
  std::vector<SizeClass> classes;  // where it is slow
};
using FastGroups = std::map<SizeClass, std::vector<const GroupTiming*>>;

// In every size class with two groups or more across hosts: the groups well above the fastest
// (`slow`), and those that are not (`fast_groups`) in a class where another group is slow.
void ClassifyGroups(const GroupTimings& timing, const SlowOptions& o, int64_t steps,
                    std::map<std::string, SlowGroup>* slow, FastGroups* fast_groups) {
  std::map<std::string, SlowGroup>& slow_by_group = *slow;
  // Cross-host groups that are not slow in a class where another group is. (Where no group of a
  // class is slow, the link does not slow collectives of that size: it tells nothing.)
  FastGroups& fast = *fast_groups;
  for (const auto& [size_class, groups] : timing) {
    double fastest = std::numeric_limits<double>::max();
    int crossing = 0;
    for (const auto& [grp, t] : groups) {
      if (t.hosts.size() < 2 || t.transfer.empty()) continue;  // crosses no link
      fastest = std::min(fastest, Median(t.transfer));
      ++crossing;
    }
    if (crossing < 2) continue;
    std::vector<const GroupTiming*> fast_here;
    bool any_slow = false;
    for (const auto& [grp, t] : groups) {
      if (t.hosts.size() < 2 || t.transfer.empty()) continue;
      const double med = Median(t.transfer);
      const double cost =
          (med - fastest) * static_cast<double>(t.transfer.size()) / static_cast<double>(steps);
      if (med < o.link_ratio * fastest) {
        fast_here.push_back(&t);
      } else if (cost >= o.min_cost_s) {  // below: slower, but by too little to tell from jitter
        any_slow = true;
        SlowGroup& g = slow_by_group[grp];
        g.name = grp;
        g.timing = &t;
        g.ratio = std::max(g.ratio, med / std::max(fastest, 1e-9));
        g.cost += cost;
        g.classes.push_back(size_class);
      }
    }
    if (any_slow) fast[size_class] = std::move(fast_here);
  }
}

// The hosts a slow link is suspected at (empty: none), the slow groups that name them, and the
// link's cost per step.
struct LinkSuspects {
  std::set<std::string> hosts;
  std::vector<std::string> groups;  // "name (ratio x)", sorted
  double cost = 0;
};

LinkSuspects PickSuspects(const std::map<std::string, SlowGroup>& slow_by_group,
                          const FastGroups& fast, double jitter_s) {
  std::vector<SlowGroup> slower;
  slower.reserve(slow_by_group.size());
  for (const auto& [grp, g] : slow_by_group) slower.push_back(g);
  // The suspects are the hosts common to the slow groups, the costliest first. A cheap slow group
  // over none of them (a healthy transfer of a millisecond stretched by a preempted rank on a busy
  // machine) is jitter beside them, not a second slow link that would empty the set.
  std::sort(slower.begin(), slower.end(),
            [](const SlowGroup& a, const SlowGroup& b) { return a.cost > b.cost; });
  LinkSuspects out;
  std::vector<std::string>& slow_groups = out.groups;
  std::set<std::string>& suspects = out.hosts;
  std::set<SizeClass> slow_classes;  // where the groups over the suspects are slow
  for (const SlowGroup& g : slower) {
    std::set<std::string> both = g.timing->hosts;
    if (!slow_groups.empty()) {
      both.clear();
      std::set_intersection(suspects.begin(), suspects.end(), g.timing->hosts.begin(),
                            g.timing->hosts.end(), std::inserter(both, both.end()));
      if (both.empty() && g.cost < jitter_s) continue;
    }
    suspects = std::move(both);
    slow_groups.push_back(g.name + " (" + Fmt("%.1f", g.ratio) + "x)");
    slow_classes.insert(g.classes.begin(), g.classes.end());
    out.cost = std::max(out.cost, g.cost);
  }
  std::sort(slow_groups.begin(), slow_groups.end());
  // A slow link slows every group that crosses it: a group over the suspects' links that is not
  // slow, in a size class where the slow groups are, contradicts the finding (one slow group among
  // several over the same hosts is jitter). A class where only jitter beside them was slow tells
  // nothing of the suspects: a preempted rank stretching another group's tiny transfers must not
  // turn the suspects' fast tiny ones into evidence against their link.
  for (const SizeClass& c : slow_classes) {
    const auto it = fast.find(c);
    if (it == fast.end()) continue;
    for (const GroupTiming* t : it->second) {
      if (!suspects.empty() &&
          std::includes(t->hosts.begin(), t->hosts.end(), suspects.begin(), suspects.end()))
        suspects.clear();
    }
  }
  return out;
}

void FindSlowLinks(Window& w, const SlowOptions& o, SlowReport* out) {
  SlowReport& rep = *out;
  auto& meta = w.meta;
  // 3. Slow links: once every member of a collective has arrived, it takes about as long as the
  // same collective of the other groups of its kind -- unless it crosses a slow link. A link short
  // of bandwidth stretches a large transfer many times over and a few bytes hardly at all, so
  // collectives are compared within a size class of their kind (sizes within 2x of the class's
  // smallest): each group's collectives are timed from their last arrival to their last
  // completion, and a group whose median in a class is well above the fastest group of that class
  // is slow. The host common to every slow group is the suspect (when two hosts are, the link
  // between them: their self-checks decide).
  const GroupTimings timing = TimeGroups(w);
  std::map<std::string, SlowGroup> slow_by_group;
  FastGroups fast;
  ClassifyGroups(timing, o, rep.steps, &slow_by_group, &fast);
  const double jitter_s = std::max(o.min_cost_s, o.link_min_step_share * rep.mean_step_s);
  const LinkSuspects found = PickSuspects(slow_by_group, fast, jitter_s);
  const std::set<std::string>& suspects = found.hosts;
  const std::vector<std::string>& slow_groups = found.groups;
  const double link_cost = found.cost;
  // ... and costs a real share of the step, not a few milliseconds of jitter.
  if (!slow_groups.empty() && !suspects.empty() && link_cost >= jitter_s) {
    Verdict v;
    v.kind = VerdictKind::kSlow;
    v.cause = Name(Cause::kLinkSlow);
    for (const std::string& h : suspects) {
      v.root_nodes.push_back(h);
      for (const auto& [rank, m] : meta) {
        if (m.node == h) {
          v.root_ranks.push_back(rank);
          break;
        }
      }
    }
    v.confidence = suspects.size() == 1 ? 0.7 : 0.6;
    v.detected_at_ns = tracer::WallNowNs();
    std::string groups;
    for (const std::string& g : slow_groups) groups += (groups.empty() ? "" : ", ") + g;
    std::string where;
    for (const std::string& h : suspects) where += (where.empty() ? "" : " and ") + h;
    v.explanation = "collectives crossing " +
                    std::string(suspects.size() == 1 ? "the link of " : "the link between ") +
                    where +
                    " took longer than the same collectives of other groups once every member had "
                    "arrived: " +
                    groups + " against the fastest group of their kind; " + Fmt("%.3f", link_cost) +
                    " s per step. The network is slow there, not the ranks.";
    v.evidence = {"cost_s_per_step=" + Fmt("%.4f", link_cost), "slow_groups=" + groups};
    rep.verdicts.push_back(std::move(v));
  }
}

// The verdicts in order of cost (a healthy one when there is none), each with the thresholds that
// decided it.
void Conclude(const SlowOptions& o, SlowReport* out) {
  SlowReport& rep = *out;
  std::sort(rep.verdicts.begin(), rep.verdicts.end(),
            [](const Verdict& a, const Verdict& b) { return a.evidence[0] > b.evidence[0]; });
  if (rep.verdicts.empty()) {
    Verdict v;
    v.kind = VerdictKind::kHealthy;
    v.confidence = 0.8;
    v.explanation = "no persistent straggler over " + std::to_string(rep.steps) + " steps";
    rep.verdicts.push_back(std::move(v));
  }
  // What decided, with every verdict (a healthy one too): a re-analysis with other thresholds or
  // over other steps may conclude otherwise, and should be able to say why.
  rep.thresholds =
      "thresholds: steps " + std::to_string(o.first_step) + ".." +
      (o.last_step == std::numeric_limits<int64_t>::max() ? std::string("the last")
                                                          : std::to_string(o.last_step)) +
      (o.attempt >= 0 ? " of attempt " + std::to_string(o.attempt)
                      : std::string(" of every attempt")) +
      "; a compute straggler computes over " + Fmt("%.2f", o.compute_ratio) +
      "x the median of its peers at its (pp, tp) (at least " + std::to_string(o.min_peers) +
      ") in at least " + Fmt("%.0f", 100 * o.persistent_share) +
      " % of the steps, costing at least " + Fmt("%.3f", o.min_cost_s) +
      " s a step; a slow link is " + Fmt("%.1f", o.link_ratio) +
      "x the fastest group of its kind and at least " + Fmt("%.0f", 100 * o.link_min_step_share) +
      " % of a step";
  const std::map<std::string, double> numbers = {
      {"first_step", static_cast<double>(o.first_step)},
      {"last_step", o.last_step == std::numeric_limits<int64_t>::max()
                        ? -1.0
                        : static_cast<double>(o.last_step)},
      {"attempt", o.attempt},
      {"compute_ratio", o.compute_ratio},
      {"persistent_share", o.persistent_share},
      {"min_cost_s", o.min_cost_s},
      {"link_ratio", o.link_ratio},
      {"link_min_step_share", o.link_min_step_share},
      {"min_peers", o.min_peers}};
  for (Verdict& v : rep.verdicts) {
    v.evidence.push_back(rep.thresholds);
    v.thresholds = numbers;
  }
}

}  // namespace

void SlowInput::Merge(SlowInput&& part) {
  ranks.merge(part.ranks);
  steps.insert(steps.end(), part.steps.begin(), part.steps.end());
  ops.insert(ops.end(), std::make_move_iterator(part.ops.begin()),
             std::make_move_iterator(part.ops.end()));
}

Result<SlowInput> LoadSlowInput(RunDatabase& db, const SlowOptions& o) {
  SlowInput in;
  RETURN_IF_ERROR(LoadSteps(db, o, &in));
  if (!in.steps.empty()) RETURN_IF_ERROR(LoadOps(db, o, &in));
  return in;
}

Result<SlowReport> AnalyzeSlow(const SlowInput& in, const SlowOptions& o) {
  Window w = Index(in);
  SlowReport rep;
  rep.steps = static_cast<int64_t>(w.compute.size());
  if (rep.steps == 0)
    return NotFound("no spans in steps " + std::to_string(o.first_step) + ".. of this run");
  Summarize(w, &rep);
  FindComputeStragglers(w, o, &rep);  // 1.
  FindStageImbalance(w, o, &rep);     // 1b.
  FindCommStragglers(w, o, &rep);     // 2.
  FindSlowLinks(w, o, &rep);          // 3.
  Conclude(o, &rep);
  return rep;
}

Result<SlowReport> AnalyzeSlow(RunDatabase& db, const SlowOptions& o) {
  ASSIGN_OR_RETURN(const SlowInput in, LoadSlowInput(db, o));
  return AnalyzeSlow(in, o);
}

SlowOptions SlowOptionsFrom(const std::map<std::string, double>& t, SlowOptions o) {
  auto get = [&t](const char* key, auto* field) {
    auto it = t.find(key);
    if (it != t.end()) *field = static_cast<std::remove_pointer_t<decltype(field)>>(it->second);
  };
  get("first_step", &o.first_step);
  get("last_step", &o.last_step);
  if (o.last_step < 0) o.last_step = std::numeric_limits<int64_t>::max();
  get("attempt", &o.attempt);
  get("compute_ratio", &o.compute_ratio);
  get("persistent_share", &o.persistent_share);
  get("min_cost_s", &o.min_cost_s);
  get("link_ratio", &o.link_ratio);
  get("link_min_step_share", &o.link_min_step_share);
  get("min_peers", &o.min_peers);
  return o;
}

std::string FormatSlowReport(const SlowReport& r) {
  std::string out = std::to_string(r.steps) + " steps, mean step " + Fmt("%.3f s", r.mean_step_s) +
                    ", pipeline bubble and idle " + Fmt("%.1f %%", 100 * r.bubble_share) +
                    " of step time\n";
  for (const Verdict& v : r.verdicts) {
    out += (v.kind == VerdictKind::kSlow
                ? "SLOW  cause: " + v.cause + "   root: rank " + std::to_string(v.root_ranks[0]) +
                      " (" + v.root_nodes[0] + ")\n  "
                : "healthy: ") +
           v.explanation + "\n";
  }
  if (!r.thresholds.empty()) out += r.thresholds + "\n";
  return out;
}

}  // namespace megascope::analyzer
