// RunConfig: a training run's TOML config (DESIGN.md §7), with `--set
// section.key=value` overrides. Every default lives in the member
// initialisers below; config.cpp holds the key table (names, types, allowed
// values) and nothing else repeats them.
//
//   RunConfig c = load_run_config("configs/quickstart.toml", {"train.lr=3e-4"});
//
// Unknown sections and keys, a value of the wrong type and an out-of-range
// value are loom::Error naming the file (and line) or the --set argument, the
// key, the value and what is allowed.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "mesh/layout.h"
#include "model/config.h"
#include "model/lora.h"

namespace loom::train {

struct DataConfig {
  std::vector<std::string> train;  // paths or globs of .bin shards; required
  std::vector<std::string> val;    // required when train.eval_every > 0
  bool shuffle = true;             // train windows in a seeded order per epoch (val is always in order)
};

struct TrainConfig {
  int64_t seq_len = 1024;     // T
  int64_t micro_batch = 4;    // B
  int64_t grad_accum = 1;     // micro-batches per step
  // Sequences per step over every dp rank, = parallel.dp x micro_batch x
  // grad_accum; when set (> 0) it sets grad_accum, and must be divisible by
  // dp x micro_batch. 0: grad_accum as given.
  int64_t global_batch = 0;
  int64_t steps = 1000;
  double lr = 6e-4;           // peak, after warmup
  double min_lr = 6e-5;       // end of the cosine decay
  int64_t warmup_steps = 100;
  double weight_decay = 0.1;  // 2-D weights only (parallel/dp.h)
  // AdamW's betas and epsilon (Megatron's adam_beta1 / adam_beta2 / adam_eps;
  // Hugging Face's defaults are 0.9 / 0.999 / 1e-8).
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.95;   // GPT-3, nanoGPT, llm.c
  double adam_eps = 1e-8;
  double grad_clip = 1.0;     // max global grad norm; 0 = no clipping
  std::string dtype = "fp32";      // fp32, or bf16 / fp16 mixed precision (DESIGN.md §6)
  // fp16 only: dynamic loss scaling (train/loss_scaler.h) starts at
  // loss_scale and doubles after loss_scale_window overflow-free steps.
  double loss_scale = 65536.0;     // 2^16, torch GradScaler's default
  int64_t loss_scale_window = 1000;  // Megatron's default
  // fp16: an overflow at a loss scale at or below min_loss_scale is a bad
  // step (the scaler's own floor is 1: train/loss_scaler.h).
  double min_loss_scale = 1.0;
  // Divergence guard (train/run.cpp): a bad step (non-finite loss or gradient
  // norm, or an fp16 overflow at min_loss_scale) skips its update; more than
  // max_bad_steps of them in a row stop the run with an error.
  int64_t max_bad_steps = 0;
  std::string recompute = "none";  // none, selective, full (model/model.h)
  // cpu, or cuda: one NVIDIA GPU per process (kernels/cuda), in builds with CUDA.
  std::string device = "cpu";
  uint64_t seed = 1337;
  int64_t eval_every = 100;   // steps; 0 = never
  int64_t eval_steps = 20;    // val batches per evaluation
};

// Parsed and range-checked. The world size must be pp * dp * cp * tp; ep
// splits dp.
struct ParallelConfig {
  int64_t dp = 1, tp = 1, pp = 1, cp = 1, ep = 1;
  std::string cp_algo = "ring";  // ring or allgather (parallel/cp.h)
  bool ep_overlap = true;        // MoE layers compute while their rows travel (model/expert_parallel.h)
  int64_t zero_stage = 0;
  bool sequence_parallel = false;
  std::string pp_schedule = "1f1b";
  int64_t virtual_stages = 1;
  // Layers per pipeline stage (pp x virtual_stages of them, summing to
  // model.n_layer); empty: the balanced partition (parallel/pp_partition.h).
  std::vector<int64_t> pp_layers;
  double bucket_mb = 25.0;
  bool offload_optimizer = false;
  // ZeRO-Infinity's disk tier (parallel/offload.h): "optimizer" keeps the
  // optimizer's state (and bf16 / f16 runs' f32 master weights) in a file
  // per rank under offload_dir, streamed through offload_budget_mb of
  // buffers during each update; offload_direct: past the page cache
  // (O_DIRECT) where the filesystem allows. "params" (zero_stage 3) also
  // keeps the rank's parameter and gradient shards there, read ahead of
  // each unit's use and written as its gradients land.
  std::string offload = "none";
  std::string offload_dir;
  double offload_budget_mb = 64.0;
  bool offload_direct = true;
  std::string comm_algo = "mpi";
  double timeout_s = 300.0;  // every blocking wait on a communicator (comm/communicator.h); at most one week
  // Parameter-server training (train/ps_server.h, parallel/ps.h): mode = ps
  // makes ranks 0..ps_servers-1 of the job servers and the next dp ranks
  // workers. ps_server: "sum" (servers add the workers' gradients, workers
  // keep the optimizer: BytePS) or "optimizer" (servers hold the weights'
  // and AdamW's shards and apply the update: ps-lite; the workers' buckets
  // are then one per model unit, whatever bucket_mb says). staleness: how
  // many steps a worker may run ahead of the slowest (0: synchronous).
  std::string mode = "collective";
  int64_t ps_servers = 1;
  std::string ps_server = "sum";
  int64_t staleness = 0;  // every blocking wait on a communicator (comm/communicator.h); at most one week
};

// Checkpoints (train/checkpoint.h) go to dir/step_NNNNNN/ every `every` steps
// and after the last step; `dir` is also where `loom train` writes the final
// model.safetensors + loom_config.json.
struct CheckpointConfig {
  std::string dir;    // required when every > 0
  int64_t every = 0;  // steps; 0 = no checkpoints
  int64_t keep = 0;   // newest step dirs kept; 0 = keep all
  // auto: resume from dir/latest if it exists, else start fresh; never; or
  // the path of a step dir.
  std::string resume = "auto";
};

struct LogConfig {
  std::string metrics;  // JSONL path; empty = none
  int64_t every = 1;    // progress line every N steps
  std::string trace;    // Chrome trace event JSON of the run (Perfetto, chrome://tracing); empty = none
  // Every kernel op in the trace too (kernels/op_trace.h), on a GPU also its
  // device time, and a table of the ops' time at the end; needs `trace`.
  bool trace_ops = false;
  // Peak FLOP/s behind MFU, in TFLOP/s; 0 = measure an f32 GEMM at start-up.
  double peak_tflops = 0.0;
};

// [lora] (model/lora.h): low-rank adapters trained on a frozen base model,
// which also gives the run its [model] (so the run has no [model] keys).
struct LoraRunConfig {
  model::LoraConfig adapters;  // rank 0: no [lora] section, every parameter trains
  std::string base;            // the base: a loom or Hugging Face model directory, or a .gguf file
  std::string init;            // a PEFT adapter directory the adapters start from (empty: Kaiming A, zero B)
};

struct RunConfig {
  std::string model_preset;  // empty: ModelConfig's defaults
  model::ModelConfig model;
  DataConfig data;
  TrainConfig train;
  ParallelConfig parallel;
  CheckpointConfig checkpoint;
  LogConfig log;
  LoraRunConfig lora;
};

// The model's compute dtype for train.dtype: f32, bf16 or f16.
DType compute_dtype(const TrainConfig& t);
// The mesh the [parallel] sizes describe (pp, dp, cp, tp, ep).
mesh::MeshShape mesh_shape(const ParallelConfig& p);

// Reads `path` and applies `overrides` ("section.key=value", later wins).
RunConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides = {});
// The same for TOML text; `source` names it in errors (e.g. the path).
RunConfig parse_run_config(std::string_view toml_text, const std::string& source,
                           const std::vector<std::string>& overrides = {});

// The constraints across keys parse_run_config checks once every key is
// set (the model's own, the pipeline's stages and schedule, what tp, cp and
// ep must divide, ...): a loom::Error prefixed with `source` saying what is
// wrong and what is allowed. For a RunConfig built in code (loom plan's
// search).
void validate_run_config(const RunConfig& c, const std::string& source);  // train/config_checks.cpp

// Every key, section by section as in the TOML (model without preset: its
// explicit values), for checkpoint manifests.
nlohmann::ordered_json run_config_to_json(const RunConfig& c);

}  // namespace loom::train
