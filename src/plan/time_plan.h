// loom plan's step-time model: the seconds one training step of a run
// config takes on a cluster (plan/cluster.h), part by part, from FLOPs,
// bytes moved and the cluster's measured rates — a model, unlike the memory
// plan (memory_plan.h), which is the layout itself.
//
// Per rank and micro-batch, each of its chunks (the model, or its pipeline
// stages) costs
//   compute    forward FLOPs F = 2 x its active weights x tokens (the LM
//              head's matmul on the last stage; an embedding lookup is no
//              matmul) + attention 4 T C per token and layer (PaLM's count,
//              Chowdhery et al. 2022 App. B), / tp; backward 2 F; recompute
//              adds the blocks' forward again (full) or their attention
//              core (selective), never the head's; the loss's passes over
//              the f32 logits at the memory bandwidth; at the cluster's
//              achieved FLOP/s for the dtype (on a CPU, a rank with fewer
//              ranks than cores gets several cores; more ranks than cores
//              take turns, filling each other's waits)
//   tp         4 collectives of the residual stream per layer (Megatron's 2
//              all-reduces forward, 2 backward; under SP as many all-gathers
//              and reduce-scatters of the same volume; Korthikanti et al.
//              2022 §4.2.2), ring cost 2 (n - 1) (alpha + S / (n beta)); loom
//              waits for them, so none is hidden
//   cp         the ring's K and V blocks, cp - 1 steps forward and twice as
//              many bytes backward (dK, dV return), hidden behind the
//              attention they overlap (what is left is paid)
//   ep         per MoE layer, its rows' dispatch and combine forward and
//              both gradients backward: all-to-alls of B T k C / ep elements
//              to each of the ep - 1 others (and a count exchange); loom
//              waits for each, so none is hidden
// The pipeline's step is simulate_pp_schedule of its schedule with those
// forward and backward times (the slowest chunk's: the stage every rank
// waits for); its idle time is the bubble, and the first micro-batch's
// activations and the last one's gradients cross every stage boundary on
// the critical path (alpha + bytes / beta each). Then
//   dp         gradient reduction over dp x cp (under ep the rank's experts
//              over expert-dp x cp): ZeRO 0 a ring all-reduce of the f32
//              gradients and 1 a reduce-scatter, in the last micro-batch's
//              backward, which they overlap; 2 and 3 a reduce-scatter in
//              every micro-batch's backward; 1 to 3 the updated parameters'
//              all-gather after the step (not hidden); 3 also every
//              micro-batch's two parameter gathers (prefetched behind its
//              compute)
//   optimizer  AdamW over the rank's shard: memory-bound, 28 bytes moved per
//              element plus the compute copy
// A group whose ranks lie on one node uses the intra-node link, else the
// inter-node one; a ring collective's step uses the link's collective
// figures where the cluster gives them (measured by --calibrate). On a CPU
// whose cores the ranks share (Cluster::shared_cores) no transfer is hidden
// behind compute: the communicator's progress thread copies and sums on the
// same cores.
#pragma once

#include <string>

#include "plan/cluster.h"
#include "train/config.h"

namespace loom::plan {

struct StepTime {
  // Seconds per step, the slowest rank's. compute, tp and cp are summed over
  // its micro-batches and chunks; bubble is the schedule's idle time on it.
  double compute = 0, tp = 0, cp = 0, ep = 0, bubble = 0, pp = 0, dp = 0, optimizer = 0;
  double total = 0;
  double tokens_per_second = 0;  // the global batch's tokens / total
  // The step's model FLOPs (6 N + 12 L T C per token, N the active
  // parameters; PaLM's MFU count) and their share of the peak of the
  // devices the run occupies.
  double model_flops = 0, mfu = 0;
};

// Predicts cfg's step on `cluster`: its world (dp x tp x pp x cp ranks)
// placed in mesh order (tp fastest), devices_per_node ranks per node. A
// world larger than the cluster is a loom::Error, unless the cluster's
// devices are cores that ranks share (a CPU: Cluster::shared_cores). A dtype
// the cluster lists no figure for is a loom::Error naming the ones it has.
StepTime predict_step_time(const train::RunConfig& cfg, const Cluster& cluster);

// "step 1.234 s (compute 0.9, tp 0.1, ...), 12345 tokens/s, MFU 41.2 %"
std::string step_time_line(const StepTime& t);

}  // namespace loom::plan
