// ModelConfig presets and validation, parameter specs (Hugging Face names and
// shapes), parameter counts, and sharding-invariant initialisation.
#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/compare.h"
#include "common/tensors.h"
#include "core/memory.h"
#include "model/config.h"
#include "model/model.h"
#include "model/params.h"

namespace loom::model {
namespace {

using loom::test::expect_error;

const ParamSpec& spec(const std::vector<ParamSpec>& specs, const std::string& name) {
  for (const ParamSpec& s : specs)
    if (s.name == name) return s;
  throw std::runtime_error("no spec " + name);
}

std::vector<std::string> names(const std::vector<ParamSpec>& specs) {
  std::vector<std::string> out;
  for (const ParamSpec& s : specs) out.push_back(s.name);
  return out;
}

TEST(ModelPreset, EveryPresetValidates) {
  for (const std::string& name : model_preset_names()) EXPECT_NO_THROW(model_preset(name).validate()) << name;
}

TEST(ModelPreset, Gpt2KvHeadsFollowAnOverriddenHeadCountUnlessGiven) {
  ModelConfig c = model_preset("gpt2-tiny");
  c.n_head = 2;
  derive_model_keys(c, /*n_kv_head_given=*/false);
  EXPECT_EQ(c.n_kv_head, 2);
  EXPECT_NO_THROW(c.validate());
  c.n_kv_head = 1;
  derive_model_keys(c, /*n_kv_head_given=*/true);
  EXPECT_EQ(c.n_kv_head, 1);  // given: kept, and validate() says what is wrong
  expect_error([&] { c.validate(); }, {"model.n_kv_head = 1", "family gpt2"});
}

TEST(ModelPreset, LlamaKeepsItsGroupedQueryKvHeads) {
  ModelConfig c = model_preset("llama-tiny");
  const int64_t kv = c.n_kv_head;
  c.n_head = 8;
  derive_model_keys(c, /*n_kv_head_given=*/false);
  EXPECT_EQ(c.n_kv_head, kv);
}

TEST(ModelPreset, UnknownNameListsTheValidOnes) {
  expect_error([] { model_preset("gpt3"); }, {"model.preset", "gpt3", "gpt2-124m", "gpt2-350m", "llama-110m",
                                              "gpt2-tiny", "llama-tiny"});
  expect_error([] { family_from_name("mamba"); }, {"model.family", "mamba", "gpt2, llama"});
}

TEST(ModelConfig, InvalidValuesNameTheKeyAndWhatIsAllowed) {
  auto with = [](auto edit) {
    ModelConfig c = model_preset("llama-tiny");
    edit(c);
    return [c] { c.validate(); };
  };
  expect_error(with([](ModelConfig& c) { c.n_layer = 0; }), {"model.n_layer = 0", ">= 1"});
  expect_error(with([](ModelConfig& c) { c.vocab_size = -5; }), {"model.vocab_size = -5"});
  expect_error(with([](ModelConfig& c) { c.n_embd = 66; }), {"model.n_embd = 66", "model.n_head = 4"});
  expect_error(with([](ModelConfig& c) { c.n_kv_head = 3; }), {"model.n_head = 4", "model.n_kv_head = 3"});
  expect_error(with([](ModelConfig& c) { c.n_embd = 60, c.n_head = 4, c.n_kv_head = 4; }),
               {"15", "odd", "RoPE"});
  expect_error(with([](ModelConfig& c) { c.norm_eps = 0.f; }), {"model.norm_eps"});
  expect_error(with([](ModelConfig& c) { c.rope_theta = -1.f; }), {"model.rope_theta"});
  expect_error(with([](ModelConfig& c) { c.n_expert = 4, c.top_k = 5; }), {"model.top_k = 5", "model.n_expert = 4"});
  expect_error(with([](ModelConfig& c) { c.n_expert = 4, c.capacity_factor = -1.f; }),
               {"model.capacity_factor = -1", "0 (dropless)"});
  expect_error(with([](ModelConfig& c) { c.n_expert = 4, c.moe_every = 3; }),
               {"model.moe_every = 3", "1 to model.n_layer = 2"});
  expect_error(with([](ModelConfig& c) { c.n_expert = 4, c.z_loss_coef = -0.1f; }), {"model.z_loss_coef"});
  expect_error(with([](ModelConfig& c) { c.n_expert = 4, c.routing_group = 0; }), {"model.routing_group = 0"});
  expect_error(with([](ModelConfig& c) { c.n_layer = int64_t{1} << 62; }), {"model.n_layer", "too large"});
  expect_error(with([](ModelConfig& c) { c.n_layer = 1 << 20, c.n_embd = 1 << 20, c.n_head = 1 << 10, c.n_kv_head = 1 << 10; }),
               {"parameters", "more than 2^50"});
  ModelConfig g = model_preset("gpt2-tiny");
  g.n_kv_head = 2;
  expect_error([g] { g.validate(); }, {"model.n_kv_head = 2", "gpt2"});
  expect_error([g] { param_specs(g); }, {"model.n_kv_head"});
  g = model_preset("gpt2-tiny");
  g.n_expert = 8;
  expect_error([g] { g.validate(); }, {"model.n_expert = 8", "family = llama"});
}

TEST(ParamSpecs, Gpt2UsesHuggingFaceNamesAndLoomLinearLayout) {
  const ModelConfig c = model_preset("gpt2-124m");
  const std::vector<ParamSpec> specs = param_specs(c);
  const std::vector<std::string> first = {"wte.weight", "wpe.weight", "h.0.ln_1.weight", "h.0.ln_1.bias",
                                          "h.0.attn.c_attn.weight", "h.0.attn.c_attn.bias",
                                          "h.0.attn.c_proj.weight", "h.0.attn.c_proj.bias", "h.0.ln_2.weight",
                                          "h.0.ln_2.bias", "h.0.mlp.c_fc.weight", "h.0.mlp.c_fc.bias",
                                          "h.0.mlp.c_proj.weight", "h.0.mlp.c_proj.bias"};
  const std::vector<std::string> all = names(specs);
  ASSERT_EQ(all.size(), 2 + 12 * 12 + 2u);  // tied: no lm_head.weight
  EXPECT_EQ(std::vector<std::string>(all.begin(), all.begin() + first.size()), first);
  EXPECT_EQ(all[all.size() - 2], "ln_f.weight");
  EXPECT_EQ(all.back(), "ln_f.bias");
  EXPECT_EQ(spec(specs, "wte.weight").shape, Shape({50257, 768}));
  EXPECT_EQ(spec(specs, "wpe.weight").shape, Shape({1024, 768}));
  EXPECT_EQ(spec(specs, "h.11.attn.c_attn.weight").shape, Shape({2304, 768}));  // (out, in)
  EXPECT_EQ(spec(specs, "h.11.mlp.c_fc.weight").shape, Shape({3072, 768}));
  EXPECT_EQ(spec(specs, "h.11.mlp.c_proj.weight").shape, Shape({768, 3072}));
  EXPECT_TRUE(spec(specs, "h.3.mlp.c_proj.weight").hf_transposed);  // HF Conv1D stores (in, out)
  EXPECT_FALSE(spec(specs, "wte.weight").hf_transposed);
}

TEST(ParamSpecs, Gpt2_124mHas124439808ParametersWithTiedEmbeddings) {
  const ModelConfig c = model_preset("gpt2-124m");
  const int64_t C = c.n_embd, V = c.vocab_size, maxT = c.max_seq_len, L = c.n_layer, F = c.d_ff;
  // Per block: 2 LayerNorms (2C each), c_attn (3C x C + 3C), c_proj (C x C + C),
  // c_fc (F x C + F), mlp.c_proj (C x F + C); plus wte, wpe and ln_f.
  const int64_t block = 4 * C + (3 * C * C + 3 * C) + (C * C + C) + (F * C + F) + (C * F + C);
  const int64_t expected = V * C + maxT * C + L * block + 2 * C;
  EXPECT_EQ(expected, 124439808);
  const std::vector<ParamSpec> specs = param_specs(c);
  EXPECT_EQ(param_count(specs), expected);
  ModelConfig untied = c;
  untied.tie_embeddings = false;
  EXPECT_EQ(param_count(param_specs(untied)), expected + V * C);
  EXPECT_EQ(names(param_specs(untied)).back(), "lm_head.weight");
}

TEST(ParamSpecs, OffsetsPackEveryParameterContiguously) {
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    int64_t offset = 0;
    for (const ParamSpec& s : param_specs(model_preset(preset))) {
      EXPECT_EQ(s.offset, offset) << s.name;
      offset += s.numel();
    }
  }
}

TEST(ParamSpecs, LlamaUsesHuggingFaceNamesWithGqaShapes) {
  const ModelConfig c = model_preset("llama-tiny");  // C 64, NH 4, NKV 2, F 172
  const std::vector<ParamSpec> specs = param_specs(c);
  const std::vector<std::string> expected = {
      "model.embed_tokens.weight", "model.layers.0.input_layernorm.weight", "model.layers.0.self_attn.q_proj.weight",
      "model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.v_proj.weight",
      "model.layers.0.self_attn.o_proj.weight", "model.layers.0.post_attention_layernorm.weight",
      "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight",
      "model.layers.0.mlp.down_proj.weight"};
  const std::vector<std::string> all = names(specs);
  ASSERT_EQ(all.size(), 1 + 9 * 2 + 2u);
  EXPECT_EQ(std::vector<std::string>(all.begin(), all.begin() + expected.size()), expected);
  EXPECT_EQ(all[all.size() - 2], "model.norm.weight");
  EXPECT_EQ(all.back(), "lm_head.weight");  // untied
  EXPECT_EQ(spec(specs, "model.layers.1.self_attn.q_proj.weight").shape, Shape({64, 64}));
  EXPECT_EQ(spec(specs, "model.layers.1.self_attn.k_proj.weight").shape, Shape({32, 64}));  // NKV * HS = 2 * 16
  EXPECT_EQ(spec(specs, "model.layers.1.mlp.down_proj.weight").shape, Shape({64, 172}));
  EXPECT_EQ(spec(specs, "lm_head.weight").shape, Shape({512, 64}));
  const ModelConfig big = model_preset("llama-110m");
  const int64_t C = big.n_embd, F = big.d_ff, V = big.vocab_size;
  EXPECT_EQ(param_count(param_specs(big)), 2 * V * C + big.n_layer * (2 * C + 4 * C * C + 3 * C * F) + C);
}

TEST(InitParam, IsDeterministicAndFollowsTheSpec) {
  const ModelConfig c = model_preset("gpt2-tiny");
  Pools pools;
  Model a(c, 1, 4, pools), b(c, 1, 4, pools);
  a.init_params(1234);
  b.init_params(1234);
  const std::vector<float> pa = test::to_floats(a.params()), pb = test::to_floats(b.params());
  EXPECT_EQ(pa, pb);
  b.init_params(1235);
  EXPECT_NE(pa, test::to_floats(b.params()));
  EXPECT_EQ(test::to_floats(a.param("h.1.ln_2.weight")), std::vector<float>(64, 1.f));
  EXPECT_EQ(test::to_floats(a.param("h.1.mlp.c_fc.bias")), std::vector<float>(256, 0.f));
  // Sample std of the weights: 0.02, and 0.02 / sqrt(2 n_layer) for residual projections.
  auto sample_std = [](const std::vector<float>& v) {
    double s = 0;
    for (float x : v) s += double(x) * x;
    return std::sqrt(s / v.size());
  };
  EXPECT_NEAR(sample_std(test::to_floats(a.param("wte.weight"))), 0.02, 0.001);
  EXPECT_NEAR(sample_std(test::to_floats(a.param("h.0.mlp.c_proj.weight"))), 0.01, 0.0005);
  // Different parameters draw different values.
  EXPECT_NE(test::to_floats(a.param("h.0.mlp.c_fc.weight")), test::to_floats(a.param("h.1.mlp.c_fc.weight")));
}

TEST(InitParam, ARowSliceEqualsTheSameSliceOfTheWholeTensor) {
  const std::vector<ParamSpec> specs = param_specs(model_preset("llama-tiny"));
  for (const char* name : {"model.layers.1.self_attn.k_proj.weight", "model.embed_tokens.weight"}) {
    const ParamSpec& s = spec(specs, name);
    const int64_t rows = s.shape[0], cols = s.shape[1];
    std::vector<float> whole(s.numel());
    init_param(Tensor(whole.data(), DType::f32, s.shape), s, 7);
    for (int64_t begin : {int64_t{0}, int64_t{5}, rows - 3}) {
      const int64_t n = std::min<int64_t>(11, rows - begin);
      std::vector<float> part(n * cols);
      init_param(Tensor(part.data(), DType::f32, {n, cols}), s, 7, begin);
      EXPECT_EQ(part, std::vector<float>(whole.begin() + begin * cols, whole.begin() + (begin + n) * cols))
          << name << " rows from " << begin;
    }
  }
}

TEST(Model, RejectsSequencesLongerThanMaxSeqLenAndWrongBatches) {
  const ModelConfig c = model_preset("gpt2-tiny");
  Pools pools;
  expect_error([&] { Model(c, 2, 65, pools); }, {"sequence length 65", "model.max_seq_len = 64"});
  Model m(c, 2, 4, pools);
  std::vector<int32_t> tokens(3 * 4, 0);
  expect_error([&] { m.forward(Tensor(tokens.data(), DType::i32, {3, 4})); }, {"tokens", "i32(3, 4)", "i32(2, 4)"});
  expect_error([&] { m.param("lm_head.weight"); }, {"lm_head.weight"});
  expect_error([&] { m.backward(); }, {"no targets"});
}

TEST(Model, MemoryIsTaggedParamsGradsActivations) {
  const ModelConfig c = model_preset("gpt2-tiny");
  Pools pools;
  Model m(c, 2, 8, pools);
  const MemoryReport r = pools.report();
  EXPECT_EQ(r[MemTag::params].current, size_t(m.num_params()) * 4);
  EXPECT_EQ(r[MemTag::grads].current, size_t(m.num_params()) * 4);
  EXPECT_GT(r[MemTag::activations].current, size_t(2 * 8 * 512) * 4);  // at least the logits
}

}  // namespace
}  // namespace loom::model
