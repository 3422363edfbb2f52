// A run context (mesh/context.h) for tests: the mesh of a shape over a
// communicator the test chose (the world, or a sub-group of it), or a
// one-process mesh, with pools of its own.
//
//   TestContext one;                                   // one process
//   TestContext grid(train::mesh_shape(cfg.parallel), &world());
//   train::Trainer t(cfg, grid.ctx());
#pragma once

#include <memory>

#include "comm/communicator.h"
#include "core/memory.h"
#include "mesh/context.h"
#include "mesh/mesh.h"

namespace loom::test {

class TestContext {
 public:
  // world: the ranks the mesh spans (collective over it: Mesh splits it);
  // null: a LocalMesh (shape must then be all ones).
  explicit TestContext(const mesh::MeshShape& shape = {}, comm::Communicator* world = nullptr) {
    if (world == nullptr) {
      local_ = std::make_unique<mesh::LocalMesh>();
      mesh::validate_shape(shape, 1);
    } else {
      mesh_ = std::make_unique<mesh::Mesh>(shape, *world);
    }
    ctx_ = std::make_unique<Context>(Context{world == nullptr ? local_->mesh() : *mesh_, pools_});
  }
  TestContext(const TestContext&) = delete;
  TestContext& operator=(const TestContext&) = delete;

  Context& ctx() { return *ctx_; }
  Pools& pools() { return pools_; }
  mesh::Mesh& mesh() { return ctx_->mesh; }

 private:
  std::unique_ptr<mesh::LocalMesh> local_;
  std::unique_ptr<mesh::Mesh> mesh_;
  Pools pools_;
  std::unique_ptr<Context> ctx_;
};

}  // namespace loom::test
