#include "model/config.h"

#include <cmath>
#include <cstdint>
#include <utility>

#include "core/error.h"

namespace loom::model {
namespace {

struct Preset {
  const char* name;
  ModelConfig cfg;
};

ModelConfig gpt2(int64_t n_layer, int64_t n_embd, int64_t n_head, int64_t vocab, int64_t max_seq) {
  ModelConfig c;
  c.family = Family::gpt2;
  c.n_layer = n_layer, c.n_embd = n_embd, c.n_head = n_head, c.n_kv_head = n_head;
  c.d_ff = 4 * n_embd, c.vocab_size = vocab, c.max_seq_len = max_seq;
  c.tie_embeddings = true;
  return c;
}

ModelConfig llama(int64_t n_layer, int64_t n_embd, int64_t n_head, int64_t n_kv_head, int64_t d_ff, int64_t vocab,
                  int64_t max_seq) {
  ModelConfig c;
  c.family = Family::llama;
  c.n_layer = n_layer, c.n_embd = n_embd, c.n_head = n_head, c.n_kv_head = n_kv_head;
  c.d_ff = d_ff, c.vocab_size = vocab, c.max_seq_len = max_seq;
  c.tie_embeddings = false;
  return c;
}

// GPT-2 sizes from Radford et al. 2019 (124M is the smallest, 350M "medium").
// llama-110m uses GPT-2's vocabulary (50257) until loom has a SentencePiece
// tokenizer; d_ff 2048 is Llama's 8/3 * C rounded to a multiple of 256.
const Preset kPresets[] = {
    {"gpt2-124m", gpt2(12, 768, 12, 50257, 1024)},
    {"gpt2-350m", gpt2(24, 1024, 16, 50257, 1024)},
    {"llama-110m", llama(12, 768, 12, 12, 2048, 50257, 1024)},
    {"gpt2-tiny", gpt2(2, 64, 4, 512, 64)},
    {"llama-tiny", llama(2, 64, 4, 2, 172, 512, 64)},
};

void require_positive(const char* key, int64_t v) {
  LOOM_REQUIRE(v > 0, "model.", key, " = ", v, " is invalid: allowed values are integers >= 1");
}

}  // namespace

std::string_view family_name(Family f) { return f == Family::gpt2 ? "gpt2" : "llama"; }

Family family_from_name(std::string_view name) {
  if (name == "gpt2") return Family::gpt2;
  if (name == "llama") return Family::llama;
  fail("model.family = '", name, "' is unknown: allowed values are gpt2, llama");
}

void ModelConfig::validate() const {
  require_positive("n_layer", n_layer);
  require_positive("n_embd", n_embd);
  require_positive("n_head", n_head);
  require_positive("n_kv_head", n_kv_head);
  require_positive("d_ff", d_ff);
  require_positive("vocab_size", vocab_size);
  require_positive("max_seq_len", max_seq_len);
  // Sizes beyond int32 are no model this code can hold, and bounding them
  // keeps every size product below in int64 (no overflow).
  constexpr int64_t kMaxDim = int64_t{1} << 31;
  for (auto [key, value] : {std::pair{"n_layer", n_layer}, {"n_embd", n_embd}, {"n_head", n_head},
                            {"n_kv_head", n_kv_head}, {"d_ff", d_ff}, {"vocab_size", vocab_size},
                            {"max_seq_len", max_seq_len}})
    LOOM_REQUIRE(value <= kMaxDim, "model.", key, " = ", value, " is too large: allowed values are 1 to ", kMaxDim);
  // Layer and unit indices are int, and every layer costs tens of KB of host
  // bookkeeping (specs, views) besides its tensors: 2^20 layers is 1000x the
  // deepest trained transformer.
  constexpr int64_t kMaxLayers = int64_t{1} << 20;
  LOOM_REQUIRE(n_layer <= kMaxLayers, "model.n_layer = ", n_layer, " is too large: allowed values are 1 to ",
               kMaxLayers);
  // Parameters (counted in floating point: the exact count could overflow).
  const double C = static_cast<double>(n_embd), F = static_cast<double>(d_ff);
  const double approx = static_cast<double>(n_layer) * (4 * C * C + 3 * C * F) +
                        2 * static_cast<double>(vocab_size) * C + static_cast<double>(max_seq_len) * C;
  LOOM_REQUIRE(approx < 0x1p50, "model with n_layer = ", n_layer, ", n_embd = ", n_embd, ", d_ff = ", d_ff,
               ", vocab_size = ", vocab_size, " has about ", approx, " parameters: more than 2^50 is not supported");
  LOOM_REQUIRE(n_embd % n_head == 0, "model.n_embd = ", n_embd, " is not divisible by model.n_head = ", n_head,
               ": n_embd must be a multiple of n_head (head size = n_embd / n_head)");
  LOOM_REQUIRE(n_head % n_kv_head == 0, "model.n_head = ", n_head, " is not divisible by model.n_kv_head = ",
               n_kv_head, ": n_kv_head must divide n_head (grouped-query attention)");
  LOOM_REQUIRE(std::isfinite(norm_eps) && norm_eps > 0.f, "model.norm_eps = ", norm_eps,
               " is invalid: allowed values are finite and > 0");
  if (family == Family::gpt2) {
    LOOM_REQUIRE(n_kv_head == n_head, "model.n_kv_head = ", n_kv_head, " differs from model.n_head = ", n_head,
                 ": family gpt2 has no grouped-query attention (set n_kv_head = n_head or family = llama)");
  } else {
    LOOM_REQUIRE(head_size() % 2 == 0, "model.n_embd / model.n_head = ", n_embd, " / ", n_head, " = ", head_size(),
                 " is odd: family llama needs an even head size for RoPE");
    LOOM_REQUIRE(std::isfinite(rope_theta) && rope_theta > 0.f, "model.rope_theta = ", rope_theta,
                 " is invalid: allowed values are finite and > 0");
  }
  validate_moe();
}

void ModelConfig::validate_moe() const {
  if (n_expert == 0) return;
  LOOM_REQUIRE(n_expert > 0 && n_expert <= 4096, "model.n_expert = ", n_expert,
               " is invalid: allowed values are 0 (dense) to 4096");
  LOOM_REQUIRE(family == Family::llama, "model.n_expert = ", n_expert,
               ": mixture-of-experts layers are Llama's (Mixtral's layout): set model.family = llama");
  LOOM_REQUIRE(top_k >= 1 && top_k <= n_expert, "model.top_k = ", top_k, " is invalid: allowed values are 1 to ",
               "model.n_expert = ", n_expert);
  LOOM_REQUIRE(std::isfinite(capacity_factor) && capacity_factor >= 0.f, "model.capacity_factor = ", capacity_factor,
               " is invalid: allowed values are 0 (dropless) or finite and > 0");
  for (auto [key, value] : {std::pair{"aux_loss_coef", aux_loss_coef}, {"z_loss_coef", z_loss_coef},
                            {"aux_free_rate", aux_free_rate}})
    LOOM_REQUIRE(std::isfinite(value) && value >= 0.f, "model.", key, " = ", value,
                 " is invalid: allowed values are finite and >= 0");
  LOOM_REQUIRE(moe_every >= 1 && moe_every <= n_layer, "model.moe_every = ", moe_every,
               " is invalid: allowed values are 1 to model.n_layer = ", n_layer, " (layer l is a MoE layer when ",
               "(l + 1) is a multiple of it)");
  LOOM_REQUIRE(n_shared_expert >= 0 && n_shared_expert <= 64, "model.n_shared_expert = ", n_shared_expert,
               " is invalid: allowed values are 0 to 64");
  LOOM_REQUIRE(routing_group >= 1, "model.routing_group = ", routing_group,
               " is invalid: allowed values are >= 1 (sequences per capacity group)");
}

std::string_view router_score_name(RouterScore s) { return s == RouterScore::softmax ? "softmax" : "sigmoid"; }

RouterScore router_score_from_name(std::string_view name) {
  if (name == "softmax") return RouterScore::softmax;
  if (name == "sigmoid") return RouterScore::sigmoid;
  fail("model.router_score = '", name, "' is unknown: allowed values are softmax, sigmoid");
}

ModelConfig model_preset(std::string_view name) {
  for (const Preset& p : kPresets)
    if (name == p.name) return p.cfg;
  std::string valid;
  for (const Preset& p : kPresets) valid += (valid.empty() ? "" : ", ") + std::string(p.name);
  fail("model.preset = '", name, "' is unknown: valid presets are ", valid);
}

void derive_model_keys(ModelConfig& cfg, bool n_kv_head_given) {
  if (cfg.family == Family::gpt2 && !n_kv_head_given) cfg.n_kv_head = cfg.n_head;
}

std::vector<std::string> model_preset_names() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.emplace_back(p.name);
  return names;
}

}  // namespace loom::model
