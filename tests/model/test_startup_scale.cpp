// Start-up work is linear in the number of layers (issue 15, defect 7): the
// spec list, its units and the model's size are built or computed without
// scanning every parameter once per layer, and a model too large for memory
// is refused before anything loops over its layers or allocates. These tests
// count work (sizes, invariants) at 100000 layers, where a quadratic start-up
// would not finish within the test's timeout; they time nothing.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "core/memory.h"
#include "model/config.h"
#include "model/model.h"
#include "model/params.h"

namespace loom::model {
namespace {

constexpr int64_t kDeep = 100000;

// A deep, narrow model: every per-layer cost shows, the tensors stay small.
ModelConfig deep(Family family, int64_t n_layer, bool tied) {
  ModelConfig c = model_preset(family == Family::gpt2 ? "gpt2-tiny" : "llama-tiny");
  // Llama: grouped-query attention, 4 heads of size 2 sharing 2 KV heads.
  c.n_layer = n_layer, c.n_embd = 8, c.n_head = family == Family::gpt2 ? 2 : 4, c.n_kv_head = 2;
  c.d_ff = 16, c.vocab_size = 64, c.max_seq_len = 8;
  c.tie_embeddings = tied;
  return c;
}

std::string error_of(auto f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ParamSpecs, A100000LayerListHasEveryLayersParametersPackedInOrder) {
  const ModelConfig c = deep(Family::gpt2, kDeep, true);
  const std::vector<ParamSpec> specs = param_specs(c);
  ASSERT_EQ(specs.size(), static_cast<size_t>(2 + 12 * kDeep + 2));
  int64_t offset = 0;
  for (const ParamSpec& s : specs) {
    ASSERT_EQ(s.offset, offset) << s.name;
    offset += s.numel();
  }
  EXPECT_EQ(param_count(specs), param_count(c));
  EXPECT_EQ(specs[2].name, "h.0.ln_1.weight");
  EXPECT_EQ(specs[2 + 12 * (kDeep - 1)].name, concat("h.", kDeep - 1, ".ln_1.weight"));
  EXPECT_EQ(specs.back().name, "ln_f.bias");
}

TEST(ModelUnits, A100000LayerModelHasOneUnitPerLayerBetweenEmbeddingsAndHead) {
  const ModelConfig c = deep(Family::llama, kDeep, false);
  const std::vector<ParamSpec> specs = param_specs(c);
  const std::vector<Unit> units = model_units(c, specs);
  ASSERT_EQ(units.size(), static_cast<size_t>(kDeep + 2));
  EXPECT_EQ(units.front().begin, 0);
  EXPECT_EQ(units.back().end, param_count(specs));
  const int64_t per_layer = units[1].numel();
  for (size_t u = 1; u < units.size(); ++u) ASSERT_EQ(units[u].begin, units[u - 1].end) << u;
  for (int64_t l = 0; l < kDeep; ++l) {
    ASSERT_EQ(units[1 + l].numel(), per_layer) << l;
    ASSERT_EQ(units[1 + l].begin, specs[1 + 9 * l].offset) << l;  // model.layers.l.input_layernorm.weight
  }
  EXPECT_EQ(units.back().begin, specs[1 + 9 * kDeep].offset);  // model.norm.weight, then lm_head
}

// A stage's list holds its own layers only; its units are [embeddings], its
// layers, [head], where the head of a later stage holds the tied copy.
TEST(ModelUnits, AMiddleAndALastStageOfADeepModelHaveTheirLayersUnits) {
  const ModelConfig c = deep(Family::gpt2, kDeep, true);
  const std::vector<ParamSpec> middle = param_specs(c, {}, {500, 1000});
  ASSERT_EQ(middle.size(), 12u * 1000);
  EXPECT_EQ(middle.front().name, "h.500.ln_1.weight");
  EXPECT_EQ(model_units(c, middle).size(), 1000u);
  const std::vector<ParamSpec> last = param_specs(c, {}, {kDeep - 10, -1});
  ASSERT_EQ(last.size(), 12u * 10 + 3);  // ln_f weight and bias, the copy of wte
  EXPECT_TRUE(last.back().pp_copy);
  const std::vector<Unit> units = model_units(c, last);
  ASSERT_EQ(units.size(), 11u);
  EXPECT_EQ(units.back().begin, last[12 * 10].offset);
  EXPECT_EQ(units.back().end, param_count(last));
}

// param_count(cfg, tp, stage) is O(1) in n_layer; it must equal the list's
// count for every family, tying, tp rank and stage.
TEST(ParamSpecs, CountWithoutTheListEqualsTheListsCount) {
  for (Family f : {Family::gpt2, Family::llama})
    for (bool tied : {true, false})
      for (int tp : {1, 2}) {
        const ModelConfig c = deep(f, 7, tied);
        for (PpStage st : {PpStage{}, PpStage{0, 3}, PpStage{3, 2}, PpStage{5, -1}, PpStage{6, 1}})
          for (int r = 0; r < tp; ++r)
            EXPECT_EQ(param_count(c, {tp, r}, st), param_count(param_specs(c, {tp, r}, st)))
                << family_name(f) << " tied " << tied << " tp " << tp << " stage " << st.first_layer;
      }
  EXPECT_NE(error_of([] { (void)param_count(deep(Family::gpt2, 4, true), {}, {3, 2}); }).find("pipeline stage"),
            std::string::npos);
}

// Building a stage's specs directly gives what filtering the whole list
// gives: the same parameters (name, shape, init, split), repacked, and the
// tied copy last.
TEST(ParamSpecs, AStagesListIsTheWholeListsPartRepacked) {
  for (bool tied : {true, false}) {
    const ModelConfig c = deep(Family::gpt2, 6, tied);
    const std::vector<ParamSpec> whole = param_specs(c, {2, 1});
    for (PpStage st : {PpStage{0, 2}, PpStage{2, 3}, PpStage{5, 1}}) {
      std::vector<const ParamSpec*> expected;
      for (const ParamSpec& s : whole) {
        int64_t l = -1;
        const ParamPart part = param_part(c, s.name, &l);
        const bool first = st.first_layer == 0, last = st.first_layer + st.n_layers == c.n_layer;
        if (part == ParamPart::embedding ? first
            : part == ParamPart::head    ? last
                                         : l >= st.first_layer && l < st.first_layer + st.n_layers)
          expected.push_back(&s);
      }
      const bool copy = tied && st.first_layer > 0 && st.first_layer + st.n_layers == c.n_layer;
      if (copy) expected.push_back(&whole.front());  // wte.weight
      const std::vector<ParamSpec> got = param_specs(c, {2, 1}, st);
      ASSERT_EQ(got.size(), expected.size());
      int64_t offset = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        const ParamSpec& e = *expected[i];
        EXPECT_EQ(got[i].name, e.name);
        EXPECT_EQ(got[i].shape, e.shape);
        EXPECT_EQ(got[i].global_shape, e.global_shape);
        EXPECT_EQ(got[i].init, e.init);
        EXPECT_EQ(got[i].init_std, e.init_std);
        EXPECT_EQ(got[i].hf_transposed, e.hf_transposed);
        EXPECT_EQ(got[i].split.dim, e.split.dim);
        EXPECT_EQ(got[i].split.extent, e.split.extent);
        EXPECT_EQ(got[i].split.blocks, e.split.blocks);
        EXPECT_EQ(got[i].pp_copy, copy && i + 1 == got.size());
        EXPECT_EQ(got[i].offset, offset);
        offset += got[i].numel();
      }
    }
  }
}

// state_bytes is computed from one- and two-layer layouts; the pools hold
// exactly that after the constructor, for every recompute policy, dtype,
// stage and slot count (the bookkeeping beside the pools is an estimate, and
// the model reports the one it checked).
TEST(ModelMemory, StateBytesEqualWhatTheConstructorTakesFromThePools) {
  const ModelConfig c = deep(Family::llama, 5, false);
  struct Build {
    DType compute;
    Recompute recompute;
    StageOptions stage;
  };
  for (const Build& b : {Build{DType::f32, Recompute::none, {}}, Build{DType::bf16, Recompute::selective, {}},
                         Build{DType::f32, Recompute::full, {{1, 3}, 2}},
                         Build{DType::f16, Recompute::none, {{2, -1}, 3}}}) {
    Pools pools;
    const ModelOptions options{.compute = b.compute, .recompute = b.recompute, .stage = b.stage};
    const ModelBytes need = Model::state_bytes(c, 2, 4, options);
    const Model m(c, 2, 4, pools, options);
    const MemoryReport r = pools.report();
    EXPECT_EQ(static_cast<int64_t>(r[MemTag::params].current), need.params);
    EXPECT_EQ(static_cast<int64_t>(r[MemTag::master].current), need.master);
    EXPECT_EQ(static_cast<int64_t>(r[MemTag::grads].current), need.grads);
    EXPECT_EQ(static_cast<int64_t>(r[MemTag::activations].current), need.activations);
    EXPECT_EQ(m.memory().host, need.host);
    EXPECT_GT(need.host, 0);
  }
}

// 2^20 layers of width 4096: about 2 x 10^14 parameters, petabytes of
// state. The constructor says so at once, having allocated nothing.
TEST(ModelMemory, AModelLargerThanMemoryIsRefusedBeforeItAllocates) {
  ModelConfig c = model_preset("gpt2-124m");
  c.n_layer = int64_t{1} << 20, c.n_embd = 4096, c.n_head = 32, c.n_kv_head = 32, c.d_ff = 16384;
  Pools pools;
  const std::string msg = error_of([&] { Model m(c, 1, 1, pools); });
  for (const char* part : {"model of ", " parameters on this rank", "model.n_layer = 1048576", " needs ", " GiB",
                           "but this machine has ", " of memory", "allowed are runs whose state fits in memory"})
    EXPECT_NE(msg.find(part), std::string::npos) << part << " in: " << msg;
  EXPECT_EQ(pools.report().peak_total, 0u);
}

TEST(ModelConfig, MoreThan2To20LayersIsTooLarge) {
  ModelConfig c = deep(Family::gpt2, (int64_t{1} << 20) + 1, true);
  const std::string msg = error_of([&] { c.validate(); });
  EXPECT_NE(msg.find("model.n_layer = 1048577 is too large: allowed values are 1 to 1048576"), std::string::npos)
      << msg;
}

}  // namespace
}  // namespace loom::model
