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
// part alike.
//
// What is balanced: a pipeline rank runs every micro-batch through each of
// its stages (stage s is on rank s % pp; with virtual_stages = v rank r holds
// stages r, r + pp, ..., r + (v - 1) pp), so in steady state the busiest
// rank's total work, its load, sets the step time, not the dearest single
// stage. The split therefore balances rank loads first: since every layer
// costs the same 1, each rank gets v layers (one per stage it holds), then
// each further layer goes to the rank with the smallest load. For equal
// items this water-filling gives the least possible maximum load and, past
// it, the most even loads (the loads sorted largest first are
// lexicographically least), so when the LM head alone is the bottleneck the
// other ranks still come out level instead of with whatever layers a tie
// left them. Then, inside each rank, its layers are spread over its v stages
// the same way, so no single stage (a pipeline bubble's unit) is needlessly
// dear. Ties go to the higher rank and the later stage: under 1F1B stage s
// keeps p - s micro-batches' activations, so later stages have memory to
// spare. With v = 1 a rank is a stage, and the split has the least
// possible maximum stage cost.
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
  // The embedding's and the head's costs that stage 0 and the last stage
  // include (pp_embedding_cost, pp_head_cost), kept for rank_loads.
  double embedding_cost = 0, head_cost = 0;
  double max_cost() const;
  // Per rank r of pp (stage s is on rank s % pp; pp must divide the number
  // of stages): the sum of its stages' costs, evaluated as its layer count
  // + the embedding (rank 0) + the head (rank pp - 1), the same terms in the
  // same order as a stage's cost. A load so depends on the rank's layer
  // count alone, and equal counts give bit-equal loads whatever the split
  // inside the rank (adding stage costs one by one would round differently).
  // With pp = number of stages, rank_loads(pp)[s] == stages[s].cost exactly.
  std::vector<double> rank_loads(int pp) const;
};

// Cost of the head (final norm + LM head) and the embedding in units of one
// transformer layer's cost, for a model trained at seq_len.
double pp_head_cost(const model::ModelConfig& cfg, int64_t seq_len);
double pp_embedding_cost(const model::ModelConfig& cfg, int64_t seq_len);

// Balanced split of cfg.n_layer layers into pp x virtual_stages stages, in
// model order (stage c x pp + r is rank r's chunk c), by the rule above.
// pp or virtual_stages < 1 is a loom::Error, and so are more stages than
// layers ("parallel.pp x parallel.virtual_stages = 8 stages for
// model.n_layer = 6 layers: every stage needs at least one layer").
PpPartition balanced_pp_partition(const model::ModelConfig& cfg, int64_t seq_len, int pp, int virtual_stages);

// An explicit split (parallel.pp_layers): layers per stage, in order; they
// must be >= 1 each, there must be `stages` of them and they must sum to
// n_layer, else a loom::Error saying which.
PpPartition explicit_pp_partition(const model::ModelConfig& cfg, int64_t seq_len, int stages,
                                  const std::vector<int64_t>& layers_per_stage);

}  // namespace loom::parallel
