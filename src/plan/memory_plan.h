// loom plan's memory model: the bytes each rank of a training run holds per
// memory tag, predicted from the run's config by the functions that lay the
// memory out — Model::state_bytes (parameters, gradients, activations), the
// data-parallel layout (dp_layout.h: buckets and each rank's shard), AdamW's
// two moments per shard element — without building anything. The
// prediction is the layout, not a formula: it equals what
// `loom train --memory-json` measures, line for line.
//
// Per rank, with P its parameters (its tp slice; under pipelining those of
// its stages, each a chunk of its own: train::rank_stages), S its dp shard
// of them (every parameter under ZeRO 0, its 1/dp slice under ZeRO 1 to 3:
// shard_segments decides, unevenly where dp does not divide a bucket; a
// tied embedding's copy on the first or last stage is a bucket of its own):
//   params       P x the compute dtype's size; under ZeRO 3 S x that size
//   grads        4 P (f32, whole on every rank under ZeRO 0 and 1), 4 S under ZeRO 2 and 3
//   master       4 S when the compute dtype is not f32 or the optimizer is offloaded
//   optimizer    8 S (AdamW's m and v), + 4 S offloaded gradients
//   activations  the model's layout (activation_bytes; a stage's with the activation slots
//                its schedule keeps in flight) + the step's tokens and targets (2 B T i32;
//                under cp also the whole sequences they are cut from; under pipelining
//                every micro-batch's as well)
//   workspace    at peak: 4 x the largest bucket (init_params draws one bucket at a time),
//                4 S of a chunk when the run writes its model (gather_master packs the shard), or
//                a cp attention call's packed q, running result and gradients (cp.h call_bytes)
//   comm         the peak of what the step's hook calls hold, replayed over its
//                passes as DataParallel keeps it (dp_layout.h zero_comm_peak):
//                under ZeRO 2 and 3 the bucket buffers (and ZeRO 3's gathered
//                units), under ZeRO 0/1 the packed reductions of spread buckets
//                (dense buckets reduce in place), and beside them a cp
//                attention call's K/V blocks in flight (and dK/dV travelling)
//                while a layer computes; or, where more, the packed all-gather
//                of spread buckets after the update (ZeRO 1 and 2) and of the
//                master when the model is written; under pipelining (ZeRO 0/1)
//                a cp call's buffers, every chunk's packed reductions and the
//                message buffers its runtime keeps (pp_messages.h: B T C per
//                message, in the compute dtype for activations, f32 for gradients)
//   kv_cache     0 (serving's)
// current_bytes is the same but for workspace and comm, which are freed (0),
// except the pipeline's message buffers, cached for the next step.
//
// Under expert parallelism each rank holds its experts (param_specs' ep
// rank), sharded over expert-dp x cp beside the dense parameters over
// dp x cp; a bucket of a group spread over the flat buffer is reduced from
// a packed f32 copy held in comm until the step's gradients are waited for.
// The MoE layers' exchange buffers are the model's own activations, sized
// for the worst routing (model/moe.h moe_sizes), so they are predicted
// exactly whatever the router does.
//
// LoRA ([lora]): the adapters are what trains (their gradients, shards and
// AdamW state as above), and every rank holds the frozen base beside them
// in params as load_frozen_base reads it (model/lora.h frozen_base_bytes:
// its tp slice in the compute dtype, or a GGUF's blocks and the rest in f32).
//
// Every layout loom trains on the CPU: dp (ZeRO 0 to 3) x cp x ep x tp,
// and pp x dp (ZeRO 0 and 1) x cp x ep x tp, but ep and cp together with
// pipelining (refused with a message saying so).
#pragma once

#include <string>
#include <vector>

#include "core/memory.h"
#include "train/config.h"
#include "train/reports.h"

namespace loom::plan {

// The textbook figures for the same rank, printed beside loom's own:
//   model states  the ZeRO paper's mixed-precision Adam (Rajbhandari et al.
//                 2020, §3.1: 2 Ψ fp16 parameters + 2 Ψ fp16 gradients +
//                 K Ψ optimizer states, K = 12) for the rank's Ψ parameters,
//                 divided over the Nd dp ranks as its stage does (§5.1:
//                 1: 4 Ψ + 12 Ψ / Nd, 2: 2 Ψ + 14 Ψ / Nd, 3: 16 Ψ / Nd).
//                 loom keeps gradients in f32 (2 Ψ more than the paper's
//                 fp16 ones under stages 0 and 1) and, in fp32 runs, no
//                 master copy.
//   activations   Korthikanti et al. 2022's s b h (34 + 5 a s / h) per layer
//                 (their tp and SP forms) times the layers, without the
//                 5 a s / h term (loom's attention keeps no s x s scores),
//                 for recompute none: train/reports.h's prediction.
struct Textbook {
  double model_states = 0;  // bytes
  double activations = 0;   // bytes, recompute none
};

struct RankMemory {
  train::MemoryRankCoords at;
  MemoryReport bytes;  // per tag: peak, and current at the run's end
  Textbook textbook;
};

struct MemoryPlanOptions {
  bool writes_model = false;  // the run writes its final model (--out or checkpoint.dir)
};

// Every rank of cfg's mesh, in world-rank order. loom::Error for a config
// load_run_config would refuse, and for the layouts not yet predicted.
std::vector<RankMemory> plan_memory(const train::RunConfig& cfg, const MemoryPlanOptions& o = {});

// One rank of it (world_rank in 0 .. world - 1): what loom plan's search
// checks a layout's ranks with without laying out every one.
RankMemory plan_memory_rank(const train::RunConfig& cfg, int world_rank, const MemoryPlanOptions& o = {});

// A rank's prediction as loom plan prints it: its coordinates, the bytes
// per tag (at the end and at peak, MiB), its model states and activations
// beside the textbook figures.
std::string memory_plan_table(const RankMemory& r);

}  // namespace loom::plan
