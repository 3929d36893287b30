// The job both scale benchmarks analyse: dp x tp x pp ranks with the groups the trainer registers
// (tp, dp, pp, mp, world) and steps of 30 flight-recorder entries: 24 tensor-parallel all-reduces,
// 3 sends and 2 receives along the pipeline, one data-parallel all-reduce. Every member issues the
// same ops in the same order.
#pragma once

#include <string>
#include <vector>

#include "megascope/tracer/records.h"
#include "megascope/tracer/snapshot.h"

namespace megascope::bench {

struct ScaleLayout {
  int dp, tp, pp;

  static constexpr int kPerStep = 30;
  // Indexes of Groups(r).
  static constexpr int kTp = 0, kDp = 1, kPp = 2, kMp = 3, kWorld = 4;

  int world() const { return dp * tp * pp; }
  int Rank(int d, int p, int t) const { return t + tp * (d + dp * p); }
  tracer::Coords CoordsOf(int r) const { return {(r / tp) % dp, r / (tp * dp), r % tp}; }

  std::vector<tracer::GroupInfo> Groups(int r) const {
    const tracer::Coords c = CoordsOf(r);
    const int d = c.dp, p = c.pp, t = c.tp;
    tracer::GroupInfo tpg{"tp." + std::to_string(p) + "." + std::to_string(d), "tp", {}};
    tpg.ranks.AppendRun(Rank(d, p, 0), tp, 1);
    tracer::GroupInfo dpg{"dp." + std::to_string(p) + "." + std::to_string(t), "dp", {}};
    dpg.ranks.AppendRun(Rank(0, p, t), dp, tp);
    tracer::GroupInfo ppg{"pp." + std::to_string(d) + "." + std::to_string(t), "pp", {}};
    for (int i = 0; i < pp; ++i) ppg.ranks.push_back(Rank(d, i, t));
    tracer::GroupInfo mpg{"mp." + std::to_string(d), "mp", {}};
    for (int i = 0; i < pp; ++i) mpg.ranks.AppendRun(Rank(d, i, 0), tp, 1);
    tracer::GroupInfo wg{"world", "world", {}};
    wg.ranks.AppendRun(0, world(), 1);
    return {tpg, dpg, ppg, mpg, wg};
  }

  // The k-th op of rank r's history (its group index, op, peer or -1, bytes).
  struct Op {
    int group;
    tracer::OpType op;
    int peer;
    uint64_t bytes;
  };
  Op OpAt(int r, int k) const {
    const tracer::Coords c = CoordsOf(r);
    const int i = k % kPerStep;
    if (i < 24) return {kTp, tracer::OpType::kAllreduce, -1, 65536};
    if (i < 27) return {kPp, tracer::OpType::kSend, Rank(c.dp, (c.pp + 1) % pp, c.tp), 1 << 18};
    if (i < 29)
      return {kPp, tracer::OpType::kRecv, Rank(c.dp, (c.pp + pp - 1) % pp, c.tp), 1 << 18};
    return {kDp, tracer::OpType::kAllreduce, -1, 1 << 20};
  }
};

}  // namespace megascope::bench
