// The Mesh on a real MPI world (tests/mpi.cmake runs this at 1, 2, 3, 4 and
// 8 ranks): for every shape whose size is the world size, each group
// communicator reaches exactly the ranks the layout predicts, in the
// layout's order, and pipeline neighbours exchange messages.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "common/mpi_env.h"
#include "common/tensors.h"
#include "mesh/mesh.h"

namespace loom::mesh {
namespace {

using test::world;

// Every (pp, dp, cp, tp) whose product is the world size, with every ep
// that divides dp.
std::vector<MeshShape> shapes_of_this_world() {
  const int n = world().size();
  std::vector<MeshShape> shapes;
  for (int pp = 1; pp <= n; ++pp)
    for (int dp = 1; dp <= n; ++dp)
      for (int cp = 1; cp <= n; ++cp)
        for (int ep = 1; ep <= dp; ++ep)
          if (n % (pp * dp * cp) == 0 && dp % ep == 0)
            shapes.push_back({.pp = pp, .dp = dp, .cp = cp, .tp = n / (pp * dp * cp), .ep = ep});
  return shapes;
}

TEST(Mesh, EveryGroupReachesExactlyTheRanksTheLayoutPredicts) {
  const int me = world().rank();
  const std::vector<MeshShape> shapes = shapes_of_this_world();
  for (const MeshShape& shape : shapes) {
    SCOPED_TRACE(shape.str());
    Mesh mesh(shape, world());
    const Layout& layout = mesh.layout();
    EXPECT_EQ(mesh.coord(), layout.coord(me));
    for (Group g : kAllGroups) {
      SCOPED_TRACE(std::string(group_name(g)));
      comm::Communicator& c = mesh.group(g);
      const std::vector<int> expected = layout.group_ranks(g, me);
      EXPECT_EQ(c.size(), static_cast<int>(expected.size()));  // EXPECT: every rank must go on issuing
      EXPECT_EQ(c.rank(), layout.group_rank(g, me));
      // Who is in the group, in group-rank order.
      int64_t mine = me;
      std::vector<int64_t> gathered(c.size());
      c.all_gather(Tensor(gathered.data(), DType::i64, {c.size()}), Tensor(&mine, DType::i64, {1}))->wait();
      EXPECT_EQ(gathered, std::vector<int64_t>(expected.begin(), expected.end()));
      // ... and no one else: the sum of one bit per member.
      int64_t bits = int64_t{1} << me, expected_bits = 0;
      for (int r : expected) expected_bits |= int64_t{1} << r;
      c.all_reduce(Tensor(&bits, DType::i64, {1}), comm::ReduceOp::sum)->wait();
      EXPECT_EQ(bits, expected_bits);
    }
  }
}

TEST(Mesh, NamedAccessorsAreTheirGroups) {
  Mesh mesh(shapes_of_this_world().back(), world());
  EXPECT_EQ(&mesh.tp(), &mesh.group(Group::tp));
  EXPECT_EQ(&mesh.cp(), &mesh.group(Group::cp));
  EXPECT_EQ(&mesh.dp(), &mesh.group(Group::dp));
  EXPECT_EQ(&mesh.pp(), &mesh.group(Group::pp));
  EXPECT_EQ(&mesh.dp_cp(), &mesh.group(Group::dp_cp));
  EXPECT_EQ(&mesh.ep(), &mesh.group(Group::ep));
  EXPECT_EQ(&mesh.expert_dp(), &mesh.group(Group::expert_dp));
  EXPECT_EQ(&mesh.expert_dp_cp(), &mesh.group(Group::expert_dp_cp));
  EXPECT_EQ(&mesh.world(), &world());
  EXPECT_EQ(mesh.world_rank(), world().rank());
  EXPECT_EQ(mesh.world_size(), world().size());
}

// Every stage sends its world rank to the next stage and receives from the
// previous one (wrapping), send posted first: the pipeline's exchange.
TEST(Mesh, PipelineNeighboursExchangeOverThePpCommunicator) {
  for (const MeshShape& shape : shapes_of_this_world()) {
    if (shape.pp == 1) continue;
    SCOPED_TRACE(shape.str());
    Mesh mesh(shape, world());
    int64_t mine = world().rank(), from_prev = -1;
    auto sent = mesh.pp().send(Tensor(&mine, DType::i64, {1}), mesh.pp_next_rank());
    auto got = mesh.pp().recv(Tensor(&from_prev, DType::i64, {1}), mesh.pp_prev_rank());
    sent->wait();
    got->wait();
    EXPECT_EQ(from_prev, mesh.layout().pp_prev(world().rank()));
    EXPECT_EQ(mesh.is_first_stage(), mesh.coord().pp == 0);
    EXPECT_EQ(mesh.is_last_stage(), mesh.coord().pp == shape.pp - 1);
  }
}

// Validation runs before any split, so every rank throws and no collective
// is left half-issued.
TEST(Mesh, ShapeNotMatchingTheWorldIsAnErrorOnEveryRank) {
  const int n = world().size();
  test::expect_error([&] { Mesh({.tp = n + 1}, world()); },
                     {"parallel: pp*dp*cp*tp = 1*1*1*", "does not equal the world size"});
  test::expect_error([&] { Mesh({.dp = n, .ep = n + 1}, world()); }, {"must divide parallel.dp"});
  world().barrier()->wait();
}

}  // namespace
}  // namespace loom::mesh
