// Pipeline stages (model.h PpStage, DESIGN.md §5 PP) in one process: a model
// cut into stages, each holding only its layers (the first also the
// embeddings, the last the head, with its own copy of a tied embedding), run
// stage by stage — each stage's output copied into the next one's input,
// each gradient back — gives the whole model's loss and gradients.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/tensors.h"
#include "core/memory.h"
#include "kernels/ops.h"
#include "model/model.h"

namespace loom::model {
namespace {

using loom::test::expect_error;

ModelConfig four_layer(Family family, bool tied) {
  ModelConfig c = model_preset(family == Family::gpt2 ? "gpt2-tiny" : "llama-tiny");
  c.n_layer = 4, c.tie_embeddings = tied;
  return c;
}

// Deterministic tokens and targets below V.
std::vector<int32_t> ids(int64_t n, int64_t V, uint32_t seed) {
  std::vector<int32_t> v(n);
  for (int32_t& x : v) seed = seed * 1664525u + 1013904223u, x = static_cast<int32_t>((seed >> 8) % V);
  return v;
}

std::vector<float> floats(const Tensor& t) {
  const float* p = t.data_as<float>();
  return std::vector<float>(p, p + t.numel());
}

struct Run {
  double loss = 0;
  std::map<std::string, std::vector<float>> grads;  // by name; a tied copy's gradient added to the original's
};

constexpr int64_t B = 2, T = 8;

// The model cut at `cuts` (first layers of stages 1, 2, ...), trained one
// micro-batch stage by stage.
Run run_stages(const ModelConfig& cfg, const std::vector<int64_t>& cuts, Recompute recompute) {
  std::vector<int64_t> firsts = {0};
  firsts.insert(firsts.end(), cuts.begin(), cuts.end());
  Pools pools;
  std::vector<std::unique_ptr<Model>> stages;
  for (size_t s = 0; s < firsts.size(); ++s) {
    const int64_t end = s + 1 < firsts.size() ? firsts[s + 1] : cfg.n_layer;
    stages.push_back(std::make_unique<Model>(
        cfg, B, T, pools, ModelOptions{.recompute = recompute, .stage = {{firsts[s], end - firsts[s]}}}));
    stages.back()->init_params(7);
    stages.back()->zero_grads();
  }
  std::vector<int32_t> tok = ids(B * T, cfg.vocab_size, 1), tgt = ids(B * T, cfg.vocab_size, 2);
  const Tensor tokens(tok.data(), DType::i32, {B, T}), targets(tgt.data(), DType::i32, {B, T});
  Run r;
  for (size_t s = 0; s < stages.size(); ++s) {
    Model& m = *stages[s];
    if (s > 0) std::memcpy(m.stage_input().data(), stages[s - 1]->stage_output().data(), m.stage_input().nbytes());
    const bool last = s + 1 == stages.size();
    const float loss = m.forward(s == 0 ? tokens : Tensor(), last ? targets : Tensor());
    if (last) r.loss = loss;
  }
  for (size_t s = stages.size(); s-- > 0;) {
    Model& m = *stages[s];
    if (s + 1 < stages.size()) std::memcpy(m.stage_grad().data(), stages[s + 1]->stage_grad().data(), m.stage_grad().nbytes());
    m.backward();
  }
  for (const auto& m : stages)
    for (const ParamSpec& spec : m->param_specs()) {
      std::vector<float> g = floats(m->grad(spec.name));
      auto [it, fresh] = r.grads.emplace(spec.name, g);
      if (!fresh)
        for (size_t i = 0; i < g.size(); ++i) it->second[i] += g[i];
    }
  return r;
}

void expect_same_as_whole(const ModelConfig& cfg, const std::vector<int64_t>& cuts, Recompute recompute) {
  const Run whole = run_stages(cfg, {}, recompute), split = run_stages(cfg, cuts, recompute);
  EXPECT_EQ(whole.loss, split.loss);
  ASSERT_EQ(whole.grads.size(), split.grads.size());
  for (const auto& [name, g] : whole.grads) {
    ASSERT_TRUE(split.grads.contains(name)) << name;
    EXPECT_EQ(g, split.grads.at(name)) << name;  // the same kernels in the same order: bitwise
  }
}

TEST(PipelineStages, Gpt2TiedSplitIntoThreeStagesGivesTheWholeModelsLossAndGradients) {
  expect_same_as_whole(four_layer(Family::gpt2, true), {1, 3}, Recompute::none);
}

TEST(PipelineStages, LlamaUntiedSplitIntoFourStagesGivesTheWholeModelsLossAndGradients) {
  expect_same_as_whole(four_layer(Family::llama, false), {1, 2, 3}, Recompute::none);
}

TEST(PipelineStages, RecomputePoliciesWorkOnStages) {
  expect_same_as_whole(four_layer(Family::gpt2, true), {2}, Recompute::full);
  expect_same_as_whole(four_layer(Family::llama, true), {2}, Recompute::selective);
}

// A stage holds its layers' parameters; the first the embeddings, the last
// the head — and with tied embeddings its own copy of wte, initialised like
// stage 0's; units: [embeddings], layers, [head].
TEST(PipelineStages, StagesHoldTheirPartsAndUnits) {
  const ModelConfig cfg = four_layer(Family::gpt2, true);
  Pools pools;
  Model first(cfg, B, T, pools, {.stage = {{0, 1}}});
  Model middle(cfg, B, T, pools, {.stage = {{1, 2}}});
  Model last(cfg, B, T, pools, {.stage = {{3, 1}}});
  EXPECT_TRUE(first.has_embedding() && !first.has_head());
  EXPECT_TRUE(!middle.has_embedding() && !middle.has_head());
  EXPECT_TRUE(!last.has_embedding() && last.has_head());
  EXPECT_EQ(first.units().size(), 2u);   // embeddings, layer 0
  EXPECT_EQ(middle.units().size(), 2u);  // layers 1, 2
  EXPECT_EQ(last.units().size(), 2u);    // layer 3, head (ln_f + wte copy)
  EXPECT_EQ(middle.param_specs().front().name, "h.1.ln_1.weight");
  EXPECT_EQ(last.param_specs().back().name, "wte.weight");
  first.init_params(3), last.init_params(3);
  EXPECT_EQ(floats(first.param("wte.weight")), floats(last.param("wte.weight")));
  const int64_t whole = param_count(param_specs(cfg));
  const int64_t wte = cfg.vocab_size * cfg.n_embd;
  EXPECT_EQ(first.num_params() + middle.num_params() + last.num_params(), whole + wte);
  // Only the last stage keeps logits (and the final norm's outputs): a stage
  // of one layer without the head holds far less than the last one.
  const int64_t logits = B * T * cfg.vocab_size * 4;
  const int64_t mid = Model::activation_bytes(cfg, B, T, {.stage = {{1, 1}}});
  const int64_t end = Model::activation_bytes(cfg, B, T, {.stage = {{3, 1}}});
  EXPECT_GE(end - mid, logits);
}

// Two micro-batches in flight (two slots, the second's backward first, as a
// 1F1B warm-up makes them) accumulate the gradients of running them one
// after the other; the second slot's logits do not disturb the first's.
TEST(PipelineStages, SlotsKeepMicroBatchesInFlight) {
  for (Family family : {Family::gpt2, Family::llama}) {
    const ModelConfig cfg = four_layer(family, family == Family::gpt2);
    Pools pools;
    Model one(cfg, B, T, pools);
    Model two(cfg, B, T, pools, {.recompute = Recompute::selective, .stage = {{}, 2}});
    EXPECT_EQ(two.slots(), 2);
    one.init_params(5), two.init_params(5), one.zero_grads(), two.zero_grads();
    std::vector<int32_t> tok_a = ids(B * T, cfg.vocab_size, 3), tgt_a = ids(B * T, cfg.vocab_size, 4);
    std::vector<int32_t> tok_b = ids(B * T, cfg.vocab_size, 5), tgt_b = ids(B * T, cfg.vocab_size, 6);
    const Tensor ta(tok_a.data(), DType::i32, {B, T}), ga(tgt_a.data(), DType::i32, {B, T});
    const Tensor tb(tok_b.data(), DType::i32, {B, T}), gb(tgt_b.data(), DType::i32, {B, T});
    const float la = one.forward(ta, ga);
    one.backward(0.5f);
    const float lb = one.forward(tb, gb);
    one.backward(0.5f);
    EXPECT_EQ(two.forward(ta, ga, 0), la);
    EXPECT_EQ(two.forward(tb, gb, 1), lb);
    two.backward(0.5f, 1);
    two.backward(0.5f, 0);
    // The sums are added in the other order (a GEMM with beta = 1 folds the
    // old gradient into its accumulation), so they agree to rounding.
    const std::vector<float> g1 = floats(one.grads()), g2 = floats(two.grads());
    float worst = 0, largest = 0;
    for (size_t i = 0; i < g1.size(); ++i) worst = std::max(worst, std::abs(g1[i] - g2[i])), largest = std::max(largest, std::abs(g1[i]));
    EXPECT_LE(worst, 1e-6f * largest);
    // In the same order, through the second slot: bitwise.
    two.zero_grads();
    two.forward(ta, ga, 1), two.backward(0.5f, 1), two.forward(tb, gb, 0), two.backward(0.5f, 0);
    EXPECT_EQ(floats(one.grads()), floats(two.grads()));
    expect_error([&] { two.backward(0.5f, 0); }, {"of slot 0", "call forward"});
    expect_error([&] { two.forward(ta, ga, 2); }, {"activation slot 2 is invalid", "0 to 1"});
  }
  // Each slot holds a whole micro-batch's activations; scratch is shared.
  const ModelConfig cfg = four_layer(Family::gpt2, true);
  const int64_t one_slot = Model::activation_bytes(cfg, B, T);
  const int64_t three = Model::activation_bytes(cfg, B, T, {.stage = {{}, 3}});
  EXPECT_GT(three, 2 * one_slot);
  EXPECT_LT(three, 3 * one_slot);
}

TEST(PipelineStages, BadStagesAndMisuseAreClearErrors) {
  const ModelConfig cfg = four_layer(Family::gpt2, true);
  Pools pools;
  expect_error([&] { Model(cfg, B, T, pools, {.stage = {{3, 2}}}); },
               {"pipeline stage of layers [3, 5) is invalid", "model.n_layer = 4"});
  expect_error([&] { Model(cfg, B, T, pools, {.stage = {{1, 0}}}); },
               {"every stage needs at least one"});
  Model middle(cfg, B, T, pools, {.stage = {{1, 2}}});
  std::vector<int32_t> tgt(B * T, 0);
  expect_error([&] { middle.forward(Tensor(), Tensor(tgt.data(), DType::i32, {B, T})); },
               {"targets given to a pipeline stage without the head", "layers 1 to 2"});
  expect_error([&] { middle.backward(); }, {"call forward"});
  Model first(cfg, B, T, pools, {.stage = {{0, 1}}});
  expect_error([&] { first.stage_input(); }, {"first stage reads tokens"});
}

}  // namespace
}  // namespace loom::model
