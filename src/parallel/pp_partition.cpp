// Pipeline partition (parallel/pp_partition.h): per-part costs in layer
// units, then an exact linear partition by dynamic programming.
#include "parallel/pp_partition.h"

#include <algorithm>
#include <limits>
#include <string_view>

#include "core/error.h"
#include "model/params.h"

namespace loom::parallel {
namespace {

// A transformer layer's parameters: the model with two layers less the model
// with one, so the count follows param_specs (biases, norms, GQA, d_ff).
int64_t layer_params(const model::ModelConfig& cfg) {
  model::ModelConfig one = cfg, two = cfg;
  one.n_layer = 1, two.n_layer = 2;
  return model::param_count(model::param_specs(two)) - model::param_count(model::param_specs(one));
}

// The final norm's parameters (GPT-2 ln_f weight + bias, Llama's norm weight).
int64_t final_norm_params(const model::ModelConfig& cfg) {
  int64_t n = 0;
  for (const model::ParamSpec& s : model::param_specs(cfg)) {
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
  const int stages = static_cast<int>(counts.size());
  int64_t first = 0;
  for (int s = 0; s < stages; ++s) {
    p.stages.push_back({first, counts[s], stage_cost(s, stages, counts[s], embedding, head)});
    first += counts[s];
  }
  return p;
}

}  // namespace

double PpPartition::max_cost() const {
  double m = 0;
  for (const Stage& s : stages) m = std::max(m, s.cost);
  return m;
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

// best[s][i]: the least possible max cost of layers [i, L) over stages
// [s, S), each stage >= 1 layer. Costs are sums computed by stage_cost alone,
// so equal splits give bit-equal costs and ties compare exactly. The split is
// then read off front to back taking, at each stage, the fewest layers that
// still reach the optimum: the lexicographically smallest counts among the
// optimal splits. Rationale: under 1F1B stage s holds p - s micro-batches'
// activations, so layers a tie lets move go to later stages.
PpPartition balanced_pp_partition(const model::ModelConfig& cfg, int64_t seq_len, int stages) {
  const int64_t L = cfg.n_layer;
  LOOM_REQUIRE(stages >= 1, "pipeline partition: ", stages, " stages requested: at least 1 is needed");
  LOOM_REQUIRE(stages <= L, "parallel.pp x parallel.virtual_stages = ", stages, " stages for model.n_layer = ", L,
               " layers: every stage needs at least one layer");
  const double embedding = pp_embedding_cost(cfg, seq_len), head = pp_head_cost(cfg, seq_len);
  constexpr double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(L + 1, inf));
  best[stages][L] = 0;
  for (int s = stages - 1; s >= 0; --s) {
    // Stage s starts at i >= s and leaves >= 1 layer for each later stage.
    for (int64_t i = s; i <= L - (stages - s); ++i) {
      for (int64_t c = 1; i + c <= L - (stages - s - 1); ++c)
        best[s][i] = std::min(best[s][i], std::max(stage_cost(s, stages, c, embedding, head), best[s + 1][i + c]));
    }
  }
  const double target = best[0][0];
  std::vector<int64_t> counts;
  int64_t i = 0;
  for (int s = 0; s < stages; ++s) {
    int64_t c = 1;
    while (std::max(stage_cost(s, stages, c, embedding, head), best[s + 1][i + c]) > target) ++c;
    counts.push_back(c);
    i += c;
  }
  LOOM_CHECK(i == L, "pipeline partition covers ", i, " of ", L, " layers");
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
