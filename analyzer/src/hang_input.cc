#include "megascope/analyzer/hang_input.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "hang/analysis.h"
#include "megascope/tracer/enum_names.h"
#include "megascope/tracer/parallel.h"

namespace megascope::analyzer {
namespace {

using hang::IsOpen;
using tracer::FlightEntry;
using tracer::OpState;
using tracer::OpType;

// Sorts [first, last) by `key` and keeps, of elements with equal keys, the last (the newest: the
// input is in issue order). Returns the end of the kept ones.
template <typename It, typename Key>
It KeepNewest(It first, It last, const Key& key) {
  auto less = [&](const auto& a, const auto& b) { return key(a) < key(b); };
  if (!std::is_sorted(first, last, less)) std::stable_sort(first, last, less);
  It out = first;
  for (It i = first; i != last; ++i) {
    if (std::next(i) == last || key(*std::next(i)) != key(*i)) *out++ = *i;
  }
  return out;
}

// The entries' transfers, last collective seqs, issue history and blocking op; coll_start
// holds each group's count of collectives (at g + 1).
void IndexEntries(const tracer::Dump& dump, const std::vector<int32_t>& canon, RankOps& o) {
  const auto& entries = dump.snapshot.entries;
  o.last_coll.assign(dump.snapshot.groups.size(), -1);
  o.coll_start.assign(dump.snapshot.groups.size() + 1, 0);
  size_t n_colls = 0, n_sends = 0;
  for (const FlightEntry& e : entries) {
    n_colls += !tracer::IsP2P(e.op);
    n_sends += e.op == OpType::kSend;
  }
  o.history.reserve(n_colls);
  o.sends.reserve(n_sends);
  o.recvs.reserve(entries.size() - n_colls - n_sends);
  const FlightEntry* blocking = nullptr;
  for (const FlightEntry& e : entries) {
    const int32_t g = canon[e.group];
    const auto seq = static_cast<int64_t>(e.seq);
    if (tracer::IsP2P(e.op)) {
      const bool send = e.op == OpType::kSend;
      (send ? o.sends : o.recvs)
          .push_back({g, e.peer, seq, e.bytes, send ? e.bytes_sent : e.bytes_received, IsOpen(e)});
    } else {
      ++o.coll_start[g + 1];
      o.last_coll[g] = std::max(o.last_coll[g], seq);
      o.history.push_back(g);
    }
    o.in_op |= e.state == OpState::kEnqueued || e.state == OpState::kStarted;
    // Entries are in issue order: the newest open op is where a rank's thread waits; behind a
    // device queue (NCCL), the oldest open op is the one everything after it waits for.
    if (IsOpen(e) && (blocking == nullptr || !dump.oldest_open_blocks)) {
      blocking = &e;
      o.blocking_group = g;
      o.history_at_blocking = o.history.size();  // the collectives issued up to it
    }
  }
  if (blocking != nullptr) o.blocking = *blocking;
  if (!entries.empty()) o.newest = entries.back();
}

// Collectives bucketed by group (issue order kept within one), then by seq within a group where
// the recorder's order is not already that; of a seq recorded twice the newest is kept.
void IndexCollectives(const tracer::Dump& dump, const std::vector<int32_t>& canon, RankOps& o) {
  const auto& entries = dump.snapshot.entries;
  const auto n_groups = static_cast<int32_t>(dump.snapshot.groups.size());
  const size_t n_colls = o.history.size();
  for (int32_t g = 0; g < n_groups; ++g) o.coll_start[g + 1] += o.coll_start[g];
  std::vector<uint32_t> at(n_colls);  // positions in `entries`
  std::vector<uint32_t> next(o.coll_start.begin(), o.coll_start.end() - 1);
  for (uint32_t i = 0; i < entries.size(); ++i) {
    if (!tracer::IsP2P(entries[i].op)) at[next[canon[entries[i].group]]++] = i;
  }
  uint32_t kept = 0;
  for (int32_t g = 0; g < n_groups; ++g) {
    const auto first = at.begin() + o.coll_start[g];
    const auto last = KeepNewest(first, at.begin() + o.coll_start[g + 1],
                                 [&](uint32_t i) { return static_cast<int64_t>(entries[i].seq); });
    if (o.coll_start[g] != kept) std::copy(first, last, at.begin() + kept);
    o.coll_start[g] = kept;
    kept += static_cast<uint32_t>(last - first);
  }
  o.coll_start[n_groups] = kept;
  o.colls.reserve(kept);
  for (uint32_t k = 0; k < kept; ++k) {
    const FlightEntry& e = entries[at[k]];
    RankOps::Collective& c = o.colls.emplace_back();
    c.seq = static_cast<int64_t>(e.seq);
    c.bytes = e.bytes;
    c.op = e.op;
    c.dtype = e.dtype;
    c.state = e.state;
    if (e.bytes_sent >= 0 && static_cast<uint64_t>(e.bytes_sent) == e.bytes) {
      c.sent = RankOps::kSentAll;
    } else if (e.bytes_sent >= 0) {
      c.sent = static_cast<int32_t>(o.partial_sent.size());
      o.partial_sent.push_back(e.bytes_sent);
    }
  }
}

}  // namespace

RankOps IndexOps(const tracer::Dump& dump, const std::shared_ptr<tracer::Arena>& arena) {
  RankOps o;
  const tracer::ArenaAllocator<void> in(arena);
  o.colls = RankOps::Array<RankOps::Collective>(in);
  o.sends = RankOps::Array<RankOps::Transfer>(in);
  o.recvs = RankOps::Array<RankOps::Transfer>(in);
  o.history = RankOps::Array<int32_t>(in);
  const auto& groups = dump.snapshot.groups;
  const auto n_groups = static_cast<int32_t>(groups.size());
  // Entries name groups by position; two groups of one name are one (the later one's members).
  o.by_name.resize(groups.size());
  std::iota(o.by_name.begin(), o.by_name.end(), 0);
  o.by_name.erase(KeepNewest(o.by_name.begin(), o.by_name.end(),
                             [&](int32_t g) -> std::string_view { return groups[g].name; }),
                  o.by_name.end());
  std::vector<int32_t> canon(groups.size());
  for (int32_t g = 0; g < n_groups; ++g) canon[g] = hang::GroupOf(o, groups, groups[g].name);
  IndexEntries(dump, canon, o);
  IndexCollectives(dump, canon, o);
  auto transfer_key = [](const RankOps::Transfer& t) {
    return std::make_tuple(t.group, t.peer, t.seq);
  };
  o.sends.erase(KeepNewest(o.sends.begin(), o.sends.end(), transfer_key), o.sends.end());
  o.recvs.erase(KeepNewest(o.recvs.begin(), o.recvs.end(), transfer_key), o.recvs.end());
  return o;
}

Status HangInputBuilder::Add(RankView view) {
  const tracer::RankInfo& info = view.dump.snapshot.info;
  std::lock_guard<std::mutex> lock(mu_);
  if (in_.world_size == 0) {
    in_.world_size = info.world_size;
    in_.ranks.resize(in_.world_size);
  } else if (info.world_size != in_.world_size) {
    return InvalidArgument(view.source + ": world_size " + std::to_string(info.world_size) +
                           " disagrees with " + std::to_string(in_.world_size) +
                           " in the other dumps");
  }
  RankView& v = in_.ranks[info.rank];
  // Of two dumps of a rank the newer is kept; of two as new, the first by source (whatever order
  // they arrive in).
  if (v.present && std::make_pair(-v.dump.dumped_at_ns, std::string_view(v.source)) <=
                       std::make_pair(-view.dump.dumped_at_ns, std::string_view(view.source)))
    return Status::Ok();
  v = std::move(view);
  v.present = true;
  return Status::Ok();
}

Result<HangInput> HangInputBuilder::Finish() && {
  std::lock_guard<std::mutex> lock(mu_);
  if (in_.world_size == 0) return InvalidArgument("no flight-recorder dumps to analyse");
  // group -> its members in the first rank's dump that has it, and that dump's source
  std::map<std::string_view, std::pair<const tracer::RankList*, const std::string*>> membership;
  for (const RankView& v : in_.ranks) {
    if (!v.present) continue;
    for (const auto& g : v.dump.snapshot.groups) {
      auto [it, added] = membership.try_emplace(g.name, &g.ranks, &v.source);
      if (!added && *it->second.first != g.ranks) {
        return InvalidArgument("group '" + g.name + "' has different members in " + v.source +
                               " and " + *it->second.second);
      }
    }
  }
  // Unknown values (a newer writer's phase, op, state or dtype): once per field and value.
  struct Seen {
    int dumps = 0;
    std::string first;
  };
  std::map<std::pair<std::string, std::string>, Seen> unknown;
  for (const RankView& v : in_.ranks) {
    std::set<std::pair<std::string, std::string>> here;
    for (const tracer::UnknownValue& u : v.dump.unknown_values) {
      Seen& s = unknown[{u.field, u.value}];
      if (s.first.empty()) s.first = v.source + ": " + u.where;
      if (here.insert({u.field, u.value}).second) ++s.dumps;
    }
  }
  for (const auto& [key, s] : unknown) {
    in_.warnings.push_back("unknown " + key.first + " '" + key.second + "' in " +
                           std::to_string(s.dumps) + (s.dumps == 1 ? " dump" : " dumps") +
                           " (first: " + s.first + "): read as unknown, the analysis goes on");
  }
  return std::move(in_);
}

Result<HangInput> MakeHangInput(std::vector<std::pair<std::string, tracer::Dump>> dumps) {
  std::vector<RankOps> ops(dumps.size());
  tracer::ParallelFor(dumps.size(), std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 8),
                      [&](size_t i) { ops[i] = IndexOps(dumps[i].second); });
  HangInputBuilder builder;
  for (size_t i = 0; i < dumps.size(); ++i) {  // in the caller's order: its first error is named
    RankView v;
    v.source = std::move(dumps[i].first);
    v.dump = std::move(dumps[i].second);
    v.ops = std::move(ops[i]);
    RETURN_IF_ERROR(builder.Add(std::move(v)));
  }
  return std::move(builder).Finish();
}

}  // namespace megascope::analyzer
