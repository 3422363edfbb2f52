// Expert parallelism in the MoE layer (model/moe.h, parallel/ep.h) against
// the same model on one process: every rank of the world is one ep rank of
// a Llama MoE model holding n_expert / ep experts and its own sequences of a
// global batch; the losses, aux and z losses, loads, dropped choices and
// every gradient must be the single model's on the whole batch (fp32, rel
// 1e-5): dense gradients averaged over the ranks, each rank's experts'
// gradients as they are (the layer scales them by 1 / ep). Cases: a random
// router, top-1 and top-2, dropless and capacity 1.0 with drops, a shared
// expert; and a zero router, whose tied scores send every token of every
// rank to experts 0 and 1 — all on rank 0, so every other rank's experts
// receive no row at all.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "common/compare.h"
#include "common/mpi_env.h"
#include "common/tensors.h"
#include "core/error.h"
#include "core/memory.h"
#include "kernels/ops.h"
#include "model/model.h"
#include "parallel/ep.h"

namespace loom::test {
namespace {

using model::Model;
using model::ModelConfig;

struct Case {
  const char* name;
  int64_t top_k = 2;
  float capacity = 0.f;
  int64_t shared = 0;
  bool zero_router = false;
};

ModelConfig moe_config(const Case& c, int64_t experts) {
  ModelConfig m = model::model_preset("llama-tiny");
  m.n_layer = 2, m.n_embd = 32, m.n_head = 4, m.n_kv_head = 2, m.d_ff = 24, m.vocab_size = 97, m.max_seq_len = 16;
  m.n_expert = experts, m.top_k = c.top_k, m.capacity_factor = c.capacity, m.n_shared_expert = c.shared;
  m.z_loss_coef = 1e-3f;
  return m;
}

double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  double scale = 1e-30, diff = 0;
  for (size_t i = 0; i < a.size(); ++i) scale = std::max(scale, double(std::fabs(b[i])));
  for (size_t i = 0; i < a.size(); ++i) diff = std::max(diff, std::fabs(double(a[i]) - b[i]));
  return diff / scale;
}

void expect_ep_matches_one_model(const Case& c) {
  comm::Communicator& w = world();
  const int P = w.size();
  const int64_t E = 4 * P, B = 2, T = 8;  // each rank: 2 sequences of 8 tokens
  const ModelConfig cfg = moe_config(c, E);
  Pools pools;
  Model whole(cfg, B * P, T, pools);
  whole.init_params(11);
  if (c.zero_router)
    for (int64_t l = 0; l < cfg.n_layer; ++l)
      kernels::fill(whole.param(concat("model.layers.", l, ".block_sparse_moe.gate.weight")), 0.f);
  parallel::ExpertParallel ep(w);
  Model part(cfg, B, T, pools, {.ep = ep.options()});
  for (const model::ParamSpec& s : part.param_specs()) kernels::copy(part.param(s.name), whole.param(s.name));
  // The global batch, the same on every rank; the rank's rows of it.
  std::mt19937 rng(7);
  std::vector<int32_t> tokens(static_cast<size_t>(B * P * T)), targets(tokens.size());
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % cfg.vocab_size);
  for (auto& t : targets) t = static_cast<int32_t>(rng() % cfg.vocab_size);
  const Tensor all_tokens(tokens.data(), DType::i32, {B * P, T}), all_targets(targets.data(), DType::i32, {B * P, T});
  whole.zero_grads(), part.zero_grads();
  const double loss_whole = whole.forward(all_tokens, all_targets);
  const double loss_part = part.forward(all_tokens.slice(0, w.rank() * B, B), all_targets.slice(0, w.rank() * B, B));
  whole.backward(), part.backward();
  // Losses and routing: means / sums over the ranks.
  std::vector<double> mine = {loss_part, part.moe_stats().aux_loss, part.moe_stats().z_loss,
                              double(part.moe_stats().dropped)};
  std::vector<float> sums(mine.begin(), mine.end());
  w.all_reduce(f32_view(sums, {4}), comm::ReduceOp::sum)->wait();
  const model::MoeStats& ref = whole.moe_stats();
  EXPECT_NEAR(sums[0] / P, loss_whole, 1e-5 * loss_whole) << c.name;
  // aux is per routing group (one sequence), z per token: the means over ranks are the whole batch's.
  EXPECT_NEAR(sums[1] / P, ref.aux_loss, 1e-5 * ref.aux_loss) << c.name;
  EXPECT_NEAR(sums[2] / P, ref.z_loss, 1e-5 * ref.z_loss) << c.name;
  EXPECT_EQ(int64_t(sums[3]), ref.dropped) << c.name << ": the same choices dropped";
  std::vector<int64_t> load = part.moe_stats().load;
  w.all_reduce(Tensor(load.data(), DType::i64, {int64_t(load.size())}), comm::ReduceOp::sum)->wait();
  EXPECT_EQ(load, ref.load) << c.name;
  if (c.zero_router && w.rank() == 0) {
    for (size_t e = 0; e < load.size(); ++e)
      EXPECT_EQ(load[e] > 0, e % E < 2) << "a zero router sends every token to experts 0 and 1";
  }
  double worst = 0;
  for (const model::ParamSpec& s : part.param_specs()) {
    std::vector<float> g = to_floats(part.grad(s.name));
    if (!model::is_expert_param(s.name)) {
      w.all_reduce(f32_view(g, {int64_t(g.size())}), comm::ReduceOp::sum)->wait();
      for (float& x : g) x /= float(P);
    }
    const double rel = max_rel(g, to_floats(whole.grad(s.name)));
    worst = std::max(worst, rel);
    EXPECT_LE(rel, 1e-5) << c.name << ": " << s.name;
  }
  if (w.rank() == 0) std::printf("[ep N=%d] %s: loss %.5f, max relative gradient difference %.3g\n", P, c.name,
                                 loss_whole, worst);
}

TEST(ExpertParallelLayer, EveryRankOwnTokensMatchOneModelOnTheWholeBatch) {
  for (const Case& c : {Case{"top-2 dropless", 2, 0.f}, Case{"top-1 capacity 1.0", 1, 1.f},
                        Case{"top-2 capacity 1.0 shared expert", 2, 1.f, 1}})
    expect_ep_matches_one_model(c);
}

TEST(ExpertParallelLayer, EveryTokenToRankZerosExpertsLeavesTheOthersEmpty) {
  expect_ep_matches_one_model({"zero router", 2, 0.f, 0, true});
  expect_ep_matches_one_model({"zero router, capacity 1.0", 2, 1.f, 0, true});
}

// Overlap (model/expert_parallel.h) only moves waits: the layer computes its
// own rows while the others' travel, and the shared experts and router
// backward while the outputs and input gradients travel back. Turned off,
// every exchange blocks first; the loss and every gradient are the same
// bits, with a shared expert and capacity drops.
TEST(ExpertParallelLayer, OverlappedExchangesGiveTheBitsOfBlockingOnes) {
  comm::Communicator& w = world();
  const int64_t B = 2, T = 8;
  const ModelConfig cfg = moe_config({"overlap", 2, 1.f, 1}, 4 * w.size());
  Pools pools;
  std::vector<std::vector<float>> grads[2];
  double loss[2] = {0, 0};
  std::mt19937 rng(3 + w.rank());
  std::vector<int32_t> tokens(static_cast<size_t>(B * T)), targets(tokens.size());
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % cfg.vocab_size);
  for (auto& t : targets) t = static_cast<int32_t>(rng() % cfg.vocab_size);
  for (const bool overlap : {true, false}) {
    parallel::ExpertParallel ep(w, overlap);
    Model m(cfg, B, T, pools, {.ep = ep.options()});
    m.init_params(5);
    m.zero_grads();
    loss[overlap] = m.forward(Tensor(tokens.data(), DType::i32, {B, T}), Tensor(targets.data(), DType::i32, {B, T}));
    m.backward();
    for (const model::ParamSpec& s : m.param_specs()) grads[overlap].push_back(to_floats(m.grad(s.name)));
  }
  EXPECT_EQ(loss[0], loss[1]);
  ASSERT_EQ(grads[0].size(), grads[1].size());
  for (size_t i = 0; i < grads[0].size(); ++i) EXPECT_EQ(grads[0][i], grads[1][i]) << "gradient " << i;
}

}  // namespace
}  // namespace loom::test
