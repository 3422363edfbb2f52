// Pipeline partition (parallel/pp_partition.h): per-part costs in layer
// units, layers handed out one at a time to ranks, then to a rank's stages.
#include "parallel/pp_partition.h"

#include <algorithm>
#include <functional>
#include <string_view>

#include "core/error.h"
#include "model/params.h"

namespace loom::parallel {
namespace {

// cfg cut to n layers, every one of them a MoE layer when cfg has experts.
model::ModelConfig with_layers(const model::ModelConfig& cfg, int64_t n) {
  model::ModelConfig c = cfg;
  c.n_layer = n, c.moe_every = 1;
  return c;
}

// A transformer layer's parameters a token uses (its active ones): the model
// with two layers less the model with one, so the count follows param_specs
// (biases, norms, GQA, d_ff). With experts every moe_every-th layer is a
// MoE layer (its chosen experts counted): the mean over the model's layers.
// The partition counts every layer as this mean (layers of one kind cost
// the same; a dense layer between MoE layers is then over- or under-counted
// by the difference).
int64_t layer_params(const model::ModelConfig& cfg) {
  const auto per_layer = [](const model::ModelConfig& c) {
    return model::active_param_count(with_layers(c, 2)) - model::active_param_count(with_layers(c, 1));
  };
  if (!cfg.is_moe()) return per_layer(cfg);
  model::ModelConfig dense = cfg;
  dense.n_expert = 0;
  const int64_t moe_layers = cfg.n_layer / cfg.moe_every, L = cfg.n_layer;
  return (moe_layers * per_layer(cfg) + (L - moe_layers) * per_layer(dense)) / L;
}

// The final norm's parameters (GPT-2 ln_f weight + bias, Llama's norm
// weight): from a one-layer model's list, the same head whatever n_layer.
int64_t final_norm_params(const model::ModelConfig& cfg) {
  const model::ModelConfig one = with_layers(cfg, 1);
  int64_t n = 0;
  for (const model::ParamSpec& s : model::param_specs(one)) {
    const std::string_view name = s.name;
    if (name.starts_with("ln_f.") || name.starts_with("model.norm.")) n += s.numel();
  }
  return n;
}

// One layer's forward + backward FLOPs per token: 6 x parameters for the
// GEMMs (2 forward, 4 backward), 12 C T for QK^T and AV over the whole
// context (not halved for causality, as Kaplan et al. count it).
double layer_flops(const model::ModelConfig& cfg, int64_t seq_len) {
  LOOM_REQUIRE(seq_len > 0, "pipeline partition: seq_len = ", seq_len, " must be positive");
  return 6.0 * static_cast<double>(layer_params(cfg)) + 12.0 * static_cast<double>(cfg.n_embd) * seq_len;
}

// Stage s of `stages` holding `count` layers, in layer units.
double stage_cost(int s, int stages, int64_t count, double embedding, double head) {
  return static_cast<double>(count) + (s == 0 ? embedding : 0.0) + (s == stages - 1 ? head : 0.0);
}

PpPartition make_partition(const std::vector<int64_t>& counts, double embedding, double head) {
  PpPartition p;
  p.embedding_cost = embedding, p.head_cost = head;
  const int stages = static_cast<int>(counts.size());
  int64_t first = 0;
  for (int s = 0; s < stages; ++s) {
    p.stages.push_back({first, counts[s], stage_cost(s, stages, counts[s], embedding, head)});
    first += counts[s];
  }
  return p;
}

// `total` unit items into `bins` bins, `each` to every bin first, then one at
// a time to the bin whose cost(bin, count) is least, ties to the highest
// bin. With costs offset + count (each item adds 1), a bin a holding more
// than `each` ends with cost(a) - 1 <= cost(b) for every bin b (a was least
// when its last item came, and costs only grow): no single move of an item
// lowers a cost without raising another as high, which for unit items means
// the least possible maximum and the lexicographically least costs sorted
// largest first (water-filling). Costs come from `cost` alone, so ties are
// exact comparisons.
std::vector<int64_t> fill_evenly(int bins, int64_t each, int64_t total,
                                 const std::function<double(int, int64_t)>& cost) {
  std::vector<int64_t> counts(static_cast<size_t>(bins), each);
  for (int64_t left = total - each * bins; left > 0; --left) {
    int least = bins - 1;
    for (int b = bins - 2; b >= 0; --b)
      if (cost(b, counts[b]) < cost(least, counts[least])) least = b;
    ++counts[least];
  }
  return counts;
}

}  // namespace

double PpPartition::max_cost() const {
  double m = 0;
  for (const Stage& s : stages) m = std::max(m, s.cost);
  return m;
}

std::vector<double> PpPartition::rank_loads(int pp) const {
  LOOM_CHECK(pp >= 1 && stages.size() % static_cast<size_t>(pp) == 0, "pipeline partition: ", stages.size(),
             " stages over ", pp, " ranks");
  std::vector<int64_t> layers(static_cast<size_t>(pp), 0);
  for (size_t s = 0; s < stages.size(); ++s) layers[s % static_cast<size_t>(pp)] += stages[s].count;
  std::vector<double> loads;
  for (int r = 0; r < pp; ++r) loads.push_back(stage_cost(r, pp, layers[r], embedding_cost, head_cost));
  return loads;
}

// The LM head GEMM (V, C) runs forward and backward whether or not its weight
// is tied to the embedding: 6 V C per token, plus the final norm at the same
// 6-per-parameter rate (negligible). The softmax / cross-entropy over V
// logits is a few V FLOPs, under 1% of 6 V C, and left out.
double pp_head_cost(const model::ModelConfig& cfg, int64_t seq_len) {
  const double flops = 6.0 * static_cast<double>(cfg.vocab_size) * static_cast<double>(cfg.n_embd) +
                       6.0 * static_cast<double>(final_norm_params(cfg));
  return flops / layer_flops(cfg, seq_len);
}

// Per token the embedding copies one C-row out of each table forward (token,
// and GPT-2's learned positions) and adds one C-row into its gradient
// backward: 2 C memory-bound element operations per table, counted as 2 C
// FLOPs. That is ~1e-4 of a layer: real, but it only matters for ties, where
// it steers the extra layer away from stage 0. The (V, C) optimizer update is
// per step, not per token, and is left out here as it is for every layer.
double pp_embedding_cost(const model::ModelConfig& cfg, int64_t seq_len) {
  const int64_t tables = cfg.family == model::Family::gpt2 ? 2 : 1;
  return 2.0 * static_cast<double>(tables * cfg.n_embd) / layer_flops(cfg, seq_len);
}

// Two passes of fill_evenly: layers to ranks (rank r's load is
// stage_cost(r, pp, ...): its layers + e on rank 0 + h on rank pp - 1, as
// rank_loads evaluates it), then each rank's layers to its v stages (stage
// c x pp + r, costed by stage_cost over all pp x v stages).
PpPartition balanced_pp_partition(const model::ModelConfig& cfg, int64_t seq_len, int pp, int virtual_stages) {
  const int64_t L = cfg.n_layer;
  const int v = virtual_stages;
  LOOM_REQUIRE(pp >= 1, "pipeline partition: parallel.pp = ", pp, ": at least 1 rank is needed");
  LOOM_REQUIRE(v >= 1, "pipeline partition: parallel.virtual_stages = ", v, ": at least 1 is needed");
  const int64_t n_stages = static_cast<int64_t>(pp) * v;
  LOOM_REQUIRE(n_stages <= L, "parallel.pp x parallel.virtual_stages = ", n_stages, " stages for model.n_layer = ",
               L, " layers: every stage needs at least one layer");
  const int stages = static_cast<int>(n_stages);
  const double embedding = pp_embedding_cost(cfg, seq_len), head = pp_head_cost(cfg, seq_len);
  const std::vector<int64_t> per_rank = fill_evenly(pp, v, L, [&](int r, int64_t n) {
    return stage_cost(r, pp, n, embedding, head);
  });
  std::vector<int64_t> counts(static_cast<size_t>(stages));
  for (int r = 0; r < pp; ++r) {
    const std::vector<int64_t> per_chunk = fill_evenly(v, 1, per_rank[r], [&](int c, int64_t n) {
      return stage_cost(c * pp + r, stages, n, embedding, head);
    });
    for (int c = 0; c < v; ++c) counts[static_cast<size_t>(c * pp + r)] = per_chunk[c];
  }
  return make_partition(counts, embedding, head);
}

PpPartition explicit_pp_partition(const model::ModelConfig& cfg, int64_t seq_len, int stages,
                                  const std::vector<int64_t>& layers_per_stage) {
  const auto n = static_cast<int64_t>(layers_per_stage.size());
  LOOM_REQUIRE(n == stages, "parallel.pp_layers has ", n, " entries but parallel.pp x parallel.virtual_stages = ",
               stages, " stages: give one layer count per stage");
  int64_t sum = 0;
  for (int64_t s = 0; s < n; ++s) {
    LOOM_REQUIRE(layers_per_stage[s] >= 1, "parallel.pp_layers[", s, "] = ", layers_per_stage[s],
                 ": every stage needs at least one layer");
    sum += layers_per_stage[s];
  }
  LOOM_REQUIRE(sum == cfg.n_layer, "parallel.pp_layers sums to ", sum, " layers but model.n_layer = ", cfg.n_layer);
  return make_partition(layers_per_stage, pp_embedding_cost(cfg, seq_len), pp_head_cost(cfg, seq_len));
}

}  // namespace loom::parallel
