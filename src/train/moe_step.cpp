#include "train/moe_step.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <tuple>

#include "comm/host_values.h"
#include "core/error.h"
#include "core/tensor.h"
#include "parallel/dp.h"

namespace loom::train {

namespace {

// In place: the elementwise sum over `group` (i64, exact).
void sum_over(comm::Communicator& group, std::vector<int64_t>& v) {
  if (group.size() == 1 || v.empty()) return;
  comm::all_reduce_host(group, Tensor(v.data(), DType::i64, {static_cast<int64_t>(v.size())}), comm::ReduceOp::sum);
}

double sum_over(comm::Communicator& group, double x) { return parallel::exact_group_sum(group, x); }

// One layer's bias update toward balance: +rate below the mean load, -rate above.
std::vector<float> bias_update(const int64_t* load, int64_t E, float rate) {
  int64_t total = 0;
  for (int64_t e = 0; e < E; ++e) total += load[e];
  std::vector<float> delta(static_cast<size_t>(E), 0.f);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t scaled = load[e] * E;  // load_e vs total / E, in integers
    delta[static_cast<size_t>(e)] = scaled < total ? rate : scaled > total ? -rate : 0.f;
  }
  return delta;
}

}  // namespace

std::pair<double, double> load_spread(std::span<const int64_t> load, int64_t E) {
  double lo = std::numeric_limits<double>::infinity(), hi = 0;
  for (size_t l = 0; l + size_t(E) <= load.size(); l += size_t(E)) {
    int64_t total = 0;
    for (int64_t e = 0; e < E; ++e) total += load[l + size_t(e)];
    if (total == 0) continue;  // a dense layer, or one no token reached
    for (int64_t e = 0; e < E; ++e) {
      const double ratio = static_cast<double>(load[l + size_t(e)] * E) / static_cast<double>(total);
      lo = std::min(lo, ratio), hi = std::max(hi, ratio);
    }
  }
  return {std::isinf(lo) ? 0 : lo, hi};
}

MoeStep finish_moe_step(const std::vector<model::Model*>& chunks, mesh::Mesh& mesh) {
  const model::ModelConfig& cfg = chunks.front()->config();
  const int64_t L = cfg.n_layer, E = cfg.n_expert;
  // Counts: loads (L x E), then MoE layer forwards, choices, dropped.
  std::vector<int64_t> counts(static_cast<size_t>(L * E + 3), 0);
  double aux = 0, z = 0;
  for (model::Model* m : chunks) {
    const model::MoeStats& st = m->moe_stats();
    for (size_t i = 0; i < st.load.size(); ++i) counts[i] += st.load[i];
    counts[size_t(L * E)] += st.layer_forwards, counts[size_t(L * E + 1)] += st.choices;
    counts[size_t(L * E + 2)] += st.dropped;
    aux += st.aux_loss, z += st.z_loss;
    m->reset_moe_stats();
  }
  for (comm::Communicator* g : {&mesh.dp_cp(), &mesh.pp()}) {
    sum_over(*g, counts);
    aux = sum_over(*g, aux), z = sum_over(*g, z);
  }
  MoeStep out;
  const double forwards = static_cast<double>(std::max<int64_t>(1, counts[size_t(L * E)]));
  out.stats.aux_loss = aux / forwards, out.stats.z_loss = z / forwards;
  out.stats.dropped = static_cast<double>(counts[size_t(L * E + 2)]) /
                      static_cast<double>(std::max<int64_t>(1, counts[size_t(L * E + 1)]));
  std::tie(out.stats.load_min, out.stats.load_max) = load_spread(std::span(counts).first(size_t(L * E)), E);
  out.bias_deltas.resize(chunks.size());
  if (!cfg.has_expert_bias()) return out;
  for (size_t c = 0; c < chunks.size(); ++c)
    for (const model::ParamSpec& s : chunks[c]->param_specs()) {
      int64_t layer = 0;
      const std::string suffix = "gate.e_score_correction_bias";
      if (!s.name.ends_with(suffix)) continue;
      (void)model::param_part(cfg, s.name, &layer);
      out.bias_deltas[c].push_back({s.offset, bias_update(&counts[size_t(layer * E)], E, cfg.aux_free_rate)});
    }
  return out;
}

}  // namespace loom::train
