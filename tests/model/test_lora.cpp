// LoRA (model/lora.h) against a float64 PyTorch LoRA written independently
// in tests/ref/ref_lora.py: logits, loss and the gradient of every adapter
// over a frozen base (f32 and bf16), 5 AdamW steps on the adapters alone,
// the merge, and the errors for adapters a model cannot have.
//
// Tolerances as test_model.cpp's (f32 vs float64): loss rtol 1e-4, logits
// rtol 1e-4 atol 1e-5, gradients rtol 1e-4 atol 1e-5 x max |e| of the
// tensor. bf16 base and compute against float64 from the bf16-rounded
// weights: DESIGN.md §6's bf16 bound, loss abs 2e-2; logits atol 5e-2 x
// max |e|: bf16 activations round every op by up to 2^-9, and the adapters
// (scale 2, B ~ 0.2) amplify what they read [observed: gpt2 2.0e-2, llama
// 3.4e-2 x max |e| ~ 2].
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "common/compare.h"
#include "common/ref.h"
#include "common/ref_model_config.h"
#include "common/tensors.h"
#include "core/error.h"
#include "core/memory.h"
#include "io/safetensors.h"
#include "kernels/ops.h"
#include "io/gguf.h"
#include "model/blocks.h"
#include "model/config_json.h"
#include "model/gguf_model.h"
#include "model/lora.h"
#include "model/quant_weights.h"
#include "model/model.h"

namespace loom::model {
namespace {

using namespace loom::test;

std::string ref_file(const std::string& name) { return std::string(LOOM_REF_DIR) + "/" + name; }

LoraConfig all_linear(RefCase& rc) {
  LoraConfig l;
  l.rank = static_cast<int64_t>(rc["rank"].scalar());
  l.alpha = rc["alpha"].scalar();
  return l;
}

// The base's weights from ref_lora.py's file, in `dtype`.
OwnedTensor base_weights(const ModelConfig& cfg, const std::string& family, DType dtype, Pools& pools) {
  OwnedTensor flat = pools[MemTag::params].empty(DType::f32, {param_count(param_specs(cfg))});
  load_params(flat, param_specs(cfg), io::SafetensorsFile::open(ref_file("lora_" + family + "_base.safetensors")));
  return params_in_dtype(std::move(flat), dtype, pools[MemTag::params]);
}

struct Case {
  explicit Case(const std::string& family, DType dtype = DType::f32, Recompute recompute = Recompute::none)
      : rc("lora_" + family + ".ref"),
        cfg(model_config_of(rc)),
        lora(all_linear(rc)),
        base(cfg, base_weights(cfg, family, dtype, pools)),
        model(cfg, rc["tokens"].shape[0], rc["tokens"].shape[1], pools,
              {.compute = dtype, .recompute = recompute, .lora = {lora, &base}}) {
    model.load_params(io::SafetensorsFile::open(ref_file("lora_" + family + "_adapters.safetensors")));
  }
  Tensor tokens() { return rc["tokens"].view(); }
  Tensor targets() { return rc["targets"].view(); }

  RefCase rc;
  ModelConfig cfg;
  LoraConfig lora;
  Pools pools;
  FrozenWeights base;
  Model model;
};

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, double(std::fabs(x)));
  return m;
}

void expect_matches_torch(const std::string& family) {
  Case c(family);
  EXPECT_EQ(c.model.num_params(), lora_param_count(c.cfg, c.lora));  // the adapters, not the base
  c.model.zero_grads();
  const float loss = c.model.forward(c.tokens(), c.targets());
  EXPECT_NEAR(loss, c.rc["loss"].scalar(), 1e-4 * std::fabs(c.rc["loss"].scalar()));
  EXPECT_ALL_CLOSE(to_floats(c.model.logits()), c.rc["logits"].floats(), 1e-4, 1e-5);
  c.model.backward();
  for (const ParamSpec& s : c.model.param_specs()) {
    const std::vector<float> expected = c.rc["grad." + s.name].floats();
    EXPECT_TRUE(all_close(to_floats(c.model.grad(s.name)), expected, 1e-4, 1e-5 * max_abs(expected))) << s.name;
  }
}

TEST(Lora, Gpt2LogitsLossAndAdapterGradientsMatchTorch) { expect_matches_torch("gpt2"); }
TEST(Lora, LlamaLogitsLossAndAdapterGradientsMatchTorch) { expect_matches_torch("llama"); }

void expect_adamw_losses_match_torch(const std::string& family) {
  Case c(family);
  EXPECT_ALL_CLOSE(adamw_losses(c.model, c.pools, c.rc, c.tokens(), c.targets()), c.rc["adamw_losses"].floats(), 1e-4,
                   0.0);
}

TEST(Lora, Gpt2FiveAdamWStepsOnTheAdaptersMatchTorch) { expect_adamw_losses_match_torch("gpt2"); }
TEST(Lora, LlamaFiveAdamWStepsOnTheAdaptersMatchTorch) { expect_adamw_losses_match_torch("llama"); }

void expect_bf16_base_matches_torch(const std::string& family) {
  Case c(family, DType::bf16);
  const float loss = c.model.forward(c.tokens(), c.targets());
  EXPECT_NEAR(loss, c.rc["bf16_loss"].scalar(), 2e-2);
  const std::vector<float> logits = c.rc["bf16_logits"].floats();
  EXPECT_ALL_CLOSE(to_floats(c.model.logits()), logits, 0.0, 5e-2 * max_abs(logits));
  c.model.backward();  // the adapters' gradients: finite, and near the f32 ones
  for (const ParamSpec& s : c.model.param_specs()) {
    const std::vector<float> expected = c.rc["grad." + s.name].floats();
    EXPECT_TRUE(all_close(to_floats(c.model.grad(s.name)), expected, 0.0, 0.1 * max_abs(expected))) << s.name;
  }
}

TEST(Lora, Gpt2Bf16BaseMatchesTorchWithinBf16Bounds) { expect_bf16_base_matches_torch("gpt2"); }
TEST(Lora, LlamaBf16BaseMatchesTorchWithinBf16Bounds) { expect_bf16_base_matches_torch("llama"); }

// Every recompute policy gives bitwise the same adapter gradients.
TEST(Lora, RecomputePoliciesGiveTheSameAdapterGradients) {
  for (const std::string family : {"gpt2", "llama"}) {
    std::vector<std::vector<float>> grads;
    for (Recompute r : {Recompute::none, Recompute::selective, Recompute::full}) {
      Case c(family, DType::f32, r);
      c.model.zero_grads();
      c.model.forward(c.tokens(), c.targets());
      c.model.backward();
      grads.push_back(to_floats(c.model.grads()));
    }
    EXPECT_EQ(grads[0], grads[1]) << family;
    EXPECT_EQ(grads[0], grads[2]) << family;
  }
}

// Initialised adapters (B = 0) leave the base model's logits bit for bit.
TEST(Lora, FreshAdaptersComputeExactlyTheBaseModel) {
  for (const std::string family : {"gpt2", "llama"}) {
    Case c(family);
    c.model.init_params(7);
    c.model.forward(c.tokens());
    Model plain(c.cfg, c.rc["tokens"].shape[0], c.rc["tokens"].shape[1], c.pools);
    kernels::copy(plain.master_params(), c.base.flat());
    plain.forward(c.tokens());
    EXPECT_EQ(to_floats(c.model.logits()), to_floats(plain.logits())) << family;
    // A is Kaiming-uniform within 1 / sqrt(in), B zero.
    const Tensor a = c.model.param(layer_prefix(c.cfg, 0) + (family == "gpt2" ? "attn.c_attn" : "self_attn.q_proj") +
                                   ".lora_A.weight");
    const std::vector<float> av = to_floats(a);
    EXPECT_GT(max_abs(av), 0.0);
    EXPECT_LE(max_abs(av), 1.0 / std::sqrt(double(c.cfg.n_embd)));
  }
}

// The merged model (W + scale B A) computes what the base with adapters did.
TEST(Lora, MergedModelGivesTheAdaptedLogits) {
  for (const std::string family : {"gpt2", "llama"}) {
    Case c(family);
    c.model.forward(c.tokens());
    Model merged(c.cfg, c.rc["tokens"].shape[0], c.rc["tokens"].shape[1], c.pools);
    kernels::copy(merged.master_params(), c.base.flat());
    lora_merge(merged.master_params(), c.cfg, c.lora, c.model.master_params());
    merged.forward(c.tokens());
    EXPECT_ALL_CLOSE(to_floats(merged.logits()), to_floats(c.model.logits()), 1e-5, 1e-5) << family;
  }
}

// QLoRA: a base written as a GGUF file of `weights` (C = 256, so every
// type's blocks fit), adapters on every linear. Its forward, loss and
// adapter gradients equal those of the same adapters on the file's weights
// dequantized to f32 (an f32 base, which the cases above hold to PyTorch),
// up to the f32 rounding of GEMMs blocked otherwise (a tile of W's rows at a
// time): rtol 1e-4 as against torch [observed below 1e-5].
ModelConfig qlora_config(Family family, int64_t vocab = 64) {
  ModelConfig cfg;
  cfg.family = family, cfg.n_layer = 2, cfg.n_embd = 256, cfg.n_head = 4, cfg.n_kv_head = family == Family::llama ? 2 : 4;
  cfg.d_ff = 512, cfg.vocab_size = vocab, cfg.max_seq_len = 16, cfg.tie_embeddings = family == Family::gpt2;
  return cfg;
}

// cfg's parameters (seed 5) written as a GGUF file of `weights`.
ModelDir write_quantized_base(const ModelConfig& cfg, model::GgufWeights weights) {
  Pools pools;
  OwnedTensor flat = pools[MemTag::params].empty(DType::f32, {param_count(cfg)});
  init_params(flat, param_specs(cfg), 5);
  const std::string path = concat(::testing::TempDir(), "qlora_", gguf_weights_name(weights), "_",
                                  family_name(cfg.family), "_v", cfg.vocab_size, ".gguf");
  io::GgufWriter w;
  gguf_add_model(w, cfg, flat, weights, "qlora test");
  w.write(path);
  return load_model_dir(path);
}

void expect_qlora_equals_lora_on_dequantized(model::GgufWeights weights, Family family) {
  const ModelConfig cfg = qlora_config(family);
  Pools pools;
  const ModelDir dir = write_quantized_base(cfg, weights);
  const std::unique_ptr<FrozenWeights> quantized = load_frozen_base(dir, DType::f32, pools);
  ASSERT_NE(quantized->quant(), nullptr);
  EXPECT_FALSE(quantized->quant()->empty());
  OwnedTensor dequantized_flat = pools[MemTag::params].empty(DType::f32, {param_count(cfg)});
  load_model_params(dir, dequantized_flat);  // every weight dequantized to f32
  const FrozenWeights dequantized(cfg, std::move(dequantized_flat));
  LoraConfig lora;
  lora.rank = 8, lora.alpha = 16;
  Model q(cfg, 2, 16, pools, {.lora = {lora, quantized.get()}});
  Model f(cfg, 2, 16, pools, {.lora = {lora, &dequantized}});
  OwnedTensor adapters = pools[MemTag::params].empty(DType::f32, {q.num_params()});
  init_params(adapters, q.param_specs(), 9);
  for (const ParamSpec& s : q.param_specs())  // B = 0 would hide A's path: random B too
    if (s.name.ends_with("lora_B.weight")) {
      std::vector<float> v(static_cast<size_t>(s.numel()));
      for (size_t i = 0; i < v.size(); ++i) v[i] = 0.05f * std::sin(0.7f * static_cast<float>(i) + 0.3f);
      kernels::copy(param_view(adapters, s), Tensor(v.data(), DType::f32, s.shape));
    }
  kernels::copy(q.master_params(), adapters), kernels::copy(f.master_params(), adapters);
  std::vector<int32_t> tok(32), tgt(32);
  for (int i = 0; i < 32; ++i) tok[i] = (i * 7 + 3) % 64, tgt[i] = (i * 5 + 1) % 64;
  const Tensor tokens(tok.data(), DType::i32, {2, 16}), targets(tgt.data(), DType::i32, {2, 16});
  q.zero_grads(), f.zero_grads();
  const float lq = q.forward(tokens, targets), lf = f.forward(tokens, targets);
  EXPECT_NEAR(lq, lf, 1e-4 * std::fabs(lf));
  EXPECT_ALL_CLOSE(to_floats(q.logits()), to_floats(f.logits()), 1e-4, 1e-5);
  q.backward(), f.backward();
  const std::vector<float> gf = to_floats(f.grads());
  EXPECT_TRUE(all_close(to_floats(q.grads()), gf, 1e-4, 1e-5 * max_abs(gf)));
}

TEST(Qlora, Gpt2OnQ8_0BaseEqualsLoraOnItsDequantizedWeights) {
  expect_qlora_equals_lora_on_dequantized(GgufWeights::q8_0, Family::gpt2);
}
TEST(Qlora, Gpt2OnQ4_0BaseEqualsLoraOnItsDequantizedWeights) {
  expect_qlora_equals_lora_on_dequantized(GgufWeights::q4_0, Family::gpt2);
}
TEST(Qlora, LlamaOnQ4_KBaseEqualsLoraOnItsDequantizedWeights) {
  expect_qlora_equals_lora_on_dequantized(GgufWeights::q4_K, Family::llama);
}
TEST(Qlora, LlamaOnQ6_KBaseEqualsLoraOnItsDequantizedWeights) {
  expect_qlora_equals_lora_on_dequantized(GgufWeights::q6_K, Family::llama);
}

// QLoRA under tensor parallelism: each tp rank holds its slice of every
// quantized weight in the file's own blocks (a column-parallel weight's
// rows, c_attn's in q, k, v blocks; a row-parallel weight's columns where a
// rank's count is whole blocks, else that weight dequantized; the tied
// head's vocabulary rows, padding zero), and the rest's slices in f32:
// dequantized, each rank's parameters equal tp_slice of the whole file
// dequantized, bit for bit; and frozen_base_bytes predicts the bytes held.
void expect_tp_ranks_hold_their_slices(const ModelConfig& cfg, model::GgufWeights weights, int tp) {
  const ModelDir dir = write_quantized_base(cfg, weights);
  Pools pools;
  OwnedTensor whole = pools[MemTag::params].empty(DType::f32, {param_count(cfg)});
  load_model_params(dir, whole);
  const std::vector<ParamSpec> all = param_specs(cfg);
  for (int r = 0; r < tp; ++r) {
    const TpRank rank{tp, r};
    OwnedTensor expected = pools[MemTag::params].empty(DType::f32, {param_count(cfg, rank)});
    tp_slice(expected, cfg, rank, whole);
    const std::unique_ptr<FrozenWeights> base = load_frozen_base(dir, DType::f32, pools, rank);
    ASSERT_NE(base->quant(), nullptr);
    const QuantWeights& q = *base->quant();
    std::vector<ParamSpec> mine = param_specs(cfg, rank);
    if (cfg.tie_embeddings) mine.push_back(mine.front()), mine.back().name = "lm_head.weight";  // wte's rows
    for (const ParamSpec& s : mine) {
      std::vector<float> got(static_cast<size_t>(s.numel()));
      const Tensor out(got.data(), DType::f32, s.shape);
      if (q.holds(s.name)) kernels::dequantize_rows(out, q.blocks(s.name), q.type_of(q.blocks(s.name)), 0);
      else kernels::copy(out, base->views()(s.name));
      const ParamSpec& place = cfg.tie_embeddings && s.name == "lm_head.weight" ? mine.front() : s;
      EXPECT_EQ(got, to_floats(param_view(expected, place))) << s.name << " on tp rank " << r << " of " << tp;
    }
    const FrozenBytes predicted = frozen_base_bytes(dir, DType::f32, rank);
    EXPECT_TRUE(predicted.quantized);
    EXPECT_EQ(predicted.bytes, q.bytes() + static_cast<int64_t>(base->flat().nbytes())) << "tp rank " << r;
  }
}

TEST(Qlora, Gpt2Q8_0TpRanksHoldTheirSliceOfEachWeightInItsBlocks) {
  // vocab 63: at tp 2 and 4 the last rank's head has padding rows.
  for (int tp : {2, 4}) expect_tp_ranks_hold_their_slices(qlora_config(Family::gpt2, 63), GgufWeights::q8_0, tp);
}

TEST(Qlora, LlamaQ4_KTpRanksHoldTheirSliceOfEachWeightInItsBlocks) {
  // q4_K's 256-value blocks: o_proj's 256 columns split over 2 ranks are not
  // whole blocks (dequantized there); down_proj's 512 are. q and k rows
  // carry llama.cpp's permutation.
  const ModelConfig cfg = qlora_config(Family::llama);
  expect_tp_ranks_hold_their_slices(cfg, GgufWeights::q4_K, 2);
  Pools pools;
  const std::unique_ptr<FrozenWeights> rank1 = load_frozen_base(write_quantized_base(cfg, GgufWeights::q4_K),
                                                                DType::f32, pools, {2, 1});
  EXPECT_FALSE(rank1->quant()->holds("model.layers.0.self_attn.o_proj.weight"));
  EXPECT_TRUE(rank1->quant()->holds("model.layers.0.mlp.down_proj.weight"));
  EXPECT_TRUE(rank1->quant()->holds("model.layers.0.self_attn.q_proj.weight"));
  EXPECT_EQ(rank1->views()("model.layers.0.self_attn.o_proj.weight").dtype(), DType::f32);
}

template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Lora, AdaptersAModelCannotHaveAreClearErrors) {
  ModelConfig gpt2;
  gpt2.n_layer = 2, gpt2.n_embd = 32, gpt2.n_head = 4, gpt2.n_kv_head = 4, gpt2.d_ff = 128;
  LoraConfig l;
  l.rank = 0;
  EXPECT_NE(error_of([&] { lora_modules(gpt2, l); }).find("lora.rank = 0 is invalid"), std::string::npos);
  l.rank = 33;
  EXPECT_NE(error_of([&] { lora_modules(gpt2, l); }).find("lora.rank = 33 is larger than attn.c_attn (96 x 32)"),
            std::string::npos);
  l.rank = 4, l.targets = {"q_proj"};
  const std::string unknown = error_of([&] { lora_modules(gpt2, l); });
  EXPECT_NE(unknown.find("'q_proj' is not a linear of a gpt2 block: allowed names are qkv, c_attn, proj"),
            std::string::npos)
      << unknown;
  l.targets = {"c_proj"};  // PEFT's name: both of GPT-2's c_proj linears
  const std::vector<LoraModule> both = lora_modules(gpt2, l);
  ASSERT_EQ(both.size(), 2u);
  EXPECT_EQ(both[0].name, "attn.c_proj");
  EXPECT_EQ(both[1].name, "mlp.c_proj");
  l.dropout = 1;
  EXPECT_NE(error_of([&] { lora_modules(gpt2, l); }).find("lora.dropout = 1 is invalid: allowed values are 0"),
            std::string::npos);
  l.dropout = 0, l.alpha = 0;
  EXPECT_NE(error_of([&] { lora_modules(gpt2, l); }).find("lora.alpha = 0 is invalid"), std::string::npos);
  l.alpha = 16, l.targets = {"c_attn"};
  EXPECT_NE(error_of([&] { lora_param_specs(gpt2, l, {3, 0}); }).find("divide"), std::string::npos);  // 4 heads
}

// ---- dropout ----------------------------------------------------------------

// The mask: a fraction p of zeros (within 5 sigma), the rest 1 / (1 - p);
// another sample, position or linear draws another; a row-parallel
// linear's tp rank 1 draws exactly the right half of the whole mask's
// columns (its features), whatever its rows' order in the batch.
TEST(LoraDropout, MaskDropsAFractionPAndIsKeyedByGlobalSampleAndFeature) {
  const int64_t B = 3, T = 5, IC = 4000;
  const std::vector<int64_t> samples = {7, 1000000007, 12};
  Dims d{B, T, 64, 4, 4, 16, 256, 1e-5f, 1e4f};
  d.lora.dropout = 0.25f, d.lora.seed = 42, d.lora.samples = samples;
  std::vector<float> mask(B * T * IC);
  const Tensor m(mask.data(), DType::f32, {B * T, IC});
  LoraPair p;
  p.key = 9, p.row = true;
  lora_dropout_mask(d, m, p);
  int64_t zeros = 0;
  for (float v : mask) {
    EXPECT_TRUE(v == 0.f || v == 1.f / 0.75f) << v;
    zeros += v == 0.f ? 1 : 0;
  }
  const double n = static_cast<double>(mask.size()), sigma = std::sqrt(n * 0.25 * 0.75);
  EXPECT_NEAR(static_cast<double>(zeros), 0.25 * n, 5 * sigma);
  const auto row = [&](const std::vector<float>& v, int64_t r, int64_t c0, int64_t cols, int64_t ld) {
    return std::vector<float>(v.begin() + r * ld + c0, v.begin() + r * ld + c0 + cols);
  };
  EXPECT_NE(row(mask, 0, 0, IC, IC), row(mask, 1, 0, IC, IC));      // positions
  EXPECT_NE(row(mask, 0, 0, IC, IC), row(mask, T, 0, IC, IC));      // samples
  std::vector<float> other(mask.size());
  LoraPair q = p;
  q.key = 10;
  lora_dropout_mask(d, Tensor(other.data(), DType::f32, {B * T, IC}), q);
  EXPECT_NE(other, mask);  // linears
  // tp rank 1 of 2, its batch holding the last sequence only.
  Dims half = d;
  half.B = 1, half.par.tp.size = 2, half.par.tp.rank = 1;
  const std::vector<int64_t> last = {samples[2]};
  half.lora.samples = last;
  std::vector<float> mine(T * IC / 2);
  lora_dropout_mask(half, Tensor(mine.data(), DType::f32, {T, IC / 2}), p);
  for (int64_t t = 0; t < T; ++t)
    EXPECT_EQ(row(mine, t, 0, IC / 2, IC / 2), row(mask, 2 * T + t, IC / 2, IC / 2, IC)) << "position " << t;
}

// A model with lora.dropout: without sample indices (evaluation) it
// computes exactly the model without dropout; with them the same indices
// give the same bits and others others; and its adapter gradients are the
// derivative of its forward under the drawn masks (a central difference of
// 1e-3 along the gradient, f32: 1% [observed 0.14% gpt2, 0.01% llama; the
// difference converges to the gradient as the step shrinks]).
TEST(LoraDropout, EvaluationIsTheDropoutFreeModelAndGradientsAreTheMaskedForwardsDerivative) {
  for (const std::string family : {"gpt2", "llama"}) {
    Case c(family);
    LoraConfig drop = c.lora;
    drop.dropout = 0.3;
    Model m(c.cfg, c.rc["tokens"].shape[0], c.rc["tokens"].shape[1], c.pools, {.lora = {drop, &c.base, 11}});
    kernels::copy(m.master_params(), c.model.master_params());
    const float plain = c.model.forward(c.tokens(), c.targets());
    EXPECT_EQ(m.forward(c.tokens(), c.targets()), plain) << family << ": no samples, no dropout";
    std::vector<int64_t> samples(static_cast<size_t>(m.batch_size()));
    for (size_t b = 0; b < samples.size(); ++b) samples[b] = 100 + static_cast<int64_t>(b);
    m.set_samples(samples);
    m.zero_grads();
    const float dropped = m.forward(c.tokens(), c.targets());
    EXPECT_NE(dropped, plain) << family;
    m.backward();
    EXPECT_EQ(m.forward(c.tokens(), c.targets()), dropped) << family << ": the same samples, the same masks";
    const std::vector<float> g = to_floats(m.grads());
    double norm = 0;
    for (float v : g) norm += double(v) * v;
    norm = std::sqrt(norm);
    const std::vector<float> theta = to_floats(m.master_params());
    const auto loss_at = [&](double eps) {
      std::vector<float> moved(theta);
      for (size_t i = 0; i < moved.size(); ++i) moved[i] += static_cast<float>(eps * g[i] / norm);
      kernels::copy(m.master_params(), Tensor(moved.data(), DType::f32, {static_cast<int64_t>(moved.size())}));
      return double(m.forward(c.tokens(), c.targets()));
    };
    const double eps = 1e-3, slope = (loss_at(eps) - loss_at(-eps)) / (2 * eps);
    EXPECT_NEAR(slope, norm, 1e-2 * norm) << family;
    samples[0] += 1;
    m.set_samples(samples);
    std::vector<float> start(theta);
    kernels::copy(m.master_params(), Tensor(start.data(), DType::f32, {static_cast<int64_t>(start.size())}));
    EXPECT_NE(m.forward(c.tokens(), c.targets()), dropped) << family << ": another sample, another mask";
  }
}

// Under tp an adapter is cut as the linear it wraps: a column-parallel W's B
// by rows (c_attn's in q, k, v blocks), a row-parallel W's A by columns; the
// other matrix whole on every rank.
TEST(Lora, TensorParallelAdaptersAreCutAsTheirLinears) {
  ModelConfig gpt2;
  gpt2.n_layer = 1, gpt2.n_embd = 32, gpt2.n_head = 4, gpt2.n_kv_head = 4, gpt2.d_ff = 128;
  LoraConfig l;
  l.rank = 4, l.targets = {"c_attn", "mlp.c_proj"};
  const std::vector<ParamSpec> s = lora_param_specs(gpt2, l, {2, 1});
  ASSERT_EQ(s.size(), 4u);
  EXPECT_EQ(s[0].shape, Shape({4, 32}));  // c_attn A: whole
  EXPECT_TRUE(s[0].replicated());
  EXPECT_EQ(s[1].shape, Shape({48, 4}));  // c_attn B: the rank's q, k, v rows
  EXPECT_EQ(s[1].split.blocks, 3);
  EXPECT_EQ(s[2].shape, Shape({4, 64}));  // mlp.c_proj A: the rank's input columns
  EXPECT_EQ(s[2].split.dim, 1);
  EXPECT_EQ(s[3].shape, Shape({32, 4}));  // mlp.c_proj B: whole
  EXPECT_TRUE(s[3].replicated());
}

TEST(Lora, PeftKeysRoundTrip) {
  ModelConfig gpt2, llama;
  llama.family = Family::llama;
  EXPECT_EQ(peft_key(gpt2, "h.0.attn.c_attn.lora_A.weight"), "base_model.model.transformer.h.0.attn.c_attn.lora_A.weight");
  EXPECT_EQ(peft_key(llama, "model.layers.1.self_attn.q_proj.lora_B.weight"),
            "base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight");
  EXPECT_EQ(from_peft_key(llama, "base_model.model.model.layers.1.mlp.up_proj.lora_A.weight"),
            "model.layers.1.mlp.up_proj.lora_A.weight");
  EXPECT_NE(error_of([&] { from_peft_key(gpt2, "base_model.model.transformer.h.0.attn.c_attn.weight"); })
                .find("is not a LoRA weight of a gpt2 model"),
            std::string::npos);
}

// PEFT options that change what the adapter computes are refused by name
// (each was read as a plain adapter before), and so are target modules of
// another model family, naming the base the adapter was trained on.
TEST(Lora, PeftOptionsLoomDoesNotImplementAndOtherFamiliesAreNamed) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("loom_test_peft_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  ModelConfig gpt2, llama;
  llama.family = Family::llama;
  const auto read_with = [&](const char* key, const nlohmann::json& value, const ModelConfig& cfg) {
    nlohmann::json j = {{"peft_type", "LORA"},  {"r", 4},         {"lora_alpha", 8},
                        {"target_modules", {"c_attn"}}, {"base_model_name_or_path", "gpt2"}};
    if (key != nullptr) j[key] = value;
    std::ofstream(dir / "adapter_config.json") << j.dump();
    return error_of([&] { read_peft_config(dir.string(), cfg); });
  };
  EXPECT_EQ(read_with(nullptr, nullptr, gpt2), "");
  EXPECT_EQ(read_with("init_lora_weights", "gaussian", gpt2), "");
  EXPECT_EQ(read_with("layer_replication", nullptr, gpt2), "");
  for (const auto& [key, value, why] : std::vector<std::tuple<const char*, nlohmann::json, const char*>>{
           {"layer_replication", {{0, 1}, {0, 1}}, "each layer its own base layer"},
           {"lora_bias", true, "no bias on lora_B"},
           {"exclude_modules", {"h.0.attn.c_attn"}, "every target module of every layer"},
           {"trainable_token_indices", {1, 2}, "no trained token rows"},
           {"init_lora_weights", "pissa", "relative to a base modified at its start"},
           {"init_lora_weights", "loftq", "relative to a base modified at its start"}}) {
    const std::string e = read_with(key, value, gpt2);
    EXPECT_NE(e.find(concat("adapter_config.json: ", key, " = ", value.dump(), " is not supported")),
              std::string::npos) << e;
    EXPECT_NE(e.find(why), std::string::npos) << e;
  }
  const std::string e = read_with(nullptr, nullptr, llama);
  EXPECT_NE(e.find("adapter_config.json: target_modules holds 'c_attn', which is not a linear of a llama block"),
            std::string::npos) << e;
  EXPECT_NE(e.find("the adapter was made for another model (base_model_name_or_path = 'gpt2')"), std::string::npos)
      << e;
  std::filesystem::remove_all(dir);
}

// An adapted model's units: the base's count, the embeddings' and head's empty.
TEST(Lora, UnitsFollowTheBaseModelsUnits) {
  ModelConfig cfg;
  cfg.n_layer = 3, cfg.n_embd = 32, cfg.n_head = 4, cfg.n_kv_head = 4, cfg.d_ff = 128;
  LoraConfig l;
  l.rank = 2, l.targets = {"qkv"};
  const std::vector<ParamSpec> specs = lora_param_specs(cfg, l);
  const std::vector<Unit> units = lora_units(cfg, specs);
  ASSERT_EQ(units.size(), 5u);
  EXPECT_EQ(units[0].numel(), 0);
  for (int i = 1; i <= 3; ++i) EXPECT_EQ(units[i].numel(), 2 * (32 + 96)) << i;
  EXPECT_EQ(units[4].numel(), 0);
  EXPECT_EQ(units[4].begin, param_count(specs));
}

}  // namespace
}  // namespace loom::model
