// Internal to train/ps_server.cpp and train/ps_async.cpp: what a parameter
// server holds, and the pieces of its work both modes share.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "core/memory.h"
#include "mesh/context.h"
#include "mesh/mesh.h"
#include "parallel/ps.h"
#include "train/checkpoint_dir.h"
#include "train/config.h"
#include "train/trainer.h"

namespace loom::train {

inline Tensor ps_i64_view(int64_t* p, int64_t n) { return Tensor(p, DType::i64, {n}); }

struct PsServerCore {
  // Receives every worker's hello (which must agree with the run and each
  // other); optimizer servers then build their Trainer.
  PsServerCore(const RunConfig& cfg, comm::Communicator& world, comm::Communicator& servers, Pools& pools);

  int worker_world_rank(int w) const { return parallel::ps::worker_rank(S, w); }
  int num_buckets() const { return static_cast<int>(sizes.size()); }
  // This server's range of bucket b's elements.
  comm::Range piece(int b) const { return comm::shard_range(sizes[static_cast<size_t>(b)], S, servers.rank()); }
  // Optimizer servers: sets bucket b's piece of the gradients before an
  // update (src: piece(b).count f32, into the gradient shard), and copies
  // bucket b's piece of the updated weights out of the parameter shard.
  void set_grad_piece(int b, const float* src);
  void copy_param_piece(int b, float* dst) const;
  // The update from the gradients in place: their global norm over the
  // servers, clipping, AdamW at the learning rate of step `step`; returns
  // {norm, skipped} (a non-finite norm skips it). Collective over servers.
  std::pair<double, bool> update(int64_t step);
  // Loads the step dir `path` ("": starts fresh). Collective over servers.
  void resume(const std::string& path);
  // Writes a checkpoint as of step `step` with the data at `position`.
  // Collective over servers.
  void save(int64_t step, int64_t position);

  const RunConfig& cfg;
  comm::Communicator& world;
  comm::Communicator& servers;
  Pools& pools;
  parallel::PsKind kind;
  int S, W;
  std::vector<int64_t> sizes;  // the workers' buckets' elements
  // Optimizer servers: the run as a ZeRO-3 group of S ranks (ps_server.h),
  // and per bucket the range of its ParamPieces in the group's.
  RunConfig server_cfg;
  std::unique_ptr<mesh::Mesh> mesh;
  std::unique_ptr<Context> ctx;
  std::unique_ptr<Trainer> trainer;
  std::unique_ptr<CheckpointRun> checkpoints;
  std::vector<std::pair<size_t, size_t>> bucket_pieces;

 private:
  void receive_layout();
  void build_trainer();
};

// The synchronous loop (ps_server.cpp) and the asynchronous one (ps_async.cpp):
// each serves until the workers are done.
void serve_synchronous(PsServerCore& core);
void serve_asynchronous(PsServerCore& core);

}  // namespace loom::train
