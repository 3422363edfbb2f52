// A mixture-of-experts run's per-step bookkeeping (DESIGN.md §4 MoE): the
// routing figures of the progress line and metrics, and DeepSeek-V3's
// auxiliary-loss-free balancing (Wang et al. 2024): after each optimizer
// step every MoE layer's selection bias moves by model.aux_free_rate toward
// balance, b_e += rate x sign(mean load - load_e), from the step's loads
// summed over every rank and micro-batch (so every replica moves alike).
// The bias changes which experts are chosen, never the gate weights (its
// gradient is zero: the router's scores, not the biased keys, weight the
// experts).
#pragma once

#include <span>
#include <utility>
#include <vector>

#include "mesh/mesh.h"
#include "model/model.h"
#include "train/optimizer.h"

namespace loom::train {

struct MoeStepStats {
  double aux_loss = 0, z_loss = 0;  // means over MoE layers and micro-batches (aux 1 = balanced)
  double load_min = 0, load_max = 0;  // over (layer, expert): an expert's choices over its layer's mean
  double dropped = 0;               // the fraction of choices dropped over capacity
};

struct MoeStep {
  MoeStepStats stats;
  std::vector<std::vector<ParamDelta>> bias_deltas;  // per chunk: the balancing bias updates (aux_free_rate > 0)
};

// The least and most loaded expert over its layer's mean, over every layer
// of load (layers x E choices) that routed any choice: {min, max}, {0, 0}
// when none did.
std::pair<double, double> load_spread(std::span<const int64_t> load, int64_t E);

// The step's figures from every chunk's MoeStats, summed over the dp x cp
// ranks (each routes its own tokens) and the pipeline stages (each holds its
// own layers; tp ranks route the same tokens and are counted once).
// Collective over mesh.dp_cp() and mesh.pp(). Resets the stats.
MoeStep finish_moe_step(const std::vector<model::Model*>& chunks, mesh::Mesh& mesh);

}  // namespace loom::train
