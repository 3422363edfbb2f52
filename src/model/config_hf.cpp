// Hugging Face config.json (GPT2Config, LlamaConfig, MixtralConfig) <-> ModelConfig,
// and generation_config.json's end-of-sequence ids. A key that changes what
// transformers computes and that loom does not implement is refused by name.
#include <algorithm>
#include <filesystem>
#include <utility>
#include <vector>

#include "core/error.h"
#include "model/config_json.h"
#include "model/json_keys.h"

namespace loom::model {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A key and the only value loom computes the model for (null: the key must
// be absent or null, as any value changes the model).
struct Neutral {
  const char* key;
  json value;
  const char* why = "loom does not implement it";
};

// Keys transformers' attention or RoPE code reads from any of these configs
// (partial_rotary_factor, via getattr), or that mark a checkpoint of another
// architecture labelled llama / gpt2 (Gemma 2's soft-capping, OLMo / Llama 4's
// QK norm, Granite's multipliers): loom implements none of them.
const std::vector<Neutral>& other_model_keys() {
  static const std::vector<Neutral> keys = {
      {"partial_rotary_factor", 1.0, "loom rotates every dimension of a head"},
      {"attn_logit_softcapping", nullptr}, {"final_logit_softcapping", nullptr},
      {"query_pre_attn_scalar", nullptr}, {"qk_layernorm", false}, {"use_qk_norm", false},
      {"use_sliding_window", false}, {"embedding_multiplier", 1.0}, {"logits_scaling", 1.0},
      {"residual_multiplier", 1.0}, {"attention_multiplier", nullptr}};
  return keys;
}

// GPT2Config's attention options; reorder_and_upcast_attn is not here: it
// only computes the same softmax(QK^T / sqrt(d)) in f32 with the scale applied
// first, which loom's f32 attention already is.
const std::vector<Neutral>& gpt2_attention_keys() {
  static const char* why = "loom's GPT-2 scales every layer's attention by 1 / sqrt(head size)";
  static const std::vector<Neutral> keys = {{"scale_attn_weights", true, why},
                                            {"scale_attn_by_inverse_layer_idx", false, why}};
  return keys;
}

// loom's MoE keys that transformers' MixtralForCausalLM ignores: it runs
// every layer as MoE, without shared experts or an expert bias, with a
// softmax router whose top-k weights it always renormalises. Any other value
// in a mixtral config.json would make loom compute another model than
// transformers does from the same files.
const std::vector<Neutral>& mixtral_ignored_keys() {
  static const std::vector<Neutral> keys = {
      {"moe_every", 1, "transformers' Mixtral ignores it and makes every layer MoE"},
      {"n_shared_expert", 0, "transformers' Mixtral ignores it and has no shared experts"},
      {"router_score", "softmax", "transformers' Mixtral ignores it and routes by a softmax"},
      {"norm_topk_prob", true, "transformers' Mixtral ignores it and always renormalises the top-k weights"},
      {"aux_free_rate", 0.0, "transformers' Mixtral ignores it and has no expert bias"}};
  return keys;
}

// The balancing loss's coefficient in transformers' Mixtral and in loom mean different things. transformers'
// (load_balancing_loss_func) is one loss over every layer's router at once, E sum_e f_e P_e with f counting
// all k choices (k when balanced), added once. loom's (Megatron's) is per MoE layer, f counted per choice
// (1 when balanced), summed over the L MoE layers. The same balance pressure, value and gradient per
// router probability (where the layers route alike): loom's = transformers' x k / L.
float loom_aux_loss_coef(double hf_coef, const ModelConfig& c) {
  return static_cast<float>(hf_coef * static_cast<double>(c.top_k) / static_cast<double>(c.n_moe_layers()));
}
double hf_router_aux_loss_coef(const ModelConfig& c) {
  return static_cast<double>(c.aux_loss_coef) * static_cast<double>(c.n_moe_layers()) /
         static_cast<double>(c.top_k);
}

void require_neutral(const Keys& k, const std::vector<Neutral>& keys) {
  for (const Neutral& n : keys) {
    if (!k.has(n.key) || k.at(n.key) == n.value) continue;
    fail(k.where(), ": key '", n.key, "' = ", k.at(n.key).dump(), " is not supported: ", n.why, "; allowed is ",
         n.value.is_null() ? std::string("null") : n.value.dump(), " (or the key left out)");
  }
}

// rope_parameters (transformers v5) or rope_scaling (v4): plain RoPE only.
// Its rope_theta, if any, is added to `thetas`.
void read_rope_object(const Keys& k, const char* key, std::vector<std::pair<std::string, float>>& thetas) {
  if (!k.has(key)) return;
  const std::string where = k.where() + ": key '" + key + "'";
  const Keys r(k.at(key), where);
  for (const char* type_key : {"rope_type", "type"})
    if (r.has(type_key))
      LOOM_REQUIRE(r.string(type_key) == "default", where, ": key '", type_key, "' = '", r.string(type_key),
                   "' is not supported: loom implements only plain RoPE, rope_type \"default\"");
  for (const auto& [name, value] : r.object().items())
    LOOM_REQUIRE(name == "rope_type" || name == "type" || name == "rope_theta" || name == "partial_rotary_factor",
                 where, ": key '", name, "' is not supported: loom implements plain RoPE, whose keys are rope_type ",
                 "(\"default\"), rope_theta and partial_rotary_factor (1.0)");
  if (r.has("partial_rotary_factor"))
    LOOM_REQUIRE(r.number("partial_rotary_factor") == 1.f, where, ": key 'partial_rotary_factor' = ",
                 r.number("partial_rotary_factor"), " is not supported: loom rotates every dimension of a head; ",
                 "allowed is 1.0");
  if (r.has("rope_theta")) thetas.emplace_back(std::string(key) + ".rope_theta", r.number("rope_theta"));
}

// rope_theta from the top-level key, rope_parameters or rope_scaling, which
// must agree; `fallback` (the config class's default) if none has it.
float read_rope_theta(const Keys& k, float fallback) {
  std::vector<std::pair<std::string, float>> thetas;
  if (k.has("rope_theta")) thetas.emplace_back("rope_theta", k.number("rope_theta"));
  read_rope_object(k, "rope_parameters", thetas);
  read_rope_object(k, "rope_scaling", thetas);
  for (const auto& [key, theta] : thetas)
    LOOM_REQUIRE(theta == thetas.front().second, k.where(), ": key '", key, "' = ", theta, " differs from '",
                 thetas.front().first, "' = ", thetas.front().second, ": give one RoPE base (rope_theta)");
  return thetas.empty() ? fallback : thetas.front().second;
}

// Mistral / Mixtral's sliding-window attention: loom attends to the whole
// context, which is the same model only while no sequence is longer than the window.
void require_no_sliding_window(const Keys& k, int64_t max_position_embeddings) {
  if (!k.has("sliding_window")) return;
  const int64_t w = k.integer("sliding_window");
  LOOM_REQUIRE(w >= max_position_embeddings, k.where(), ": key 'sliding_window' = ", w,
               " is not supported: loom has no sliding-window attention; allowed is null or at least ",
               "max_position_embeddings = ", max_position_embeddings, " (a window that never applies)");
}

// The head counts under HF's names, before validate() would name loom's.
void require_head_counts(const Keys& k, const ModelConfig& c) {
  LOOM_REQUIRE(c.n_head > 0 && c.n_kv_head > 0, k.where(), ": keys 'num_attention_heads' = ", c.n_head,
               " and 'num_key_value_heads' = ", c.n_kv_head, " must be at least 1");
  LOOM_REQUIRE(c.n_embd % c.n_head == 0, k.where(), ": key 'hidden_size' = ", c.n_embd,
               " is not a multiple of 'num_attention_heads' = ", c.n_head, ": loom needs whole heads");
  LOOM_REQUIRE(c.n_head % c.n_kv_head == 0, k.where(), ": key 'num_key_value_heads' = ", c.n_kv_head,
               " does not divide 'num_attention_heads' = ", c.n_head,
               ": allowed are the divisors of num_attention_heads (grouped-query attention)");
}

ModelConfig gpt2_from_hf_json(const Keys& k) {
  ModelConfig c;
  c.family = Family::gpt2;
  c.n_layer = k.integer("n_layer"), c.n_embd = k.integer("n_embd"), c.n_head = k.integer("n_head");
  c.n_kv_head = c.n_head;
  c.d_ff = k.has("n_inner") ? k.integer("n_inner") : 4 * c.n_embd;
  c.max_seq_len = k.integer("n_positions"), c.vocab_size = k.integer("vocab_size");
  c.norm_eps = k.has("layer_norm_epsilon") ? k.number("layer_norm_epsilon") : 1e-5f;
  c.tie_embeddings = k.has("tie_word_embeddings") ? k.boolean("tie_word_embeddings") : true;
  if (k.has("activation_function")) {
    const std::string act = k.string("activation_function");
    LOOM_REQUIRE(act == "gelu_new" || act == "gelu_pytorch_tanh", k.where(), ": key 'activation_function' = '", act,
                 "' is not supported: allowed is gelu_new (tanh GELU)");
  }
  require_neutral(k, gpt2_attention_keys());
  if (k.has("reorder_and_upcast_attn")) (void)k.boolean("reorder_and_upcast_attn");
  return c;
}

ModelConfig llama_from_hf_json(const Keys& k, bool mixtral) {
  ModelConfig c;
  c.family = Family::llama;
  c.n_embd = k.integer("hidden_size"), c.d_ff = k.integer("intermediate_size");
  c.n_layer = k.integer("num_hidden_layers"), c.n_head = k.integer("num_attention_heads");
  c.n_kv_head = k.has("num_key_value_heads") ? k.integer("num_key_value_heads") : c.n_head;
  c.max_seq_len = k.integer("max_position_embeddings"), c.vocab_size = k.integer("vocab_size");
  c.norm_eps = k.has("rms_norm_eps") ? k.number("rms_norm_eps") : 1e-6f;
  c.rope_theta = read_rope_theta(k, mixtral ? 1e6f : 1e4f);  // MixtralConfig's default base is 1e6
  c.tie_embeddings = k.has("tie_word_embeddings") ? k.boolean("tie_word_embeddings") : false;
  require_no_sliding_window(k, c.max_seq_len);
  require_head_counts(k, c);
  for (const char* key : {"attention_bias", "mlp_bias"})
    LOOM_REQUIRE(!k.has(key) || !k.boolean(key), k.where(), ": key '", key, "' is true: loom's Llama has no biases");
  if (k.has("hidden_act"))
    LOOM_REQUIRE(k.string("hidden_act") == "silu", k.where(), ": key 'hidden_act' = '", k.string("hidden_act"),
                 "' is not supported: allowed is silu");
  if (k.has("head_dim"))
    LOOM_REQUIRE(k.integer("head_dim") == c.n_embd / c.n_head, k.where(), ": key 'head_dim' = ",
                 k.integer("head_dim"), " is not hidden_size / num_attention_heads: loom needs head_dim = ",
                 c.n_embd / c.n_head);
  if (!mixtral) return c;
  c.n_expert = k.integer("num_local_experts"), c.top_k = k.integer("num_experts_per_tok");
  c.capacity_factor = k.has("capacity_factor") ? k.number("capacity_factor") : 0.f;  // transformers: dropless
  // loom's own coefficient, as loom writes it (exact); a config.json loom wrote before it wrote that key (it has
  // loom's routing_group) holds loom's value under transformers' name; another's is converted.
  if (k.has("aux_loss_coef")) {
    c.aux_loss_coef = k.number("aux_loss_coef");
  } else if (k.has("router_aux_loss_coef")) {
    const double coef = k.number("router_aux_loss_coef");
    const bool older_loom = k.has("routing_group") || c.n_moe_layers() == 0;
    c.aux_loss_coef = older_loom ? static_cast<float>(coef) : loom_aux_loss_coef(coef, c);
  }
  // loom's training-only MoE keys, which change no output.
  k.maybe("z_loss_coef", c.z_loss_coef, &Keys::number), k.maybe("routing_group", c.routing_group, &Keys::integer);
  require_neutral(k, mixtral_ignored_keys());
  return c;
}

// Why a MoE model cannot be written as transformers' Mixtral ("" if it can).
std::string mixtral_export_problem(const ModelConfig& c) {
  if (c.moe_every != 1)
    return concat("model.moe_every = ", c.moe_every, ": Mixtral makes every layer MoE (allowed: 1)");
  if (c.n_shared_expert != 0)
    return concat("model.n_shared_expert = ", c.n_shared_expert, ": Mixtral has no shared experts (allowed: 0)");
  if (c.router_score != RouterScore::softmax)
    return "model.router_score = sigmoid: Mixtral's router is a softmax (allowed: softmax)";
  if (c.has_expert_bias())
    return concat("model.aux_free_rate = ", c.aux_free_rate, ": Mixtral has no expert bias (allowed: 0)");
  if (!c.norm_topk_prob)
    return "model.norm_topk_prob = false: Mixtral always renormalises the top-k weights (allowed: true)";
  return "";
}

// The ids of `key` (an integer or a list of them, null: none), each a token of the model.
std::vector<int32_t> eos_ids_of(const Keys& k, const char* key, int64_t vocab_size) {
  std::vector<int32_t> ids;
  if (!k.has(key)) return ids;
  const json& v = k.at(key);
  for (const json& id : v.is_array() ? v : json::array({v})) {
    LOOM_REQUIRE(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < vocab_size, k.where(),
                 ": key '", key, "' = ", v.dump(), " is invalid: allowed is a token id or a list of them, each 0 to ",
                 vocab_size - 1, " (vocab_size - 1)");
    if (std::find(ids.begin(), ids.end(), id.get<int32_t>()) == ids.end()) ids.push_back(id.get<int32_t>());
  }
  return ids;
}

}  // namespace

void require_hf_exportable(const ModelConfig& c, const std::string& where) {
  if (!c.is_moe()) return;
  const std::string problem = mixtral_export_problem(c);
  LOOM_REQUIRE(problem.empty(), where, ": ", problem, "; transformers' MixtralForCausalLM cannot represent it: ",
               "keep loom's format for this model");
}

json hf_config_to_json(const ModelConfig& c) {
  require_hf_exportable(c, "Hugging Face config.json");
  json j;
  if (c.family == Family::gpt2) {
    j["architectures"] = {"GPT2LMHeadModel"};
    j["model_type"] = "gpt2";
    j["n_layer"] = c.n_layer, j["n_embd"] = c.n_embd, j["n_head"] = c.n_head, j["n_inner"] = c.d_ff;
    j["n_positions"] = c.max_seq_len, j["n_ctx"] = c.max_seq_len, j["vocab_size"] = c.vocab_size;
    j["layer_norm_epsilon"] = decimal(c.norm_eps), j["activation_function"] = "gelu_new";
  } else {
    j["architectures"] = {"LlamaForCausalLM"};
    j["model_type"] = "llama";
    j["hidden_size"] = c.n_embd, j["intermediate_size"] = c.d_ff, j["num_hidden_layers"] = c.n_layer;
    j["num_attention_heads"] = c.n_head, j["num_key_value_heads"] = c.n_kv_head;
    j["max_position_embeddings"] = c.max_seq_len, j["rms_norm_eps"] = decimal(c.norm_eps);
    j["rope_theta"] = decimal(c.rope_theta);
    j["vocab_size"] = c.vocab_size, j["hidden_act"] = "silu", j["attention_bias"] = false, j["mlp_bias"] = false;
    if (c.is_moe()) {  // Mixtral's keys, and loom's training-only ones (transformers ignores them)
      j["architectures"] = {"MixtralForCausalLM"};
      j["model_type"] = "mixtral";
      j["num_local_experts"] = c.n_expert, j["num_experts_per_tok"] = c.top_k;
      j["router_aux_loss_coef"] = decimal(static_cast<float>(hf_router_aux_loss_coef(c)));
      j["aux_loss_coef"] = decimal(c.aux_loss_coef), j["capacity_factor"] = decimal(c.capacity_factor);
      j["z_loss_coef"] = decimal(c.z_loss_coef), j["routing_group"] = c.routing_group;
    }
  }
  j["tie_word_embeddings"] = c.tie_embeddings;
  j["torch_dtype"] = "float32";
  return j;
}

ModelConfig model_config_from_hf_json(const json& j, const std::string& where) {
  const Keys k(j, where);
  const std::string type = k.string("model_type");
  LOOM_REQUIRE(type == "gpt2" || type == "llama" || type == "mixtral", where, ": key 'model_type' = '", type,
               "' is not supported: allowed values are gpt2, llama, mixtral");
  require_neutral(k, other_model_keys());
  const ModelConfig c = type == "gpt2" ? gpt2_from_hf_json(k) : llama_from_hf_json(k, type == "mixtral");
  validate_at(c, where);
  return c;
}

std::vector<int32_t> hf_eos_token_ids(const std::string& dir, int64_t vocab_size) {
  const fs::path gen = fs::path(dir) / kHfGenerationConfigFile, cfg = fs::path(dir) / kHfConfigFile;
  std::error_code ec;
  // As transformers' generate and vLLM: generation_config.json, else the model config's own ids.
  const std::string file = fs::exists(gen, ec) ? gen.string() : fs::exists(cfg, ec) ? cfg.string() : "";
  if (file.empty()) return {};
  const json j = read_json_file(file);
  return eos_ids_of(Keys(j, file), "eos_token_id", vocab_size);
}

}  // namespace loom::model
