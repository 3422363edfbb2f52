// Pipeline partition (DESIGN.md §5 PP): the model's layers cut into
// pp x virtual_stages contiguous chunks (stages, in model order) balanced by
// cost, the embedding counted in the first stage and the final norm + LM
// head in the last, as Megatron's and torchtitan's layer splits do.
//
// Cost model, per token, in units of one transformer layer: a layer costs
// its forward + backward FLOPs (6 x its parameters + 12 x n_embd x seq_len
// for attention) = 1; the final norm + LM head cost 6 V C (+ 6 x the norm's
// parameters), tied or not, which for GPT-2 124M at T = 1024 is ~4.46
// layers; the embedding costs its row copy forward and row add backward,
// 2 n_embd per table (token, and GPT-2's positions), ~1e-4 of a layer. The
// optimizer update is per step, not per token, and is left out for every
// part alike. The split minimises the most expensive stage (linear
// partition, exact); among equally good splits it takes the
// lexicographically smallest layer counts (earlier stages hold fewer
// layers: under 1F1B stage s keeps p - s micro-batches' activations).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace loom::parallel {

struct PpPartition {
  // layers[s]: the layers of stage s = [first, first + count); every stage
  // holds at least one layer; stage 0 also the embedding, the last stage the
  // final norm and LM head.
  struct Stage {
    int64_t first = 0, count = 0;
    double cost = 0;  // in layer units (one transformer layer = 1)
  };
  std::vector<Stage> stages;
  double max_cost() const;
};

// Cost of the head (final norm + LM head) and the embedding in units of one
// transformer layer's cost, for a model trained at seq_len.
double pp_head_cost(const model::ModelConfig& cfg, int64_t seq_len);
double pp_embedding_cost(const model::ModelConfig& cfg, int64_t seq_len);

// Balanced split of cfg.n_layer layers into `stages` = pp x virtual_stages
// stages. More stages than layers is a loom::Error ("parallel.pp x
// parallel.virtual_stages = 8 stages for model.n_layer = 6 layers: every
// stage needs at least one layer").
PpPartition balanced_pp_partition(const model::ModelConfig& cfg, int64_t seq_len, int stages);

// An explicit split (parallel.pp_layers): layers per stage, in order; they
// must be >= 1 each, there must be `stages` of them and they must sum to
// n_layer, else a loom::Error saying which.
PpPartition explicit_pp_partition(const model::ModelConfig& cfg, int64_t seq_len, int stages,
                                  const std::vector<int64_t>& layers_per_stage);

}  // namespace loom::parallel
