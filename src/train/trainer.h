// The single-process training loop (DESIGN.md §7): a step is grad_accum
// micro-batches of (micro_batch, seq_len) tokens, averaged (backward with
// dloss = 1 / grad_accum), global-norm clipped and applied with AdamW under
// a warmup + cosine learning rate. train.dtype = bf16 builds the model with
// bf16 compute; the model owns the f32 master weights (model/model.h), which
// AdamW updates and checkpoints and save_model write. train.dtype = fp16 does
// the same with f16 compute and dynamic loss scaling (train/loss_scaler.h).
//
//   Pools pools;
//   Trainer t(cfg, pools);
//   for (...) StepStats s = t.step();
//   double val = t.evaluate();
//
// The run context (mesh/context.h) gives the mesh; its axes are the run's
// parallelism (a one-process run: every axis of one rank).
//
// Data parallelism (parallel/dp.h): over mesh.dp(), each rank trains its
// replica (or shard: parallel.zero_stage) on its slice of every global batch
// of dp x micro_batch x grad_accum sequences; losses are averaged over the
// group. A dp axis of one rank is plain training (stage 0).
//
// Context parallelism (parallel/cp.h): over mesh.cp(), each rank holds two
// zig-zag chunks of every sequence (seq_len / cp tokens) and attention
// passes keys and values around the cp group; gradients and ZeRO shards
// span dp x cp, and the loss, each rank's mean over its tokens, is averaged
// over dp x cp (every rank has the same number of targets).
//
// Tensor parallelism (parallel/tp.h): over mesh.tp(), the model holds
// this rank's slice (heads, hidden units, vocabulary rows) and the ranks of a
// tp group train on the same data; dp groups are per tp rank (mesh.h), the
// gradient norm spans both.
//
// Deterministic: the same config and seed (and thread count) give bitwise
// identical losses.
//
// A straggler for tests and benchmarks (environment): LOOM_DP_DELAY = "r:ms"
// makes data-parallel rank r (a parameter-server worker's index) sleep ms
// milliseconds before each step; "rotate:ms" makes rank (step mod dp) sleep
// before step `step`: each rank is the straggler one step in dp.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/memory.h"
#include "core/trace.h"
#include "model/model.h"
#include "train/config.h"
#include "train/data_loader.h"
#include "train/loss_scaler.h"
#include "train/lr_schedule.h"
#include "train/moe_step.h"
#include "train/reports.h"  // the run's reports (measure_peak_flops, ...), for train/run.cpp
#include "comm/communicator.h"
#include "mesh/context.h"
#include "train/rank_chunks.h"
#include "parallel/ps.h"

namespace loom {
class StopSignals;  // core/stop_signal.h
}  // namespace loom

namespace loom::train {

struct StepStats {
  int64_t step = 0;  // 1-based: updates done after this step
  double loss = 0;   // mean over the step's micro-batches
  double lr = 0;
  double grad_norm = 0;  // before clipping
  double seconds = 0;    // wall time of the step
  int64_t tokens = 0;    // dp * micro_batch * grad_accum * seq_len
  std::optional<double> val_loss;
  // fp16 (train/loss_scaler.h): the loss scale this step's backward used
  // (0 without fp16) and whether its gradients overflowed, so its update was
  // skipped (grad_norm is then Inf or NaN).
  double loss_scale = 0;
  bool skipped = false;
  // A bad step (the divergence guard, train/run.cpp): a non-finite loss or
  // gradient norm, or under fp16 an overflow at or below
  // train.min_loss_scale. Its update is skipped (skipped is then true).
  bool bad = false;
  // A mixture-of-experts model's routing this step (train/moe_step.h).
  std::optional<MoeStepStats> moe;
  // parallel.offload: the step's disk traffic (every chunk's), the time
  // forward and backward waited for parameter reads (offload = params), and
  // the update's time (the state streaming through).
  struct Disk {
    double wait_seconds = 0, update_seconds = 0;
    int64_t bytes = 0;  // read and written
  };
  std::optional<Disk> disk;
};

class Trainer {
 public:
  // Opens the data (train, and val when eval_every > 0), builds the model
  // from ctx.pools and initialises it from train.seed. Throws loom::Error for
  // bad data. The mesh's dp, tp and pp axes must have the sizes
  // parallel.dp, tp and pp say. Collective over the mesh, as are step,
  // evaluate and the checkpoint functions. ctx must outlive the trainer.
  // Under pipeline parallelism the rank holds virtual_stages chunks of the
  // balanced partition (parallel/pp_partition.h), each with its own
  // DataParallel, run by the schedule parallel.pp_schedule over grad_accum
  // micro-batches (parallel/pp_runtime.h); model() and dp() are chunk 0's.
  Trainer(const RunConfig& cfg, Context& ctx);

  StepStats step();
  // Mean loss over the first eval_steps global batches of val (fewer if val
  // holds fewer windows; each rank its slice), always the same; no gradients.
  double evaluate();

  const RunConfig& config() const { return cfg_; }
  model::Model& model() { return *rank_.models[0]; }
  // Pipeline parallelism: the rank's chunks (one without it).
  int num_chunks() const { return static_cast<int>(rank_.models.size()); }
  model::Model& chunk(int c) { return *rank_.models[static_cast<size_t>(c)]; }
  parallel::DataParallel& chunk_dp(int c) { return *rank_.dps[static_cast<size_t>(c)]; }
  mesh::Mesh& mesh() { return mesh_; }
  int pp_size() const { return mesh_.shape().pp; }
  int pp_rank() const { return mesh_.coord().pp; }
  // Steps run, including steps an fp16 overflow skipped (Megatron counts them
  // too): the LR schedule and data follow it; AdamW counts applied updates.
  int64_t steps_done() const { return steps_; }
  void set_steps_done(int64_t steps) { steps_ = steps; }
  // The fp16 loss scaler; null under fp32 and bf16.
  DynamicLossScaler* loss_scaler() { return scaler_ ? &*scaler_ : nullptr; }
  // The sharding and its state (master weights) and the optimizer (AdamW
  // moments, update count) for checkpoints (train/checkpoint.h); the LR
  // follows from steps_done(). chunk_optimizer(c) is chunk c's.
  parallel::DataParallel& dp() { return *rank_.dps[0]; }
  AdamW& optimizer() { return *rank_.optimizers[0]; }
  AdamW& chunk_optimizer(int c) { return *rank_.optimizers[static_cast<size_t>(c)]; }
  // The tensor-parallel collectives; null without tensor parallelism.
  parallel::TensorParallel* tp() { return rank_.tp.get(); }
  int tp_rank() const { return mesh_.coord().tp; }
  int tp_size() const { return mesh_.shape().tp; }
  DataLoader& train_data() { return train_data_; }
  const LrSchedule& lr_schedule() const { return schedule_; }
  // Model FLOPs per trained token of the run's model (train/reports.h).
  double flops_per_token() const;
  // step and evaluate record their spans (forward, backward, grad sync wait,
  // optimizer, evaluate) into `trace`; null (the default) records nothing.
  // The cp attention's blocks and waits nest in forward and backward.
  void set_trace(TraceRecorder* trace) {
    trace_ = trace;
    if (rank_.cp) rank_.cp->set_trace(trace);
  }
  // Parameter-server training (parallel.mode = ps, parallel/ps.h): this
  // worker's link to the servers; null in collective mode.
  parallel::PsWorker* ps() { return ps_.get(); }
  // The servers apply the update (parallel.ps_server = optimizer): the
  // worker's own optimizer does not step.
  bool updated_by_servers() const { return ps_ && ps_->kind() == parallel::PsKind::optimizer; }
  // Asynchronous parameter-server training (parallel.staleness > 0): the
  // workers never communicate with each other after start-up, so losses,
  // evaluations and stop signals are each worker's own.
  bool asynchronous() const { return ps_ && ps_->asynchronous(); }
  // Context parallelism's attention; null without it.
  const parallel::ContextParallelAttention* cp() const { return rank_.cp.get(); }
  // LoRA ([lora], model/lora.h): the frozen base the adapters train on, and
  // the SHA-256 of its weights file (what checkpoints record, so a resume
  // on another base is refused); null and "" without [lora].
  const model::FrozenWeights* lora_base() const { return lora_base_.get(); }
  const std::string& lora_base_sha256() const { return lora_base_sha256_; }

 private:
  RunConfig cfg_;
  mesh::Mesh& mesh_;
  StepStats pipeline_step();
  // Under context parallelism the rank's tokens and targets (B, seq_len / cp)
  // of the loader's whole sequences in seq_tokens_ / seq_targets_: the
  // targets were shifted before the split, so a chunk's last target is the
  // first token of the next chunk, wherever that chunk lives. Without cp the
  // loader writes tokens and targets directly.
  void take_rank_tokens(const Tensor& tokens, const Tensor& targets) const;
  // The mean of a per-rank value over the data-parallel replicas (an
  // asynchronous worker's own value).
  double mean_over_replicas(double value);
  double backward_scale(double loss_scale) const;
  StepStats finish_step(StepStats s, double loss_scale, double loss, std::chrono::steady_clock::time_point start);

  // The host's memory of a device run: its batches, which the data loaders
  // write and the model copies to the device (model/model.h's forward).
  MemoryTracker host_tracker_;
  Pool host_batches_{MemTag::activations, Device::cpu(), host_tracker_};
  // ZeRO-Offload on a device (parallel.offload_optimizer): the host pools of
  // the master weights, the gradients' host copy and AdamW's moments, apart
  // from the device's (ctx.pools: its memory report is the GPU's).
  std::unique_ptr<Pools> host_state_;  // before rank_: its DataParallel and AdamW allocate from it
  std::unique_ptr<model::FrozenWeights> lora_base_;  // before rank_: its models read it
  std::string lora_base_sha256_;
  RankChunks rank_;  // the rank's chunks (one without pipelining), their DataParallel, tp ops, pipeline
  std::vector<OwnedTensor> micro_tokens_, micro_targets_;  // a step's micro-batches (pipelining)
  LrSchedule schedule_;
  DataLoader train_data_;
  std::unique_ptr<DataLoader> val_data_;
  std::optional<DynamicLossScaler> scaler_;
  int64_t steps_ = 0;
  int64_t disk_bytes_ = 0;  // the offload files' traffic until the last step (StepStats::Disk)
  OwnedTensor tokens_, targets_;  // (B, T) i32, T the rank's tokens of each sequence (seq_len / cp)
  OwnedTensor seq_tokens_, seq_targets_;  // (B, seq_len) i32 whole sequences, under cp
  TraceRecorder* trace_ = nullptr;
  std::unique_ptr<parallel::PsWorker> ps_;
  int delay_ms_ = 0;          // LOOM_DP_DELAY for this rank
  bool delay_rotates_ = false;  // LOOM_DP_DELAY = rotate:ms
};

struct TrainOptions {
  std::string metrics_path;  // JSONL, one object per step; overrides log.metrics when set
  std::string out_dir;       // final model.safetensors + loom_config.json; overrides checkpoint.dir
  bool memory_report = false;
  // Every rank's current and peak bytes per memory tag at the end, as JSON
  // lines on stdout (memory_json_lines): what loom plan predicts.
  bool memory_json = false;
  // loom train --plan: each rank's predicted bytes per tag (loom plan's,
  // indexed by world rank, the step's own figures: no final model written),
  // printed beside what the rank measured after its first step.
  std::vector<MemoryReport> planned_memory;
  // loom train --plan --plan-cluster: loom plan's predicted step seconds
  // (0: none), printed at the end beside the measured median step.
  double planned_step_s = 0;
  // loom train --memory-budget-mb: after each step the process's peak
  // resident memory (VmHWM) must be within it, else the run stops with an
  // error (its checkpoints kept); 0: no budget.
  int64_t memory_budget_bytes = 0;
  bool progress = true;      // progress lines on stdout
  // SIGTERM / SIGINT handlers the caller installed before anything else
  // (loom train: before the ranks compare configs, so that a signal in
  // start-up is not fatal); null: run_training installs its own.
  const StopSignals* stop = nullptr;
};

struct TrainSummary {
  std::vector<StepStats> steps;
  std::optional<double> initial_val_loss;  // before the first step
  std::optional<double> final_val_loss;
  double seconds = 0;
  double peak_flops = 0;  // FLOP/s of one rank behind MFU (MFU = model FLOP/s of all ranks / (dp x tp x peak))
  // The SIGTERM, SIGINT or SIGUSR1 that stopped the run early (after a checkpoint,
  // without the final model), or 0: the run trained all its steps.
  int stop_signal = 0;
};

// train/run.cpp. ctx: as for Trainer. Only rank 0 of the mesh prints
// and writes metrics and the final model. Before anything else, every output
// location (checkpoint.dir, --out, log.metrics, log.trace's directory) is
// created and probed for writing, and checkpoint.dir and --out are locked for
// the run (core/dir_lock.h). Resumes as checkpoint.resume says
// (train/checkpoint_dir.h; a checkpoint at or past train.steps is an error),
// then runs up to cfg.train.steps steps in all with evaluation (before the
// first step of a fresh run, every eval_every steps and after the last),
// progress lines every log.every steps, metrics (a resumed run first drops
// the records past its checkpoint), checkpoints every checkpoint.every steps
// and after the last, and the final model written to out_dir /
// checkpoint.dir, then log.trace (every rank records its timeline and rank 0
// merges them: core/trace.h). summary.steps holds this run's steps only.
// Divergence guard: more than train.max_bad_steps bad steps in a row
// (StepStats::bad) is a loom::Error naming the step, with nothing saved.
// SIGTERM / SIGINT: the ranks agree after each step on whether one arrived;
// then the step is checkpointed (when checkpointing is on), the trace
// written, no final model, and summary.stop_signal says which signal.
TrainSummary run_training(const RunConfig& cfg, const TrainOptions& options, Context& ctx);

// A bf16 run on the CPU needs a bf16 GEMM (without one the matmuls would widen bf16 to f32: slower than fp32
// with bf16's rounding): a loom::Error naming `what` ("train.dtype = bf16"), the --isa cap or the CPU that
// lacks it, and how to ask for fp32 (`fp32`) otherwise. The Trainer checks its config with it.
void require_cpu_bf16_gemm(const std::string& what, const std::string& fp32);

// Writes dir/model.safetensors (every parameter, f32 master weights, under
// its spec name, loom layout) and dir/loom_config.json (model/config_json.h);
// creates dir. Collective: every rank gathers the weights (over dp, then
// the tp slices into whole tensors), rank 0 of both writes.
void save_model(Trainer& trainer, const std::string& dir);

}  // namespace loom::train
