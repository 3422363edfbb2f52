#include "mesh/mesh.h"

#include <string>

#include "core/error.h"

namespace loom::mesh {

Mesh::Mesh(const MeshShape& shape, comm::Communicator& world)
    : world_(world), layout_(shape, world.size()), coord_(layout_.coord(world.rank())) {
  const int rank = world.rank();
  // color: which group of the kind; key: the position the layout gives, so a
  // group communicator's rank is this rank's coordinate on the group's axes.
  for (size_t i = 0; i < kAllGroups.size(); ++i) {
    const Group g = kAllGroups[i];
    groups_[i] = world.split(layout_.group_index(g, rank), layout_.group_rank(g, rank),
                             std::string(group_name(g)));
    LOOM_CHECK(groups_[i]->size() == layout_.group_size(g) &&
                   groups_[i]->rank() == layout_.group_rank(g, rank),
               "split of group ", group_name(g), " gave rank ", groups_[i]->rank(), " of ",
               groups_[i]->size(), ", the layout says ", layout_.group_rank(g, rank), " of ",
               layout_.group_size(g));
  }
}

comm::Communicator& Mesh::group(Group g) {
  const auto i = static_cast<size_t>(g);
  LOOM_CHECK(i < groups_.size() && kAllGroups[i] == g, "unknown group ", static_cast<int>(g));
  return *groups_[i];
}

}  // namespace loom::mesh
