// Internal to model/: the mixture-of-experts MLP step (DESIGN.md §4 MoE):
// Mixtral's sparse MoE block as one more MlpStep (steps.h) — router, top-k,
// capacity per routing group, the balancing losses, the experts as one
// grouped GEMM, expert parallelism's dispatch and combine
// (expert_parallel.h) — and its activation layout.
//
//   logits = h @ router^T                    (N, E), compute dtype, then f32
//   scores = softmax(logits) | sigmoid(logits)
//   sel    = top-k of scores + bias           bias: the loss-free balancing bias, selection only
//   weight = scores[sel] (/ their sum)        Mixtral renormalises (norm_topk_prob)
//   keep   = capacity per routing group       ceil(cf x group tokens x k / E) per expert, highest scores kept
//   out    = sum over kept j of weight_j x expert_{sel_j}(h)  [+ shared experts(h)]
//
// Each expert is a SwiGLU: w2(silu(w1 x) * w3 x). The training objective
// adds, per MoE layer, aux_loss_coef x the Switch / GShard loss (E sum_e
// f_e P_e per group, averaged over the groups) and z_loss_coef x the mean
// of lse^2; their gradients enter the router in backward (scaled by the
// backward's dloss), so Model::forward's loss stays the language-model loss
// and the two are reported apart (Model::moe_stats).
//
// Layout independence: a routing group is routing_group whole sequences,
// so which choices drop depends only on the group's tokens, never on how the
// batch is split over dp, ep or tp ranks. Under ep > 1 every rank routes its
// own tokens and the rows travel to the experts' ranks and back.
#pragma once

#include <cstdint>
#include <functional>

#include "core/tensor.h"
#include "model/blocks.h"
#include "model/expert_parallel.h"
#include "model/model.h"
#include "model/steps.h"

namespace loom::model {

// What every MoE layer of a model shares while it runs.
struct MoeRun {
  const ModelConfig* cfg = nullptr;
  int64_t group_tokens = 0;  // tokens per routing group: routing_group x the sequence length
  EpOptions ep;
  bool training = true;      // false (serving, evaluation): no capacity, no statistics
  bool recomputing = false;  // full recompute's second forward of a layer: not counted again
  float dloss = 1.f;         // the backward's loss scale, for the aux and z losses' gradients
  MoeStats stats;
  // Context parallelism: a routing group's tokens are spread over the cp
  // group (its collectives; null at cp = 1); the rank's tokens' positions in
  // their sequences of seq_len tokens.
  RoutingGroupOps* cp = nullptr;
  std::vector<int32_t> positions;
  int64_t seq_len = 0;
  int cp_size = 1;
};

class MoeMlp final : public MlpStep {
 public:
  explicit MoeMlp(MoeRun& run) : run_(run) {}
  void forward(Tensor out, const Tensor& h, const LayerWeights& w, LayerActs& a,
               const BlockContext& c) const override;
  void recompute(LayerActs& a) const override;
  Tensor backward(const Tensor& dy, const Tensor& h, const LayerWeights& w, const LayerWeights& g,
                  const LayerActs& a, Scratch& s, const BlockContext& c) const override;

 private:
  MoeRun& run_;
};

// A MoE layer's buffer sizes for N routed tokens.
struct MoeSizes {
  int64_t N = 0, k = 0, E = 0, C = 0;
  int64_t groups = 0;  // routing groups of the rank's tokens (0: serving, no statistics)
  int64_t R = 0;   // rows this ep rank's experts may receive
  int64_t F = 0;   // an expert's hidden units on this tp rank
  int64_t Fs = 0;  // the shared experts' hidden units on this tp rank (0: none)
  bool ep = false;  // ep > 1: the exchange buffers
};
// N tokens in `groups` routing groups of group_tokens tokens each (cp: the
// group's tokens over every cp rank); group_tokens <= 0: no capacity (serving).
MoeSizes moe_sizes(const ModelConfig& cfg, int64_t N, int64_t groups, int64_t group_tokens, int tp, int ep);

using MoeAlloc = std::function<Tensor(Shape, DType)>;
// The buffers a MoE layer keeps (all of MoeActs but act and sh_act, which
// selective recompute drops), and those it drops.
void moe_kept_acts(MoeActs& a, const MoeSizes& z, const MoeAlloc& alloc, DType compute);
void moe_dropped_acts(MoeActs& a, const MoeSizes& z, const MoeAlloc& alloc, DType compute);
MoeScratch moe_scratch(const MoeSizes& z, const MoeAlloc& alloc);

}  // namespace loom::model
