// Data parallelism and ZeRO (DESIGN.md §5 DP/ZeRO): one model replica per
// rank of the dp group, each on its own slice of the global batch, with the
// optimizer state (stage >= 1), the gradients (>= 2) and the parameters (3)
// sharded across the group.
//
// Buckets and shards. The flat parameter buffer (model.h, spec order) is cut
// into buckets of whole units: stages 0-2 merge units in backward's order
// (the last unit first) until a bucket holds bucket_mb of f32 gradients;
// stage 3 makes every unit a bucket (FSDP's per-layer wrapping; bucket_mb is
// not used). Under stages 0-1 a parameter named in DpOptions::solo_params is
// then cut out of its unit into a bucket of its own. A bucket finishes when
// backward finishes its lowest unit. Each bucket is split across the group
// by comm::shard_range; a rank's shard is its piece of every bucket (stage 0:
// every bucket whole), packed in bucket order: segments() says where each
// piece sits in the flat buffer.
//
//   stage  the model keeps   this class keeps   gradient communication per bucket
//   0      params, grads     master*, m, v      all_reduce(avg), last micro-batch only
//   1      params, grads     master*, m, v      reduce_scatter(avg) in place, last
//                            (shard)            micro-batch only; params all_gather
//                                               after the update
//   2      params            grads, master*,    each micro-batch: the bucket's
//                            m, v (shard)       gradients go to a buffer (pools[comm])
//                                               that is reduce_scattered and added
//                                               into the shard, then freed
//   3      -                 params, grads,     as 2; each unit's params all_gathered
//                            master*, m, v      into pools[comm] before use, the next
//                            (shard)            unit's gather prefetched, freed after
//   * master: f32 weights, present under bf16 / f16 compute and with
//     offload_optimizer; otherwise the f32 parameters are the master.
//
// Every bucket's collective is issued from the model's grads_ready hook as
// soon as the bucket finishes, so it runs while backward goes on (the
// communicator's progress thread: comm/communicator.h); the optimizer waits
// for all of them. With a group of one (comm == nullptr or size 1) nothing
// is communicated and stage 0 is the single-process trainer.
//
// offload_optimizer: master weights and AdamW moments live in host memory
// (pools[master], pools[optimizer] on the CPU) and the update runs there on a
// host copy of the gradient shard; the updated weights are then copied to the
// model's parameters. On a CPU-only run the copies are host to host: it
// gives the same numbers, and matters once the model runs on a GPU.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/memory.h"
#include "model/model.h"

namespace loom::parallel {

struct DpOptions {
  int zero_stage = 0;        // 0 (DDP) to 3 (FSDP)
  double bucket_mb = 25.0;   // stages 0-2: f32 gradient bytes per bucket, in MiB
  bool offload_optimizer = false;
  // Parameters (by name) whose gradients form a bucket of their own, stages
  // 0 and 1 only: the bucket's shard is then the same slice of the parameter
  // on every model holding it with the same dp group size, whatever else the
  // model holds. Pipeline stages use it for a tied embedding: stage 0 and the
  // last stage each hold a copy, and under ZeRO-1 each sums just its reduced
  // piece with the other's (parallel/pp_tied.h). Unknown names are a
  // loom::Error.
  std::vector<std::string> solo_params = {};
};

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.95;  // GPT-3 / llm.c / nanoGPT
  double eps = 1e-8;
  double weight_decay = 0.1;  // 2-D weights only (linear weights, embeddings): nanoGPT, llm.c
};

// Units [first_unit, last_unit] (model.h), flat elements [begin, end).
struct Bucket {
  int first_unit = 0, last_unit = 0;
  int64_t begin = 0, end = 0;
  int64_t numel() const { return end - begin; }
};
// Pure: the buckets of a model's units under a stage (see above). solo:
// flat element ranges (stages 0 and 1), each inside one unit, cut out of
// the bucket holding them as buckets of their own; such a bucket, and the
// rest of a unit cut in two, finish with the unit (a bucket finishes when
// backward finishes its lowest unit).
std::vector<Bucket> make_buckets(const std::vector<model::Unit>& units, int zero_stage, double bucket_mb,
                                 const std::vector<model::Unit>& solo = {});

// One piece of a rank's shard: flat elements [offset, offset + count) of the
// parameter buffer, at shard_offset in the rank's packed shard buffers.
struct Segment {
  int64_t offset = 0, count = 0, shard_offset = 0;
};
// The sum of a per-rank value over a group (nullptr: the value), the same
// bits on every rank: exchanged as bit patterns and summed in rank order.
double exact_group_sum(comm::Communicator* group, double value);

// Pure: rank's shard under a stage (stage 0: every bucket whole).
std::vector<Segment> shard_segments(const std::vector<Bucket>& buckets, int zero_stage, int size, int rank);

// A run of a segment inside one parameter: AdamW's weight decay is per
// tensor (2-D weights decay).
struct ParamPiece {
  int64_t offset = 0, count = 0, shard_offset = 0;
  bool decay = false;
};
// Pure: the segments cut at parameter boundaries, in order. specs: the
// model's, packed in offset order; each segment finds its first parameter
// by binary search, so the work is linear in segments plus pieces.
std::vector<ParamPiece> segment_pieces(const std::vector<Segment>& segments,
                                       const std::vector<model::ParamSpec>& specs);

// What a step's gradient communication cost and how much of it backward hid.
struct CommStats {
  int64_t ops = 0;              // gradient collectives issued
  int64_t bytes = 0;            // their input bytes
  double exposed_seconds = 0;   // time spent waiting for them (gradients and stage-3 gathers)
};

class DataParallel : public model::StepHooks {
 public:
  // What the model must allocate itself under a stage: DataParallel keeps
  // the master weights, and from stage 2 the gradients, from 3 the params.
  static model::Storage model_storage(int zero_stage);

  // `model` must have been built with model_storage(options.zero_stage);
  // this sets itself as its hooks. comm: the dp group (nullptr: a group of
  // one); every member builds its DataParallel with the same options and
  // model. Shard state (master, moments, gradients, parameters) comes from
  // pools by tag; gathered parameters and bucket buffers from pools[comm].
  DataParallel(model::Model& model, comm::Communicator* comm, const DpOptions& options, const AdamWOptions& adamw,
               Pools& pools);
  ~DataParallel() override;
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  const DpOptions& options() const { return opt_; }
  const AdamWOptions& adamw_options() const { return adamw_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  // The dp group; nullptr for a group of one.
  comm::Communicator* group() const { return comm_; }
  const std::vector<Bucket>& buckets() const { return buckets_; }
  const std::vector<Segment>& segments() const { return segments_; }
  // The bucket made of parameter `name` alone (DpOptions::solo_params).
  int solo_bucket(const std::string& name) const;
  int64_t shard_numel() const { return shard_numel_; }

  // Sharding-invariant init (model/params.h) of every parameter: each rank
  // computes one bucket at a time in f32 in pools[workspace] (freed on
  // return) and keeps what its stage needs.
  void init_params(uint64_t seed);

  // A step: zero_grads(), then per micro-batch begin_micro_batch(last) +
  // model forward + backward, then grad_norm() and update().
  void zero_grads();
  // Stages 0 and 1 communicate only in the last micro-batch's backward.
  void begin_micro_batch(bool last);
  // Waits for every gradient collective, then returns the global L2 norm of
  // the averaged gradients (the same on every rank; under tensor
  // parallelism the whole model's, each replicated parameter counted once).
  double grad_norm();
  // Its square before the root (pipeline stages add theirs), and the wait
  // for every gradient collective that both begin with.
  double grad_sum_squares();
  void wait_gradients();
  // The model's tensor-parallel group (parallel/tp.h; nullptr: none). Only
  // the gradient norm spans it: dp groups are per tp rank.
  void set_tp_group(comm::Communicator* tp) { tp_ = tp; }
  // One AdamW update of this rank's shard with gradients times grad_scale
  // (unscaling and clipping folded in), then the parameters every rank
  // needs refreshed (stages 1 and 2 all_gather them). Counts an update.
  void update(double lr, float grad_scale);
  int64_t steps_taken() const { return step_; }
  void set_steps_taken(int64_t steps) { step_ = steps; }

  // The mean of a per-rank value over the group (losses), the same on every
  // rank, summed in rank order.
  double mean(double value);

  // Checkpoint state, packed like segments(): master weights (f32), AdamW
  // moments. m() and v() are views of the state; pack_master copies.
  Tensor m() const { return m_; }
  Tensor v() const { return v_; }
  void pack_master(Tensor out) const;
  // Sets the master weights (and the moments) from packed shards and
  // refreshes the model's parameters. Collective for stages 1 and 2.
  void load_state(const Tensor& master, const Tensor& m, const Tensor& v);
  // Every rank gets the whole (P) f32 master weights. Collective.
  void gather_master(Tensor out);

  // Gradient communication since the last reset.
  const CommStats& comm_stats() const { return stats_; }
  void reset_comm_stats() { stats_ = {}; }
  // Seconds one step's gradient collectives take alone (no compute beside
  // them), best of `repeats`: what backward could hide. Collective.
  double measure_gradient_comm_seconds(int repeats = 3);

  // model::StepHooks
  Tensor acquire_params(int unit, model::Pass pass) override;
  void release_params(int unit) override;
  Tensor acquire_grads(int unit) override;
  void grads_ready(int unit) override;

 private:
  struct Impl;
  // Stages 2 and 3: adds the oldest finished gradient reduction into the
  // shard (block: waits for it); false if it is still running.
  bool retire_reduction(bool block);
  // flat (P): every rank holds its segments; all_gather each bucket in place
  // so every rank holds everything. Collective (nothing in a group of one).
  void gather_pieces(Tensor flat);

  DpOptions opt_;
  AdamWOptions adamw_;
  model::Model& model_;
  comm::Communicator* comm_;
  comm::Communicator* tp_ = nullptr;
  int rank_ = 0, size_ = 1;
  std::vector<Bucket> buckets_;
  std::vector<Segment> segments_;  // one per bucket, in bucket order
  int64_t shard_numel_ = 0;
  OwnedTensor master_, m_, v_;     // (S) f32; master_ undefined without a master (see above)
  OwnedTensor grad_shard_;         // (S) f32, stages 2 and 3
  OwnedTensor param_shard_;        // (S) compute dtype, stage 3
  OwnedTensor host_grads_;         // (S) f32, offload_optimizer
  int64_t step_ = 0;
  CommStats stats_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace loom::parallel
