// The mesh layout (pure arithmetic, no MPI): coordinates and process groups
// for every factorisation of small world sizes, literal small examples, and
// the error messages of invalid shapes.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

#include "common/tensors.h"
#include "mesh/layout.h"

namespace loom::mesh {
namespace {

using loom::test::expect_error;

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

// Every (pp, dp, cp, tp) with product `world` and every ep dividing dp.
std::vector<MeshShape> all_shapes(int world) {
  std::vector<MeshShape> shapes;
  for (int pp : divisors(world))
    for (int dp : divisors(world / pp))
      for (int cp : divisors(world / pp / dp))
        for (int ep : divisors(dp))
          shapes.push_back({.pp = pp, .dp = dp, .cp = cp, .tp = world / pp / dp / cp, .ep = ep});
  return shapes;
}

std::vector<int> test_world_sizes() {
  std::vector<int> sizes;
  for (int w = 1; w <= 16; ++w) sizes.push_back(w);
  sizes.push_back(24);
  sizes.push_back(64);
  return sizes;
}

// Do ranks with coordinates a and b belong to the same group of kind g? The
// definition the layout must implement: equal on every coordinate the group
// does not span.
bool same_group_by_definition(Group g, const Coord& a, const Coord& b) {
  const bool pp = a.pp == b.pp, cp = a.cp == b.cp, tp = a.tp == b.tp, dp = a.dp == b.dp;
  const bool ep = a.ep == b.ep, edp = a.expert_dp == b.expert_dp;
  switch (g) {
    case Group::tp: return pp && dp && cp;
    case Group::cp: return pp && dp && tp;
    case Group::dp: return pp && cp && tp;
    case Group::pp: return dp && cp && tp;
    case Group::dp_cp: return pp && tp;
    case Group::ep: return pp && cp && tp && edp;
    case Group::expert_dp: return pp && cp && tp && ep;
    case Group::expert_dp_cp: return pp && tp && ep;
  }
  return false;
}

std::set<int> as_set(const std::vector<int>& v) { return {v.begin(), v.end()}; }

TEST(MeshLayout, CoordinatesAreUniqueAndRoundTripForEveryFactorisation) {
  for (int world : test_world_sizes()) {
    for (const MeshShape& shape : all_shapes(world)) {
      SCOPED_TRACE(shape.str());
      const Layout layout(shape, world);
      std::set<std::vector<int>> seen;
      for (int r = 0; r < world; ++r) {
        const Coord c = layout.coord(r);
        EXPECT_TRUE(seen.insert({c.pp, c.dp, c.cp, c.tp}).second) << "rank " << r;
        EXPECT_EQ(layout.rank_of(c), r);
        EXPECT_EQ(c.dp, c.expert_dp * shape.ep + c.ep);
        EXPECT_EQ(r, ((c.pp * shape.dp + c.dp) * shape.cp + c.cp) * shape.tp + c.tp);
      }
    }
  }
}

TEST(MeshLayout, GroupsPartitionTheWorldAndMatchTheirDefinition) {
  for (int world : test_world_sizes()) {
    for (const MeshShape& shape : all_shapes(world)) {
      SCOPED_TRACE(shape.str());
      const Layout layout(shape, world);
      for (Group g : kAllGroups) {
        SCOPED_TRACE(std::string(group_name(g)));
        const int size = layout.group_size(g);
        std::set<int> indices;
        for (int r = 0; r < world; ++r) {
          const std::vector<int> ranks = layout.group_ranks(g, r);
          ASSERT_EQ(static_cast<int>(ranks.size()), size);
          EXPECT_TRUE(std::is_sorted(ranks.begin(), ranks.end()));
          ASSERT_EQ(ranks[layout.group_rank(g, r)], r);
          for (int s : ranks) {
            EXPECT_EQ(layout.group_ranks(g, s), ranks) << "rank " << s << " in the group of " << r;
            EXPECT_EQ(layout.group_index(g, s), layout.group_index(g, r));
          }
          indices.insert(layout.group_index(g, r));
          const Coord a = layout.coord(r);
          const std::set<int> members = as_set(ranks);
          for (int s = 0; s < world; ++s)
            EXPECT_EQ(members.count(s) == 1, same_group_by_definition(g, a, layout.coord(s)))
                << "ranks " << r << " and " << s;
        }
        // One index per group, 0 .. world/size - 1: the groups partition the world.
        EXPECT_EQ(static_cast<int>(indices.size()) * size, world);
        EXPECT_EQ(*indices.rbegin(), world / size - 1);
      }
    }
  }
}

TEST(MeshLayout, GroupSizesFollowTheShape) {
  const Layout layout({.pp = 2, .dp = 6, .cp = 2, .tp = 2, .ep = 3}, 48);
  EXPECT_EQ(layout.group_size(Group::tp), 2);
  EXPECT_EQ(layout.group_size(Group::cp), 2);
  EXPECT_EQ(layout.group_size(Group::dp), 6);
  EXPECT_EQ(layout.group_size(Group::pp), 2);
  EXPECT_EQ(layout.group_size(Group::dp_cp), 12);
  EXPECT_EQ(layout.group_size(Group::ep), 3);
  EXPECT_EQ(layout.group_size(Group::expert_dp), 2);
  EXPECT_EQ(layout.group_size(Group::expert_dp_cp), 4);
}

TEST(MeshLayout, TpGroupsAreConsecutiveRanks) {
  for (int world : test_world_sizes()) {
    for (const MeshShape& shape : all_shapes(world)) {
      const Layout layout(shape, world);
      for (int r = 0; r < world; ++r) {
        const std::vector<int> ranks = layout.group_ranks(Group::tp, r);
        for (int i = 0; i < shape.tp; ++i) EXPECT_EQ(ranks[i], r / shape.tp * shape.tp + i);
      }
    }
  }
}

TEST(MeshLayout, CombinedGroupsAreUnionsAndEpSplitsDp) {
  for (int world : test_world_sizes()) {
    for (const MeshShape& shape : all_shapes(world)) {
      SCOPED_TRACE(shape.str());
      const Layout layout(shape, world);
      for (int r = 0; r < world; ++r) {
        std::set<int> dp_union, edp_union;
        for (int s : layout.group_ranks(Group::cp, r)) {
          for (int m : layout.group_ranks(Group::dp, s)) dp_union.insert(m);
          for (int m : layout.group_ranks(Group::expert_dp, s)) edp_union.insert(m);
        }
        EXPECT_EQ(as_set(layout.group_ranks(Group::dp_cp, r)), dp_union);
        EXPECT_EQ(as_set(layout.group_ranks(Group::expert_dp_cp, r)), edp_union);

        const std::set<int> dp = as_set(layout.group_ranks(Group::dp, r));
        const std::set<int> ep = as_set(layout.group_ranks(Group::ep, r));
        const std::set<int> edp = as_set(layout.group_ranks(Group::expert_dp, r));
        EXPECT_TRUE(std::includes(dp.begin(), dp.end(), ep.begin(), ep.end()));
        EXPECT_TRUE(std::includes(dp.begin(), dp.end(), edp.begin(), edp.end()));
        EXPECT_EQ(ep.size() * edp.size(), dp.size());
        std::vector<int> both;
        std::set_intersection(ep.begin(), ep.end(), edp.begin(), edp.end(), std::back_inserter(both));
        EXPECT_EQ(both, std::vector<int>{r});
        // Megatron's convention: an ep group is ep consecutive dp indices.
        const Coord c = layout.coord(r);
        for (int s : ep) EXPECT_EQ(layout.coord(s).dp / shape.ep, c.dp / shape.ep);
      }
    }
  }
}

TEST(MeshLayout, PipelineNeighboursWrapAroundTheStages) {
  for (int world : test_world_sizes()) {
    for (const MeshShape& shape : all_shapes(world)) {
      const Layout layout(shape, world);
      for (int r = 0; r < world; ++r) {
        const Coord c = layout.coord(r);
        Coord next = c, prev = c;
        next.pp = (c.pp + 1) % shape.pp;
        prev.pp = (c.pp + shape.pp - 1) % shape.pp;
        EXPECT_EQ(layout.pp_next(r), layout.rank_of(next));
        EXPECT_EQ(layout.pp_prev(r), layout.rank_of(prev));
        EXPECT_EQ(layout.pp_prev(layout.pp_next(r)), r);
      }
    }
  }
}

std::vector<std::vector<int>> all_groups(const Layout& layout, Group g) {
  std::set<std::vector<int>> groups;
  for (int r = 0; r < layout.world_size(); ++r) groups.insert(layout.group_ranks(g, r));
  return {groups.begin(), groups.end()};
}

using Groups = std::vector<std::vector<int>>;

TEST(MeshLayout, World8Pp2Dp2Tp2MatchesHandWrittenGroups) {
  const Layout layout({.pp = 2, .dp = 2, .tp = 2}, 8);
  EXPECT_EQ(all_groups(layout, Group::tp), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(all_groups(layout, Group::dp), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(all_groups(layout, Group::pp), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(all_groups(layout, Group::cp), (Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  EXPECT_EQ(all_groups(layout, Group::dp_cp), all_groups(layout, Group::dp));
  EXPECT_EQ(layout.coord(6), (Coord{.pp = 1, .dp = 1, .cp = 0, .tp = 0, .ep = 0, .expert_dp = 1}));
  EXPECT_EQ(layout.pp_next(6), 2);
  EXPECT_EQ(layout.pp_prev(2), 6);
}

TEST(MeshLayout, World16Pp2Dp2Cp2Tp2MatchesTheWorkedExample) {
  const Layout layout({.pp = 2, .dp = 2, .cp = 2, .tp = 2}, 16);
  EXPECT_EQ(layout.coord(5), (Coord{.pp = 0, .dp = 1, .cp = 0, .tp = 1, .ep = 0, .expert_dp = 1}));
  EXPECT_EQ(layout.group_ranks(Group::tp, 5), (std::vector<int>{4, 5}));
  EXPECT_EQ(layout.group_ranks(Group::cp, 5), (std::vector<int>{5, 7}));
  EXPECT_EQ(layout.group_ranks(Group::dp, 5), (std::vector<int>{1, 5}));
  EXPECT_EQ(layout.group_ranks(Group::pp, 5), (std::vector<int>{5, 13}));
  EXPECT_EQ(layout.group_ranks(Group::dp_cp, 5), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(layout.group_rank(Group::dp_cp, 5), 2);  // (dp 1, cp 0) with cp fastest
  EXPECT_EQ(all_groups(layout, Group::dp_cp),
            (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));
}

TEST(MeshLayout, World8Dp4Ep2Tp2MatchesHandWrittenExpertGroups) {
  const Layout layout({.dp = 4, .tp = 2, .ep = 2}, 8);
  EXPECT_EQ(all_groups(layout, Group::dp), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(all_groups(layout, Group::ep), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(all_groups(layout, Group::expert_dp), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(all_groups(layout, Group::expert_dp_cp), all_groups(layout, Group::expert_dp));
  EXPECT_EQ(layout.coord(6), (Coord{.pp = 0, .dp = 3, .cp = 0, .tp = 0, .ep = 1, .expert_dp = 1}));
}

TEST(MeshLayout, World12Dp3Cp2Tp2MatchesHandWrittenGroups) {
  const Layout layout({.dp = 3, .cp = 2, .tp = 2}, 12);
  EXPECT_EQ(all_groups(layout, Group::cp), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}}));
  EXPECT_EQ(all_groups(layout, Group::dp), (Groups{{0, 4, 8}, {1, 5, 9}, {2, 6, 10}, {3, 7, 11}}));
  EXPECT_EQ(all_groups(layout, Group::dp_cp), (Groups{{0, 2, 4, 6, 8, 10}, {1, 3, 5, 7, 9, 11}}));
  EXPECT_EQ(all_groups(layout, Group::pp).size(), 12u);
}

TEST(MeshLayout, InvalidShapesAreErrorsNamingTheKeys) {
  expect_error([] { Layout({.pp = 2, .dp = 3, .tp = 2}, 8); },
               {"parallel: pp*dp*cp*tp = 2*3*1*2 = 12 does not equal the world size 8"});
  expect_error([] { Layout({.dp = 4, .ep = 3}, 4); },
               {"parallel.ep = 3 must divide parallel.dp = 4"});
  expect_error([] { Layout({.dp = 2, .ep = 4}, 2); }, {"parallel.ep = 4 must divide parallel.dp = 2"});
  expect_error([] { Layout({.tp = 0}, 1); }, {"parallel.tp = 0", ">= 1"});
  expect_error([] { Layout({.pp = -1}, 1); }, {"parallel.pp = -1", ">= 1"});
  expect_error([] { Layout({.cp = 0}, 1); }, {"parallel.cp = 0", ">= 1"});
  expect_error([] { Layout({.dp = 0}, 1); }, {"parallel.dp = 0", ">= 1"});
  expect_error([] { Layout({.ep = 0}, 1); }, {"parallel.ep = 0", ">= 1"});
  expect_error([] { Layout({}, 0); }, {"world size is 0"});
  expect_error([] { validate_shape({.tp = 3}, 2); }, {"pp*dp*cp*tp = 1*1*1*3 = 3", "world size 2"});
}

TEST(MeshLayout, HugeExtentsGiveAMessageNotAnOverflow) {
  constexpr int kBig = 1 << 30;
  expect_error([] { Layout({.pp = kBig, .dp = kBig, .cp = kBig, .tp = kBig}, 8); },
               {"= (too large) does not equal the world size 8"});
}

}  // namespace
}  // namespace loom::mesh
