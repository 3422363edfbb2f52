#include "plan/memory_plan.h"

#include <algorithm>
#include <cstdio>
#include <optional>

#include "core/error.h"
#include "mesh/layout.h"
#include "model/config_json.h"
#include "model/lora.h"
#include "model/model.h"
#include "model/params.h"
#include "parallel/cp.h"
#include "parallel/dp.h"
#include "parallel/dp_layout.h"
#include "parallel/pp_messages.h"
#include "parallel/pp_schedule.h"
#include "parallel/pp_tied.h"
#include "train/rank_chunks.h"

namespace loom::plan {
namespace {

void require_predicted(const train::RunConfig& cfg) {
  const train::ParallelConfig& p = cfg.parallel;
  const auto refuse = [](const std::string& what) {
    throw loom::Error(concat("loom plan does not predict ", what,
                             " yet: it predicts data (ZeRO 0 to 3), context, tensor, pipeline and expert "
                             "parallelism on the CPU"));
  };
  if (p.mode != "collective") refuse("parameter-server training (parallel.mode = ps)");
  LOOM_REQUIRE(p.pp == 1 || p.zero_stage <= 1, "parallel.pp = ", p.pp,
               " composes with ZeRO stages 0 and 1 (parallel.zero_stage = ", p.zero_stage, ")");
  // Its packed reductions and a cp call's buffers would be held together
  // across chunks: not replayed yet.
  if (p.ep > 1 && p.cp > 1 && p.pp > 1)
    refuse(concat("expert and context parallelism (parallel.ep = ", p.ep, ", parallel.cp = ", p.cp,
                  ") with pipelining"));
  if (cfg.train.device != "cpu") refuse(concat("train.device = ", cfg.train.device));
}

// The rank's dp shard of its parameters (make_group's recipe: one group of
// every parameter over the dp ranks) and the largest bucket's elements.
struct Shard {
  std::vector<model::Unit> space_units;  // the model's units in the group's index space (GroupSpace::units)
  std::vector<parallel::Bucket> buckets;
  std::vector<parallel::Segment> segments;
  int64_t numel = 0, largest_bucket = 0;
  // ZeRO 0 and 1: the f32 copies of the buckets spread over the flat buffer
  // (a group of some parameters: under ep) that their reductions pack, and
  // under ZeRO 1 each one's reduced piece, held until the step's gradients
  // are waited for (dp_grads.cpp reduce_bucket).
  int64_t packed_bytes = 0;
  std::vector<int64_t> packed;  // per bucket (parallel::ZeroGroup::packed); packed_bytes their sum
  // Elements of the spread buckets and the rank's pieces of them, which
  // DataParallel::gather_pieces packs all at once (a group of 2 or more).
  int64_t spread = 0;
};
Shard dp_shard(const std::vector<model::ParamSpec>& specs, const std::vector<model::Unit>& units,
               const std::vector<int>& group_of, int group, const parallel::DpOptions& o, int size, int rank) {
  const parallel::GroupSpace space = parallel::group_space(specs, units, group_of, group);
  Shard s;
  s.space_units = space.units;
  s.buckets = parallel::make_buckets(space.units, o.zero_stage, o.bucket_mb, parallel::solo_ranges(space, o.solo_params));
  s.segments = parallel::shard_segments(s.buckets, o.zero_stage, size, rank);
  for (const parallel::Segment& seg : s.segments) s.numel += seg.count;
  for (size_t b = 0; b < s.buckets.size(); ++b) {
    const parallel::Bucket& bk = s.buckets[b];
    s.largest_bucket = std::max(s.largest_bucket, bk.numel());
    s.packed.push_back(0);
    const bool spread = size > 1 && !parallel::is_one_run(space, bk.begin, bk.numel());  // size 1: no collective
    if (spread) s.spread += bk.numel() + s.segments[b].count;
    if (spread && o.zero_stage <= 1) s.packed.back() = 4 * (bk.numel() + (o.zero_stage == 1 ? s.segments[b].count : 0));
    s.packed_bytes += s.packed.back();
  }
  return s;
}

// A parameter group of the rank (parallel/dp_layout.h): its size and the
// rank's place in it (train::gradient_groups).
struct GroupPos {
  int size = 1, rank = 0;
};
std::vector<GroupPos> group_positions(const mesh::Layout& layout, int r, int ep) {
  std::vector<GroupPos> out;
  for (mesh::Group g : train::gradient_groups(ep)) out.push_back({layout.group_size(g), layout.group_rank(g, r)});
  return out;
}

// The textbook figures for rank r's Ψ parameters and the activations of
// `layers` layers (memory_plan.h).
Textbook textbook_of(const train::RunConfig& cfg, double psi, int64_t layers, int64_t B, int64_t T, DType compute) {
  const train::ParallelConfig& p = cfg.parallel;
  const double nd = static_cast<double>(p.dp);
  const double per_psi[] = {16.0, 4.0 + 12.0 / nd, 2.0 + 14.0 / nd, 16.0 / nd};
  return {.model_states = psi * per_psi[p.zero_stage],
          .activations = static_cast<double>(layers) *
                         train::predicted_layer_activation_bytes(cfg.model, B, T, compute, static_cast<int>(p.tp),
                                                                 p.sequence_parallel)};
}

// The transient tags: the most the step's communication (ZeRO 2/3's
// buckets and gathered units; a cp attention call's K/V in flight) and
// its workspace hold.
struct Transient {
  int64_t comm = 0, workspace = 0;
};
// shards: the rank's in each parameter group, of groups[g].size ranks;
// unit_group: the group each unit lies in.
Transient transient_bytes(const train::RunConfig& cfg, const model::PpStage& stage,
                          const std::vector<model::Unit>& units, const std::vector<Shard>& shards,
                          const std::vector<GroupPos>& groups, const std::vector<int>& unit_group,
                          const parallel::DpOptions& dpo, int64_t B, int64_t T, DType compute, bool writes_model) {
  const train::ParallelConfig& p = cfg.parallel;
  const auto elem = static_cast<int64_t>(dtype_size(compute));
  parallel::ContextParallelAttention::CallBytes cpb;  // a cp attention call's buffers, forward or backward
  if (p.cp > 1)
    cpb = parallel::ContextParallelAttention::call_bytes(B, T, cfg.model.n_head / p.tp, cfg.model.n_kv_head / p.tp,
                                                         cfg.model.n_embd / cfg.model.n_head, compute,
                                                         static_cast<int>(p.cp),
                                                         parallel::cp_algo_from_name(p.cp_algo), true);
  Transient t;
  // init_params draws one bucket at a time; gather_master packs a group's
  // shard (the groups one at a time), except where one rank's state on disk
  // is written a part at a time (train/trainer.cpp save_model).
  t.workspace = std::max(cpb.forward_workspace, cpb.backward_workspace);
  const bool streams_model = dpo.disk.enabled && p.tp == 1 && p.pp == 1 && p.ep == 1 && groups.size() == 1 &&
                             groups[0].size == 1 && !cfg.lora.adapters.enabled();
  for (const Shard& s : shards)
    t.workspace = std::max({t.workspace, 4 * s.largest_bucket, writes_model && !streams_model ? 4 * s.numel : 0});
  t.comm = std::max(cpb.forward_comm, cpb.backward_comm);
  // The replay of the step's hook calls: ZeRO 2 and 3's buckets and
  // gathers; without pipelining also 0 and 1's packed reductions (with it
  // plan_rank adds every chunk's).
  if (dpo.zero_stage >= 2 || cfg.parallel.pp == 1) {
    // Every bound unit but the embeddings' and the head's is a layer's
    // (model.h Unit: a MoE layer's experts are bound with it); its attention
    // runs while the layer computes, in the backward again under recompute
    // before its own backward.
    const int embedding = stage.holds_embedding() ? 0 : -1;
    const int head = stage.holds_head(cfg.model.n_layer) ? static_cast<int>(units.size()) - 1 : -1;
    const int64_t backward_cp = cfg.train.recompute == "none" ? cpb.backward_comm
                                                               : std::max(cpb.forward_comm, cpb.backward_comm);
    const auto attention = [&](int unit, bool backward) -> int64_t {
      if (unit == embedding || unit == head) return 0;
      return backward ? backward_cp : cpb.forward_comm;
    };
    std::vector<parallel::ZeroGroup> zero;
    for (size_t g = 0; g < shards.size(); ++g)
      zero.push_back({shards[g].buckets, shards[g].segments, groups[g].size, shards[g].packed});
    const model::StageOptions so{.layers = stage};
    t.comm = parallel::zero_comm_peak(model::Model::hook_events(cfg.model, model::Pass::forward, so),
                                      model::Model::hook_events(cfg.model, model::Pass::backward, so), units, zero,
                                      unit_group, dpo.zero_stage, static_cast<int>(cfg.train.grad_accum), elem,
                                      attention);
    // After the step, with nothing else in comm: ZeRO 1 and 2 gather the
    // updated parameters, and a written model the master (f32), packing the
    // spread buckets all at once (DataParallel::gather_pieces).
    int64_t spread = 0;
    for (const Shard& s : shards) spread += s.spread;
    if (dpo.zero_stage == 1 || dpo.zero_stage == 2) t.comm = std::max(t.comm, elem * spread);
    if (writes_model && dpo.zero_stage > 0) t.comm = std::max(t.comm, 4 * spread);
  }
  return t;
}

// The bytes of the message buffers pipeline rank `rank`'s runtime keeps
// (parallel/pp_messages.h): received activations in the compute dtype,
// gradients in f32, sharing buffers when the two are alike (an f32 run).
int64_t pp_message_bytes(const parallel::PpSchedule& schedule, int rank, int64_t stream_numel, DType compute) {
  const parallel::PpMessageBuffers n = parallel::pp_message_buffers(schedule, rank);
  const int64_t act = stream_numel * static_cast<int64_t>(dtype_size(compute)), grad = stream_numel * 4;
  if (compute == DType::f32) return n.either * grad;
  return n.activations * act + n.gradients * grad;
}

// What a rank's chunks hold together (one chunk without pipelining).
struct Chunks {
  model::ModelBytes model;
  parallel::DataParallel::ShardStateBytes state;
  Transient transient;  // the most any one chunk's step holds
  int64_t packed = 0;   // comm: the packed reductions of spread buckets (Shard::packed_bytes)
  int64_t psi = 0, layers = 0;  // parameters; layers x their activation slots
};

// Each of the rank's chunks (the whole model, or its pipeline stages) as
// build_rank_chunks lays it out: the model's own state and its
// DataParallel's shard state over the dp x cp group of dp_size ranks.
Chunks chunk_bytes(const train::RunConfig& cfg, const train::ChunkOptions& co,
                   const std::vector<model::StageOptions>& stages, model::ModelOptions mo,
                   const std::vector<GroupPos>& groups, const MemoryPlanOptions& o) {
  const int64_t B = co.micro_batch, T = co.seq_len / cfg.parallel.cp;
  parallel::DpOptions dpo = co.dp;
  Chunks out;
  for (const model::StageOptions& so : stages) {
    mo.stage = so;
    const model::ModelBytes m = model::Model::state_bytes(cfg.model, B, T, mo);
    out.model.params += m.params, out.model.grads += m.grads, out.model.activations += m.activations;
    // What trains: the model's parameters, or its LoRA adapters (model/lora.h).
    const model::LoraConfig& lora = mo.lora.config;
    const std::vector<model::ParamSpec> specs =
        model::trainable_param_specs(cfg.model, lora, mo.tp.tp, so.layers, mo.ep.ep);
    const std::vector<model::Unit> units = lora.enabled() ? model::lora_units(cfg.model, specs, so.layers)
                                                          : model::model_units(cfg.model, specs);
    std::vector<int> group_of;  // group 1: the rank's experts, under ep
    for (const model::ParamSpec& spec : specs) group_of.push_back(parallel::in_expert_group(spec.name, mo.ep.ep.size));
    const int64_t n_layers = so.layers.layer_count(cfg.model.n_layer);
    if (cfg.parallel.pp > 1 && !lora.enabled())  // adapters alone: no tied copy (rank_chunks.cpp)
      dpo.solo_params = parallel::TiedEmbedding::solo_params(cfg.model, so.layers.holds_embedding(),
                                                             so.layers.holds_head(cfg.model.n_layer));
    // The groups' shard state together; each unit lies in one group
    // (DataParallel's unit_group).
    std::vector<Shard> shards;
    std::vector<int> unit_group(units.size(), 0);
    int64_t total = 0;
    for (size_t g = 0; g < groups.size(); ++g) {
      shards.push_back(dp_shard(specs, units, group_of, static_cast<int>(g), dpo, groups[g].size, groups[g].rank));
      total += shards.back().numel;
      if (cfg.parallel.pp > 1) out.packed += shards.back().packed_bytes;  // every chunk's and group's, waited for together
      const std::vector<model::Unit>& in_group = shards.back().space_units;
      for (size_t u = 0; u < units.size(); ++u)
        if (in_group[u].numel() > 0) unit_group[u] = static_cast<int>(g);
    }
    const parallel::DataParallel::ShardStateBytes s = parallel::DataParallel::shard_state_bytes(total, co.compute, dpo);
    out.state.params += s.params, out.state.grads += s.grads, out.state.master += s.master;
    out.state.optimizer += s.optimizer;
    const Transient t =
        transient_bytes(cfg, so.layers, units, shards, groups, unit_group, dpo, B, T, co.compute, o.writes_model);
    out.transient.workspace = std::max(out.transient.workspace, t.workspace);
    out.transient.comm = std::max(out.transient.comm, t.comm);
    out.psi += model::param_count(specs), out.layers += n_layers * so.slots;
  }
  return out;
}

// World rank r of cfg's layout: its chunks, the trainer's token buffers and
// under pipelining the runtime's messages.
RankMemory plan_rank(const train::RunConfig& cfg, const mesh::Layout& layout, int r, const MemoryPlanOptions& o) {
  const train::ParallelConfig& p = cfg.parallel;
  const train::ChunkOptions co = train::chunk_options(cfg);
  const DType compute = co.compute;
  const int64_t B = co.micro_batch, T = co.seq_len / p.cp;  // the rank's tokens of each sequence
  const mesh::Coord c = layout.coord(r);
  model::ModelOptions mo{
      .compute = compute, .recompute = co.recompute, .storage = parallel::DataParallel::model_storage(co.dp.zero_stage)};
  mo.tp.tp = {static_cast<int>(p.tp), c.tp};
  mo.tp.sequence_parallel = p.sequence_parallel;
  mo.cp.size = static_cast<int>(p.cp);
  std::vector<model::StageOptions> stages(1);
  std::optional<parallel::PpSchedule> schedule;
  if (p.pp > 1) {
    schedule = parallel::make_pp_schedule(parallel::pp_schedule_from_name(co.pp_schedule), static_cast<int>(p.pp),
                                          static_cast<int>(co.micro_batches), static_cast<int>(co.virtual_stages));
    stages = train::rank_stages(co, *schedule, static_cast<int>(p.pp), c.pp);
  }
  mo.ep.ep = {static_cast<int>(p.ep), c.ep};
  // LoRA: the adapters train, and every rank holds the frozen base (its tp
  // slice) as load_frozen_base reads it.
  model::FrozenBytes base;
  if (cfg.lora.adapters.enabled()) {
    base = model::frozen_base_bytes(model::load_model_dir(cfg.lora.base), compute, mo.tp.tp);
    mo.lora.config = cfg.lora.adapters, mo.lora.quantized_base = base.quantized;
  }
  // The gradients are averaged (and ZeRO-sharded) over dp x cp; an ep rank's experts over expert-dp x cp.
  const Chunks chunks = chunk_bytes(cfg, co, stages, mo, group_positions(layout, r, static_cast<int>(p.ep)), o);
  const model::ModelBytes& m = chunks.model;
  const parallel::DataParallel::ShardStateBytes& state = chunks.state;
  Transient t = chunks.transient;
  t.comm += chunks.packed;
  const int64_t messages =
      schedule ? pp_message_bytes(*schedule, c.pp, model::Model::stream_numel(cfg.model, B, T, mo), compute) : 0;
  t.comm += messages;
  RankMemory rm;
  rm.at = {.world_rank = r, .pp_rank = c.pp, .dp_rank = c.dp, .cp_rank = c.cp, .tp_rank = c.tp, .ep_rank = c.ep};
  const auto set = [&rm](MemTag tag, int64_t peak, int64_t current) {
    rm.bytes.tags[static_cast<size_t>(tag)] = {static_cast<size_t>(current), static_cast<size_t>(peak)};
  };
  // The step's tokens and targets; under cp also the whole sequences they
  // are cut from, under pipelining every micro-batch's.
  const int64_t sequences = 1 + (p.pp > 1 ? co.micro_batches : 0);
  const int64_t tokens =
      2 * B * (T * sequences + (p.cp > 1 ? co.seq_len : 0)) * static_cast<int64_t>(sizeof(int32_t));
  set(MemTag::params, m.params + state.params + base.bytes, m.params + state.params + base.bytes);
  set(MemTag::grads, m.grads + state.grads, m.grads + state.grads);
  set(MemTag::master, state.master, state.master);
  set(MemTag::optimizer, state.optimizer, state.optimizer);
  set(MemTag::activations, m.activations + tokens, m.activations + tokens);
  set(MemTag::workspace, t.workspace, 0);
  // The pipeline's message buffers stay cached for the next step; the rest is freed.
  set(MemTag::comm, t.comm, messages);
  rm.textbook = textbook_of(cfg, static_cast<double>(chunks.psi), chunks.layers, B, T, compute);
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

RankMemory plan_memory_rank(const train::RunConfig& cfg, int world_rank, const MemoryPlanOptions& o) {
  require_predicted(cfg);
  const train::ParallelConfig& p = cfg.parallel;
  const mesh::Layout layout(train::mesh_shape(p), static_cast<int>(p.dp * p.tp * p.pp * p.cp));
  LOOM_REQUIRE(world_rank >= 0 && world_rank < layout.world_size(), "plan_memory_rank: rank ", world_rank,
               " is invalid: allowed 0 to ", layout.world_size() - 1);
  return plan_rank(cfg, layout, world_rank, o);
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
