// Internal to parallel/dp*.cpp: DataParallel's state per parameter group and
// in flight (parallel/dp.h), and the helpers its files share.
#pragma once

#include <chrono>
#include <deque>
#include <memory>
#include <utility>
#include <span>
#include <vector>

#include "kernels/ops.h"
#include "parallel/dp.h"

namespace loom::parallel {

using DpClock = std::chrono::steady_clock;
inline double seconds_since(DpClock::time_point t) {
  return std::chrono::duration<double>(DpClock::now() - t).count();
}

inline int64_t bytes_of(const Tensor& t) { return t.numel() * static_cast<int64_t>(dtype_size(t.dtype())); }

// dst = src, of one dtype: kernels::copy on one device, copy_tensor between
// the host and a device (offload_optimizer's state beside a GPU's model).
inline void copy_between(Tensor dst, const Tensor& src) {
  if (dst.device() == src.device()) kernels::copy(dst, src);
  else copy_tensor(dst, src);
}


// The flat element of group index `index` (inside a run).
int64_t flat_index(const GroupSpace& s, int64_t index);
// packed (count) = flat's elements at group indices [index, index + count),
// and back: a group's bucket or segment spread over the flat buffer.
void pack_runs(const GroupSpace& s, const Tensor& flat, int64_t index, Tensor packed);
void unpack_runs(const GroupSpace& s, const Tensor& packed, int64_t index, Tensor flat);

// A parameter group's layout and the shard state DataParallel keeps for it,
// each (S) = layout.shard_numel, packed like its segments.
struct GroupState {
  explicit GroupState(GroupLayout l) : layout(std::move(l)) {}
  GroupLayout layout;
  std::vector<std::vector<int>> finishes;  // unit -> the buckets whose lowest unit it is
  OwnedTensor master;       // f32, when DataParallel keeps master weights (Impl::has_master)
  OwnedTensor grad_shard;   // f32, stages 2 and 3
  OwnedTensor param_shard;  // compute dtype, stage 3
  OwnedTensor host_grads;   // f32, offload_optimizer
  std::vector<OwnedTensor> open;  // stages 2 and 3, by bucket: acquired, not yet finished
};

struct DataParallel::Impl {
  explicit Impl(Pools& p) : pools(p) {}
  Pools& pools;
  std::vector<GroupState> groups;
  bool has_master = false;  // see dp.h: compute dtype other than f32, or offload_optimizer
  // DpOptions::disk: the master weights (array 0 when has_master) and the
  // optimizer's arrays of every group's shard; GroupState::master unused.
  std::unique_ptr<OffloadedState> disk;
  // DpOptions::disk.params: the parameter and gradient shards (stage 3);
  // GroupState::param_shard and grad_shard unused.
  std::unique_ptr<OffloadedShards> shards;
  int grad_slot = 0, param_slot = 0;  // the shards' slot of each kind the next use takes
  // Per extent of the state (OffloadedState::extents): whether its gradient
  // record was written this step, and the sums of squares the gradient
  // norm adds for it (norm_block_sums), from its last write.
  std::vector<char> written;
  std::vector<std::vector<double>> terms;
  bool has_pp_copy = false;  // the model holds a pipeline stage's copy of a tied embedding
  // Stages 2 and 3 (each unit in one group): unit -> its group and its bucket there.
  std::vector<int> unit_group, unit_bucket;
  bool communicate = true;  // stages 0 and 1: this micro-batch's backward reduces (the last one)
  // Stages 0 and 1: the collectives of this step, waited for in grad_norm();
  // a bucket spread over the flat buffer reduces a packed copy (packed, and
  // under stage 1 its reduced piece), unpacked into the gradients then.
  struct Pending {
    comm::WorkPtr work;
    int group = -1, bucket = -1;
    OwnedTensor packed, piece;
  };
  std::vector<Pending> pending;
  // Stages 2 and 3: one gradient buffer per bucket while its reduce_scatter runs.
  struct GradBuffer {
    OwnedTensor buf, piece;  // the bucket's gradients, this rank's reduced piece
    comm::WorkPtr work;
    int group = -1, bucket = -1;
  };
  std::deque<GradBuffer> reducing;
  // Stage 3: gathered parameters of each unit.
  struct Gathered {
    OwnedTensor buf;
    bool from_disk = false;  // the shards on disk: buf's piece is read (reads, one per extent), then gathered
    std::vector<io::OffloadFile::Io> reads;
    comm::WorkPtr work;
    int refs = 0;
  };
  std::vector<Gathered> gathered;
  std::vector<int> order[2];  // the units forward / backward acquires, in order
  size_t cursor[2] = {0, 0};
};

// The gradient norm's sums of squares: one per block of kNormBlock
// elements of each piece of the shard (from the piece's start), summed in
// shard order, so the same with the gradients in memory or streamed
// through the offload file's extents (cut at multiples of it). The sums of
// every block of each of `grads` (pieces' gradients, or runs of one starting
// a multiple of kNormBlock from its start), in order, from one op: on a GPU
// one wait for them all.
inline constexpr int64_t kNormBlock = OffloadedState::kGrain;
inline std::vector<double> norm_block_sums(std::span<const Tensor> grads) {
  int64_t blocks = 0;
  for (const Tensor& g : grads) blocks += (g.numel() + kNormBlock - 1) / kNormBlock;
  std::vector<double> sums(static_cast<size_t>(blocks));
  kernels::sum_squares_blocks(sums, grads, kNormBlock);
  return sums;
}

// The order the model acquires its units' parameters (model.h), for stage 3's prefetch.
void set_acquire_order(const model::Model& model, std::vector<int> (&order)[2]);

}  // namespace loom::parallel
