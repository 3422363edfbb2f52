// The optimizer (DESIGN.md §2: train/ owns it; parallel/dp.h owns the
// sharding of what it updates). AdamW keeps its moments per parameter group
// of a DataParallel, packed like the group's shard on this rank, and updates
// every piece of each shard through the DataParallel's views:
//
//   DataParallel dp(model, mesh.dp(), mesh.tp(), dp_options, pools);
//   AdamW adamw(dp, {.weight_decay = 0.1});
//   ... forward, backward, norm = dp.grad_norm() ...
//   adamw.step(lr, grad_scale);    // every rank of every group, collective
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/memory.h"
#include "parallel/dp.h"

namespace loom::train {

// A change to parameters made beside the gradient step (a MoE layer's
// loss-free balancing bias, train/moe_step.h): values (count) f32 added to
// the master weights at flat elements [offset, offset + count) of the
// model's buffer, wherever the rank's shard holds them.
struct ParamDelta {
  int64_t offset = 0;
  std::vector<float> values;
};

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.95;  // GPT-3 / llm.c / nanoGPT
  double eps = 1e-8;
  double weight_decay = 0.1;  // 2-D weights only (linear weights, embeddings): nanoGPT, llm.c
  // false: the update runs elsewhere (a parameter-server worker whose
  // optimizer servers hold the state, train/ps_server.h): no moments are
  // kept, step() and the moments' views are internal errors, and
  // load_moments ignores a checkpoint's.
  bool keeps_state = true;
};

class AdamW {
 public:
  // Zero moments for each group's shard of dp from dp.state_pools()'s
  // pools[optimizer] (host memory under offload_optimizer). dp must outlive this; its
  // DpOptions::optimizer_state_floats must count the two moments (the
  // default does).
  AdamW(parallel::DataParallel& dp, const AdamWOptions& options);

  const AdamWOptions& options() const { return options_; }
  // One update of every group's shard with gradients times grad_scale
  // (unscaling and clipping folded in; kernels::adamw_step per piece, decay
  // on 2-D weights only), then the parameters every rank needs made
  // available (DataParallel::update_finish: collective). Counts an update.
  // deltas are added after the update to the pieces holding them.
  void step(double lr, float grad_scale, std::span<const ParamDelta> deltas = {});
  int64_t steps_taken() const { return steps_; }
  void set_steps_taken(int64_t steps) { steps_ = steps; }

  // Group g's moments, (S_g) f32 views packed like its segments (in
  // memory: not under an optimizer offloaded to disk, DpOptions::disk).
  Tensor m(int g) const;
  Tensor v(int g) const;
  // Copies of them, (S_g) f32, wherever they live (a device, the disk).
  void read_moments(int g, Tensor m, Tensor v) const;
  // Sets group g's moments (checkpoints).
  void load_moments(int g, const Tensor& m, const Tensor& v);
  // Checkpoint state of the single group (DataParallel::segments; a
  // loom::Error with several groups): the moments, and setting them and the
  // update count.
  Tensor m() const;
  Tensor v() const;
  void load_state(const Tensor& m, const Tensor& v, int64_t steps_taken);

 private:
  parallel::DataParallel& dp_;
  AdamWOptions options_;
  std::vector<OwnedTensor> m_, v_;  // per group, (S_g) f32
  // DataParallel::state_pools' optimizer pool, on the master weights' device
  // (the host's under offload_optimizer): the moments, and the staging of
  // bias deltas onto a device or of rounded weights off the host.
  Pool* state_pool_ = nullptr;
  Storage staging_;  // the rounded weights off the host, reused (optimizer.cpp's write_param)
  int64_t steps_ = 0;
};

}  // namespace loom::train
