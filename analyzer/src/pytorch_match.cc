// PyTorch's Flight Recorder analysis rules over the ops a PyTorch dump recorded: how two members
// of a collective compare (torch/distributed/flight_recorder/components/types.py, Op.match), who
// departs from a collective's members, and the evidence a PyTorch user recognises.
#include <algorithm>
#include <cstdio>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <tuple>

#include "megascope/analyzer/pytorch.h"
#include "megascope/tracer/format.h"

namespace megascope::analyzer {
namespace {

using Sizes = std::vector<std::vector<int64_t>>;

// The elements of the first tensor of `sizes` (math.prod(sizes[0]) in types.py), 0 if none.
int64_t FirstNumel(const Sizes& sizes) {
  if (sizes.empty()) return 0;
  return std::accumulate(sizes[0].begin(), sizes[0].end(), int64_t{1},
                         [](int64_t a, int64_t d) { return a * std::max<int64_t>(d, 0); });
}

// Op.match between two single entries (types as SplitName spells them: all_to_all is "alltoall"),
// in PyTorch's order of checks: type; input sizes (not for
// all_to_all or scatter, whose per-rank inputs legally differ); output sizes (not for all_to_all or
// gather); an all-reduce's input against the other's output; an all-gather's output against
// input x group size, a reduce-scatter's input against output x group size; then dtypes
// (Op.dtype_mismatch). A closing entry of a coalesced block is compared by type only. States are
// not compared here: a state difference is the hang analysis's evidence, not a mismatch of ops.
std::optional<MismatchKind> MatchOne(const PyTorchOp& a, const PyTorchOp& b, size_t pg_size) {
  if (a.type != b.type) return MismatchKind::kType;
  if (IsCoalescedClosing(a.type)) return std::nullopt;
  const std::string& t = a.type;
  // A side with no tensors recorded (a recorder that wrote no sizes) is not compared.
  auto differ = [](const Sizes& x, const Sizes& y) { return !x.empty() && !y.empty() && x != y; };
  if (t != "alltoall" && t != "scatter" && differ(a.input_sizes, b.input_sizes))
    return MismatchKind::kSize;
  if (t != "alltoall" && t != "gather" && differ(a.output_sizes, b.output_sizes))
    return MismatchKind::kSize;
  if ((t == "allreduce" || t == "allreducecoalesced") && differ(a.input_sizes, b.output_sizes))
    return MismatchKind::kSize;
  const auto size = static_cast<int64_t>(pg_size);
  const bool sized = !a.input_sizes.empty() && !a.output_sizes.empty() && !b.input_sizes.empty() &&
                     !b.output_sizes.empty();
  if (sized && (t == "allgather" || t == "allgatherbase" || t == "allgatherintotensorcoalesced") &&
      FirstNumel(b.output_sizes) != FirstNumel(a.input_sizes) * size)
    return MismatchKind::kSize;
  if (sized &&
      (t == "reducescatter" || t == "reducescatterbase" || t == "reducescattertensorcoalesced") &&
      FirstNumel(b.input_sizes) != FirstNumel(a.output_sizes) * size)
    return MismatchKind::kSize;
  // Each dtype comparison only where both sides have a tensor with dimensions.
  auto set = [](const std::vector<std::string>& v) {
    return std::set<std::string>(v.begin(), v.end());
  };
  auto has = [](const Sizes& s) { return !s.empty() && !s[0].empty(); };
  const bool in_vs_out = t != "scatter" && t != "gather" && t != "broadcast" &&
                         set(a.input_dtypes) != set(a.output_dtypes) && has(a.input_sizes) &&
                         has(a.output_sizes);
  const bool in_vs_in = t != "scatter" && t != "broadcast" &&
                        set(a.input_dtypes) != set(b.input_dtypes) && has(a.input_sizes) &&
                        has(b.input_sizes);
  const bool out_vs_out = t != "gather" && set(a.output_dtypes) != set(b.output_dtypes) &&
                          has(a.output_sizes) && has(b.output_sizes);
  if (in_vs_out || in_vs_in || out_vs_out) return MismatchKind::kDtype;
  return std::nullopt;
}

std::string Shapes(const Sizes& sizes) {
  std::string s = "[";
  for (size_t i = 0; i < sizes.size(); ++i) {
    s += i ? ", [" : "[";
    for (size_t k = 0; k < sizes[i].size(); ++k) s += (k ? ", " : "") + std::to_string(sizes[i][k]);
    s += "]";
  }
  return s + "]";
}

const PyTorchOp* OpAt(const PyTorchInput& in, int rank, std::string_view group, int64_t seq) {
  if (rank < 0 || rank >= static_cast<int>(in.ranks.size())) return nullptr;
  const auto& c = in.ranks[rank].collectives;
  auto it = c.find({std::string(group), seq});
  return it == c.end() ? nullptr : &it->second;
}

// An all_to_all recorded with one tensor per peer (ProcessGroupNCCL::alltoall's lists: what the
// rank sends each peer in input_sizes, what it receives from each in output_sizes, in the order of
// the group's ranks) is checked pair by pair: what i sends j must be what j receives from i. The
// splits may be uneven (an MoE's routing), so Op.match skips these sizes and check_size_alltoall
// compares only the totals; the pairs name the rank whose splits disagree -- the one in every
// disagreeing pair (both ends where one pair alone disagrees). Nothing where every member's
// record is not in that form or every pair agrees.
MemberComparison AllToAllPairs(const std::vector<std::pair<int, const PyTorchOp*>>& ops,
                               const std::vector<int32_t>& group_ranks) {
  MemberComparison out;
  const size_t n = group_ranks.size();
  if (n < 2 || ops.size() != n) return out;
  std::map<int, const PyTorchOp*> by_local;
  for (const auto& [rank, op] : ops) {
    const auto at = std::find(group_ranks.begin(), group_ranks.end(), rank);
    if (at == group_ranks.end() || op->type != "alltoall" || op->input_sizes.size() != n ||
        op->output_sizes.size() != n)
      return out;
    by_local[static_cast<int>(at - group_ranks.begin())] = op;
  }
  if (by_local.size() != n) return out;  // a group that names a rank twice
  std::map<int, int> disagrees;          // local index -> pairs it is in
  std::vector<std::pair<int, int>> bad;  // (sender, receiver), local indices
  for (int i = 0; i < static_cast<int>(n); ++i) {
    for (int j = 0; j < static_cast<int>(n); ++j) {
      if (i == j || by_local[i]->input_sizes[static_cast<size_t>(j)] ==
                        by_local[j]->output_sizes[static_cast<size_t>(i)])
        continue;
      bad.emplace_back(i, j);
      ++disagrees[i];
      ++disagrees[j];
    }
  }
  if (bad.empty()) return out;
  int most = 0;
  for (const auto& [local, k] : disagrees) most = std::max(most, k);
  for (const auto& [local, k] : disagrees) {
    if (k == most) out.odd.push_back(group_ranks[static_cast<size_t>(local)]);
  }
  std::sort(out.odd.begin(), out.odd.end());
  out.kind = MismatchKind::kSize;
  // The first disagreeing pair of the first rank named, told from that rank's side.
  for (const auto& [i, j] : bad) {
    const int odd = out.odd.front();
    if (group_ranks[static_cast<size_t>(i)] != odd && group_ranks[static_cast<size_t>(j)] != odd)
      continue;
    const std::string sent = Shapes({by_local[i]->input_sizes[static_cast<size_t>(j)]});
    const std::string got = Shapes({by_local[j]->output_sizes[static_cast<size_t>(i)]});
    const std::string from = std::to_string(group_ranks[static_cast<size_t>(i)]);
    const std::string to = std::to_string(group_ranks[static_cast<size_t>(j)]);
    const std::string& name = by_local[i]->profiling_name;
    const bool receives = group_ranks[static_cast<size_t>(j)] == odd;
    out.found = name + (receives ? " expecting " + got + " from rank " + from
                                 : " sending " + sent + " to rank " + to);
    out.expected = name +
                   (receives ? " where rank " + from + " sends it " + sent
                             : " where rank " + to + " expects " + got) +
                   "; " + std::to_string(bad.size()) + " of the " + std::to_string(n * (n - 1)) +
                   " pairs' splits disagree";
    break;
  }
  return out;
}

// The members' ops at (group, seq) in classes of ops that match one another (each against its
// class's first op, as PyTorch compares each rank's entry against one reference), the norm being
// the largest class; of two as large, the one fewer of whose members changed type since their
// previous op in the group (the others took another path), then the one with the lowest rank.
MemberComparison Compare(const PyTorchInput& in, std::string_view group, int64_t seq,
                         const std::vector<int>& members) {
  MemberComparison out;
  std::vector<std::pair<int, const PyTorchOp*>> ops;
  for (int m : members) {
    if (const PyTorchOp* op = OpAt(in, m, group, seq)) ops.emplace_back(m, op);
  }
  for (const auto& [m, op] : ops) {
    if (!op->members.empty() || IsCoalescedClosing(op->type)) out.states_compared = false;
  }
  if (ops.size() < 2) return out;
  size_t pg_size = ops.size();
  std::vector<int32_t> group_ranks;
  if (const RankView& v = in.hang.ranks[ops[0].first]; v.present) {
    for (const auto& g : v.dump.snapshot.groups) {
      if (g.name == group) {
        pg_size = g.ranks.size();
        group_ranks = g.ranks.ToVector();
      }
    }
  }
  std::sort(group_ranks.begin(), group_ranks.end());  // a group's ranks number its members
  if (MemberComparison pairs = AllToAllPairs(ops, group_ranks); !pairs.odd.empty()) return pairs;
  struct Class {
    const PyTorchOp* rep;
    std::vector<int> who;
    int departs = 0;
  };
  std::vector<Class> classes;
  // The same record on two ranks is one class even where PyTorch's rule fails an op against
  // itself (an all_reduce whose output differs from its input, on every rank: nobody departs).
  auto same = [](const PyTorchOp& a, const PyTorchOp& b) {
    auto key = [](const PyTorchOp& o) {
      return std::tie(o.type, o.input_sizes, o.output_sizes, o.input_dtypes, o.output_dtypes);
    };
    if (key(a) != key(b) || a.members.size() != b.members.size()) return false;
    for (size_t i = 0; i < a.members.size(); ++i) {
      if (key(a.members[i]) != key(b.members[i])) return false;
    }
    return true;
  };
  for (const auto& member : ops) {
    const int m = member.first;
    const PyTorchOp* op = member.second;
    auto c = std::find_if(classes.begin(), classes.end(), [&](const Class& k) {
      return same(*k.rep, *op) || !MatchPyTorchOps(*k.rep, *op, pg_size).has_value();
    });
    if (c == classes.end()) c = classes.insert(classes.end(), Class{op, {}, 0});
    c->who.push_back(m);
    const PyTorchOp* prev = OpAt(in, m, group, seq - 1);
    c->departs += prev != nullptr && prev->type != op->type;
  }
  if (classes.size() < 2) return out;
  auto norm = std::min_element(classes.begin(), classes.end(), [](const Class& a, const Class& b) {
    if (a.who.size() != b.who.size()) return a.who.size() > b.who.size();
    if (a.departs != b.departs) return a.departs < b.departs;
    return a.who.front() < b.who.front();
  });
  for (const Class& c : classes) {
    if (&c == &*norm) continue;
    if (out.odd.empty()) {
      out.kind = *MatchPyTorchOps(*norm->rep, *c.rep, pg_size);
      out.found = FormatPyTorchOp(*c.rep);
      out.expected = FormatPyTorchOp(*norm->rep);
      // In a block, the first member that differs says it best.
      const auto& a = norm->rep->members;
      const auto& b = c.rep->members;
      for (size_t i = 0; i < a.size() && i < b.size() && a.size() == b.size(); ++i) {
        if (!MatchOne(a[i], b[i], pg_size)) continue;
        const std::string at = " (op " + std::to_string(i + 1) + " of " + std::to_string(a.size()) +
                               " in " + c.rep->profiling_name + ")";
        out.found = FormatPyTorchOp(b[i]) + at;
        out.expected = FormatPyTorchOp(a[i]);
        break;
      }
    }
    out.odd.insert(out.odd.end(), c.who.begin(), c.who.end());
  }
  std::sort(out.odd.begin(), out.odd.end());
  return out;
}

// Evidence lines for a verdict at (group, seq): each shown rank's op as PyTorch recorded it, and
// the stack that issued a root's op.
void AddEvidence(const PyTorchInput& in, Verdict* v) {
  if (v->group.empty() || v->seq < 0) return;
  std::string desc;
  for (int r : v->root_ranks) {
    if (r >= 0 && r < static_cast<int>(in.ranks.size())) {
      auto it = in.ranks[r].pg_desc.find(v->group);
      if (it != in.ranks[r].pg_desc.end()) desc = it->second;
    }
  }
  const std::string pg = "process group " + v->group + (desc.empty() ? "" : " (" + desc + ")");
  std::vector<int> show(v->root_ranks.begin(), v->root_ranks.end());
  for (int w : v->waiting_ranks) {
    if (show.size() >= 8) break;
    show.push_back(w);
  }
  bool any = false;
  // A transfer's op on `r` with one of the shown ranks, at the verdict's number.
  auto transfer = [&](int r) -> const PyTorchOp* {
    if (r < 0 || r >= static_cast<int>(in.ranks.size())) return nullptr;
    for (int peer : show) {
      for (bool send : {true, false}) {
        auto it = in.ranks[r].transfers.find({v->group, peer, send, v->seq});
        if (it != in.ranks[r].transfers.end()) return &it->second;
      }
    }
    return nullptr;
  };
  for (int r : show) {
    if (const PyTorchOp* t = transfer(r)) {
      any = true;
      v->evidence.push_back("pytorch: rank " + std::to_string(r) + ": " + FormatPyTorchOp(*t) +
                            ", p2p_seq_id " + std::to_string(t->p2p_seq_id) + " in " + pg +
                            ", record_id " + std::to_string(t->record_id) + ", state " +
                            (t->state.empty() ? "unknown" : t->state));
      continue;
    }
    const PyTorchOp* op = OpAt(in, r, v->group, v->seq);
    if (op == nullptr) {
      if (r >= 0 && r < static_cast<int>(in.ranks.size()) && in.hang.ranks[r].present &&
          in.ranks[r].pg_desc.count(v->group) > 0)  // a member that has not issued it
        v->evidence.push_back("pytorch: rank " + std::to_string(r) + " recorded no op #" +
                              std::to_string(v->seq) + " in " + pg);
      continue;
    }
    any = true;
    v->evidence.push_back("pytorch: rank " + std::to_string(r) + ": " + FormatPyTorchOp(*op) +
                          ", collective_seq_id " + std::to_string(op->collective_seq_id) + " in " +
                          pg + ", record_id " + std::to_string(op->record_id) + ", state " +
                          (op->state.empty() ? "unknown" : op->state) +
                          (op->stack_id >= 0 ? ", stack_id " + std::to_string(op->stack_id) : ""));
  }
  for (int r : show) {
    const PyTorchOp* op = transfer(r);
    if (op == nullptr) op = OpAt(in, r, v->group, v->seq);
    if (op == nullptr || op->frames.empty()) continue;
    if (std::find(v->root_ranks.begin(), v->root_ranks.end(), r) == v->root_ranks.end() &&
        r != show.front())
      continue;  // the roots' stacks, or the first waiter's where a root recorded nothing
    std::string stack;
    for (size_t i = 0; i < op->frames.size() && i < 6; ++i)
      stack += (i ? " <- " : "") + op->frames[i];
    v->evidence.push_back("pytorch: rank " + std::to_string(r) + " issued it from " + stack);
  }
  if (any) {
    for (int r : show) {
      const PyTorchOp* op = transfer(r);
      if (op == nullptr) op = OpAt(in, r, v->group, v->seq);
      if (op == nullptr || op->backend.empty()) continue;
      v->evidence.push_back(
          "pytorch: backend " + op->backend +
          (in.ranks[r].version.empty() ? "" : ", dump version " + in.ranks[r].version));
      break;
    }
  }
}

}  // namespace

std::string FormatPyTorchOp(const PyTorchOp& op) {
  std::string s = op.profiling_name.empty() ? "(unnamed op)" : op.profiling_name;
  if (!op.members.empty()) {  // a block: each member's name and input sizes
    s += " of " + std::to_string(op.members.size()) + " ops (";
    for (size_t i = 0; i < op.members.size() && i < 8; ++i) {
      const PyTorchOp& m = op.members[i];
      s += (i ? ", " : "") + m.profiling_name.substr(m.profiling_name.find(':') + 1) + " " +
           Shapes(m.input_sizes);
    }
    return s + (op.members.size() > 8 ? ", ...)" : ")");
  }
  s += " input_sizes " + Shapes(op.input_sizes) + " output_sizes " + Shapes(op.output_sizes);
  if (!op.input_dtypes.empty()) s += " " + op.input_dtypes[0];
  return s;
}

std::optional<MismatchKind> MatchPyTorchOps(const PyTorchOp& expected, const PyTorchOp& found,
                                            size_t pg_size) {
  if (auto k = MatchOne(expected, found, pg_size)) return k;
  // A coalesced block: its members one by one, in order (utils.py
  // match_coalesced_groups_with_non_p2p checks each member as a collective of its own).
  if (expected.members.size() != found.members.size()) return MismatchKind::kSize;
  for (size_t i = 0; i < expected.members.size(); ++i) {
    if (auto k = MatchOne(expected.members[i], found.members[i], pg_size)) return k;
  }
  return std::nullopt;
}

// How many times the longest earlier run of an op an open one may have taken and still be
// progressing at its usual pace: an op's time varies with the load on its links, and a kernel
// stuck for good outgrows it within a few steps.
constexpr double kUsualPaceSlack = 2.0;

// With timing on (TORCH_NCCL_ENABLE_TIMING: completed ops carry duration_ms), the op each of
// `ranks` is blocked in has been open for less than its timeout and no longer than kUsualPaceSlack
// times the longest the same op of its group took on that rank before: a slow op making its way,
// not a stuck one. False where any rank's op has no such history or its dump's time is not known.
bool InFlightAtItsUsualPace(const PyTorchInput& in, const std::vector<int32_t>& ranks,
                            std::string* evidence) {
  if (ranks.empty()) return false;
  for (const int32_t r : ranks) {
    if (r < 0 || r >= static_cast<int>(in.ranks.size())) return false;
    const RankView& v = in.hang.ranks[r];
    const auto& blocking = v.ops.blocking;
    const auto& groups = v.dump.snapshot.groups;
    if (!v.present || in.ranks[r].dated_by_timeout || !blocking || v.ops.blocking_group < 0 ||
        v.ops.blocking_group >= static_cast<int>(groups.size()))
      return false;
    const std::string& group = groups[v.ops.blocking_group].name;
    const PyTorchOp* open = OpAt(in, r, group, static_cast<int64_t>(blocking->seq));
    if (open == nullptr) return false;
    double usual_ms = -1;
    for (const auto& [key, op] : in.ranks[r].collectives) {
      if (key.first == group && op.type == open->type && op.state == "completed")
        usual_ms = std::max(usual_ms, op.duration_ms);
    }
    const int64_t since =
        blocking->started_at_ns > 0 ? blocking->started_at_ns : blocking->enqueued_at_ns;
    const double open_ms = static_cast<double>(v.dump.dumped_at_ns - since) / 1e6;
    if (usual_ms <= 0 || since <= 0 || open_ms > kUsualPaceSlack * usual_ms ||
        (blocking->timeout_ms > 0 && open_ms >= blocking->timeout_ms))
      return false;
    if (evidence->empty()) {
      std::string line =
          tracer::Format("rank %d: %s open %.1f s, the same op took up to %.1f s before", r,
                         open->profiling_name.c_str(), open_ms / 1e3, usual_ms / 1e3);
      *evidence = line;
    }
  }
  return true;
}

std::vector<Verdict> AnalyzePyTorch(const PyTorchInput& in, HangOptions options) {
  // PyTorch dumps from every live rank on a timeout or an NCCL error: a rank without one is gone.
  options.absent_is_gone = !options.absent_not_collected;
  options.matcher = [&in](std::string_view group, int64_t seq, const std::vector<int>& members) {
    return Compare(in, group, seq, members);
  };
  std::vector<Verdict> verdicts = AnalyzeHang(in.hang, options);
  // Every member joined every open op and their ops match: PyTorch's analysis finds no error
  // (utils.py error_analysis: "No errors found for this collective entry"). Whether that is a hang
  // rests on how long the ops were open; where the files were copied since, nothing says it, and
  // a dump taken mid-run (_dump_nccl_trace on a healthy job) looks just so.
  // A set of dumps taken as partial (absent_not_collected) says nothing of the missing ranks:
  // nothing it does not show is concluded healthy.
  bool partial = false;
  for (const RankView& v : in.hang.ranks) partial |= options.absent_not_collected && !v.present;
  // The unknown verdict made healthy, for `why` (after "every member of every open op joined it
  // and their ops match (PyTorch's analysis finds no error)"), its evidence kept.
  auto healthy = [&](double confidence, const std::string& why) {
    Verdict v;
    v.kind = VerdictKind::kHealthy;
    v.detected_at_ns = verdicts[0].detected_at_ns;
    v.confidence = confidence;
    v.explanation =
        "every member of every open op joined it and their ops match (PyTorch's analysis finds "
        "no error)" +
        why;
    v.evidence = std::move(verdicts[0].evidence);
    return v;
  };
  if (!partial && verdicts.size() == 1 && ParseCause(verdicts[0].cause) == Cause::kUnknown) {
    if (std::string pace; InFlightAtItsUsualPace(in, verdicts[0].waiting_ranks, &pace)) {
      Verdict v = healthy(0.8, ", and each has been open no longer than " +
                                   std::to_string(static_cast<int>(kUsualPaceSlack)) +
                                   " times what the same op took before (its recorded "
                                   "duration_ms) and less than its timeout: a slow op making "
                                   "progress, not a hang");
      v.evidence.push_back(pace);
      return {v};
    }
    bool dated = true;
    for (int r : verdicts[0].waiting_ranks) {
      dated &= r >= 0 && r < static_cast<int>(in.ranks.size()) && in.ranks[r].dated_by_timeout;
    }
    if (dated) {
      return {healthy(0.6,
                      "; the dumps were copied since they were written, so how long those ops had "
                      "been open is not known, and a dump taken mid-run looks the same.")};
    }
  }
  for (Verdict& v : verdicts) {
    if (v.kind == VerdictKind::kHang) AddEvidence(in, &v);
  }
  return verdicts;
}

}  // namespace megascope::analyzer
