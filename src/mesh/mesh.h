// Mesh: this rank's place on the device mesh and one communicator per axis
// and axis combination (DESIGN.md §5). The arithmetic (rank order, which
// ranks form which group, the ep convention) is in mesh/layout.h; this class
// only turns each group into a Communicator.
//
// Usage: every rank of the world builds the Mesh with the same shape, then
// e.g. tp::all_reduce_region runs on mesh.tp(), dense gradients reduce on
// mesh.dp_cp(), expert gradients on mesh.expert_dp_cp(), pipeline p2p on
// mesh.pp() with pp_prev_rank() / pp_next_rank().
#pragma once

#include <array>
#include <memory>

#include "comm/communicator.h"
#include "mesh/layout.h"

namespace loom::mesh {

class Mesh {
 public:
  // Validates `shape` against world.size() (loom::Error naming the
  // [parallel] keys), then splits `world` once per group kind, in the order
  // of kAllGroups. Collective over `world`: every rank must construct its
  // Mesh with the same shape at the same point of its program. `world` must
  // outlive the Mesh.
  Mesh(const MeshShape& shape, comm::Communicator& world);

  const Layout& layout() const { return layout_; }
  const MeshShape& shape() const { return layout_.shape(); }
  // This rank's coordinates.
  const Coord& coord() const { return coord_; }
  int world_rank() const { return world_.rank(); }
  int world_size() const { return world_.size(); }

  comm::Communicator& world() { return world_; }
  comm::Communicator& tp() { return group(Group::tp); }
  comm::Communicator& cp() { return group(Group::cp); }
  comm::Communicator& dp() { return group(Group::dp); }
  comm::Communicator& pp() { return group(Group::pp); }
  // Dense-parameter gradient reduction (dp x cp).
  comm::Communicator& dp_cp() { return group(Group::dp_cp); }
  // Token dispatch / combine between the experts of one ep group.
  comm::Communicator& ep() { return group(Group::ep); }
  // Replicas of the same experts (dp / ep ranks).
  comm::Communicator& expert_dp() { return group(Group::expert_dp); }
  // Expert-parameter gradient reduction (expert_dp x cp).
  comm::Communicator& expert_dp_cp() { return group(Group::expert_dp_cp); }
  comm::Communicator& group(Group g);

  // The previous / next pipeline stage as a rank of pp() (which equals the
  // stage index), wrapping around: pp_prev_rank() of stage 0 is pp - 1.
  int pp_prev_rank() const { return (coord_.pp + shape().pp - 1) % shape().pp; }
  int pp_next_rank() const { return (coord_.pp + 1) % shape().pp; }
  bool is_first_stage() const { return coord_.pp == 0; }
  bool is_last_stage() const { return coord_.pp == shape().pp - 1; }

 private:
  comm::Communicator& world_;
  Layout layout_;
  Coord coord_;
  std::array<std::unique_ptr<comm::Communicator>, kAllGroups.size()> groups_;
};

}  // namespace loom::mesh
