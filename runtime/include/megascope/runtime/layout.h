// The 3D-parallel layout: world = dp x tp x pp, ranks ordered tp fastest, then dp, then pp
// (Megatron's order; this is the one place that says so), and the process groups each rank
// belongs to, named as in docs/formats.md section 1: tp.<pp>.<dp>, dp.<pp>.<tp>, pp.<dp>.<tp>,
// mp.<dp> (the tp x pp ranks of one replica), emb.<dp>.<tp> (first and last stage, for the tied
// embedding when pp > 1) and world.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "megascope/tracer/enum_names.h"
#include "megascope/tracer/records.h"

namespace megascope::runtime {

// A process group's kind, spelled as kGroupKindNames (the `kind` of trace.db's groups and the
// first part of a group's name).
enum class GroupKind : uint8_t { kTp = 0, kDp, kPp, kMp, kEmb, kWorld };
inline constexpr std::array<std::string_view, 6> kGroupKindNames = {"tp", "dp",  "pp",
                                                                    "mp", "emb", "world"};
inline std::string_view Name(GroupKind k) { return tracer::NameFrom(kGroupKindNames, k); }

struct GroupSpec {
  std::string name;
  GroupKind kind = GroupKind::kWorld;
  std::vector<int32_t> ranks;
  int IndexOf(int rank) const;
};

struct Layout {
  int dp = 1, tp = 1, pp = 1;

  int world() const { return dp * tp * pp; }
  tracer::Coords CoordsOf(int rank) const;
  int RankOf(const tracer::Coords& c) const;
  // Groups of `rank`, in the order every rank creates them (kinds in a fixed order, so that
  // rendezvous never waits in a cycle).
  std::vector<GroupSpec> GroupsOf(int rank) const;
};

}  // namespace megascope::runtime
