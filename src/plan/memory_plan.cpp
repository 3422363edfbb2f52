#include "plan/memory_plan.h"

#include <algorithm>
#include <cstdio>

#include "core/error.h"
#include "mesh/layout.h"
#include "model/model.h"
#include "model/params.h"
#include "parallel/cp.h"
#include "parallel/dp.h"
#include "parallel/dp_layout.h"

namespace loom::plan {
namespace {

void require_predicted(const train::RunConfig& cfg) {
  const train::ParallelConfig& p = cfg.parallel;
  const auto refuse = [](const std::string& what) {
    throw loom::Error(concat("loom plan does not predict ", what,
                             " yet: it predicts data (ZeRO 0 to 3), context (ZeRO 0 and 1, dense models) and tensor parallelism on the CPU"));
  };
  if (p.pp > 1) refuse(concat("pipeline parallelism (parallel.pp = ", p.pp, ")"));
  if (p.cp > 1 && p.zero_stage >= 2)
    refuse(concat("context parallelism (parallel.cp = ", p.cp, ") under ZeRO stage ", p.zero_stage));
  if (p.cp > 1 && cfg.model.is_moe()) refuse(concat("context parallelism (parallel.cp = ", p.cp, ") of a MoE model"));
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

// The textbook figures for rank r's Ψ parameters (memory_plan.h).
Textbook textbook_of(const train::RunConfig& cfg, double psi, int64_t B, int64_t T, DType compute) {
  const train::ParallelConfig& p = cfg.parallel;
  const double nd = static_cast<double>(p.dp);
  const double per_psi[] = {16.0, 4.0 + 12.0 / nd, 2.0 + 14.0 / nd, 16.0 / nd};
  return {.model_states = psi * per_psi[p.zero_stage],
          .activations = static_cast<double>(cfg.model.n_layer) *
                         train::predicted_layer_activation_bytes(cfg.model, B, T, compute, static_cast<int>(p.tp),
                                                                 p.sequence_parallel)};
}

// The transient tags: the most the step's communication (ZeRO 2/3's
// buckets and gathered units; a cp attention call's K/V in flight) and
// its workspace hold.
struct Transient {
  int64_t comm = 0, workspace = 0;
};
Transient transient_bytes(const train::RunConfig& cfg, const std::vector<model::Unit>& units, const Shard& shard,
                          const parallel::DpOptions& dpo, int dp_size, int64_t B, int64_t T, DType compute,
                          bool writes_model) {
  const train::ParallelConfig& p = cfg.parallel;
  const auto elem = static_cast<int64_t>(dtype_size(compute));
  parallel::ContextParallelAttention::CallBytes cpb;  // a cp attention call's buffers, forward or backward
  if (p.cp > 1)
    cpb = parallel::ContextParallelAttention::call_bytes(B, T, cfg.model.n_head / p.tp, cfg.model.n_kv_head / p.tp,
                                                         cfg.model.n_embd / cfg.model.n_head, compute,
                                                         static_cast<int>(p.cp),
                                                         parallel::cp_algo_from_name(p.cp_algo), true);
  Transient t;
  // init_params draws one bucket at a time; gather_master packs the shard.
  t.workspace = std::max({4 * shard.largest_bucket, writes_model ? 4 * shard.numel : 0, cpb.forward_workspace,
                          cpb.backward_workspace});
  t.comm = std::max(cpb.forward_comm, cpb.backward_comm);
  if (dpo.zero_stage >= 2)
    t.comm = parallel::zero_comm_peak(model::Model::hook_events(cfg.model, model::Pass::forward),
                                      model::Model::hook_events(cfg.model, model::Pass::backward), units,
                                      shard.buckets, shard.segments, dpo.zero_stage, dp_size,
                                      static_cast<int>(cfg.train.grad_accum), elem);
  return t;
}

// World rank r of cfg's layout.
RankMemory plan_rank(const train::RunConfig& cfg, const mesh::Layout& layout, int r, const MemoryPlanOptions& o) {
  const train::ParallelConfig& p = cfg.parallel;
  const DType compute = train::compute_dtype(cfg.train);
  const int64_t B = cfg.train.micro_batch, T = cfg.train.seq_len / p.cp;  // the rank's tokens of each sequence
  parallel::DpOptions dpo;
  dpo.zero_stage = static_cast<int>(p.zero_stage);
  dpo.bucket_mb = p.bucket_mb;
  dpo.offload_optimizer = p.offload_optimizer;
  const mesh::Coord c = layout.coord(r);
  model::ModelOptions mo{.compute = compute,
                         .recompute = model::recompute_from_name(cfg.train.recompute),
                         .storage = parallel::DataParallel::model_storage(dpo.zero_stage)};
  mo.tp.tp = {static_cast<int>(p.tp), c.tp};
  mo.tp.sequence_parallel = p.sequence_parallel;
  mo.cp.size = static_cast<int>(p.cp);
  const model::ModelBytes m = model::Model::state_bytes(cfg.model, B, T, mo);
  const std::vector<model::ParamSpec> specs = model::param_specs(cfg.model, mo.tp.tp);
  const std::vector<model::Unit> units = model::model_units(cfg.model, specs);
  // The gradients are averaged (and ZeRO-sharded) over dp x cp.
  const std::vector<int> dp_group = layout.group_ranks(mesh::Group::dp_cp, r);
  const auto dp_size = static_cast<int>(dp_group.size());
  const auto dp_rank = static_cast<int>(std::find(dp_group.begin(), dp_group.end(), r) - dp_group.begin());
  const Shard shard = dp_shard(specs, units, dpo, dp_size, dp_rank);
  const parallel::DataParallel::ShardStateBytes state =
      parallel::DataParallel::shard_state_bytes(shard.numel, compute, dpo);
  RankMemory rm;
  rm.at = {.world_rank = r, .pp_rank = c.pp, .dp_rank = c.dp, .cp_rank = c.cp, .tp_rank = c.tp, .ep_rank = c.ep};
  const auto set = [&rm](MemTag tag, int64_t peak, int64_t current) {
    rm.bytes.tags[static_cast<size_t>(tag)] = {static_cast<size_t>(current), static_cast<size_t>(peak)};
  };
  // The step's tokens and targets, and under cp the whole sequences they are cut from.
  const int64_t tokens = 2 * B * (T + (p.cp > 1 ? cfg.train.seq_len : 0)) * static_cast<int64_t>(sizeof(int32_t));
  // The model's own state (what ZeRO leaves it) and the rank's shard state.
  set(MemTag::params, m.params + state.params, m.params + state.params);
  set(MemTag::grads, m.grads + state.grads, m.grads + state.grads);
  set(MemTag::master, state.master, state.master);
  set(MemTag::optimizer, state.optimizer, state.optimizer);
  set(MemTag::activations, m.activations + tokens, m.activations + tokens);
  const Transient t = transient_bytes(cfg, units, shard, dpo, dp_size, B, T, compute, o.writes_model);
  set(MemTag::workspace, t.workspace, 0);
  set(MemTag::comm, t.comm, 0);
  rm.textbook = textbook_of(cfg, static_cast<double>(model::param_count(specs)), B, T, compute);
  return rm;
}

}  // namespace

std::vector<RankMemory> plan_memory(const train::RunConfig& cfg, const MemoryPlanOptions& o) {
  require_predicted(cfg);
  const train::ParallelConfig& p = cfg.parallel;
  const mesh::Layout layout(train::mesh_shape(p), static_cast<int>(p.dp * p.tp * p.pp * p.cp));
  std::vector<RankMemory> out;
  for (int r = 0; r < layout.world_size(); ++r) out.push_back(plan_rank(cfg, layout, r, o));
  return out;
}

std::string memory_plan_table(const RankMemory& r) {
  const auto mib = [](double bytes) {
    char s[32];
    std::snprintf(s, sizeof s, "%.2f", bytes / (1024.0 * 1024.0));
    return std::string(s);
  };
  std::string out = concat("[rank ", r.at.world_rank, ": pp ", r.at.pp_rank, ", dp ", r.at.dp_rank, ", cp ",
                           r.at.cp_rank, ", tp ", r.at.tp_rank, ", ep ", r.at.ep_rank, "]\n");
  char line[96];
  std::snprintf(line, sizeof line, "%-12s%14s%14s\n", "tag", "end MiB", "peak MiB");
  out += line;
  double states = 0;
  for (int i = 0; i < kNumMemTags; ++i) {
    const auto tag = static_cast<MemTag>(i);
    const TagUsage& u = r.bytes[tag];
    std::snprintf(line, sizeof line, "%-12s%14s%14s\n", std::string(mem_tag_name(tag)).c_str(),
                  mib(static_cast<double>(u.current)).c_str(), mib(static_cast<double>(u.peak)).c_str());
    out += line;
    if (tag == MemTag::params || tag == MemTag::grads || tag == MemTag::master || tag == MemTag::optimizer)
      states += static_cast<double>(u.peak);
  }
  return out + concat("model states ", mib(states), " MiB; the ZeRO paper's mixed-precision Adam (16 psi, K = 12, as "
                      "this stage divides it) ", mib(r.textbook.model_states), " MiB\nactivations per Korthikanti et "
                      "al. (recompute none, no s x s scores) ", mib(r.textbook.activations), " MiB\n");
}

}  // namespace loom::plan
