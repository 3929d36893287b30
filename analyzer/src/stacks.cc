#include "megascope/analyzer/stacks.h"

#include <algorithm>
#include <map>

namespace megascope::analyzer {
namespace {

// The stack that says what a rank is doing: its main thread's (the training loop; its tid is the
// process id), else its first thread's.
const tracer::ThreadStack* MainStack(const tracer::Dump& d) {
  if (d.stacks.empty()) return nullptr;
  for (const tracer::ThreadStack& t : d.stacks) {
    if (t.tid == d.snapshot.info.pid) return &t;
  }
  return &d.stacks.front();
}

// The functions of the program's own code: where in the training step the thread is. Frames of
// libraries below it (a socket wait or a futex, which differ from rank to rank by timing) are
// left out, unless the stack has no frame of ours (then every function counts).
std::vector<std::string> KeyOf(const tracer::ThreadStack& t) {
  std::vector<std::string> ours, all;
  for (const std::string& f : t.frames) {
    std::string fn = tracer::FrameFunction(f);
    if (fn.rfind("megascope::", 0) == 0 || fn == "main") ours.push_back(fn);
    all.push_back(std::move(fn));
  }
  return ours.empty() ? all : ours;
}

std::string RankList(const std::vector<int32_t>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size() && i < 16; ++i)
    s += (i ? ", " : "") + std::to_string(ranks[i]);
  if (ranks.size() > 16) s += ", ... (" + std::to_string(ranks.size()) + ")";
  return s;
}

}  // namespace

std::vector<StackGroup> GroupByStack(const HangInput& in) {
  std::map<std::vector<std::string>, size_t> index;
  std::vector<StackGroup> groups;
  for (int r = 0; r < static_cast<int>(in.ranks.size()); ++r) {
    const RankView& v = in.ranks[r];
    if (!v.present) continue;
    const tracer::ThreadStack* t = MainStack(v.dump);
    if (t == nullptr) continue;
    std::vector<std::string> key = KeyOf(*t);
    auto [it, added] = index.try_emplace(key, groups.size());
    if (added) groups.push_back({{}, std::move(key), *t});
    groups[it->second].ranks.push_back(r);
  }
  std::stable_sort(groups.begin(), groups.end(), [](const StackGroup& a, const StackGroup& b) {
    return a.ranks.size() > b.ranks.size();
  });
  return groups;
}

std::string OddStackEvidence(const HangInput& in, const std::vector<StackGroup>& groups) {
  if (groups.size() < 2) return "";
  auto waits = [&](const StackGroup& g) {  // some rank of the group is inside an open op
    return std::any_of(g.ranks.begin(), g.ranks.end(),
                       [&](int32_t r) { return in.ranks[r].ops.in_op; });
  };
  const StackGroup* odd = nullptr;
  size_t waiting = 0, idle_groups = 0;
  for (const StackGroup& g : groups) {
    if (waits(g)) {
      waiting += g.ranks.size();
    } else {
      ++idle_groups;
      odd = &g;
    }
  }
  std::string where, others;
  if (idle_groups == 1 && waiting > 0) {  // where its own code is, innermost
    where = odd->key.empty() ? "no frames" : odd->key.front();
    others = std::to_string(waiting) + " ranks wait in collectives";
  } else {
    odd = &groups.back();
    if (odd->ranks.size() == groups[groups.size() - 2].ranks.size()) return "";  // no one smallest
    // Where the two part, from the outermost frame in: what each called there.
    const auto &a = odd->key, &b = groups.front().key;
    size_t common = 0;
    while (common < a.size() && common < b.size() &&
           a[a.size() - 1 - common] == b[b.size() - 1 - common]) {
      ++common;
    }
    auto at = [&](const std::vector<std::string>& k) {
      return common < k.size() ? k[k.size() - 1 - common] : std::string("no further frame");
    };
    where = at(a);
    others = std::to_string(groups.front().ranks.size()) + " ranks are in " + at(b);
  }
  const bool one = odd->ranks.size() == 1;
  return "stacks: rank" + std::string(one ? " " : "s ") + RankList(odd->ranks) +
         (one ? " stands" : " stand") + " apart, in " + where + ", while " + others;
}

std::string FormatStackGroups(const std::vector<StackGroup>& groups, size_t max_frames) {
  if (groups.empty()) return "";
  std::string out = "stacks (main thread; " + std::to_string(groups.size()) + " distinct):\n";
  for (const StackGroup& g : groups) {
    out += "  " + std::to_string(g.ranks.size()) + (g.ranks.size() > 1 ? " ranks" : " rank") +
           " [" + RankList(g.ranks) + "]" + ":\n";
    for (size_t i = 0; i < g.stack.frames.size() && i < max_frames; ++i)
      out += "    #" + std::to_string(i) + " " + g.stack.frames[i] + "\n";
    if (g.stack.frames.size() > max_frames)
      out += "    ... " + std::to_string(g.stack.frames.size() - max_frames) + " more\n";
    if (g.stack.frames.empty()) out += "    (the thread did not answer)\n";
  }
  return out;
}

}  // namespace megascope::analyzer
