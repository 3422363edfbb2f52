#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <span>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/log.h"
#include "kernels/ops.h"
#include "model/config_json.h"
#include "train/checkpoint.h"
#include "parallel/pp_partition.h"

namespace loom::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::span<int32_t> span_of(const Tensor& t) { return {t.data_as<int32_t>(), static_cast<size_t>(t.numel())}; }

DataLoaderOptions loader_options(const RunConfig& c, const std::vector<std::string>& shards, bool shuffle,
                                 comm::Communicator* dp) {
  DataLoaderOptions o;
  if (dp != nullptr) o.rank = dp->rank(), o.world = dp->size();
  o.shards = shards;
  o.batch = c.train.micro_batch;
  o.seq_len = c.train.seq_len;
  o.shuffle = shuffle;
  o.seed = c.train.seed;
  o.vocab_size = c.model.vocab_size;
  return o;
}

double mib(size_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

}  // namespace

std::string recompute_report(const model::Model& m, const MemoryReport& report) {
  const model::ModelConfig& cfg = m.config();
  auto layout = [&](model::Recompute r) {
    return model::Model::activation_bytes(cfg, m.batch_size(), m.seq_len(), m.compute_dtype(), r, m.tensor_parallel());
  };
  const int64_t none = layout(model::Recompute::none), chosen = layout(m.recompute());
  const size_t peak = report[MemTag::activations].peak;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "recompute = %s: activations peak %.1f MiB measured; model layout %.1f MiB "
                "(none %.1f, selective %.1f, full %.1f MiB): %.1f%% less than none",
                std::string(model::recompute_name(m.recompute())).c_str(), mib(peak), mib(chosen), mib(none),
                mib(layout(model::Recompute::selective)), mib(layout(model::Recompute::full)),
                100.0 * (1.0 - static_cast<double>(chosen) / static_cast<double>(none)));
  return buf;
}

double predicted_layer_activation_bytes(const model::ModelConfig& cfg, int64_t B, int64_t T, DType compute, int tp,
                                        bool sequence_parallel) {
  const double sbh = static_cast<double>(T) * static_cast<double>(B) * static_cast<double>(cfg.n_embd);
  const double t = tp;
  // Per sbh at 2 bytes: 34 unsplit (11 attention + 19 MLP + 4 norms); TP
  // splits 24 of them (q, k, v, scores input, MLP hidden) and SP the other 10.
  const double per_sbh = tp == 1 ? 34.0 : sequence_parallel ? 34.0 / t : 10.0 + 24.0 / t;
  return sbh * per_sbh * static_cast<double>(dtype_size(compute)) / 2.0;
}

std::string activation_prediction_report(const model::Model& m) {
  model::ModelConfig one_less = m.config();
  model::ModelConfig cfg = m.config();
  if (cfg.n_layer == 1) cfg.n_layer = 2;  // the difference of two layouts needs a second layer
  one_less.n_layer = cfg.n_layer - 1;
  const model::TpOptions& tp = m.tensor_parallel();
  auto layout = [&](const model::ModelConfig& c) {
    return model::Model::activation_bytes(c, m.batch_size(), m.seq_len(), m.compute_dtype(), model::Recompute::none, tp);
  };
  const int64_t per_layer = layout(cfg) - layout(one_less);
  const double predicted =
      predicted_layer_activation_bytes(cfg, m.batch_size(), m.seq_len(), m.compute_dtype(), tp.tp.size, tp.sp());
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "activations per layer (recompute none, tp = %d%s): %.2f MiB in this rank's layout; Korthikanti et "
                "al. predict %.2f MiB (s b h (%s), no 5 a s / h term: flash attention keeps no s x s scores%s): "
                "ratio %.3f",
                tp.tp.size, tp.sp() ? ", sequence parallel" : "", mib(static_cast<size_t>(per_layer)),
                predicted / (1024.0 * 1024.0),
                tp.tp.size == 1 ? "34" : tp.sp() ? "34 / t" : "10 + 24 / t",
                cfg.d_ff == 4 * cfg.n_embd ? "" : "; the formula assumes d_ff = 4 h",
                static_cast<double>(per_layer) / predicted);
  return buf;
}

namespace {

comm::Communicator* checked_group(const char* key, int64_t expected, comm::Communicator* group) {
  const int64_t size = group != nullptr ? group->size() : 1;
  LOOM_REQUIRE(size == expected, "parallel.", key, " = ", expected, " but the group has ", size,
               " ranks: run with mpirun -np (pp * dp * cp * tp) and build the groups from the mesh");
  return group;
}

}  // namespace

Trainer::Trainer(const RunConfig& cfg, Pools& pools, comm::Communicator* dp, comm::Communicator* tp,
                 comm::Communicator* pp)
    : cfg_(cfg),
      schedule_{cfg.train.lr, cfg.train.min_lr, cfg.train.warmup_steps, cfg.train.steps},
      train_data_(loader_options(cfg, cfg.data.train, cfg.data.shuffle, checked_group("dp", cfg.parallel.dp, dp))) {
  checked_group("tp", cfg.parallel.tp, tp);
  checked_group("pp", cfg.parallel.pp, pp);
  if (tp != nullptr && tp->size() > 1)
    tp_ = std::make_unique<parallel::TensorParallel>(*tp, cfg.parallel.sequence_parallel);
  if (cfg.train.eval_every > 0)
    val_data_ = std::make_unique<DataLoader>(loader_options(cfg, cfg.data.val, false, dp));
  const int64_t B = cfg.train.micro_batch, T = cfg.train.seq_len;
  const int stage = static_cast<int>(cfg.parallel.zero_stage);
  // Pipeline parallelism: this rank's chunks are stages c pp + r of the
  // balanced partition, each a Model with the slots its schedule keeps in
  // flight; without it, one chunk: the whole model.
  const int n_pp = static_cast<int>(cfg.parallel.pp), v = static_cast<int>(cfg.parallel.virtual_stages);
  const bool pipelined = n_pp > 1;  // (config: virtual_stages > 1 needs pp > 1)
  std::vector<model::StageOptions> stages(1);
  if (pipelined) {
    LOOM_REQUIRE(stage <= 1, "parallel.pp = ", n_pp, " composes with ZeRO stages 0 and 1 (parallel.zero_stage = ",
                 stage, ")");
    pp_ = pp;
    // GPT-2's tied embedding: stage 0 and the last stage each hold a copy
    // with a dp bucket of its own; their gradients are summed each step.
    tied_ = std::make_unique<parallel::TiedEmbedding>(cfg.model, pp);
    pp_schedule_ = parallel::make_pp_schedule(parallel::pp_schedule_from_name(cfg.parallel.pp_schedule), n_pp,
                                              static_cast<int>(cfg.train.grad_accum), v);
    const parallel::PpPartition part =
        cfg.parallel.pp_layers.empty()
            ? parallel::balanced_pp_partition(cfg.model, T, n_pp, v)
            : parallel::explicit_pp_partition(cfg.model, T, n_pp * v, cfg.parallel.pp_layers);
    const int r = pp != nullptr ? pp->rank() : 0;
    stages.clear();
    for (int c = 0; c < v; ++c) {
      const parallel::PpPartition::Stage& st = part.stages[static_cast<size_t>(c * n_pp + r)];
      stages.push_back({{st.first, st.count}, parallel::PipelineRuntime::slots_needed(*pp_schedule_, r, c)});
    }
  }
  parallel::DpOptions dpo;
  dpo.zero_stage = stage;
  dpo.bucket_mb = cfg.parallel.bucket_mb;
  dpo.offload_optimizer = cfg.parallel.offload_optimizer;
  parallel::AdamWOptions opt;
  opt.weight_decay = cfg.train.weight_decay;
  for (const model::StageOptions& so : stages) {
    models_.push_back(std::make_unique<model::Model>(
        cfg.model, B, T, pools, compute_dtype(cfg.train), model::recompute_from_name(cfg.train.recompute),
        parallel::DataParallel::model_storage(stage), tp_ ? tp_->options() : model::TpOptions{}, so));
    if (tied_) dpo.solo_params = tied_->solo_params(*models_.back());
    dps_.push_back(std::make_unique<parallel::DataParallel>(*models_.back(), dp, dpo, opt, pools));
    if (tp_) dps_.back()->set_tp_group(&tp_->group());
    dps_.back()->init_params(cfg.train.seed);
  }
  if (pipelined) {
    std::vector<model::Model*> chunks;
    for (auto& m : models_) chunks.push_back(m.get());
    pipe_ = std::make_unique<parallel::PipelineRuntime>(*pp_schedule_, pp, chunks, pools);
    pipe_->set_before_backward(
        [this](int chunk, int mb) { dps_[static_cast<size_t>(chunk)]->begin_micro_batch(mb == cfg_.train.grad_accum - 1); });
    for (int64_t k = 0; k < cfg.train.grad_accum; ++k) {
      micro_tokens_.push_back(pools[MemTag::activations].zeros(DType::i32, {B, T}));
      micro_targets_.push_back(pools[MemTag::activations].zeros(DType::i32, {B, T}));
    }
  }
  if (cfg.train.dtype == "fp16") scaler_.emplace(cfg.train.loss_scale, cfg.train.loss_scale_window);
  tokens_ = pools[MemTag::activations].zeros(DType::i32, {B, T});
  targets_ = pools[MemTag::activations].zeros(DType::i32, {B, T});
}

StepStats Trainer::pipeline_step() {
  const auto start = Clock::now();
  const int64_t accum = cfg_.train.grad_accum;
  StepStats s;
  const double loss_scale = scaler_ ? scaler_->scale() : 1.0;
  for (auto& dp : dps_) dp->zero_grads();
  std::vector<Tensor> tokens, targets;
  for (int64_t k = 0; k < accum; ++k) {
    train_data_.next(span_of(micro_tokens_[k]), span_of(micro_targets_[k]));
    tokens.push_back(micro_tokens_[k]), targets.push_back(micro_targets_[k]);
  }
  double loss = 0;
  {
    TraceSpan span(trace_, "pipeline");
    pipe_->set_trace(trace_);  // the runtime's actions nest inside "pipeline"
    loss = pipe_->run(tokens, targets, static_cast<float>(loss_scale / static_cast<double>(accum)));
  }
  double sum_squares = 0;
  {
    TraceSpan span(trace_, "grad sync wait");
    for (auto& dp : dps_) dp->wait_gradients();
    std::vector<model::Model*> chunks;
    std::vector<parallel::DataParallel*> dps;
    for (size_t c = 0; c < models_.size(); ++c) chunks.push_back(models_[c].get()), dps.push_back(dps_[c].get());
    tied_->sum_grads(chunks, dps);
    for (auto& dp : dps_) sum_squares += dp->grad_sum_squares();
    sum_squares = parallel::exact_group_sum(pp_, sum_squares);
  }
  s.grad_norm = std::sqrt(sum_squares) / loss_scale;
  // The last stage's rank knows the loss; the sum over pp gives it to all.
  return finish_step(s, loss_scale, parallel::exact_group_sum(pp_, loss), start);
}

// The update and the step's figures, once the gradients and their norm are
// ready: fp16 overflow skip, clipping, AdamW on every chunk.
StepStats Trainer::finish_step(StepStats s, double loss_scale, double loss, std::chrono::steady_clock::time_point start) {
  s.lr = schedule_.at(steps_);
  s.loss = dps_[0]->mean(loss);  // the same on every rank, as grad_norm
  const bool finite_loss = std::isfinite(s.loss);
  if (scaler_) {
    s.loss_scale = loss_scale;
    s.skipped = !scaler_->update(std::isfinite(s.grad_norm));
    s.bad = !finite_loss || (s.skipped && loss_scale <= cfg_.train.min_loss_scale);
  } else {
    s.bad = !finite_loss || !std::isfinite(s.grad_norm);
  }
  s.skipped = s.skipped || s.bad;  // a diverged step's update would write Inf / NaN weights
  if (!s.skipped) {
    const double clip = cfg_.train.grad_clip;
    // Clipping and unscaling are folded into AdamW's grad_scale (kernels/ops.h).
    const double clip_factor = clip > 0 && s.grad_norm > clip ? clip / s.grad_norm : 1.0;
    TraceSpan span(trace_, "optimizer");
    for (auto& dp : dps_) dp->update(s.lr, static_cast<float>(clip_factor / loss_scale));
  }
  s.step = ++steps_;
  s.tokens = dps_[0]->size() * cfg_.train.grad_accum * cfg_.train.micro_batch * cfg_.train.seq_len;
  s.seconds = seconds_since(start);
  return s;
}

double Trainer::flops_per_token() const {
  const model::ModelConfig& m = cfg_.model;
  return 6.0 * static_cast<double>(model::param_count(model::param_specs(m))) +
         12.0 * static_cast<double>(m.n_layer * m.n_embd * cfg_.train.seq_len);
}

StepStats Trainer::step() {
  if (pipe_) return pipeline_step();
  const auto start = Clock::now();
  const int64_t accum = cfg_.train.grad_accum;
  StepStats s;
  // fp16: gradients carry the loss scale until the update divides it out.
  const double loss_scale = scaler_ ? scaler_->scale() : 1.0;
  dps_[0]->zero_grads();
  double loss_sum = 0;
  for (int64_t k = 0; k < accum; ++k) {
    dps_[0]->begin_micro_batch(k == accum - 1);
    train_data_.next(span_of(tokens_), span_of(targets_));
    {
      TraceSpan span(trace_, "forward");
      loss_sum += models_[0]->forward(tokens_, targets_);
    }
    TraceSpan span(trace_, "backward");
    models_[0]->backward(static_cast<float>(loss_scale / static_cast<double>(accum)));
  }
  {
    TraceSpan span(trace_, "grad sync wait");  // grad_norm waits for the gradient collectives
    s.grad_norm = dps_[0]->grad_norm() / loss_scale;
  }
  return finish_step(s, loss_scale, loss_sum / static_cast<double>(accum), start);
}

double Trainer::evaluate() {
  LOOM_CHECK(val_data_ != nullptr, "evaluate without val data");
  TraceSpan span(trace_, "evaluate");
  if (pipe_) pipe_->set_trace(trace_);  // the current recorder (or none), never a stale one
  const int64_t global_batch = cfg_.train.micro_batch * dps_[0]->size();
  const int64_t batches =
      std::min(cfg_.train.eval_steps, std::max<int64_t>(1, val_data_->windows_per_epoch() / global_batch));
  double sum = 0;
  for (int64_t k = 0; k < batches; ++k) {
    val_data_->batch_at(k * global_batch, span_of(tokens_), span_of(targets_));
    sum += pipe_ ? pipe_->forward_only(tokens_, targets_) : models_[0]->forward(tokens_, targets_);
  }
  if (pipe_) sum = parallel::exact_group_sum(pp_, sum);  // only the last stage's rank holds the losses
  return dps_[0]->mean(sum / static_cast<double>(batches));
}

double measure_peak_flops(DType dtype) {
  constexpr int64_t n = 1024;
  MemoryTracker tracker;
  Pool pool(MemTag::workspace, Device::cpu(), tracker);
  OwnedTensor a = pool.empty(dtype, {n, n}), b = pool.empty(dtype, {n, n}), c = pool.empty(dtype, {n, n});
  kernels::fill(a, 0.5f);
  kernels::fill(b, 0.25f);
  kernels::matmul(c, a, b);  // warm-up: oneDNN builds its kernel
  double best = 1e30;
  for (int i = 0; i < 8; ++i) {
    const auto start = Clock::now();
    kernels::matmul(c, a, b);
    best = std::min(best, seconds_since(start));
  }
  return 2.0 * n * n * n / best;
}

void save_model(Trainer& trainer, const std::string& dir) {
  const model::ModelConfig& cfg = trainer.model().config();
  MemoryTracker tracker;
  Pool pool(MemTag::workspace, Device::cpu(), tracker);
  const bool lead_of_stage = trainer.dp().rank() == 0 && trainer.tp_rank() == 0;
  if (trainer.tp() == nullptr && trainer.pp_size() == 1) {  // one chunk holding whole tensors
    OwnedTensor full = pool.empty(DType::f32, {trainer.model().num_params()});
    trainer.dp().gather_master(full);
    if (lead_of_stage) model::save_model_dir(dir, cfg, full, model::ParamLayout::loom);
    return;
  }
  // Every chunk's master weights over dp, every tp rank's slices of them
  // (the same size on each), placed by name into the whole model's buffer by
  // dp = tp = 0 of each pipeline rank; the pipeline ranks' buffers (each
  // parameter filled by exactly one stage, zeros elsewhere) are then summed.
  const std::vector<model::ParamSpec> whole_specs = model::param_specs(cfg);
  std::map<std::string, int64_t> whole_offset;
  for (const model::ParamSpec& spec : whole_specs) whole_offset[spec.name] = spec.offset;
  OwnedTensor whole = pool.zeros(DType::f32, {model::param_count(whole_specs)});
  const int tp = trainer.tp_size();
  for (int c = 0; c < trainer.num_chunks(); ++c) {
    const model::Model& m = trainer.chunk(c);
    const int64_t P = m.num_params();
    OwnedTensor slices = pool.empty(DType::f32, {tp * P});
    if (tp == 1) {
      trainer.chunk_dp(c).gather_master(slices);
    } else {
      OwnedTensor full = pool.empty(DType::f32, {P});
      trainer.chunk_dp(c).gather_master(full);
      trainer.tp()->group().all_gather(slices, full)->wait();
    }
    if (!lead_of_stage) continue;
    for (int r = 0; r < tp; ++r) {
      const std::vector<model::ParamSpec> specs =
          model::param_specs(cfg, {tp, r}, model::PpStage{m.first_layer(), m.num_layers()});
      const float* src = Tensor(slices).data_as<float>() + r * P;
      for (const model::ParamSpec& spec : specs) {
        if (spec.pp_copy || (spec.replicated() && r != 0)) continue;  // written by stage 0 / tp rank 0
        float* dst = Tensor(whole).data_as<float>() + whole_offset.at(spec.name);
        for (const model::ShardRun& run : model::shard_runs(spec))
          if (run.global >= 0) std::copy_n(src + spec.offset + run.local, run.count, dst + run.global);
      }
    }
  }
  if (trainer.pp_group() != nullptr) trainer.pp_group()->all_reduce(whole, comm::ReduceOp::sum)->wait();
  if (lead_of_stage && trainer.pp_rank() == 0) model::save_model_dir(dir, cfg, whole, model::ParamLayout::loom);
}

}  // namespace loom::train
