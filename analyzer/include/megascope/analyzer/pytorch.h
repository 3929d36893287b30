// PyTorch Flight Recorder dumps read as PyTorch means them: each rank's dump (pickle or JSON, any
// process-group backend) becomes a megascope dump for the hang analysis, and what PyTorch
// recorded of each op (its profiling name, sizes, dtypes, states, stack) is kept to compare the
// members of a collective by PyTorch's own rules (torch/distributed/flight_recorder/components/
// types.py, Op.match) and to show a PyTorch user the evidence in PyTorch's words.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "megascope/analyzer/hang.h"

namespace megascope::analyzer {

// One op as PyTorch recorded it: an entry, or a coalesced block (its closing entry, with the
// block's member entries in `members`).
struct PyTorchOp {
  std::string profiling_name;  // as written: "nccl:all_reduce", "gloo:broadcast", "nccl:coalesced"
  std::string backend;         // the name's prefix: nccl, gloo, xccl, nccl2, ... ("" if none)
  // The name's op without case or underscores: allreduce, broadcastoop, send, coalesced, ...
  std::string type;
  std::vector<std::vector<int64_t>> input_sizes, output_sizes;
  std::vector<std::string> input_dtypes, output_dtypes;
  std::string state;  // scheduled, started, completed (as written; "" if none)
  // With TORCH_NCCL_ENABLE_TIMING, a completed op's time from its start to its end event, in ms
  // (duration_ms); < 0 when not recorded.
  double duration_ms = -1;
  // Newer recorders number each distinct stack (stack_id, -1 when not written); the evidence shows
  // it, so ranks that issued an op from the same code can be told apart from those that did not.
  int64_t stack_id = -1;
  int64_t record_id = -1, collective_seq_id = -1, p2p_seq_id = -1;
  std::vector<std::string> frames;  // "function at file:line", innermost first
  std::vector<PyTorchOp> members;   // of a coalesced block, in issue order
};

// What one rank's dump says beyond the megascope dump it became.
struct PyTorchRank {
  std::string version;                         // the dump's "version" ("" for the first form)
  std::map<std::string, std::string> pg_desc;  // process group name -> its description
  std::map<std::pair<std::string, int64_t>, PyTorchOp> collectives;  // (group, seq) -> op
  // (group, peer, is a send, seq as the hang analysis numbers it) -> op
  std::map<std::tuple<std::string, int32_t, bool, int64_t>, PyTorchOp> transfers;
  bool wrapped = false;  // its ring had dropped older entries (the first record_id is not 0)
  // The file was copied after the dump (its time is past every open op's timeout): the dump is
  // dated as if written when its open ops timed out, which is when PyTorch dumps on its own.
  bool dated_by_timeout = false;
};

struct PyTorchInput {
  HangInput hang;                  // the converted dumps (ranks without a dump are absent)
  std::vector<PyTorchRank> ranks;  // index = rank, as hang.ranks
};

struct PyTorchLoadOptions {
  // torchft: each replica group runs its own default process group whose members are numbered
  // 0..N-1 inside the replica; with N here (fr_trace --transform-ft, N the group world size) a
  // dump of global rank R has its default_pg's ranks moved to replica R / N's global ranks, so
  // the replicas' groups stay apart. 0: as written.
  int ft_group_world_size = 0;
};

// Reads every rank's dump in `dir` (the rank from a "rank" field or the digits ending the file
// name). A file that is not a readable dump is left out with a warning; an error if none is.
Result<PyTorchInput> LoadPyTorch(const std::string& dir, const PyTorchLoadOptions& options = {});

// True for the type of the entry that closes a coalesced block ("coalesced", "allgathercoalesced",
// "reducescattercoalesced": PyTorch's coalesced, ALLGATHER_coalesced, REDUCE_SCATTER_coalesced):
// its members are the entries before it of the same group and sequence number.
bool IsCoalescedClosing(std::string_view type);

// An op as a PyTorch user reads it: "nccl:all_gather input_sizes [[4, 4]] output_sizes [[8, 4]]
// Float"; a block with its members.
std::string FormatPyTorchOp(const PyTorchOp& op);

// PyTorch's rule for two members' ops at one sequence number (Op.match): the first difference in
// the order PyTorch checks them (type, sizes, dtypes), or nothing. `pg_size` is the group's size.
std::optional<MismatchKind> MatchPyTorchOps(const PyTorchOp& expected, const PyTorchOp& found,
                                            size_t pg_size);

// Hang verdicts for `in` with PyTorch's semantics: members compared by PyTorch's rules (the ranks
// outside the largest matching set named), coalesced blocks matched by type, a rank without a
// dump taken as gone; each verdict carries the ops as PyTorch recorded them per rank.
std::vector<Verdict> AnalyzePyTorch(const PyTorchInput& in, HangOptions options = {});

}  // namespace megascope::analyzer
