#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <span>
#include <thread>

#include <nlohmann/json.hpp>

#include "comm/host_values.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/log.h"
#include "core/sha256.h"
#include "io/safetensors_index.h"
#include "kernels/cpu_isa.h"
#include "kernels/ops.h"
#include "model/config_json.h"
#include "train/checkpoint.h"
#include "train/evaluate.h"

namespace loom::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::span<int32_t> span_of(const Tensor& t) { return {t.data_as<int32_t>(), static_cast<size_t>(t.numel())}; }

DataLoaderOptions loader_options(const RunConfig& c, const std::vector<std::string>& shards, bool shuffle,
                                 const comm::Communicator& dp) {
  DataLoaderOptions o;
  o.rank = dp.rank(), o.world = dp.size();
  o.shards = shards;
  o.batch = c.train.micro_batch;
  o.seq_len = c.train.seq_len;
  o.shuffle = shuffle;
  o.seed = c.train.seed;
  o.vocab_size = c.model.vocab_size;
  return o;
}

comm::Communicator& checked_group(const char* key, int64_t expected, comm::Communicator& group) {
  LOOM_REQUIRE(group.size() == expected, "parallel.", key, " = ", expected, " but the mesh's ", key, " axis has ",
               group.size(), " ranks: build the mesh from the run config's [parallel] sizes");
  return group;
}

// What a run on a GPU does not do yet, refused before anything is built
// (dp, ZeRO, tp + SP, cp, ep and pp run over the device's communicator:
// NCCL under `loom train`; MoE layers route with the kernels' moe_* ops;
// offload_optimizer keeps the optimizer on the host): parameter servers.
void require_device_layout(const RunConfig& cfg) {
  const ParallelConfig& p = cfg.parallel;
  LOOM_REQUIRE(p.mode != "ps", "train.device = ", cfg.train.device, ": parameter-server training (parallel.mode = ps) ",
               "runs on CPUs only for now");
  LOOM_REQUIRE(cfg.train.dtype != "fp16" || p.tp == 1, "train.dtype = fp16 with parallel.tp = ", p.tp,
               " runs on CPUs only for now (tensor parallelism sums fp16 partials through f32 in host memory); on ",
               "GPUs train in bf16 (train.dtype = bf16), or in fp16 without tp");
}

// What the run's device must offer cfg: a run's ops go to the device's one
// stream (core/memory.h), which the Context must name; a GPU's layouts; on
// the CPU a bf16 GEMM for bf16 (without one the matmuls would widen bf16 to
// f32, kernels/ops.h: a bf16 run slower than f32 with bf16's rounding is no
// choice to offer).
void require_device_can_run(const RunConfig& cfg, const Context& ctx) {
  const Device device = ctx.pools.device();
  LOOM_REQUIRE(ctx.stream == device_stream(device), "trainer: the Context's stream (",
               ctx.stream.device == device ? "another stream of " : "on ", device_name(ctx.stream.device),
               ") is not the stream of its pools' device ", device_name(device),
               ": a run's ops go to that device's one stream (device_stream)");
  if (!device.is_cpu()) return require_device_layout(cfg);
  if (cfg.train.dtype == "bf16") require_cpu_bf16_gemm("train.dtype = bf16", "train.dtype = fp32");
}

// The identity of a LoRA base's weights a checkpoint records: its file's
// sha256, or a sharded checkpoint's of its index's and shards' hashes.
std::string base_weights_sha256(const model::ModelDir& base) {
  if (!base.sharded) return sha256_file_hex(base.weights);
  std::string hashes = sha256_file_hex(base.weights);
  for (const io::SafetensorsFile& f : io::SafetensorsShards::open(base.weights).files())
    hashes += sha256_file_hex(f.path());
  return sha256_hex(hashes);
}

// Val data that makes the in-training val loss misleading, allowed but
// said: a shard both splits read (data.train = "data/*.bin" catches
// val_*.bin), or fewer windows than one evaluation batch (it repeats some).
void warn_val_data(const RunConfig& cfg, const DataLoader& train, const DataLoader& val, int64_t dp) {
  std::set<std::filesystem::path> seen;
  for (const std::string& t : train.shard_paths()) seen.insert(std::filesystem::weakly_canonical(t));
  for (const std::string& v : val.shard_paths())
    if (seen.count(std::filesystem::weakly_canonical(v)) > 0)
      log_warn("data: '", v, "' is both a train shard (data.train) and a val shard (data.val): the val loss is ",
               "measured on data the model trains on");
  const int64_t eval_batch = cfg.train.micro_batch * dp;
  if (val.windows_per_epoch() < eval_batch)
    log_warn("data.val holds ", val.windows_per_epoch(), " windows of ", cfg.train.seq_len, " tokens, fewer ",
             "than one evaluation batch of ", eval_batch, " (train.micro_batch x dp): the batch repeats windows, ",
             "which the val loss then counts twice (loom eval counts each once)");
}

}  // namespace

void require_cpu_bf16_gemm(const std::string& what, const std::string& fp32) {
  const std::string why = kernels::bf16_matmul_unsupported_reason();
  if (why.empty()) return;
  using kernels::CpuIsa;
  const CpuIsa supported = kernels::cpu_isa_supported(), level = kernels::cpu_isa();
  LOOM_REQUIRE(supported < CpuIsa::avx512 || level >= CpuIsa::avx512, what, ": --isa / LOOM_ISA caps this run at ",
               "the ", kernels::cpu_isa_name(level), " level, where there is no bf16 GEMM (oneDNN needs AVX-512 for ",
               "bf16); this CPU has ", kernels::cpu_isa_name(supported), ": raise the cap to avx512 or above, or ",
               "train in fp32 (", fp32, ")");
  fail(what, ": ", why, "; train in fp32 here (", fp32, "), or in bf16 on a CPU with AVX-512");
}

Trainer::Trainer(const RunConfig& cfg, Context& ctx)
    : cfg_(cfg),
      mesh_(ctx.mesh),
      schedule_{cfg.train.lr, cfg.train.min_lr, cfg.train.warmup_steps, cfg.train.steps},
      train_data_(loader_options(cfg, cfg.data.train, cfg.data.shuffle,
                                 checked_group("dp", cfg.parallel.dp, ctx.mesh.dp()))) {
  const bool on_device = !ctx.pools.device().is_cpu();
  require_device_can_run(cfg, ctx);
  checked_group("tp", cfg.parallel.tp, ctx.mesh.tp());
  checked_group("pp", cfg.parallel.pp, ctx.mesh.pp());
  checked_group("cp", cfg.parallel.cp, ctx.mesh.cp());
  if (cfg.train.eval_every > 0) {
    val_data_ = std::make_unique<DataLoader>(loader_options(cfg, cfg.data.val, false, ctx.mesh.dp()));
    if (ctx.mesh.world_rank() == 0) warn_val_data(cfg, train_data_, *val_data_, ctx.mesh.dp().size());
  }
  ChunkOptions chunks = chunk_options(cfg);
  if (on_device && cfg.parallel.offload_optimizer)  // page-locked: copied to and from the device every step
    host_state_ = std::make_unique<Pools>(Device::cpu(), ctx.pools.device());
  chunks.dp.host_state = host_state_.get();  // ZeRO-Offload beside a device's model; null otherwise
  if (cfg.lora.adapters.enabled()) {
    const model::ModelDir base = model::load_model_dir(cfg.lora.base);
    lora_base_ = model::load_frozen_base(base, chunks.compute, ctx.pools, {mesh_.shape().tp, mesh_.coord().tp});
    lora_base_sha256_ = base_weights_sha256(base);
    chunks.lora_base = lora_base_.get();
  }
  rank_ = build_rank_chunks(chunks, ctx);
  const int64_t B = cfg.train.micro_batch, T = cfg.train.seq_len / cfg.parallel.cp;
  Pools& pools = ctx.pools;
  if (rank_.pipe) {
    for (int64_t k = 0; k < cfg.train.grad_accum; ++k) {
      micro_tokens_.push_back(pools[MemTag::activations].zeros(DType::i32, {B, T}));
      micro_targets_.push_back(pools[MemTag::activations].zeros(DType::i32, {B, T}));
    }
  }
  if (cfg.train.dtype == "fp16") scaler_.emplace(cfg.train.loss_scale, cfg.train.loss_scale_window);
  // The loader writes on the host: a device run's batches stay there (the
  // model stages them), and so do cp's whole sequences its columns come from.
  Pool& batches = on_device ? host_batches_ : pools[MemTag::activations];
  tokens_ = batches.zeros(DType::i32, {B, T});
  targets_ = batches.zeros(DType::i32, {B, T});
  if (rank_.cp) {
    seq_tokens_ = batches.zeros(DType::i32, {B, cfg.train.seq_len});
    seq_targets_ = batches.zeros(DType::i32, {B, cfg.train.seq_len});
  }
  if (cfg.parallel.mode == "ps") {
    LOOM_REQUIRE(ctx.ps_world != nullptr, "parallel.mode = ps needs the job's servers: start ", cfg.parallel.ps_servers,
                 " + ", cfg.parallel.dp, " processes under mpirun (loom train does)");
    ps_ = std::make_unique<parallel::PsWorker>(*ctx.ps_world, static_cast<int>(cfg.parallel.ps_servers),
                                               static_cast<int>(cfg.parallel.dp), mesh_.dp().rank(),
                                               parallel::ps_kind_from_name(cfg.parallel.ps_server),
                                               cfg.parallel.staleness, rank_.dps[0]->buckets(), pools);
    rank_.dps[0]->set_exchange(ps_.get());
  }
  if (const char* d = std::getenv("LOOM_DP_DELAY")) {
    int r = -1, ms = 0;
    delay_rotates_ = std::sscanf(d, "rotate:%d", &ms) == 1 && ms >= 0;
    LOOM_REQUIRE(delay_rotates_ || (std::sscanf(d, "%d:%d", &r, &ms) == 2 && r >= 0 && ms >= 0), "LOOM_DP_DELAY = '",
                 d, "' is not rank:milliseconds (e.g. 1:200) or rotate:milliseconds");
    if (delay_rotates_ || r == mesh_.dp().rank()) delay_ms_ = ms;
  }
}

void Trainer::take_rank_tokens(const Tensor& tokens, const Tensor& targets) const {
  if (!rank_.cp) return;
  // This rank's zig-zag positions of every sequence (rank_chunks.h).
  const Tensor positions(const_cast<int32_t*>(rank_.cp_positions.data()), DType::i32,
                         {static_cast<int64_t>(rank_.cp_positions.size())});
  kernels::gather_columns(tokens, seq_tokens_, positions);
  kernels::gather_columns(targets, seq_targets_, positions);
}

StepStats Trainer::pipeline_step() {
  const auto start = Clock::now();
  const int64_t accum = cfg_.train.grad_accum;
  StepStats s;
  const double loss_scale = scaler_ ? scaler_->scale() : 1.0, scale = backward_scale(loss_scale);
  for (auto& dp : rank_.dps) dp->zero_grads();
  for (model::Model* m : rank_.model_ptrs()) m->reset_moe_stats();  // an evaluation's routing is not the step's
  std::vector<Tensor> tokens, targets;
  std::vector<std::vector<int64_t>> samples;  // each micro-batch's, keying LoRA dropout on every stage
  for (int64_t k = 0; k < accum; ++k) {
    samples.push_back(train_data_.samples_at(train_data_.position()));
    if (rank_.cp) train_data_.next(span_of(seq_tokens_), span_of(seq_targets_));
    else train_data_.next(span_of(micro_tokens_[k]), span_of(micro_targets_[k]));
    take_rank_tokens(micro_tokens_[k], micro_targets_[k]);
    tokens.push_back(micro_tokens_[k]), targets.push_back(micro_targets_[k]);
  }
  double loss = 0;
  {
    TraceSpan span(trace_, "pipeline");
    rank_.pipe->set_trace(trace_);  // the runtime's actions nest inside "pipeline"
    loss = rank_.pipe->run(tokens, targets, static_cast<float>(scale / static_cast<double>(accum)), samples);
  }
  double sum_squares = 0;
  {
    TraceSpan span(trace_, "grad sync wait");
    for (auto& dp : rank_.dps) dp->wait_gradients();
    if (rank_.tied) rank_.tied->sum_grads(rank_.model_ptrs(), rank_.dp_ptrs());  // none when only adapters train
    for (auto& dp : rank_.dps) sum_squares += dp->grad_sum_squares();
    sum_squares = parallel::exact_group_sum(mesh_.pp(), sum_squares);
  }
  s.grad_norm = std::sqrt(sum_squares) / scale;
  // The last stage's rank knows the loss; the sum over pp gives it to all.
  return finish_step(s, loss_scale, parallel::exact_group_sum(mesh_.pp(), loss), start);
}

// fp16's backward runs at loss_scale / (dp cp): each rank's tokens weighted
// as in the mean over the global batch, so its f16 gradients have the single
// process's magnitude and overflow at the same loss scale (DESIGN.md §1: the
// skipped steps are part of the trajectory). The gradient reductions average
// the dp cp ranks' shares, so the norm and the update divide by this scale
// to unscale. Other dtypes cannot overflow there: loss_scale is 1, as before.
double Trainer::backward_scale(double loss_scale) const {
  if (!scaler_) return loss_scale;
  return loss_scale / static_cast<double>(cfg_.parallel.dp * cfg_.parallel.cp);
}

// The update and the step's figures, once the gradients and their norm are
// ready: fp16 overflow skip, clipping, AdamW on every chunk.
StepStats Trainer::finish_step(StepStats s, double loss_scale, double loss, std::chrono::steady_clock::time_point start) {
  s.lr = schedule_.at(steps_);
  s.loss = mean_over_replicas(loss);  // the same on every rank, as grad_norm
  const bool finite_loss = std::isfinite(s.loss);
  if (scaler_) {
    s.loss_scale = loss_scale;
    s.skipped = !scaler_->update(std::isfinite(s.grad_norm));
    s.bad = !finite_loss || (s.skipped && loss_scale <= cfg_.train.min_loss_scale);
  } else {
    s.bad = !finite_loss || !std::isfinite(s.grad_norm);
  }
  s.skipped = s.skipped || s.bad;  // a diverged step's update would write Inf / NaN weights
  MoeStep moe;
  if (cfg_.model.is_moe()) {
    moe = finish_moe_step(rank_.model_ptrs(), mesh_);
    s.moe = moe.stats;
  }
  const auto update_start = Clock::now();
  if (!s.skipped) {
    const double clip = cfg_.train.grad_clip;
    // Clipping and unscaling are folded into AdamW's grad_scale (kernels/ops.h).
    const double clip_factor = clip > 0 && s.grad_norm > clip ? clip / s.grad_norm : 1.0;
    TraceSpan span(trace_, "optimizer");
    for (size_t c = 0; !updated_by_servers() && c < rank_.optimizers.size(); ++c) {
      const std::span<const ParamDelta> deltas = moe.bias_deltas.empty() ? std::span<const ParamDelta>()
                                                                          : moe.bias_deltas[c];
      rank_.optimizers[c]->step(s.lr, static_cast<float>(clip_factor / backward_scale(loss_scale)), deltas);
    }
  }
  if (rank_.dps[0]->state_on_disk()) {
    StepStats::Disk d;
    d.update_seconds = seconds_since(update_start);
    for (const auto& dp : rank_.dps) {
      d.wait_seconds += dp->comm_stats().offload_wait_seconds;
      dp->reset_comm_stats();
      d.bytes += dp->offload_bytes();
    }
    s.disk = d;
    s.disk->bytes -= disk_bytes_, disk_bytes_ += s.disk->bytes;
  }
  s.step = ++steps_;
  s.tokens = mesh_.dp().size() * cfg_.train.grad_accum * cfg_.train.micro_batch * cfg_.train.seq_len;
  s.seconds = seconds_since(start);
  return s;
}

double Trainer::flops_per_token() const {
  if (!cfg_.lora.adapters.enabled()) return model_flops_per_token(cfg_.model, cfg_.train.seq_len);
  return lora_flops_per_token(cfg_.model, cfg_.train.seq_len, model::lora_param_count(cfg_.model, cfg_.lora.adapters));
}

StepStats Trainer::step() {
  if (rank_.pipe) return pipeline_step();
  const auto start = Clock::now();
  const int64_t accum = cfg_.train.grad_accum;
  StepStats s;
  // fp16: gradients carry the loss scale until the update divides it out.
  const double loss_scale = scaler_ ? scaler_->scale() : 1.0;
  if (delay_ms_ > 0 && (!delay_rotates_ || steps_ % mesh_.dp().size() == mesh_.dp().rank()))
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms_));
  rank_.dps[0]->zero_grads();
  rank_.models[0]->reset_moe_stats();  // an evaluation's routing is not the step's
  if (ps_) ps_->begin_step(steps_, train_data_.position());
  double loss_sum = 0;
  const float dloss = static_cast<float>(backward_scale(loss_scale) / static_cast<double>(accum));
  for (int64_t k = 0; k < accum; ++k) {
    rank_.dps[0]->begin_micro_batch(k == accum - 1);
    rank_.models[0]->set_samples(train_data_.samples_at(train_data_.position()));  // LoRA dropout's keys
    if (rank_.cp) train_data_.next(span_of(seq_tokens_), span_of(seq_targets_));
    else train_data_.next(span_of(tokens_), span_of(targets_));
    take_rank_tokens(tokens_, targets_);
    {
      TraceSpan span(trace_, "forward");
      loss_sum += rank_.models[0]->forward(tokens_, targets_, 0, dloss);  // with the loss's gradient
    }
    TraceSpan span(trace_, "backward");
    rank_.models[0]->backward(dloss);
  }
  {
    TraceSpan span(trace_, "grad sync wait");  // grad_norm waits for the gradient collectives
    if (updated_by_servers()) {  // the servers' norm, and their update's weights
      rank_.dps[0]->wait_gradients();
      const parallel::PsStepResult r = ps_->pull(rank_.models[0]->params());
      s.grad_norm = r.grad_norm;
    } else {
      s.grad_norm = rank_.dps[0]->grad_norm() / backward_scale(loss_scale);
    }
  }
  return finish_step(s, loss_scale, loss_sum / static_cast<double>(accum), start);
}

double Trainer::evaluate() {
  LOOM_CHECK(val_data_ != nullptr, "evaluate without val data");
  TraceSpan span(trace_, "evaluate");
  if (rank_.pipe) rank_.pipe->set_trace(trace_);  // the current recorder (or none), never a stale one
  const int64_t global_batch = cfg_.train.micro_batch * mesh_.dp().size();
  const int64_t batches =
      std::min(cfg_.train.eval_steps, std::max<int64_t>(1, val_data_->windows_per_epoch() / global_batch));
  const EvaluationForwards evaluating(rank_.model_ptrs());
  double sum = 0;
  if (!rank_.pipe) rank_.models[0]->set_samples({});  // nothing drawn in evaluation (the pipeline's sets none)
  for (int64_t k = 0; k < batches; ++k) {
    if (rank_.cp) val_data_->batch_at(k * global_batch, span_of(seq_tokens_), span_of(seq_targets_));
    else val_data_->batch_at(k * global_batch, span_of(tokens_), span_of(targets_));
    take_rank_tokens(tokens_, targets_);
    sum += rank_.pipe ? rank_.pipe->forward_only(tokens_, targets_) : rank_.models[0]->forward(tokens_, targets_);
  }
  if (rank_.pipe) sum = parallel::exact_group_sum(mesh_.pp(), sum);  // only the last stage's rank holds the losses
  return mean_over_replicas(sum / static_cast<double>(batches));
}

double Trainer::mean_over_replicas(double value) {
  // Asynchronous workers meet no one: each reports its own.
  return asynchronous() ? value : rank_.dps[0]->mean(value);
}

namespace {

// A model of one rank's state on disk (parallel.offload), no LoRA: the
// weights read a part at a time as the file is written (its state does not
// fit in memory at once). Whether it was.
bool save_streamed_model(Trainer& trainer, const std::string& dir) {
  const parallel::DataParallel& dp = trainer.dp();
  const bool one_rank = trainer.tp_size() == 1 && trainer.pp_size() == 1 && dp.num_groups() == 1 &&
                        dp.group(0).comm.get().size() == 1;  // memory_plan.cpp's streams_model
  if (!one_rank || !dp.state_on_disk() || trainer.config().lora.adapters.enabled()) return false;
  model::save_model_dir(dir, trainer.model().config(), [&dp](int64_t flat, Tensor out) { dp.read_master(flat, out); });
  return true;
}

}  // namespace

void save_model(Trainer& trainer, const std::string& dir) {
  if (trainer.ps()) trainer.ps()->wait_params();  // the servers' last update, still arriving
  if (save_streamed_model(trainer, dir)) return;
  const model::ModelConfig& cfg = trainer.model().config();
  MemoryTracker tracker;
  Pool pool(MemTag::workspace, Device::cpu(), tracker);
  mesh::Mesh& mesh = trainer.mesh();
  const bool lead_of_stage = trainer.dp().rank() == 0 && trainer.tp_rank() == 0;
  const int ep = mesh.shape().ep;
  if (trainer.tp_size() == 1 && trainer.pp_size() == 1 && ep == 1) {  // one chunk holding whole tensors
    OwnedTensor full = pool.empty(DType::f32, {trainer.model().num_params()});
    trainer.dp().gather_master(full);
    if (!lead_of_stage) return;
    const LoraRunConfig& lora = trainer.config().lora;
    if (lora.adapters.enabled()) model::save_peft_adapter(dir, cfg, lora.adapters, full, lora.base);
    else model::save_model_dir(dir, cfg, full, model::ParamLayout::loom);
    return;
  }
  // Every chunk's master weights over dp, every tp rank's slices of them
  // (the same size on each), placed by name into the whole model's buffer by
  // expert-dp = cp = tp = 0 of each pipeline rank (under ep, each ep rank its
  // own experts, ep rank 0 the rest); the ep and pipeline ranks' buffers
  // (each parameter filled by exactly one of them, zeros elsewhere) are
  // then summed.
  const model::LoraConfig& adapters = trainer.config().lora.adapters;
  const std::vector<model::ParamSpec> whole_specs = model::trainable_param_specs(cfg, adapters);
  std::map<std::string, int64_t> whole_offset;
  for (const model::ParamSpec& spec : whole_specs) whole_offset[spec.name] = spec.offset;
  OwnedTensor whole = pool.zeros(DType::f32, {model::param_count(whole_specs)});
  const int tp = trainer.tp_size();
  const bool lead_of_ep_rank = mesh.coord().expert_dp == 0 && mesh.coord().cp == 0 && trainer.tp_rank() == 0;
  for (int c = 0; c < trainer.num_chunks(); ++c) {
    const model::Model& m = trainer.chunk(c);
    const int64_t P = m.num_params();
    OwnedTensor slices = pool.empty(DType::f32, {tp * P});
    if (tp == 1) {
      trainer.chunk_dp(c).gather_master(slices);
    } else {
      OwnedTensor full = pool.empty(DType::f32, {P});
      trainer.chunk_dp(c).gather_master(full);
      comm::all_gather_host(trainer.mesh().tp(), slices, full);
    }
    if (!lead_of_ep_rank) continue;
    for (int r = 0; r < tp; ++r) {
      const std::vector<model::ParamSpec> specs = model::trainable_param_specs(
          cfg, adapters, {tp, r}, model::PpStage{m.first_layer(), m.num_layers()}, {ep, mesh.coord().ep});
      const Tensor rank_slice = Tensor(slices).slice(0, r * P, P);
      for (const model::ParamSpec& spec : specs) {
        if (spec.pp_copy || (spec.replicated() && r != 0)) continue;  // written by stage 0 / tp rank 0
        if (mesh.coord().ep != 0 && !model::is_expert_param(spec.name)) continue;  // written by ep rank 0
        model::place_runs(Tensor(whole).slice(0, whole_offset.at(spec.name), spec.global_numel()), rank_slice, spec);
      }
    }
  }
  if (ep > 1) comm::all_reduce_host(mesh.ep(), whole, comm::ReduceOp::sum);
  if (trainer.pp_size() > 1) comm::all_reduce_host(trainer.mesh().pp(), whole, comm::ReduceOp::sum);
  if (!lead_of_stage || trainer.pp_rank() != 0) return;
  if (adapters.enabled()) model::save_peft_adapter(dir, cfg, adapters, whole, trainer.config().lora.base);
  else model::save_model_dir(dir, cfg, whole, model::ParamLayout::loom);
}

}  // namespace loom::train
