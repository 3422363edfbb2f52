#include "plan/memory_plan.h"

#include <algorithm>

#include "core/error.h"
#include "mesh/layout.h"
#include "model/model.h"
#include "model/params.h"
#include "parallel/dp.h"
#include "parallel/dp_layout.h"

namespace loom::plan {
namespace {

void require_predicted(const train::RunConfig& cfg) {
  const train::ParallelConfig& p = cfg.parallel;
  const auto refuse = [](const std::string& what) {
    throw loom::Error(concat("loom plan does not predict ", what,
                             " yet: it predicts data parallelism (ZeRO 0 to 3) and tensor parallelism on the CPU"));
  };
  if (p.pp > 1) refuse(concat("pipeline parallelism (parallel.pp = ", p.pp, ")"));
  if (p.cp > 1) refuse(concat("context parallelism (parallel.cp = ", p.cp, ")"));
  if (p.ep > 1) refuse(concat("expert parallelism (parallel.ep = ", p.ep, ")"));
  if (cfg.train.device != "cpu") refuse(concat("train.device = ", cfg.train.device));
}

// The rank's dp shard of its parameters (make_group's recipe: one group of
// every parameter over the dp ranks) and the largest bucket's elements.
struct Shard {
  std::vector<parallel::Bucket> buckets;
  std::vector<parallel::Segment> segments;
  int64_t numel = 0, largest_bucket = 0;
};
Shard dp_shard(const std::vector<model::ParamSpec>& specs, const std::vector<model::Unit>& units,
               const parallel::DpOptions& o, int size, int rank) {
  const parallel::GroupSpace space = parallel::group_space(specs, units, std::vector<int>(specs.size(), 0), 0);
  Shard s;
  s.buckets = parallel::make_buckets(space.units, o.zero_stage, o.bucket_mb);
  s.segments = parallel::shard_segments(s.buckets, o.zero_stage, size, rank);
  for (const parallel::Segment& seg : s.segments) s.numel += seg.count;
  for (const parallel::Bucket& b : s.buckets) s.largest_bucket = std::max(s.largest_bucket, b.numel());
  return s;
}

}  // namespace

std::vector<RankMemory> plan_memory(const train::RunConfig& cfg, const MemoryPlanOptions& o) {
  require_predicted(cfg);
  const train::ParallelConfig& p = cfg.parallel;
  const mesh::Layout layout(train::mesh_shape(p), static_cast<int>(p.dp * p.tp * p.pp * p.cp));
  const DType compute = train::compute_dtype(cfg.train);
  const int64_t B = cfg.train.micro_batch, T = cfg.train.seq_len;
  parallel::DpOptions dpo;
  dpo.zero_stage = static_cast<int>(p.zero_stage);
  dpo.bucket_mb = p.bucket_mb;
  dpo.offload_optimizer = p.offload_optimizer;
  std::vector<RankMemory> out;
  for (int r = 0; r < layout.world_size(); ++r) {
    const mesh::Coord c = layout.coord(r);
    model::ModelOptions mo{.compute = compute,
                           .recompute = model::recompute_from_name(cfg.train.recompute),
                           .storage = parallel::DataParallel::model_storage(dpo.zero_stage)};
    mo.tp.tp = {static_cast<int>(p.tp), c.tp};
    mo.tp.sequence_parallel = p.sequence_parallel;
    const model::ModelBytes m = model::Model::state_bytes(cfg.model, B, T, mo);
    const std::vector<model::ParamSpec> specs = model::param_specs(cfg.model, mo.tp.tp);
    const int dp_size = layout.group_size(mesh::Group::dp_cp);
    const std::vector<model::Unit> units = model::model_units(cfg.model, specs);
    const Shard shard = dp_shard(specs, units, dpo, dp_size, c.dp);
    const int64_t S = shard.numel;
    const bool master = compute != DType::f32 || dpo.offload_optimizer;
    RankMemory rm;
    rm.at = {.world_rank = r, .pp_rank = c.pp, .dp_rank = c.dp, .cp_rank = c.cp, .tp_rank = c.tp, .ep_rank = c.ep};
    const auto set = [&rm](MemTag tag, int64_t peak, int64_t current) {
      rm.bytes.tags[static_cast<size_t>(tag)] = {static_cast<size_t>(current), static_cast<size_t>(peak)};
    };
    const int64_t tokens = 2 * B * T * static_cast<int64_t>(sizeof(int32_t));
    // The model's parameters, or ZeRO-3's shard of them in the compute dtype.
    const int64_t params = m.params + (dpo.zero_stage == 3 ? static_cast<int64_t>(dtype_size(compute)) * S : 0);
    set(MemTag::params, params, params);
    const int64_t grads = m.grads + (dpo.zero_stage >= 2 ? 4 * S : 0);  // the model's, or ZeRO-2's shard
    set(MemTag::grads, grads, grads);
    set(MemTag::master, master ? 4 * S : 0, master ? 4 * S : 0);
    const int64_t optimizer = 8 * S + (dpo.offload_optimizer ? 4 * S : 0);
    set(MemTag::optimizer, optimizer, optimizer);
    set(MemTag::activations, m.activations + tokens, m.activations + tokens);
    set(MemTag::workspace, 4 * std::max(shard.largest_bucket, o.writes_model ? S : 0), 0);
    if (dpo.zero_stage >= 2)
      set(MemTag::comm,
          parallel::zero_comm_peak(model::Model::hook_events(cfg.model, model::Pass::forward),
                                   model::Model::hook_events(cfg.model, model::Pass::backward), units, shard.buckets,
                                   shard.segments, dpo.zero_stage, dp_size, static_cast<int>(cfg.train.grad_accum),
                                   static_cast<int64_t>(dtype_size(compute))),
          0);
    const double psi = static_cast<double>(model::param_count(specs)), nd = static_cast<double>(p.dp);
    const double per_psi[] = {16.0, 4.0 + 12.0 / nd, 2.0 + 14.0 / nd, 16.0 / nd};
    rm.textbook.model_states = psi * per_psi[p.zero_stage];
    rm.textbook.activations = static_cast<double>(cfg.model.n_layer) *
                              train::predicted_layer_activation_bytes(cfg.model, B, T, compute, static_cast<int>(p.tp),
                                                                      p.sequence_parallel);
    out.push_back(std::move(rm));
  }
  return out;
}

}  // namespace loom::plan
