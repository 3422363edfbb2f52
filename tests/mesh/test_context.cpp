// The run context of a one-process run (mesh/context.h): a mesh whose every
// axis is a group of one, so code above it never meets a null group.
#include <gtest/gtest.h>

#include "mesh/context.h"

namespace loom::mesh {
namespace {

using comm::Communicator;

TEST(LocalMesh, EveryAxisOfAOneProcessRunIsAGroupOfOne) {
  LocalContext local;
  Mesh& m = local.mesh();
  EXPECT_EQ(m.world_size(), 1);
  for (Communicator* g : {&m.tp(), &m.cp(), &m.dp(), &m.pp(), &m.dp_cp(), &m.ep(), &m.expert_dp()}) {
    EXPECT_EQ(g->size(), 1) << g->name();
    EXPECT_EQ(g->rank(), 0) << g->name();
  }
  EXPECT_EQ(&local.ctx().mesh, &m);
  EXPECT_EQ(&local.ctx().pools, &local.pools());
}

}  // namespace
}  // namespace loom::mesh
