// What one rank trains, built in one place for the trainer and the training
// benchmarks (bench/train_bench.cpp): the tensor-parallel ops over mesh.tp(),
// the context-parallel attention over mesh.cp(), the rank's model chunks (the
// whole model without pipelining; under pipelining the stages c x pp + r of
// the partition, parallel/pp_partition.h) each with its DataParallel over
// mesh.dp_cp() (a cp rank's gradients are of other tokens of the same
// sequences: dense gradients are averaged, and ZeRO shards, over dp x cp as
// in Megatron's distributed optimizer), and under pipelining the
// schedule, the runtime that runs it and the tied embedding's two copies.
//
//   RankChunks rank = build_rank_chunks(options, ctx);
//   rank.models[c], rank.dps[c], rank.optimizers[c], rank.pipe (null without pipelining)
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "mesh/context.h"
#include "model/config.h"
#include "model/model.h"
#include "parallel/cp.h"
#include "parallel/dp.h"
#include "parallel/pp_runtime.h"
#include "parallel/pp_schedule.h"
#include "parallel/pp_tied.h"
#include "parallel/ep.h"
#include "parallel/tp.h"
#include "train/config.h"
#include "train/optimizer.h"

namespace loom::train {

struct ChunkOptions {
  model::ModelConfig model;
  int64_t micro_batch = 1, seq_len = 1;  // B, T of every micro-batch
  DType compute = DType::f32;
  model::Recompute recompute = model::Recompute::none;
  bool sequence_parallel = false;
  parallel::DpOptions dp;          // solo_params is filled in for a tied embedding under pipelining
  AdamWOptions adamw;
  uint64_t seed = 0;               // sharding-invariant init of every chunk
  // Pipelining (mesh.pp() of more than one rank): the schedule's name
  // (parallel/pp_schedule.h), its micro-batches per step, the chunks per
  // rank, and an explicit split (layers per stage; empty: balanced).
  std::string pp_schedule = "1f1b";
  int64_t micro_batches = 1;
  int64_t virtual_stages = 1;
  std::vector<int64_t> pp_layers;
  std::string cp_algo = "ring";    // context parallelism (mesh.cp() of more than one rank): parallel/cp.h
  bool cp_zigzag = true;           // false: contiguous chunks (the imbalance zig-zag removes, for benchmarks)
  bool ep_overlap = true;          // parallel::ExpertParallel's overlap
  Pools* cp_pools = nullptr;       // where the cp attention's buffers come from (null: the context's pools)
  // LoRA (model/lora.h): the adapters the models train, on base's frozen
  // weights (both from the run's [lora]; base must outlive the chunks).
  model::LoraConfig lora;
  const model::FrozenWeights* lora_base = nullptr;
  std::string lora_init;  // a PEFT adapter directory the adapters start from (empty: their init)
  // parallel.offload = optimizer | params: the directory of the offload files (dp.disk
  // then holds the rest; each chunk's file is named by rank, chunk and pid).
  std::string offload_dir;
};

// The chunk options of a run config: its model, micro-batch, dtype,
// recompute, ZeRO, AdamW, seed, pipeline and cp settings.
ChunkOptions chunk_options(const RunConfig& cfg);

// Pipeline rank r's stages under `schedule` over pp ranks: chunk c is stage
// c x pp + r of the partition (o.pp_layers, else balanced), with the
// activation slots the schedule keeps in flight on it. What
// build_rank_chunks builds the rank's models with, and what loom plan
// predicts them from.
std::vector<model::StageOptions> rank_stages(const ChunkOptions& o, const parallel::PpSchedule& schedule, int pp,
                                             int r);

// The mesh groups a rank's gradients are averaged (and ZeRO-sharded) over,
// one per parameter group in DataParallel's order: every parameter over
// dp x cp; under expert parallelism (ep > 1) the dense ones over dp x cp
// (parallel::kDenseGroup) and the rank's experts over expert-dp x cp
// (parallel::kExpertGroup). What build_rank_chunks reduces over, and what
// loom plan shards by.
std::vector<mesh::Group> gradient_groups(int ep);

struct RankChunks {
  std::unique_ptr<parallel::TensorParallel> tp;  // null when mesh.tp() is of one rank
  std::unique_ptr<parallel::ExpertParallel> ep;  // null when mesh.ep() is of one rank
  // Context parallelism (null when mesh.cp() is of one rank): the models'
  // attention step, and the positions of the rank's seq_len / cp tokens of
  // every sequence (zig-zag chunks).
  std::unique_ptr<parallel::ContextParallelAttention> cp;
  std::vector<int32_t> cp_positions;
  std::unique_ptr<parallel::RoutingGroups> cp_routing;  // a MoE model's routing groups over the cp ranks
  std::optional<parallel::PpSchedule> schedule;  // pipelining only, as the two below
  std::unique_ptr<parallel::TiedEmbedding> tied;
  std::vector<std::unique_ptr<model::Model>> models;
  std::vector<std::unique_ptr<parallel::DataParallel>> dps;
  std::vector<std::unique_ptr<AdamW>> optimizers;  // one per chunk, over its DataParallel
  std::unique_ptr<parallel::PipelineRuntime> pipe;

  std::vector<model::Model*> model_ptrs() const;
  std::vector<parallel::DataParallel*> dp_ptrs() const;
};

// Builds and initialises (options.seed) the rank's chunks from ctx.pools.
// Collective over the mesh. Under pipelining the runtime's before-backward
// hook starts each chunk's gradient reduction in its last micro-batch. A
// partition that cannot be made is a loom::Error (parallel/pp_partition.h).
RankChunks build_rank_chunks(const ChunkOptions& options, Context& ctx);

}  // namespace loom::train
