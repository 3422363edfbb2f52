// Internal to model/: the router of a token-choice MoE layer (model/moe.h)
// as pure functions on host f32 arrays — scores, top-k, capacity drops,
// the balancing losses and their gradients. Each token's decisions depend
// only on its own scores (and, for capacity, on the other tokens of its
// routing group), so any split of the groups over ranks decides the same.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/config.h"

namespace loom::model {

struct RouterShape {
  int64_t N = 0;  // tokens
  int64_t E = 0;  // experts
  int64_t k = 0;  // choices per token
};

// scores (N, E) = softmax of each row of logits (or each logit's sigmoid);
// lse (N) = each row's log-sum-exp (the z-loss's), for either score.
void router_scores(std::span<float> scores, std::span<float> lse, std::span<const float> logits, RouterShape s,
                   RouterScore score);

// Each token's k experts and their weights: kernels::moe_top_k (ops.h).

// An expert's capacity in a group of `tokens` tokens: ceil(factor x tokens
// x k / E); factor 0 is dropless (-1: every choice is kept).
int64_t expert_capacity(float factor, int64_t tokens, int64_t k, int64_t E);

// keep (N, k): 1 where choice (t, j) is kept, else 0. Tokens are taken in
// groups of group_tokens consecutive tokens (N a multiple of it); in each
// group every expert keeps at most `capacity` of its choices (capacity < 0:
// all): those with the highest score for it, ties to the earlier token
// (Megatron's "probs" drop policy, decided per group, never per rank).
void apply_capacity(std::span<int32_t> keep, std::span<const int32_t> sel, std::span<const float> scores,
                    RouterShape s, int64_t group_tokens, int64_t capacity);

// Per-group statistics of the balancing losses over the router's choices
// before any drop: count[g][e] choices of expert e, and prob[g][e] the
// group's mean of e's normalised score (softmax: the score; sigmoid: the
// score over the row's sum, DeepSeek-V3's sequence-wise loss).
struct GroupStats {
  int64_t groups = 0, group_tokens = 0;
  int64_t local_tokens = 0;  // a group's tokens on this rank (group_tokens, or its share under cp)
  std::vector<double> count, prob;  // (groups, E)
};
GroupStats group_stats(std::span<const int32_t> sel, std::span<const float> scores, RouterShape s,
                       int64_t group_tokens, RouterScore score);
// The Switch / GShard load-balancing loss averaged over groups: E x sum_e
// f_e P_e with f_e = count_e / (group_tokens k): 1 when perfectly balanced.
double aux_loss(const GroupStats& g, RouterShape s);
// The ST-MoE router z-loss: the mean over tokens of lse^2.
double z_loss(std::span<const float> lse);

// The logits' gradient (N, E), overwritten: from dweight (N, k), the loss's
// gradient wrt the combine weights, through the normalisation and scores;
// plus aux_scale x d aux_loss and z_scale x d z_loss (the coefficients
// times the backward's loss scale).
struct RouterGradArgs {
  std::span<const float> logits, scores, lse, weight, dweight;
  std::span<const int32_t> sel;
  const GroupStats* stats = nullptr;
  double aux_scale = 0, z_scale = 0;
};
void router_backward(std::span<float> dlogits, const RouterGradArgs& a, RouterShape s, RouterScore score,
                     bool normalise);

}  // namespace loom::model
