// `loom bench train`: tokens/s, step time, MFU and peak memory of full
// training steps (forward, backward, global-norm clip, AdamW) of a preset
// model on random tokens. Under mpirun -np N every rank runs the same steps
// data parallel (parallel/dp.h) on its own tokens; rank 0 prints, adding the
// global tokens/s and how much gradient communication backward hid. With
// --tp, groups of tp ranks hold one model replica (parallel/tp.h) and the
// share of a step spent in their collectives is printed. With --pp, groups
// of pp ranks run the pipeline's stages; each rank's bubble (time waiting
// over time computing) and peak activation memory are printed next to the
// schedule's theory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::bench {

struct TrainBenchOptions {
  std::string model = "gpt2-124m";  // a model preset (model/config.h)
  std::vector<std::string> sets;    // key=value over the preset's [model] keys (e.g. n_layer=4)
  int64_t batch = 4;                // B: sequences per step
  int64_t seq = 128;                // T: tokens per sequence
  int steps = 10;                   // timed steps
  int warmup = 2;                   // untimed steps before them
  std::string dtype = "fp32";       // fp32 | bf16 | fp16 (mixed precision: 16-bit compute, fp32 master;
                                    // fp16 with dynamic loss scaling)
  std::string recompute = "none";   // none | selective | full (model/model.h)
  bool json = false;                // one JSON Lines object instead of a table
  // After the timed steps, `steps` more with every kernel op timed
  // (kernels/op_trace.h), and their table of ops printed after the figures.
  bool ops = false;
  int threads = 1;                  // recorded in the output
  // Data parallelism over the mpirun job's ranks (a plain process is a group of one).
  int zero_stage = 0;               // 0-3 (parallel/dp.h)
  double bucket_mb = 25.0;          // stages 0-2: f32 gradient MiB per bucket
  std::string comm_algo = "mpi";    // mpi | ring (comm/communicator.h); under mpirun only
  // Tensor parallelism over groups of tp neighbouring ranks (parallel/tp.h);
  // the job's ranks / tp form the data-parallel groups.
  int tp = 1;
  bool sequence_parallel = false;
  // Pipeline parallelism (parallel/pp_runtime.h) over pp ranks of the job
  // (pp x dp x tp = its ranks): a step runs micro_batches micro-batches of
  // (B, T) through the schedule (afab | 1f1b | interleaved, the latter with
  // virtual_stages chunks per rank).
  int pp = 1;
  std::string schedule = "1f1b";
  int virtual_stages = 1;
  int micro_batches = 8;
  // Layers per stage (pp x virtual_stages of them, as parallel.pp_layers);
  // empty: the balanced partition (parallel/pp_partition.h).
  std::vector<int64_t> pp_layers;
  // Context parallelism (parallel/cp.h) over cp ranks of the job (dp x cp =
  // its ranks): each holds seq / cp tokens of every sequence, zig-zag
  // unless cp_contiguous; the run is refused when a rank's predicted
  // activations and cp buffers exceed activation_budget_mb (0: no budget).
  int cp = 1;
  bool cp_bench = false;  // --cp given: the cp figures (cp = 1 too, the baseline of a cp sweep)
  std::string cp_algo = "ring";
  bool cp_contiguous = false;
  double activation_budget_mb = 0;
  // Mixture of experts (model/moe.h): the preset (a Llama) with moe experts
  // in every layer's MLP, top_k a token, capacity_factor (0: dropless), over
  // ep ranks of the job (dp = ranks); timed beside the dense model of the
  // same active parameters (d_ff x top_k) on the same ranks.
  int moe = 0;
  int64_t top_k = 2;
  double capacity_factor = 1.25;
  int ep = 1;
  std::string command;              // the command line that reproduces the run
};

// The preset's name with --set's items after it, as the output prints it.
inline std::string model_label(const TrainBenchOptions& o) {
  std::string label = o.model;
  for (const std::string& kv : o.sets) label += " " + kv;
  return label;
}

// Runs the benchmark, prints the result to stdout; returns the exit code.
// Unknown presets, bf16 and T > max_seq_len are loom::Errors.
int run_train_bench(const TrainBenchOptions& opts);

}  // namespace loom::bench
