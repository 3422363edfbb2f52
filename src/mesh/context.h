// The run context (DESIGN.md §3): what every layer above the model is handed
// by reference from main down: the mesh (this rank's place and the
// communicator of every axis), the memory pools and the stream their
// device's ops are queued on (core/memory.h: with a GPU, the one the CUDA
// backend enqueues on and NCCL waits for; the host's has no queue). The
// kernel backend is not in it: ops find theirs by their tensors' device
// (kernels/backend.h). A run without mpirun has a mesh of one rank over a
// SelfCommunicator (LocalMesh), so no group is ever null: code asks a
// group's size, never whether it exists. model/ never sees a Context: it is
// handed its pools and the parallel ops it needs (model/tensor_parallel.h).
//
//   mesh::Mesh mesh(shape, *mpi_world);  // under mpirun
//   Pools pools;
//   Context ctx{mesh, pools};
//   train::Trainer trainer(cfg, ctx);
//
//   mesh::LocalContext local;             // one process: a mesh of one, its own pools
//   train::Trainer trainer(cfg, local.ctx());
#pragma once

#include "comm/self_communicator.h"
#include "core/memory.h"
#include "mesh/mesh.h"

namespace loom {

struct Context {
  mesh::Mesh& mesh;
  Pools& pools;
  // Parameter-server training (parallel.mode = ps): the whole job, whose
  // ranks 0..ps_servers-1 are the servers; the mesh is then the workers'.
  // Null otherwise.
  comm::Communicator* ps_world = nullptr;
  // Where the ops on the pools' device go: that device's stream, the only
  // one a run may name (train::Trainer refuses another).
  Stream stream = device_stream(pools.device());
};

}  // namespace loom

namespace loom::mesh {

// A mesh of one rank (every axis of size one) over a SelfCommunicator: the
// world of a process started without mpirun.
class LocalMesh {
 public:
  explicit LocalMesh(const comm::Options& options = {}) : world_("world", options), mesh_(MeshShape{}, world_) {}
  LocalMesh(const LocalMesh&) = delete;
  LocalMesh& operator=(const LocalMesh&) = delete;
  Mesh& mesh() { return mesh_; }

 private:
  comm::SelfCommunicator world_;
  Mesh mesh_;
};

// A one-process run's whole context: a LocalMesh and pools of its own.
class LocalContext {
 public:
  // device: where the pools allocate (a GPU's backend registered first).
  explicit LocalContext(const comm::Options& options = {}, Device device = Device::cpu())
      : mesh_(options), pools_(device) {}
  LocalContext(const LocalContext&) = delete;
  LocalContext& operator=(const LocalContext&) = delete;
  Context& ctx() { return ctx_; }
  Pools& pools() { return pools_; }
  Mesh& mesh() { return mesh_.mesh(); }

 private:
  LocalMesh mesh_;
  Pools pools_;
  Context ctx_{mesh_.mesh(), pools_};
};

}  // namespace loom::mesh
