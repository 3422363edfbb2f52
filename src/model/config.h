// ModelConfig: the [model] section of a run's config (DESIGN.md §7), named
// presets, and validation with user-facing messages.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace loom::model {

enum class Family : uint8_t { gpt2, llama };
// A MoE router's scores: softmax over the experts (Mixtral) or each
// expert's sigmoid (DeepSeek-V3).
enum class RouterScore : uint8_t { softmax, sigmoid };
std::string_view router_score_name(RouterScore s);
// "softmax" | "sigmoid"; anything else is a loom::Error listing them.
RouterScore router_score_from_name(std::string_view name);
std::string_view family_name(Family f);
// "gpt2" | "llama"; anything else is a loom::Error listing the allowed names.
Family family_from_name(std::string_view name);

// GPT-2: learned positions, LayerNorm (with bias), GELU MLP, biases
// everywhere, n_kv_head == n_head. Llama: RoPE, RMSNorm, SwiGLU MLP, no
// biases, GQA (n_kv_head divides n_head).
struct ModelConfig {
  Family family = Family::gpt2;
  int64_t n_layer = 12;
  int64_t n_embd = 768;     // C
  int64_t n_head = 12;      // NH
  int64_t n_kv_head = 12;   // NKV
  int64_t d_ff = 3072;      // F
  int64_t vocab_size = 50257;  // V
  int64_t max_seq_len = 1024;  // maxT: GPT-2's position table rows; Llama's longest sequence
  float rope_theta = 10000.f;  // Llama only
  float norm_eps = 1e-5f;
  bool tie_embeddings = true;  // lm head reads the token embedding
  // Mixture of experts (DESIGN.md §4 MoE; model/moe.h), family llama only:
  // n_expert > 0 replaces the MLP of every moe_every-th layer (layers
  // moe_every - 1, 2 moe_every - 1, ...) by a router and n_expert SwiGLU
  // experts of d_ff hidden units (Mixtral's layout and names).
  int64_t n_expert = 0;           // 0: a dense model
  int64_t top_k = 2;              // experts per token
  float capacity_factor = 1.25f;  // per routing group, in training; 0: dropless (evaluation and serving always)
  float aux_loss_coef = 0.01f;    // Switch / GShard load-balancing loss, per MoE layer (Megatron's; config_hf.cpp)
  float z_loss_coef = 0.f;        // ST-MoE router z-loss
  int64_t moe_every = 1;
  int64_t n_shared_expert = 0;    // shared experts every token uses (one SwiGLU of n_shared_expert x d_ff)
  RouterScore router_score = RouterScore::softmax;
  bool norm_topk_prob = true;     // renormalise the k chosen scores to sum to 1 (Mixtral)
  int64_t routing_group = 1;      // sequences per capacity group (GShard's groups)
  float aux_free_rate = 0.f;      // > 0: DeepSeek-V3's loss-free balancing bias, updated by +-rate a step

  bool is_moe() const { return n_expert > 0; }
  bool is_moe_layer(int64_t layer) const { return n_expert > 0 && (layer + 1) % moe_every == 0; }
  int64_t n_moe_layers() const { return n_expert > 0 ? n_layer / moe_every : 0; }
  bool has_expert_bias() const { return aux_free_rate > 0.f; }

  int64_t head_size() const { return n_embd / n_head; }  // HS
  int64_t kv_dim() const { return n_kv_head * head_size(); }  // NKV * HS
  // Throws loom::Error naming the `model.<key>`, its value and what is allowed.
  void validate() const;
  void validate_moe() const;  // the MoE keys (part of validate)
};

// Named presets: gpt2-124m, gpt2-350m, llama-110m, and the tiny test models
// gpt2-tiny, llama-tiny. An unknown name is a loom::Error listing the valid ones.
ModelConfig model_preset(std::string_view name);
// The one rule for keys derived from others, applied by every reader of
// [model] keys (run config, init-model --set, loom_config.json) once the
// explicit keys are set: GPT-2 has no grouped-query attention, so n_kv_head
// follows n_head (e.g. a preset's with n_head overridden) unless n_kv_head
// itself was given.
void derive_model_keys(ModelConfig& cfg, bool n_kv_head_given);
std::vector<std::string> model_preset_names();

}  // namespace loom::model
