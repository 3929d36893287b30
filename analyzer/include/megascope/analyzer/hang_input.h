// What the hang analysis reads (hang.h's AnalyzeHang, stacks.h's groups): every rank's dump and
// the index of its flight recorder's ops, built once from dumps however they were read (files,
// agents, PyTorch's Flight Recorder).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "megascope/tracer/arena.h"
#include "megascope/tracer/dump.h"
#include "megascope/tracer/status.h"

namespace megascope::analyzer {

// What the analysis reads of one rank's flight recorder, indexed once from its dump's entries. A
// 100,000-rank job's entries are 2 GB; this is a third of that, so the live input keeps only this
// (28 bytes a collective). Groups are the rank's own indices into its dump's groups; of two groups
// of one name the later is the one (its ops are indexed under it).
struct RankOps {
  // The index's large arrays: in the arena IndexOps is given (huge pages, faulted in ahead), else
  // on the heap.
  template <typename T>
  using Array = std::vector<T, tracer::ArenaAllocator<T>>;
  struct Collective {  // 24 bytes
    int64_t seq = 0;
    uint64_t bytes = 0;
    tracer::OpType op = tracer::OpType::kUnknown;
    tracer::DType dtype = tracer::DType::kUnknown;
    tracer::OpState state = tracer::OpState::kUnknown;
    int32_t sent = kSentUnknown;  // bytes_sent: kSentUnknown, kSentAll (`bytes`), or a partial_sent
  };
  static constexpr int32_t kSentUnknown = -1, kSentAll = -2;
  struct Transfer {
    int32_t group = 0, peer = 0;
    int64_t seq = 0;
    uint64_t bytes = 0;
    int64_t moved = -1;  // bytes_sent of a send, bytes_received of a recv; -1 unknown
    bool open = false;   // not completed
  };

  std::vector<int32_t> by_name;    // group indices sorted by name, one a name
  std::vector<int64_t> last_coll;  // group -> max collective seq issued (-1: none)
  // The collectives by group, then by seq (of a seq recorded twice, the newest); group g's are
  // colls[coll_start[g] .. coll_start[g + 1]).
  Array<Collective> colls;
  std::vector<uint32_t> coll_start;
  std::vector<int64_t> partial_sent;  // bytes_sent other than none or all, by Collective::sent
  Array<Transfer> sends, recvs;       // sorted by (group, peer, seq), one a seq (the newest)
  Array<int32_t> history;             // group indices of collectives, in issue order
  // Where the rank's thread waits: its newest open op, or behind a device queue (NCCL) the oldest
  // open one, which everything after it waits for.
  std::optional<tracer::FlightEntry> blocking;
  int32_t blocking_group = -1;
  size_t history_at_blocking = 0;             // the collectives issued up to it
  std::optional<tracer::FlightEntry> newest;  // the newest entry
  bool in_op = false;                         // an entry enqueued or started

  int64_t BytesSent(const Collective& c) const {
    return c.sent >= 0 ? partial_sent[c.sent]
                       : (c.sent == kSentAll ? static_cast<int64_t>(c.bytes) : -1);
  }
};
// Indexes `dump`'s entries, its large arrays in `arena` when given (one thread at a time).
RankOps IndexOps(const tracer::Dump& dump, const std::shared_ptr<tracer::Arena>& arena = nullptr);

// One rank's view: its dump and the index of its ops, or nothing (missing). `dump`'s entries may
// be dropped once `ops` holds them (the live input does).
struct RankView {
  bool present = false;
  std::string source;  // file or URL it came from
  tracer::Dump dump;
  RankOps ops;
};

struct HangInput {
  int world_size = 0;
  std::vector<RankView> ranks;  // index = rank
  // Things the reader met and went on past, one line per kind (an unknown value of a known field,
  // with how many dumps carry it and the first place): callers print them as warnings.
  std::vector<std::string> warnings;
};

// Builds the input from parsed dumps (checks membership agrees across ranks), indexing each.
Result<HangInput> MakeHangInput(std::vector<std::pair<std::string, tracer::Dump>> dumps);

// Builds the input from ranks' views as they arrive, from any thread, each moved into its rank's
// place once (a 100,000-rank job's views are 80 MB).
class HangInputBuilder {
 public:
  // `view`: `source`, `dump` and `ops` set. An error if its world size is not the others'; of two
  // views of one rank, the newer dump is kept.
  Status Add(RankView view);
  // Checks that every group has the same members in every rank's dump, and says once per field
  // and value which unknown values the dumps hold.
  Result<HangInput> Finish() &&;

 private:
  std::mutex mu_;
  HangInput in_;
};

}  // namespace megascope::analyzer
