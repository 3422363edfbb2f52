// Layout: the pure arithmetic of the device mesh (DESIGN.md §5) — which world
// rank sits at which coordinate, and which ranks form each process group.
// No communication here; mesh/mesh.h builds the communicators from it.
//
// World size = pp * dp * cp * tp. Rank order: tp fastest, then cp, dp, pp
// (Megatron-LM's default), so
//   rank = ((pp_i * dp + dp_i) * cp + cp_i) * tp + tp_i.
// Expert parallelism splits the dp axis (ep divides dp) with ep the faster
// part, as in Megatron-Core's "tp-cp-ep-dp-pp" order:
//   dp_i = expert_dp_i * ep + ep_i,
// so an ep group is ep consecutive dp indices, and an expert-dp group (the
// ranks holding the same experts) is the dp indices with the same ep_i,
// strided by ep.
//
// Groups (each a partition of the world; within a group, members are in
// ascending world-rank order, which is also the order of their coordinate on
// the group's axes with the faster axis fastest):
//   tp            same pp, dp, cp               (size tp)
//   cp            same pp, dp, tp               (size cp)
//   dp            same pp, cp, tp               (size dp)
//   pp            same dp, cp, tp               (size pp)
//   dp_cp         same pp, tp: dense gradients  (size dp*cp)
//   ep            same pp, cp, tp, expert_dp_i  (size ep)
//   expert_dp     same pp, cp, tp, ep_i         (size dp/ep)
//   expert_dp_cp  same pp, tp, ep_i: expert gradients (size dp/ep*cp); a cp
//                 rank sees other tokens, so expert gradients sum over cp too.
//
// Worked example, world 16 = pp2 x dp2 x cp2 x tp2 (ep 1):
//   rank  0..7 are stage pp 0, 8..15 stage pp 1.
//   rank 5 = pp 0, dp 1, cp 0, tp 1   (5 = ((0*2+1)*2+0)*2+1)
//   tp group of 5: {4, 5}     cp group: {5, 7}     dp group: {1, 5}
//   pp group of 5: {5, 13}    dp_cp group: {1, 3, 5, 7}
// With dp 4, ep 2 on world 8 = pp1 x dp4 x tp2: dp group of rank 0 is
// {0, 2, 4, 6}; its ep groups are {0, 2} and {4, 6}; its expert_dp groups are
// {0, 4} and {2, 6}.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace loom::mesh {

// Extents of the mesh axes: the [parallel] keys of DESIGN.md §7.
struct MeshShape {
  int pp = 1;
  int dp = 1;
  int cp = 1;
  int tp = 1;
  int ep = 1;  // splits dp; 1 = no expert parallelism
  std::string str() const;  // "pp=2 dp=2 cp=1 tp=2 ep=1"
  friend bool operator==(const MeshShape&, const MeshShape&) = default;
};

// Throws loom::Error naming the [parallel] keys when an extent is < 1, when
// pp*dp*cp*tp differs from world_size, or when ep does not divide dp.
void validate_shape(const MeshShape& shape, int world_size);

// A rank's position on every axis.
struct Coord {
  int pp = 0;
  int dp = 0;
  int cp = 0;
  int tp = 0;
  int ep = 0;         // dp % ep: position inside the ep group
  int expert_dp = 0;  // dp / ep: which ep group of the dp group
  friend bool operator==(const Coord&, const Coord&) = default;
};

enum class Group : uint8_t { tp, cp, dp, pp, dp_cp, ep, expert_dp, expert_dp_cp };
inline constexpr std::array<Group, 8> kAllGroups = {Group::tp, Group::cp,        Group::dp,
                                                    Group::pp, Group::dp_cp,     Group::ep,
                                                    Group::expert_dp, Group::expert_dp_cp};
std::string_view group_name(Group g);  // "tp", "dp_cp", ...

class Layout {
 public:
  // Validates (validate_shape) and keeps the shape.
  Layout(const MeshShape& shape, int world_size);

  const MeshShape& shape() const { return shape_; }
  int world_size() const { return world_size_; }

  Coord coord(int rank) const;
  // Inverse of coord(); reads pp, dp, cp, tp (ep and expert_dp follow from dp).
  int rank_of(const Coord& c) const;

  // Number of ranks in each group of kind g.
  int group_size(Group g) const;
  // World ranks of the group of kind g that holds `rank`, ascending.
  std::vector<int> group_ranks(Group g, int rank) const;
  // Position of `rank` inside its group of kind g (its index in group_ranks).
  int group_rank(Group g, int rank) const;
  // Which group of kind g holds `rank`: 0 .. world_size / group_size - 1,
  // numbered in ascending order of the groups' smallest member.
  int group_index(Group g, int rank) const;

  // World ranks of the previous / next pipeline stage with the same dp, cp,
  // tp; wraps around (stage 0's previous is stage pp-1), as interleaved
  // schedules send the last stage's output of chunk v to stage 0's chunk v+1.
  int pp_prev(int rank) const;
  int pp_next(int rank) const;

 private:
  // The mesh as five fine axes, outermost first: pp, expert_dp, ep, cp, tp.
  // dp is the pair (expert_dp, ep); every group varies a subset of them.
  static constexpr int kFineAxes = 5;
  using Fine = std::array<int, kFineAxes>;
  Fine fine_extents() const;
  Fine fine_coord(int rank) const;
  int fine_rank(const Fine& c) const;
  void check_rank(int rank) const;

  MeshShape shape_;
  int world_size_ = 1;
};

}  // namespace loom::mesh
