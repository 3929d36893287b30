// The PyTorch reader over a directory of dumps, one per rank: each converted (pytorch.cc), then
// what they mean together -- group names made unique where they mean different members, wrapped
// rings' transfers numbered alike, stale instances of re-created groups said once.
#include <algorithm>
#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "megascope/analyzer/hang.h"
#include "megascope/analyzer/pytorch.h"
#include "megascope/tracer/file_util.h"
#include "pytorch_convert.h"

namespace megascope::analyzer {
namespace {

namespace fs = std::filesystem;
using pytorch_internal::Converted;
using pytorch_internal::ParseConverted;
using tracer::OpState;
using tracer::OpType;

// Where a ring dropped its oldest entries, a rank cannot count its transfers with a peer from the
// first one, and two ranks' counts no longer meet (utils.py align_trace_from_beginning aligns
// collectives by record id for the same reason). Both sides' transfers of a pair complete in the
// same order, so each pair's are numbered from where they stop completing: the first open one on
// either side gets the same number, the larger of the two sides' counts of completed ones before
// it (so that the oldest one either ring still holds is #0).
void NumberTransfersFromTheirFirstOpen(const std::vector<tracer::Dump*>& dumps) {
  using Pair = std::tuple<std::string, int32_t, int32_t>;  // group, sender, receiver
  struct Run {
    Pair pair;
    std::vector<tracer::FlightEntry*> ops;
    size_t first_open = 0;
  };
  std::vector<Run> runs;
  std::map<Pair, size_t> base;
  for (tracer::Dump* d : dumps) {
    const int32_t self = d->snapshot.info.rank;
    std::map<std::tuple<int32_t, int32_t, bool>, std::vector<tracer::FlightEntry*>> mine;
    for (tracer::FlightEntry& e : d->snapshot.entries) {
      if (tracer::IsP2P(e.op)) mine[{e.group, e.peer, e.op == OpType::kSend}].push_back(&e);
    }
    for (auto& [key, ops] : mine) {
      const auto& [group, peer, send] = key;
      Run run{{d->snapshot.groups[group].name, send ? self : peer, send ? peer : self},
              std::move(ops),
              0};
      while (run.first_open < run.ops.size() &&
             run.ops[run.first_open]->state == OpState::kCompleted)
        ++run.first_open;
      base[run.pair] = std::max(base[run.pair], run.first_open);
      runs.push_back(std::move(run));
    }
  }
  for (Run& run : runs) {
    for (size_t i = 0; i < run.ops.size(); ++i)
      run.ops[i]->seq = base[run.pair] + i - run.first_open;
  }
}

// What the ranks' dumps mean together: a group name is local to a rank (split_group and
// DeviceMesh give different groups of ranks the same name), so where one name means different
// members, the members become part of its name; after a ring wrapped, transfers are numbered
// from the first one every rank still holds.
void Reconcile(std::vector<std::pair<std::string, Converted>>& read) {
  std::map<std::string, std::set<std::vector<int32_t>>> members;
  for (const auto& [f, c] : read) {
    for (const auto& g : c.dump.snapshot.groups) members[g.name].insert(g.ranks.ToVector());
  }
  bool wrapped = false;
  for (auto& [f, c] : read) {
    wrapped |= c.rank.wrapped;
    for (auto& g : c.dump.snapshot.groups) {
      if (members[g.name].size() < 2) continue;
      std::string list;
      for (int32_t r : g.ranks) list += (list.empty() ? "" : ",") + std::to_string(r);
      const std::string renamed = g.name + "[" + list + "]";
      if (auto it = c.rank.pg_desc.find(g.name); it != c.rank.pg_desc.end())
        c.rank.pg_desc[renamed] = it->second;
      g.name = renamed;
    }
  }
  if (wrapped) {
    std::vector<tracer::Dump*> all;
    all.reserve(read.size());
    for (auto& [f, c] : read) all.push_back(&c.dump);
    NumberTransfersFromTheirFirstOpen(all);
  }
}

}  // namespace

Result<PyTorchInput> LoadPyTorch(const std::string& dir, const PyTorchLoadOptions& options) {
  if (!fs::is_directory(dir)) return NotFound(dir + " is not a directory");
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_regular_file()) files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  static const std::regex kTrailingRank(R"((\d+)(\.json)?$)");
  // A file that is not a readable dump (a log beside them, a truncated write) is left out with a
  // warning; its rank then reads as missing, which the analysis handles.
  std::vector<std::string> skipped;
  auto rank_in_name = [](const std::string& f) {
    std::smatch m;
    const std::string name = fs::path(f).filename().string();
    return std::regex_search(name, m, kTrailingRank) && m[1].length() < 9 ? std::stoi(m[1]) : -1;
  };
  // The world as the files' names count it: what a dump that does not say its world is read with.
  int world_hint = 0;
  for (const auto& f : files) world_hint = std::max(world_hint, rank_in_name(f) + 1);
  std::vector<std::pair<std::string, Converted>> read;
  for (const auto& f : files) {
    auto text = tracer::ReadFile(f);
    auto c = text.ok() ? ParseConverted(*text, f, rank_in_name(f), world_hint,
                                        options.ft_group_world_size)
                       : Result<Converted>(text.status());
    if (!c.ok()) {
      skipped.push_back(c.status().message());
      continue;
    }
    read.emplace_back(f, std::move(*c));
  }
  if (read.empty() && !skipped.empty())
    return InvalidArgument("no readable PyTorch Flight Recorder dump in " + dir + ": " +
                           skipped.front());
  if (read.empty()) return NotFound("no PyTorch Flight Recorder dumps in " + dir);
  Reconcile(read);
  std::vector<std::pair<std::string, tracer::Dump>> dumps;
  std::vector<std::pair<int, PyTorchRank>> extra;
  for (auto& [f, c] : read) {
    const auto& groups = c.dump.snapshot.groups;
    for (auto& [key, op] : c.collectives)
      c.rank.collectives[{groups[key.first].name, key.second}] = std::move(op);
    for (auto& [at, op] : c.transfers) {
      const tracer::FlightEntry& e = c.dump.snapshot.entries[at];
      c.rank.transfers[{groups[e.group].name, e.peer, e.op == OpType::kSend,
                        static_cast<int64_t>(e.seq)}] = std::move(op);
    }
    extra.emplace_back(c.dump.snapshot.info.rank, std::move(c.rank));
    dumps.emplace_back(f, std::move(c.dump));
  }
  PyTorchInput in;
  auto made = MakeHangInput(std::move(dumps));
  if (!made.ok() && options.ft_group_world_size == 0 &&
      made.status().message().find("world_size") != std::string::npos)
    return Status(made.status().code(),
                  made.status().message() +
                      " (torchft's replica groups each number their default group's ranks from "
                      "0: read such dumps with --transform-ft N, N the replica group's size)");
  if (!made.ok()) return made.status();
  in.hang = std::move(*made);
  for (const std::string& why : skipped) in.hang.warnings.push_back("left out: " + why);
  std::map<std::string, std::pair<int, int>> stale;  // group -> (dumps, entries)
  for (const auto& [f, c] : read) {
    for (const auto& [name, n] : c.stale) {
      ++stale[name].first;
      stale[name].second += n;
    }
  }
  for (const auto& [name, n] : stale) {
    in.hang.warnings.push_back(
        "process group '" + name + "' was created again under its name (an in-process restart: " +
        "a new pg_id) in " + std::to_string(n.first) + (n.first == 1 ? " dump" : " dumps") +
        "; the " + std::to_string(n.second) +
        " entries of its earlier instances are stale and left out, the live one is analysed");
  }
  in.ranks.resize(in.hang.ranks.size());
  for (auto& [r, x] : extra) {
    if (r >= 0 && r < static_cast<int>(in.ranks.size())) in.ranks[r] = std::move(x);
  }
  return in;
}

Result<HangInput> LoadPyTorchDumps(const std::string& dir) {
  ASSIGN_OR_RETURN(PyTorchInput in, LoadPyTorch(dir));
  return std::move(in.hang);
}

}  // namespace megascope::analyzer
