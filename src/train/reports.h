// What a training run reports besides its losses (train/run.cpp, loom bench
// train): the model FLOPs per token and the peak FLOP/s behind MFU, and the
// --memory-report lines on activations (measured, per recompute policy, and
// against Korthikanti et al.'s prediction).
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "core/memory.h"
#include "model/config.h"
#include "model/model.h"
#include "parallel/cp.h"

namespace loom::train {

// Model FLOPs per trained token of m at seq_len: 6 N + 12 n_layer n_embd
// seq_len (the attention scores and mixing, forward and backward: PaLM
// appendix B), N the whole model's parameters (every tp rank's together).
double model_flops_per_token(const model::ModelConfig& m, int64_t seq_len);
// The same for LoRA fine-tuning (model/lora.h) with `adapters` trained
// parameters: the frozen base runs forward and its input gradients (4 x its
// parameters, no weight gradients), the adapters forward, backward and
// their u = x A^T once more in backward (8 x theirs), attention as above.
double lora_flops_per_token(const model::ModelConfig& m, int64_t seq_len, int64_t adapters);

// FLOP/s of a 1024^3 GEMM in `dtype` (the run's compute dtype) on this
// process's threads, best of 8 runs: the peak MFU is measured against when
// log.peak_tflops = 0. It is what this machine's GEMM reaches now, not the
// hardware's peak (a busy machine lowers it, and the model's larger GEMMs may
// beat it: MFU can then read over 100%); set log.peak_tflops for a datasheet
// figure. On a GPU (a registered backend's device): an 8192^3 GEMM, the mean
// of 8 after a warm-up (a GPU's GEMM needs that size to fill the chip).
double measure_peak_flops(DType dtype = DType::f32, Device device = Device::cpu());

// One line for --memory-report: the measured activations peak of `report`,
// and the activation bytes of m's layout under each recompute policy with the
// chosen one's reduction against none.
std::string recompute_report(const model::Model& m, const MemoryReport& report);

// One line for --memory-report: the activation bytes one layer of m's layout
// holds on this rank, next to Korthikanti et al.'s prediction ("Reducing
// Activation Recomputation in Large Transformer Models", 2022) for its tp and
// SP: s b h (34 + 5 a s / h) per layer, 2-byte activations, with TP
// s b h (10 + 24 / t + 5 a s / (h t)), with TP + SP s b h / t (34 + 5 a s / h).
// loom's attention is flash-style and keeps no s x s scores, so the 5 a s / h
// term is left out of the prediction; bytes are scaled to the compute dtype.
// The formula assumes d_ff = 4 h (GPT-2) and recompute = none.
std::string activation_prediction_report(const model::Model& m);
// Context parallelism: the most a cp attention call holds beside the
// activations (K/V blocks in flight, the running result, dK/dV travelling;
// parallel/cp.h peak_bytes), in the comm and workspace rows of the table.
std::string cp_buffers_report(const model::Model& m, const parallel::ContextParallelAttention& cp);
// Where a rank sits in the mesh, for its memory lines.
struct MemoryRankCoords {
  int world_rank = 0, pp_rank = 0, dp_rank = 0, cp_rank = 0, tp_rank = 0, ep_rank = 0;
};
// --memory-json (and loom plan's prediction, in the same form): one line
// per memory tag, {"world_rank", "pp_rank", "dp_rank", "cp_rank",
// "tp_rank", "ep_rank", "tag", "current_bytes", "peak_bytes"}, each ending
// with a newline.
std::string memory_json_lines(const MemoryRankCoords& at, const MemoryReport& report);
// The prediction above, in bytes per layer.
double predicted_layer_activation_bytes(const model::ModelConfig& cfg, int64_t B, int64_t T, DType compute, int tp,
                                        bool sequence_parallel);

}  // namespace loom::train
