// Internal to model/: what the router of a token-choice MoE layer (model/moe.h)
// decides on the host. Scores, top-k, capacity, the dispatch plan, the
// balancing statistics and the router's backward are kernels (kernels/ops.h
// moe_*), run where the layer's tensors live; here are the capacity's size,
// the balancing losses' values from the statistics (reported, not
// differentiated: their gradients are moe_router_backward's), and capacity
// decided over a cp group's gathered choices.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace loom::model {

// An expert's capacity in a group of `tokens` tokens: ceil(factor x tokens
// x k / E); factor 0 is dropless (-1: every choice is kept).
int64_t expert_capacity(float factor, int64_t tokens, int64_t k, int64_t E);

// The Switch / GShard load-balancing loss averaged over groups, E x sum_e
// f_e P_e with f_e = count_e / (group_tokens k) and P_e = score_sum_e /
// group_tokens (moe_group_stats' (groups, E) statistics over whole groups):
// 1 when perfectly balanced.
double aux_loss(std::span<const float> count, std::span<const float> score_sum, int64_t E, int64_t k,
                int64_t group_tokens);
// The ST-MoE router z-loss: the mean over tokens of lse^2.
double z_loss(std::span<const float> lse);

// Capacity when a routing group's tokens are spread over the cp ranks. One
// choice of every rank's: its expert, its score for it, and its token's
// place b x seq_len + position in the batch's sequences.
struct GatheredChoice {
  int32_t expert = 0;
  int32_t place = 0;
  float score = 0;
};
// keep (n x ranks) for the gathered choices (rank-major): per routing group
// of group_len places and per expert the `capacity` highest scores kept,
// ties to the earlier place, as moe_capacity decides within one rank.
std::vector<char> gathered_capacity(std::span<const GatheredChoice> all, int64_t E, int64_t group_len,
                                    int64_t groups, int64_t capacity);

}  // namespace loom::model
