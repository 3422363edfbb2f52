// The mixture-of-experts model (model/moe.h) against a float64 PyTorch
// Mixtral-style model written independently in tests/ref/ref_moe.py: the
// language-model loss, the aux and z losses, each layer's expert loads and
// the dropped choices, and the gradient of every parameter of the training
// objective (CE + the balancing losses) — for a softmax top-2 router with
// capacity drops and tied router scores, a sigmoid top-1 dropless router
// with a shared expert, a selection bias and an expert no token reaches,
// and 8 experts at capacity 1 per routing group of two sequences.
// Tolerances as test_model.cpp's (f32 vs float64).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/compare.h"
#include "common/ref.h"
#include "common/tensors.h"
#include "core/error.h"
#include "core/memory.h"
#include "io/safetensors.h"
#include "model/config_json.h"
#include "model/model.h"

namespace loom::model {
namespace {

using namespace loom::test;

ModelConfig config_of(RefCase& rc) {
  const std::vector<float> v = rc["config"].floats();
  ModelConfig c;
  c.family = Family::llama;
  c.n_layer = int64_t(v[0]), c.n_embd = int64_t(v[1]), c.n_head = int64_t(v[2]), c.n_kv_head = int64_t(v[3]);
  c.d_ff = int64_t(v[4]), c.vocab_size = int64_t(v[5]), c.max_seq_len = int64_t(v[6]);
  c.n_expert = int64_t(v[7]), c.top_k = int64_t(v[8]), c.moe_every = int64_t(v[9]);
  c.n_shared_expert = int64_t(v[10]);
  c.router_score = v[11] != 0 ? RouterScore::sigmoid : RouterScore::softmax;
  c.norm_topk_prob = v[12] != 0, c.routing_group = int64_t(v[13]);
  c.aux_free_rate = v[14] != 0 ? 1e-3f : 0.f;  // the bias parameter exists
  c.tie_embeddings = false;
  c.capacity_factor = rc["capacity_factor"].scalar();
  c.aux_loss_coef = rc["aux_loss_coef"].scalar(), c.z_loss_coef = rc["z_loss_coef"].scalar();
  c.norm_eps = rc["norm_eps"].scalar(), c.rope_theta = rc["rope_theta"].scalar();
  return c;
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, double(std::fabs(x)));
  return m;
}

class MoeVsTorch : public ::testing::TestWithParam<std::string> {};

TEST_P(MoeVsTorch, LossesLoadsDropsAndEveryGradientMatch) {
  RefCase rc("moe_" + GetParam() + ".ref");
  const ModelConfig cfg = config_of(rc);
  Pools pools;
  Tensor tokens = rc["tokens"].view(), targets = rc["targets"].view();
  Model model(cfg, tokens.size(0), tokens.size(1), pools);
  model.load_params(io::SafetensorsFile::open(std::string(LOOM_REF_DIR) + "/moe_" + GetParam() + ".safetensors"));
  model.zero_grads();
  const float loss = model.forward(tokens, targets);
  EXPECT_NEAR(loss, rc["loss"].scalar(), 1e-4 * std::fabs(rc["loss"].scalar()));
  const MoeStats& st = model.moe_stats();
  const std::vector<float> load = rc["load"].floats();  // (MoE layers, E)
  const int64_t moe_layers = int64_t(load.size()) / cfg.n_expert;
  EXPECT_EQ(st.layer_forwards, moe_layers);
  EXPECT_NEAR(st.aux_loss, rc["aux"].scalar(), 1e-4 * rc["aux"].scalar());
  EXPECT_NEAR(st.z_loss, rc["z"].scalar(), 1e-4 * rc["z"].scalar());
  EXPECT_EQ(st.dropped, int64_t(rc["dropped"].floats()[0]));
  EXPECT_EQ(st.choices, moe_layers * tokens.numel() * cfg.top_k);
  int64_t m = 0;
  for (int64_t l = 0; l < cfg.n_layer; ++l) {
    if (!cfg.is_moe_layer(l)) continue;
    for (int64_t e = 0; e < cfg.n_expert; ++e)
      EXPECT_EQ(st.load[size_t(l * cfg.n_expert + e)], int64_t(load[size_t(m * cfg.n_expert + e)]))
          << "layer " << l << " expert " << e;
    ++m;
  }
  model.backward();
  for (const ParamSpec& s : model.param_specs()) {
    const std::vector<float> expected = rc["grad." + s.name].floats();
    EXPECT_TRUE(all_close(to_floats(model.grad(s.name)), expected, 1e-4, 1e-5 * std::max(max_abs(expected), 1e-3)))
        << s.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, MoeVsTorch,
                         ::testing::Values("softmax_top2_capacity", "sigmoid_top1_shared_bias",
                                           "tiny_capacity_groups"));

// Recompute reruns a MoE layer's routing, dispatch and experts (full) or
// its SwiGLUs (selective) in backward: the same loss, statistics and
// gradients, bit for bit, and the routing counted once.
TEST(MoeRecompute, SelectiveAndFullGiveTheSameBitsAsNone) {
  RefCase rc("moe_softmax_top2_capacity.ref");
  const ModelConfig cfg = config_of(rc);
  const Tensor tokens = rc["tokens"].view(), targets = rc["targets"].view();
  std::vector<float> grads[3];
  MoeStats stats[3];
  for (Recompute r : {Recompute::none, Recompute::selective, Recompute::full}) {
    Pools pools;
    Model m(cfg, tokens.size(0), tokens.size(1), pools, {.recompute = r});
    m.init_params(3);
    m.zero_grads();
    m.forward(tokens, targets);
    m.backward();
    grads[int(r)] = to_floats(m.grads());
    stats[int(r)] = m.moe_stats();
  }
  for (int r : {1, 2}) {
    EXPECT_EQ(grads[r], grads[0]) << recompute_name(Recompute(r));
    EXPECT_EQ(stats[r].layer_forwards, stats[0].layer_forwards);
    EXPECT_EQ(stats[r].load, stats[0].load);
    EXPECT_EQ(stats[r].dropped, stats[0].dropped);
  }
}

// Export under Hugging Face Mixtral's names and config, read back bitwise.
TEST(MoeExport, MixtralNamesAndConfigRoundTripBitwise) {
  ModelConfig cfg = model_preset("llama-tiny");
  cfg.n_expert = 4, cfg.top_k = 2, cfg.n_shared_expert = 1, cfg.aux_free_rate = 1e-3f, cfg.moe_every = 2;
  Pools pools;
  Model a(cfg, 1, 8, pools);
  a.init_params(5);
  const std::string path = ::testing::TempDir() + "/loom_moe_export.safetensors";
  save_params(path, a.param_specs(), a.master_params(), ParamLayout::hf);
  const io::SafetensorsFile file = io::SafetensorsFile::open(path);
  for (const char* name : {"model.layers.1.block_sparse_moe.gate.weight", "model.layers.1.block_sparse_moe.experts.3.w1.weight",
                           "model.layers.1.block_sparse_moe.experts.0.w2.weight",
                           "model.layers.1.block_sparse_moe.experts.2.w3.weight",
                           "model.layers.1.block_sparse_moe.gate.e_score_correction_bias",
                           "model.layers.1.block_sparse_moe.shared_experts.down_proj.weight",
                           "model.layers.0.mlp.gate_proj.weight"})
    EXPECT_TRUE(file.has(name)) << name;
  Model b(cfg, 1, 8, pools);
  b.load_params(file, ParamLayout::hf);
  EXPECT_EQ(to_floats(a.params()), to_floats(b.params()));
  // config.json: only what transformers' Mixtral computes (every layer MoE,
  // no shared expert, no expert bias); this model's extras are refused.
  EXPECT_THROW(hf_config_to_json(cfg), loom::Error);
  cfg.n_shared_expert = 0, cfg.aux_free_rate = 0.f, cfg.moe_every = 1;
  const nlohmann::json hf = hf_config_to_json(cfg);
  EXPECT_EQ(hf["model_type"], "mixtral");
  EXPECT_EQ(hf["num_local_experts"], 4);
  EXPECT_EQ(hf["num_experts_per_tok"], 2);
  const ModelConfig back = model_config_from_hf_json(hf, "config.json");
  EXPECT_EQ(model_config_to_json(back), model_config_to_json(cfg));
}

// transformers' router_aux_loss_coef weighs one balancing loss over every layer at once (k when balanced);
// loom's aux_loss_coef each MoE layer's (1 when balanced): loom's = transformers' x k / L both ways; loom's
// own key is read exactly, and a config.json loom wrote before it had that key keeps loom's value.
TEST(MoeExport, TheBalancingCoefficientIsConvertedToTransformersMeaning) {
  ModelConfig cfg = model_preset("llama-tiny");
  cfg.n_layer = 8, cfg.n_expert = 8, cfg.top_k = 2, cfg.aux_loss_coef = 0.005f;
  nlohmann::json hf = hf_config_to_json(cfg);
  EXPECT_FLOAT_EQ(hf["router_aux_loss_coef"].get<float>(), 0.005f * 8 / 2);
  EXPECT_EQ(model_config_from_hf_json(hf, "config.json").aux_loss_coef, 0.005f);
  hf.erase("aux_loss_coef");  // as loom wrote config.json before: its own value under transformers' name
  hf["router_aux_loss_coef"] = 0.005;
  EXPECT_EQ(model_config_from_hf_json(hf, "config.json").aux_loss_coef, 0.005f);
  for (const char* key : {"routing_group", "z_loss_coef", "capacity_factor"}) hf.erase(key);
  hf["num_hidden_layers"] = 32, hf["router_aux_loss_coef"] = 0.02;  // Mixtral-8x7B's: 32 layers, top 2
  EXPECT_FLOAT_EQ(model_config_from_hf_json(hf, "config.json").aux_loss_coef, 0.02f * 2 / 32);
}

}  // namespace
}  // namespace loom::model
