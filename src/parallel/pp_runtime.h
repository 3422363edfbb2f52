// The pipeline runtime (DESIGN.md §5 PP): executes one rank's list of a
// PpSchedule (parallel/pp_schedule.h) on the rank's model chunks — forward
// and backward of micro-batch m on chunk c, activations and gradients sent to
// and received from the neighbouring stages with non-blocking send / recv —
// so any schedule the generators make runs through the same code.
//
//   PipelineRuntime rt(schedule, pp_group, {&chunk0, &chunk1}, pools);
//   chunk models zero their gradients (or DataParallel does), then
//   double loss = rt.run(tokens, targets, 1.f / m);  // one step's micro-batches
//
// With tied embeddings (GPT-2) the first and last stage each hold wte; the
// caller sums their gradients (parallel::TiedEmbedding, pp_tied.h), as
// Megatron.
//
// Transfers overlap compute: sends are posted as soon as their data exists
// and waited for only when the buffer is needed again; each receive is
// posted one compute ahead of its place in the list (before the forward or
// backward preceding the one that needs it), into a buffer of its own, so
// its message arrives while that compute runs. The communicator's progress
// thread moves the messages (comm/engine.h). Where receives are posted and
// gradient sends taken back is fixed by the schedule (pp_messages.h), so the
// message buffers a rank holds do not depend on timing.
//
// Chunk c of pipeline rank r is stage c * pp + r (pp_schedule.h); its stage
// (model/stage.h) holds that stage's layers (model.h PpStage) and at least as many
// activation slots as the schedule has its micro-batches in flight (a slot
// is taken by a micro-batch's forward and freed after its backward).
// Backward accumulates into the chunks' gradients (model.h), so a step's
// micro-batches add up as under plain gradient accumulation.
#pragma once

#include <concepts>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "comm/communicator.h"
#include "core/memory.h"
#include "core/trace.h"
#include "model/stage.h"
#include "parallel/pp_schedule.h"

namespace loom::parallel {

class PipelineRuntime {
 public:
  // pp: the pipeline group (its rank is the pipeline rank); chunks[c]: this
  // rank's stage of chunk c (model::Stage, e.g. a model::Model), for c <
  // schedule.virtual_stages. Buffers for messages in flight come from
  // pools[comm]. All must outlive the runtime.
  PipelineRuntime(const PpSchedule& schedule, comm::Communicator& pp, std::vector<model::Stage*> chunks,
                  Pools& pools);
  // The same from pointers to a Stage implementation (std::vector<Model*>).
  template <std::derived_from<model::Stage> Chunk>
  PipelineRuntime(const PpSchedule& schedule, comm::Communicator& pp, const std::vector<Chunk*>& chunks, Pools& pools)
      : PipelineRuntime(schedule, pp, std::vector<model::Stage*>(chunks.begin(), chunks.end()), pools) {}
  ~PipelineRuntime();
  PipelineRuntime(const PipelineRuntime&) = delete;
  PipelineRuntime& operator=(const PipelineRuntime&) = delete;

  // The slots chunk c's model needs: the most micro-batches the schedule has
  // in flight on it (pure; build the models with at least this many).
  static int slots_needed(const PpSchedule& schedule, int rank, int chunk);

  // Runs this rank's actions for one step. tokens[m], targets[m]: micro-batch
  // m's (B, T) i32 (read only by the ranks holding the first / last stage;
  // others may pass empty spans). dloss: each micro-batch's loss weight
  // (1 / m averages them). samples[m]: micro-batch m's global sample
  // indices (model::Stage::set_samples; every rank's), or none. Returns the
  // mean of the micro-batches' losses on the rank holding the last stage, 0
  // elsewhere.
  double run(std::span<const Tensor> tokens, std::span<const Tensor> targets, float dloss,
             std::span<const std::vector<int64_t>> samples = {});
  // One micro-batch forward through every stage, no backward (evaluation):
  // the loss on the rank holding the last stage, 0 elsewhere.
  double forward_only(const Tensor& tokens, const Tensor& targets);
  // Called before each backward with its chunk and micro-batch (a chunk's
  // micro-batches run backward in order 0 .. m - 1): data parallelism
  // reduces a chunk's gradients in its last one.
  void set_before_backward(std::function<void(int chunk, int micro_batch)> hook);

  // Seconds of the last run() spent blocked on messages — receives, and
  // sends whose buffer is needed again (what the bubble and transfers cost
  // this rank) — and computing forward / backward.
  double wait_seconds() const { return wait_s_; }
  double compute_seconds() const { return compute_s_; }

  // Records run()'s actions as spans into `trace` (null, the default: off,
  // costing a branch per action): "forward m<m> c<c>" and "backward m<m>
  // c<c>" (the compute), "send_act" / "send_grad" (posting a send, with the
  // gradient's copy), "post recv_act m<m> c<c>" / "post recv_grad m<m> c<c>"
  // (posting a receive from another rank), "recv wait" (blocked on a
  // receive, or on a send whose buffer the next action needs). The recorder
  // must outlive its use.
  void set_trace(TraceRecorder* trace);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  double wait_s_ = 0, compute_s_ = 0;
};

}  // namespace loom::parallel
