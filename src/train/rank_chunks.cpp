#include "train/rank_chunks.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>

#include "core/error.h"
#include "parallel/pp_partition.h"

namespace loom::train {

std::vector<model::Model*> RankChunks::model_ptrs() const {
  std::vector<model::Model*> out;
  for (const auto& m : models) out.push_back(m.get());
  return out;
}

std::vector<parallel::DataParallel*> RankChunks::dp_ptrs() const {
  std::vector<parallel::DataParallel*> out;
  for (const auto& d : dps) out.push_back(d.get());
  return out;
}

ChunkOptions chunk_options(const RunConfig& cfg) {
  ChunkOptions o;
  o.model = cfg.model;
  o.micro_batch = cfg.train.micro_batch, o.seq_len = cfg.train.seq_len;
  o.compute = compute_dtype(cfg.train);
  o.recompute = model::recompute_from_name(cfg.train.recompute);
  o.sequence_parallel = cfg.parallel.sequence_parallel;
  o.dp.zero_stage = static_cast<int>(cfg.parallel.zero_stage);
  o.dp.bucket_mb = cfg.parallel.bucket_mb;
  o.dp.offload_optimizer = cfg.parallel.offload_optimizer;
  if (cfg.parallel.offload != "none") {
    o.dp.disk.enabled = true;  // its path: per chunk (build_rank_chunks)
    o.dp.disk.params = cfg.parallel.offload == "params";
    o.dp.disk.budget_bytes = static_cast<int64_t>(cfg.parallel.offload_budget_mb * (1 << 20));
    o.dp.disk.direct = cfg.parallel.offload_direct;
    o.offload_dir = cfg.parallel.offload_dir;
  }
  o.adamw.weight_decay = cfg.train.weight_decay;
  o.adamw.beta1 = cfg.train.adam_beta1, o.adamw.beta2 = cfg.train.adam_beta2, o.adamw.eps = cfg.train.adam_eps;
  o.seed = cfg.train.seed;
  o.pp_schedule = cfg.parallel.pp_schedule;
  o.micro_batches = cfg.train.grad_accum;  // a step's micro-batches are the pipeline's (Megatron)
  o.virtual_stages = cfg.parallel.virtual_stages;
  o.pp_layers = cfg.parallel.pp_layers;
  o.cp_algo = cfg.parallel.cp_algo;
  o.ep_overlap = cfg.parallel.ep_overlap;
  o.lora = cfg.lora.adapters;
  o.lora_init = cfg.lora.init;
  if (cfg.parallel.mode == "ps" && cfg.parallel.ps_server == "optimizer") {  // the servers keep AdamW's state
    o.adamw.keeps_state = false;
    o.dp.optimizer_state_floats = 0;
    // One bucket per model unit (a unit always passes so small a limit): the
    // layout of the servers' ZeRO-3 group (train/ps_server.h).
    o.dp.bucket_mb = 1e-9;
  }
  return o;
}

std::vector<model::StageOptions> rank_stages(const ChunkOptions& o, const parallel::PpSchedule& schedule, int pp,
                                             int r) {
  const int v = static_cast<int>(o.virtual_stages);
  const parallel::PpPartition part =
      o.pp_layers.empty() ? parallel::balanced_pp_partition(o.model, o.seq_len, pp, v)
                          : parallel::explicit_pp_partition(o.model, o.seq_len, pp * v, o.pp_layers);
  std::vector<model::StageOptions> stages;
  for (int c = 0; c < v; ++c) {
    const parallel::PpPartition::Stage& st = part.stages[static_cast<size_t>(c * pp + r)];
    stages.push_back({{st.first, st.count}, parallel::PipelineRuntime::slots_needed(schedule, r, c)});
  }
  return stages;
}

namespace {

// A chunk's offload file: dir/loom-offload-<host>-<pid>-rank<R>-chunk<C>.bin
// (the host and pid keep runs sharing a directory apart). A missing
// directory is made. Files this host's processes left there and that are
// gone (a run killed before it could remove its own) are removed first.
std::string offload_file_path(const std::string& dir, int rank, int chunk) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  LOOM_REQUIRE(!ec, "parallel.offload_dir = '", dir, "': cannot create it: ", ec.message());
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::string mine = concat("loom-offload-", host, "-");
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!name.starts_with(mine)) continue;
    const long pid = std::strtol(name.c_str() + mine.size(), nullptr, 10);
    if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) fs::remove(e.path(), ec);
  }
  return (fs::path(dir) / concat(mine, ::getpid(), "-rank", rank, "-chunk", chunk, ".bin")).string();
}

// Expert parallelism: dense parameters averaged (and ZeRO-sharded) over dp x
// cp, each ep rank's experts over the ranks holding the same experts
// (expert-dp x cp), their gradient norm summed over the ep group too.
std::vector<parallel::ParamGroup> expert_groups(mesh::Mesh& mesh) {
  const int ep = mesh.ep().size();
  auto expert = [ep](const model::ParamSpec& s) { return parallel::in_expert_group(s.name, ep); };
  auto dense = [ep](const model::ParamSpec& s) { return !parallel::in_expert_group(s.name, ep); };
  const std::vector<mesh::Group> g = gradient_groups(ep);
  return {{parallel::kDenseGroup, mesh.group(g[0]), dense},
          {parallel::kExpertGroup, mesh.group(g[1]), expert, &mesh.ep()}};
}

// [lora] init: the adapters' values from a PEFT adapter directory written
// for the same adapters (rank, alpha, modules), each rank's slices of them.
void start_adapters_from(const ChunkOptions& o, parallel::DataParallel& dp) {
  const model::LoraConfig saved = model::read_peft_config(o.lora_init, o.model);
  const auto modules = [&](const model::LoraConfig& l) { return model::lora_module_names(o.model, l); };
  LOOM_REQUIRE(saved.rank == o.lora.rank && saved.alpha == o.lora.alpha && modules(saved) == modules(o.lora),
               "lora.init = '", o.lora_init, "' holds adapters of rank ", saved.rank, ", alpha ", saved.alpha, " on ",
               modules(saved).size(), " modules; [lora] has rank ", o.lora.rank, ", alpha ", o.lora.alpha, " on ",
               modules(o.lora).size(), ": set the same rank, alpha and targets");
  const std::vector<model::ParamSpec> whole = model::lora_param_specs(o.model, o.lora);
  MemoryTracker tracker;
  Pool pool(MemTag::workspace, Device::cpu(), tracker);
  OwnedTensor values = pool.empty(DType::f32, {model::param_count(whole)});
  model::load_peft_adapter(o.lora_init, o.model, o.lora, values);
  std::map<std::string, const model::ParamSpec*> by_name;
  for (const model::ParamSpec& s : whole) by_name[s.name] = &s;
  dp.set_params([&](Tensor dst, const model::ParamSpec& spec) {
    model::ParamSpec at_zero = spec;  // dst holds this parameter alone
    at_zero.offset = 0;
    const Tensor all = model::param_view(values, *by_name.at(spec.name)).reshape({spec.global_numel()});
    model::take_runs(dst.reshape({spec.numel()}), at_zero, all);
  });
}

}  // namespace

std::vector<mesh::Group> gradient_groups(int ep) {
  if (ep == 1) return {mesh::Group::dp_cp};
  return {mesh::Group::dp_cp, mesh::Group::expert_dp_cp};
}

RankChunks build_rank_chunks(const ChunkOptions& o, Context& ctx) {
  RankChunks rank;
  comm::Communicator &tp = ctx.mesh.tp(), &pp = ctx.mesh.pp();
  if (tp.size() > 1) rank.tp = std::make_unique<parallel::TensorParallel>(tp, o.sequence_parallel);
  comm::Communicator& cp = ctx.mesh.cp();
  if (cp.size() > 1) {
    const parallel::CpSplit split = parallel::cp_split(o.seq_len, cp.size(), o.cp_zigzag);
    rank.cp = std::make_unique<parallel::ContextParallelAttention>(cp, parallel::cp_algo_from_name(o.cp_algo),
                                                                   split.zigzag, o.cp_pools ? *o.cp_pools : ctx.pools);
    for (int64_t t = 0; t < split.local_tokens(); ++t)
      rank.cp_positions.push_back(static_cast<int32_t>(split.position(cp.rank(), t)));
    if (o.model.is_moe()) rank.cp_routing = std::make_unique<parallel::RoutingGroups>(cp);
  }
  comm::Communicator& ep = ctx.mesh.ep();
  if (ep.size() > 1) rank.ep = std::make_unique<parallel::ExpertParallel>(ep, o.ep_overlap);
  const int64_t T = o.seq_len / cp.size();  // the rank's tokens of each sequence
  const bool pipelined = pp.size() > 1;
  std::vector<model::StageOptions> stages(1);
  if (pipelined) {
    LOOM_REQUIRE(o.dp.zero_stage <= 1, "parallel.pp = ", pp.size(),
                 " composes with ZeRO stages 0 and 1 (parallel.zero_stage = ", o.dp.zero_stage, ")");
    // GPT-2's tied embedding: stage 0 and the last stage each hold a copy
    // with a dp bucket of its own; their gradients are summed each step.
    if (!o.lora.enabled()) rank.tied = std::make_unique<parallel::TiedEmbedding>(o.model, pp);  // adapters: frozen
    rank.schedule = parallel::make_pp_schedule(parallel::pp_schedule_from_name(o.pp_schedule), pp.size(),
                                               static_cast<int>(o.micro_batches), static_cast<int>(o.virtual_stages));
    stages = rank_stages(o, *rank.schedule, pp.size(), pp.rank());
  }
  parallel::DpOptions dpo = o.dp;
  if (rank.ep) dpo.groups = expert_groups(ctx.mesh);
  for (const model::StageOptions& so : stages) {
    const model::ModelOptions mo{.compute = o.compute,
                                 .recompute = o.recompute,
                                 .storage = parallel::DataParallel::model_storage(dpo.zero_stage),
                                 .tp = rank.tp ? rank.tp->options() : model::TpOptions{},
                                 .stage = so,
                                 .cp = {cp.size(), rank.cp_positions, rank.cp.get(), rank.cp_routing.get()},
                                 .ep = rank.ep ? rank.ep->options() : model::EpOptions{},
                                 .lora = {o.lora, o.lora_base, o.seed}};
    rank.models.push_back(std::make_unique<model::Model>(o.model, o.micro_batch, T, ctx.pools, mo));
    if (rank.tied) dpo.solo_params = rank.tied->solo_params(*rank.models.back());
    if (dpo.disk.enabled)
      dpo.disk.path = offload_file_path(o.offload_dir, ctx.mesh.world().rank(), static_cast<int>(rank.dps.size()));
    rank.dps.push_back(
        std::make_unique<parallel::DataParallel>(*rank.models.back(), ctx.mesh.dp_cp(), tp, dpo, ctx.pools));
    rank.dps.back()->init_params(o.seed);
    if (!o.lora_init.empty()) start_adapters_from(o, *rank.dps.back());
    rank.optimizers.push_back(std::make_unique<AdamW>(*rank.dps.back(), o.adamw));
  }
  if (pipelined) {
    rank.pipe = std::make_unique<parallel::PipelineRuntime>(*rank.schedule, pp, rank.model_ptrs(), ctx.pools);
    const int last = static_cast<int>(o.micro_batches) - 1;
    rank.pipe->set_before_backward([ptrs = rank.dp_ptrs(), last](int chunk, int mb) {
      ptrs[static_cast<size_t>(chunk)]->begin_micro_batch(mb == last);
    });
  }
  return rank;
}

}  // namespace loom::train
