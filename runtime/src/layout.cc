#include "megascope/runtime/layout.h"

#include <algorithm>

namespace megascope::runtime {

int GroupSpec::IndexOf(int rank) const {
  auto it = std::find(ranks.begin(), ranks.end(), rank);
  return it == ranks.end() ? -1 : static_cast<int>(it - ranks.begin());
}

tracer::Coords Layout::CoordsOf(int rank) const {
  return {(rank / tp) % dp, rank / (tp * dp), rank % tp};
}

int Layout::RankOf(const tracer::Coords& c) const { return c.tp + tp * (c.dp + dp * c.pp); }

std::vector<GroupSpec> Layout::GroupsOf(int rank) const {
  const tracer::Coords me = CoordsOf(rank);
  auto name = [](GroupKind kind, int a, int b) {
    return std::string(Name(kind)) + "." + std::to_string(a) + "." + std::to_string(b);
  };
  std::vector<GroupSpec> out;
  GroupSpec g{name(GroupKind::kTp, me.pp, me.dp), GroupKind::kTp, {}};
  for (int t = 0; t < tp; ++t) g.ranks.push_back(RankOf({me.dp, me.pp, t}));
  out.push_back(g);
  g = {name(GroupKind::kDp, me.pp, me.tp), GroupKind::kDp, {}};
  for (int d = 0; d < dp; ++d) g.ranks.push_back(RankOf({d, me.pp, me.tp}));
  out.push_back(g);
  g = {name(GroupKind::kPp, me.dp, me.tp), GroupKind::kPp, {}};
  for (int p = 0; p < pp; ++p) g.ranks.push_back(RankOf({me.dp, p, me.tp}));
  out.push_back(g);
  g = {std::string(Name(GroupKind::kMp)) + "." + std::to_string(me.dp), GroupKind::kMp, {}};
  for (int p = 0; p < pp; ++p) {
    for (int t = 0; t < tp; ++t) g.ranks.push_back(RankOf({me.dp, p, t}));
  }
  out.push_back(g);
  if (pp > 1 && (me.pp == 0 || me.pp == pp - 1)) {
    out.push_back({name(GroupKind::kEmb, me.dp, me.tp),
                   GroupKind::kEmb,
                   {RankOf({me.dp, 0, me.tp}), RankOf({me.dp, pp - 1, me.tp})}});
  }
  g = {std::string(Name(GroupKind::kWorld)), GroupKind::kWorld, {}};
  for (int r = 0; r < world(); ++r) g.ranks.push_back(r);
  out.push_back(g);
  return out;
}

}  // namespace megascope::runtime
