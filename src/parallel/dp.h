// Data parallelism and ZeRO (DESIGN.md §5 DP/ZeRO): one model replica per
// rank of the dp group, each on its own slice of the global batch, with the
// optimizer state (stage >= 1), the gradients (>= 2) and the parameters (3)
// sharded across the group.
//
// Parameter groups (parallel/dp_layout.h). The parameters are split into
// groups, each with its own communicator: a group's gradients are averaged
// over it and its state sharded over it. By default one group, "dense", of
// every parameter over the dp group; under expert parallelism the experts
// form a group over mesh.expert_dp_cp() (train/rank_chunks.cpp). Each group
// is laid out on its own, in its index space (its parameters packed in flat
// order; the default group's index is the flat element), as follows.
//
// Buckets and shards. A group's units (the model's units, model.h, cut to
// the group's parameters) are merged into buckets: stages 0-2 merge units in
// backward's order (the last unit first) until a bucket holds bucket_mb of
// f32 gradients; stage 3 makes every unit a bucket (FSDP's per-layer
// wrapping; bucket_mb is not used). Under stages 0-1 a parameter named in
// DpOptions::solo_params is then cut out of its unit into a bucket of its
// own. A bucket finishes when backward finishes its lowest unit. Each bucket
// is split across the group by comm::shard_range; a rank's shard is its
// piece of every bucket (stage 0: every bucket whole), packed in bucket
// order: segments say where each piece sits in the group's index space.
//
//   stage  the model keeps   this class keeps   gradient communication per bucket
//   0      params, grads     master*            all_reduce(avg), last micro-batch only
//   1      params, grads     master* (shard)    reduce_scatter(avg) in place, last
//                                               micro-batch only; params all_gather
//                                               after the update
//   2      params            grads, master*     each micro-batch: the bucket's
//                            (shard)            gradients go to a buffer (pools[comm])
//                                               that is reduce_scattered and added
//                                               into the shard, then freed
//   3      -                 params, grads,     as 2; each unit's params all_gathered
//                            master* (shard)    into pools[comm] before use, the next
//                                               unit's gather prefetched, freed after
//   * master: f32 weights, present under bf16 / f16 compute and with
//     offload_optimizer; otherwise the f32 parameters are the master.
//
// A bucket whose group indices are not one run of the flat buffer (a group
// spread over it) is packed into a buffer of pools[comm] around its
// collective. From stage 2 a unit's parameters must lie in one group.
//
// Every bucket's collective is issued from the model's grads_ready hook as
// soon as the bucket finishes, so it runs while backward goes on (the
// communicator's progress thread: comm/communicator.h); the update waits
// for all of them. With a group of one rank nothing is communicated and
// stage 0 is the single-process trainer.
//
// The optimizer (train/optimizer.h) owns its state (AdamW's moments, per
// group, packed like the group's shard) and updates each group's shard
// through update_piece; this class owns the sharding: where each piece's
// master weights, gradient and compute weights are, and making the updated
// parameters every rank's again (update_finish).
//
// offload_optimizer: master weights (and the optimizer's state) live in host
// memory (pools[master], pools[optimizer] of the state pools: state_pools())
// and the update runs there on a host copy of the gradient shard; the
// updated weights, rounded on the host, are then copied to the model's
// parameters. On a CPU-only run the copies are host to host: it gives the
// same numbers. Beside a model on a GPU (DpOptions::host_state) the copies
// cross PCIe: the gradient shard down, the weights up, each once a step.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/memory.h"
#include "model/model.h"
#include "parallel/dp_layout.h"
#include "parallel/offload.h"
#include "parallel/ps.h"

namespace loom::parallel {

struct DpOptions {
  int zero_stage = 0;        // 0 (DDP) to 3 (FSDP)
  double bucket_mb = 25.0;   // stages 0-2: f32 gradient bytes per bucket, in MiB
  bool offload_optimizer = false;
  // offload_optimizer beside a model on a device (ZeRO-Offload): host pools
  // for the master weights, the gradients' host copy and the optimizer's
  // state, while the model's pools are the device's. Null: the pools
  // DataParallel is given.
  Pools* host_state = nullptr;
  // parallel.offload = optimizer: the master weights (when kept apart from
  // the parameters: bf16 / f16 compute) and the optimizer's state live in
  // an offload file and stream through disk.budget_bytes of buffers during
  // the update (parallel/offload.h); the optimizer then updates through
  // stream_update. Not with offload_optimizer. With disk.params (stage 3
  // only) the parameter and gradient shards are on disk too
  // (OffloadedShards): a unit's piece is read into its gathered buffer when
  // the unit before it is acquired, each reduced gradient added into its
  // record, and the update reads both records a segment at a time.
  DiskOffload disk = {};
  // Parameters (by name) whose gradients form a bucket of their own, stages
  // 0 and 1 only: the bucket's shard is then the same slice of the parameter
  // on every model holding it with the same dp group size, whatever else the
  // model holds. Pipeline stages use it for a tied embedding: stage 0 and the
  // last stage each hold a copy, and under ZeRO-1 each sums just its reduced
  // piece with the other's (parallel/pp_tied.h). Unknown names are a
  // loom::Error.
  std::vector<std::string> solo_params = {};
  // The parameter groups; empty: one group "dense" of every parameter over
  // the dp group.
  std::vector<ParamGroup> groups = {};
  // f32 values the optimizer keeps per shard element (AdamW: its two
  // moments), counted in the memory check made before anything is allocated.
  int optimizer_state_floats = 2;
  // Stage 0 with one group only: each bucket's gradients go to this
  // exchange (parameter-server training, parallel/ps.h) instead of an
  // all-reduce over the group, even with a group of one rank. Not owned;
  // DataParallel::set_exchange sets it once the buckets are known.
  GradientExchange* exchange = nullptr;
};

// What a step's gradient communication cost and how much of it backward hid.
struct CommStats {
  int64_t ops = 0;              // gradient collectives issued
  int64_t bytes = 0;            // their input bytes
  double exposed_seconds = 0;   // time spent waiting for them (gradients and stage-3 gathers)
  double offload_wait_seconds = 0;  // time spent waiting for parameter shards read from disk (offload = params)
};

// A parameter group as laid out on this rank.
struct GroupLayout {
  std::string name;
  std::reference_wrapper<comm::Communicator> comm;
  comm::Communicator* spread = nullptr;  // ParamGroup::spread
  GroupSpace space;
  std::vector<Bucket> buckets;     // in the group's index space
  std::vector<Segment> segments;   // this rank's shard, one per bucket
  std::vector<ParamPiece> pieces;  // the segments cut at parameters; offset: the flat element
  int64_t shard_numel = 0;
};

// One ParamPiece of a group's shard as an optimizer updates it
// (DataParallel::update_piece): all (count) views.
struct UpdatePiece {
  Tensor master;  // f32 weights updated in place: the master weights, or the f32 parameters themselves
  Tensor grad;    // f32 averaged gradient (under offload_optimizer a host copy)
  Tensor param;   // compute-dtype weights to write the update's rounding to; undefined when master is them
};

struct GroupState;  // dp_state.h

class DataParallel : public model::StepHooks {
 public:
  // What the model must allocate itself under a stage: DataParallel keeps
  // the master weights, and from stage 2 the gradients, from 3 the params.
  static model::Storage model_storage(int zero_stage);
  // The bytes per tag a rank's shard state of S elements takes under o, in
  // compute: master weights (f32, unless compute is f32 and nothing is
  // offloaded), the gradient shard (stage >= 2), the parameter shard
  // (stage 3), and in optimizer the optimizer's o.optimizer_state_floats
  // per element (AdamW allocates them) and the offloaded gradients. Under
  // o.disk the state on disk takes only its buffers: the optimizer's
  // stream, and with o.disk.params the shards' slots.
  struct ShardStateBytes {
    int64_t params = 0, grads = 0, master = 0, optimizer = 0;
    int64_t total() const { return params + grads + master + optimizer; }
  };
  static ShardStateBytes shard_state_bytes(int64_t S, DType compute, const DpOptions& o);

  // `model` must have been built with model_storage(options.zero_stage);
  // this sets itself as its hooks. dp: the data-parallel group (mesh.dp();
  // of one rank without data parallelism), over which the batch is split and
  // losses averaged, and the default group's communicator; every member
  // builds its DataParallel with the same options and model. tp: the
  // model's tensor-parallel group (mesh.tp()): only the gradient norm spans
  // it, dp groups are per tp rank. Shard state (master weights, gradients,
  // parameters) comes from pools by tag; gathered parameters and bucket
  // buffers from pools[comm]. Bad groups are a loom::Error
  // (assign_param_groups, require_whole_units).
  DataParallel(model::Model& model, comm::Communicator& dp, comm::Communicator& tp, const DpOptions& options,
               Pools& pools);
  ~DataParallel() override;
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  const DpOptions& options() const { return opt_; }
  // Where the master weights and the optimizer's state live: the pools of
  // DpOptions::host_state, else those DataParallel was given.
  Pools& state_pools() const;
  // DpOptions::exchange, from now on (null: the group's all-reduce again);
  // a loom::Error above stage 0 or with several groups.
  void set_exchange(GradientExchange* exchange);
  // Rank and size of the dp group.
  int rank() const { return dp_.rank(); }
  int size() const { return dp_.size(); }
  comm::Communicator& dp_group() const { return dp_; }

  int num_groups() const;
  const GroupLayout& group(int g) const;
  // The single group's layout; with several groups a loom::Error.
  const std::vector<Bucket>& buckets() const { return only_group().buckets; }
  const std::vector<Segment>& segments() const { return only_group().segments; }
  int64_t shard_numel() const { return only_group().shard_numel; }
  // This rank's piece of the bucket made of parameter `name` alone
  // (DpOptions::solo_params), in whichever group holds it: offset is the
  // piece's first flat element (a solo bucket is one parameter, so one run
  // of the flat buffer), count its elements.
  Segment solo_piece(const std::string& name) const;

  // Sharding-invariant init (model/params.h) of every parameter: each rank
  // computes one bucket at a time in f32 in pools[workspace] (freed on
  // return) and keeps what its stage needs.
  void init_params(uint64_t seed);
  // The same from fill(dst, spec), which writes the rank's (tp slice of)
  // parameter `spec` into dst (spec.shape, f32): init_params is
  // fill = model::init_param. Each rank fills every parameter of the
  // buckets it holds a part of. Not collective.
  void set_params(const std::function<void(Tensor dst, const model::ParamSpec& spec)>& fill);

  // A step: zero_grads(), then per micro-batch begin_micro_batch(last) +
  // model forward + backward, then grad_norm() and the optimizer's update
  // (update_begin, update_piece for each group's pieces, update_finish).
  void zero_grads();
  // Stages 0 and 1 communicate only in the last micro-batch's backward.
  void begin_micro_batch(bool last);
  // Waits for every gradient collective, then returns the global L2 norm of
  // the averaged gradients (the same on every rank of a group; under tensor
  // parallelism the whole model's, each replicated parameter counted once).
  double grad_norm();
  // Its square before the root (pipeline stages add theirs), and the wait
  // for every gradient collective that both begin with. Each group's sum of
  // squares of its shard is summed over its communicator, the groups' sums
  // added in group order, then summed over tp.
  double grad_sum_squares();
  void wait_gradients();

  // The update of every group's shard: update_begin (under offload, copies
  // the gradient shards to host), then any changes to each piece through its
  // views, then update_finish, which gives every rank the updated parameters
  // it needs (stages 1 and 2 all_gather them). update_finish is collective.
  void update_begin();
  UpdatePiece update_piece(int g, const ParamPiece& piece) const;
  void update_finish();
  // Under DpOptions::disk the update goes through the offload file instead
  // of update_piece: f(g, piece, update, state) for each extent of every
  // group's shard in order (a run of one of its pieces), its record
  // resident: update.master in it (or, compute f32, the parameters
  // themselves), state the optimizer's optimizer_state_floats arrays; what f
  // leaves there is written back.
  bool state_on_disk() const;
  // Bytes the offload files read and wrote so far (0 without them).
  int64_t offload_bytes() const;
  using StreamedUpdate =
      std::function<void(int g, const ParamPiece& piece, const UpdatePiece& u, std::span<const Tensor> state)>;
  void stream_update(const StreamedUpdate& f);
  // Optimizer array k of group g, (S_g) f32 packed like its shard, out of
  // the offload file and into it (checkpoints); state_on_disk() only. With
  // shard_offset: its elements [shard_offset, + out.numel()) alone.
  void read_optimizer_state(int g, int k, Tensor out, int64_t shard_offset = -1) const;
  void write_optimizer_state(int g, int k, const Tensor& in);

  // The mean of a per-rank value over the dp group (losses), the same on
  // every rank, summed in rank order.
  double mean(double value);

  // Checkpoint state, packed like a group's segments: pack_master copies
  // group g's f32 master weights out (without g: the single group's, a
  // loom::Error with several); load_master sets every group's (one tensor
  // per group, in group order) and refreshes the model's parameters
  // (collective for stages 1 and 2).
  void pack_master(int g, Tensor out) const;
  void pack_master(Tensor out) const;
  // Elements [shard_offset, + out.numel()) of group g's packed master
  // weights alone (out on this run's device): a checkpoint of state on disk
  // writes them part by part.
  void pack_master(int g, Tensor out, int64_t shard_offset) const;
  void load_master(std::span<const Tensor> masters);
  void load_master(const Tensor& master);
  // Under DpOptions::disk (state_on_disk()), load_master and the
  // optimizer's state together, a part at a time (an offloaded run's state
  // does not fit in memory at once): read(g, shard_offset, parts) fills
  // parts[0] with group g's master weights at those shard elements and
  // parts[1..] with the optimizer's arrays (optimizer_state_floats of them),
  // each (count) f32; the model's parameters follow (collective for stages
  // 1 and 2, as load_master).
  using StateReader = std::function<void(int g, int64_t shard_offset, std::span<const Tensor> parts)>;
  void load_state_streamed(const StateReader& read);
  // Every rank gets the whole (P) f32 master weights. Collective.
  void gather_master(Tensor out);
  // With a group of one rank holding every parameter (no other group): flat
  // elements [flat, + out.numel()) of the f32 master weights, a part of
  // gather_master's without the whole (a model written from state on disk).
  void read_master(int64_t flat, Tensor out) const;

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
  // With an exchange: waits until the unit's bucket's weights have arrived
  // (GradientExchange::params_needed).
  void params_needed(int unit) override;

 private:
  struct Impl;  // dp_state.h
  // Group gs's master weights of segment s = src (in memory or on disk).
  void set_master(GroupState& gs, const Segment& s, const Tensor& src);
  UpdatePiece update_of(int g, const ParamPiece& p, const Tensor& master) const;
  const GroupLayout& only_group() const;
  // Stages 0-1: issues bucket b of group g's gradient collective.
  void reduce_bucket(int g, int b);
  // Stages 2 and 3: waits for the oldest gradient reduction and adds it into
  // the shard.
  void retire_reduction();
  // Group g's squared gradient norm on this rank's shard (before any sum over ranks).
  double shard_sum_squares(int g) const;
  // Whether the gradient norm counts the parameter holding flat element
  // `flat` on this rank (not a replicated one off tp rank 0, nor a pipeline
  // stage's tied copy).
  bool counts_in_norm(int64_t flat) const;
  // Stages 2 and 3: piece, bucket b's reduced gradient on this rank, added
  // into the shard (in memory, or its record on disk: dp_offload.cpp).
  void accumulate_grads(GroupState& gs, int b, const Tensor& piece);
  // Stage 3: bucket b's parameter shard = src (f32, cast to the compute
  // dtype), and back: its elements [from, + dst.numel()) into dst (f32).
  void write_param_shard(GroupState& gs, int b, const Tensor& src);
  void read_param_shard(const GroupState& gs, int b, Tensor dst, int64_t from) const;
  // Stage 3 with the shards on disk: the rank's piece of unit's parameters
  // into `piece` (its place in the gathered buffer), one read per extent
  // (Impl::Gathered::reads).
  void read_params_into(int unit, const Tensor& piece);
  // Then, as the unit is acquired: waits for those reads and gathers the
  // pieces over the group (dp_zero3.cpp).
  void gather_read_piece(int unit, const Tensor& piece);
  // stream_update with the shards on disk: their records beside the state's.
  void stream_update_shards(const StreamedUpdate& f);
  // flat (P): every rank holds its segments; all_gather each bucket of every
  // group so every rank holds everything. Collective over each group.
  void gather_pieces(Tensor flat);

  DpOptions opt_;
  model::Model& model_;
  comm::Communicator& dp_;
  comm::Communicator& tp_;
  CommStats stats_;
  std::unique_ptr<Impl> impl_;
};

// The sum of a per-rank value over a group (of one: the value), the same
// bits on every rank: exchanged as bit patterns and summed in rank order.
double exact_group_sum(comm::Communicator& group, double value);

}  // namespace loom::parallel
