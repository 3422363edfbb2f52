#include "model/config_json.h"

#include <charconv>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <cmath>
#include <limits>
#include <set>

#include "core/atomic_file.h"
#include "core/error.h"

namespace loom::model {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Typed access to one JSON object's keys with errors naming where and the key.
class Keys {
 public:
  Keys(const json& j, const std::string& where) : j_(j), where_(where) {
    LOOM_REQUIRE(j.is_object(), where, ": expected a JSON object, got ", j.type_name());
  }
  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }
  int64_t integer(const char* key) const {
    const json& v = at(key);
    LOOM_REQUIRE(v.is_number_integer(), where_, ": key '", key, "' = ", v.dump(), " is not an integer");
    return v.get<int64_t>();
  }
  float number(const char* key) const {
    const json& v = at(key);
    LOOM_REQUIRE(v.is_number(), where_, ": key '", key, "' = ", v.dump(), " is not a number");
    const double d = v.get<double>();
    LOOM_REQUIRE(std::abs(d) <= std::numeric_limits<float>::max(), where_, ": key '", key, "' = ", v.dump(),
                 " is out of range: at most ", std::numeric_limits<float>::max(), " in magnitude");
    return static_cast<float>(d);
  }
  bool boolean(const char* key) const {
    const json& v = at(key);
    LOOM_REQUIRE(v.is_boolean(), where_, ": key '", key, "' = ", v.dump(), " is not true or false");
    return v.get<bool>();
  }
  std::string string(const char* key) const {
    const json& v = at(key);
    LOOM_REQUIRE(v.is_string(), where_, ": key '", key, "' = ", v.dump(), " is not a string");
    return v.get<std::string>();
  }
  const json& at(const char* key) const {
    LOOM_REQUIRE(has(key), where_, ": key '", key, "' is missing");
    return j_[key];
  }
  template <typename T, typename F>
  void maybe(const char* key, T& dst, F get) const {
    if (has(key)) dst = (this->*get)(key);
  }

 private:
  const json& j_;
  const std::string& where_;
};

// Prefixes a config validation error with where it came from.
void validate_at(const ModelConfig& cfg, const std::string& where) {
  try {
    cfg.validate();
  } catch (const Error& e) {
    fail(where, ": ", e.what());
  }
}

const std::set<std::string> kLoomKeys = {"family",        "preset",    "n_layer",        "n_embd",
                                         "n_head",        "n_kv_head", "d_ff",           "vocab_size",
                                         "max_seq_len",   "rope_theta", "norm_eps",      "tie_embeddings",
                                         "n_expert",      "top_k",     "capacity_factor", "aux_loss_coef"};

// A float as the double with the same shortest decimal form, so 1e-5f is
// written 1e-05, not 9.999999747378752e-06.
double decimal(float f) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, f);
  return std::stod(std::string(buf, r.ptr));
}

}  // namespace

json model_config_to_json(const ModelConfig& c) {
  json j;
  j["family"] = std::string(family_name(c.family));
  j["n_layer"] = c.n_layer, j["n_embd"] = c.n_embd, j["n_head"] = c.n_head, j["n_kv_head"] = c.n_kv_head;
  j["d_ff"] = c.d_ff, j["vocab_size"] = c.vocab_size, j["max_seq_len"] = c.max_seq_len;
  j["rope_theta"] = decimal(c.rope_theta), j["norm_eps"] = decimal(c.norm_eps);
  j["tie_embeddings"] = c.tie_embeddings;
  j["n_expert"] = c.n_expert, j["top_k"] = c.top_k, j["capacity_factor"] = decimal(c.capacity_factor);
  j["aux_loss_coef"] = decimal(c.aux_loss_coef);
  return j;
}

ModelConfig model_config_from_json(const json& j, const std::string& where) {
  const Keys k(j, where);
  for (const auto& [key, value] : j.items())
    LOOM_REQUIRE(kLoomKeys.count(key), where, ": key '", key, "' is unknown: allowed keys are the [model] keys ",
                 "(family, preset, n_layer, n_embd, n_head, n_kv_head, d_ff, vocab_size, max_seq_len, rope_theta, ",
                 "norm_eps, tie_embeddings, n_expert, top_k, capacity_factor, aux_loss_coef)");
  ModelConfig c;
  if (k.has("preset")) {
    try {
      c = model_preset(k.string("preset"));
    } catch (const Error& e) {
      fail(where, ": ", e.what());
    }
  }
  if (k.has("family")) {
    try {
      c.family = family_from_name(k.string("family"));
    } catch (const Error& e) {
      fail(where, ": ", e.what());
    }
  }
  k.maybe("n_layer", c.n_layer, &Keys::integer), k.maybe("n_embd", c.n_embd, &Keys::integer);
  k.maybe("n_head", c.n_head, &Keys::integer), k.maybe("n_kv_head", c.n_kv_head, &Keys::integer);
  k.maybe("d_ff", c.d_ff, &Keys::integer), k.maybe("vocab_size", c.vocab_size, &Keys::integer);
  k.maybe("max_seq_len", c.max_seq_len, &Keys::integer), k.maybe("rope_theta", c.rope_theta, &Keys::number);
  k.maybe("norm_eps", c.norm_eps, &Keys::number), k.maybe("tie_embeddings", c.tie_embeddings, &Keys::boolean);
  k.maybe("n_expert", c.n_expert, &Keys::integer), k.maybe("top_k", c.top_k, &Keys::integer);
  k.maybe("capacity_factor", c.capacity_factor, &Keys::number);
  k.maybe("aux_loss_coef", c.aux_loss_coef, &Keys::number);
  validate_at(c, where);
  return c;
}

json hf_config_to_json(const ModelConfig& c) {
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
    j["max_position_embeddings"] = c.max_seq_len, j["rms_norm_eps"] = decimal(c.norm_eps), j["rope_theta"] = decimal(c.rope_theta);
    j["vocab_size"] = c.vocab_size, j["hidden_act"] = "silu", j["attention_bias"] = false, j["mlp_bias"] = false;
  }
  j["tie_word_embeddings"] = c.tie_embeddings;
  j["torch_dtype"] = "float32";
  return j;
}

ModelConfig model_config_from_hf_json(const json& j, const std::string& where) {
  const Keys k(j, where);
  const std::string type = k.string("model_type");
  ModelConfig c;
  if (type == "gpt2") {
    c.family = Family::gpt2;
    c.n_layer = k.integer("n_layer"), c.n_embd = k.integer("n_embd"), c.n_head = k.integer("n_head");
    c.n_kv_head = c.n_head;
    c.d_ff = k.has("n_inner") ? k.integer("n_inner") : 4 * c.n_embd;
    c.max_seq_len = k.integer("n_positions"), c.vocab_size = k.integer("vocab_size");
    c.norm_eps = k.has("layer_norm_epsilon") ? k.number("layer_norm_epsilon") : 1e-5f;
    c.tie_embeddings = k.has("tie_word_embeddings") ? k.boolean("tie_word_embeddings") : true;
    if (k.has("activation_function")) {
      const std::string act = k.string("activation_function");
      LOOM_REQUIRE(act == "gelu_new" || act == "gelu_pytorch_tanh", where, ": key 'activation_function' = '", act,
                   "' is not supported: allowed is gelu_new (tanh GELU)");
    }
  } else if (type == "llama") {
    c.family = Family::llama;
    c.n_embd = k.integer("hidden_size"), c.d_ff = k.integer("intermediate_size");
    c.n_layer = k.integer("num_hidden_layers"), c.n_head = k.integer("num_attention_heads");
    c.n_kv_head = k.has("num_key_value_heads") ? k.integer("num_key_value_heads") : c.n_head;
    c.max_seq_len = k.integer("max_position_embeddings"), c.vocab_size = k.integer("vocab_size");
    c.norm_eps = k.has("rms_norm_eps") ? k.number("rms_norm_eps") : 1e-6f;
    c.rope_theta = k.has("rope_theta") ? k.number("rope_theta") : 10000.f;
    c.tie_embeddings = k.has("tie_word_embeddings") ? k.boolean("tie_word_embeddings") : false;
    LOOM_REQUIRE(!k.has("rope_scaling"), where, ": key 'rope_scaling' is set: loom supports only plain RoPE ",
                 "(rope_scaling null)");
    for (const char* key : {"attention_bias", "mlp_bias"})
      LOOM_REQUIRE(!k.has(key) || !k.boolean(key), where, ": key '", key, "' is true: loom's Llama has no biases");
    if (k.has("hidden_act"))
      LOOM_REQUIRE(k.string("hidden_act") == "silu", where, ": key 'hidden_act' = '", k.string("hidden_act"),
                   "' is not supported: allowed is silu");
    if (k.has("head_dim") && c.n_head > 0)
      LOOM_REQUIRE(k.integer("head_dim") == c.n_embd / c.n_head, where, ": key 'head_dim' = ", k.integer("head_dim"),
                   " is not hidden_size / num_attention_heads: loom needs head_dim = ", c.n_embd / c.n_head);
  } else {
    fail(where, ": key 'model_type' = '", type, "' is not supported: allowed values are gpt2, llama");
  }
  validate_at(c, where);
  return c;
}

json read_json_file(const std::string& path) {
  std::ifstream in(path);
  LOOM_REQUIRE(in, "cannot open '", path, "': ", fs::exists(path) ? "not readable" : "no such file");
  try {
    return json::parse(in);
  } catch (const json::parse_error& e) {
    fail(path, ": not valid JSON: ", e.what());
  }
}

void write_json_file(const std::string& path, const json& j) { write_file_atomic(path, j.dump(2) + "\n"); }

ModelDir load_model_dir(const std::string& dir) {
  LOOM_REQUIRE(fs::is_directory(dir), "model directory '", dir, "' does not exist");
  ModelDir m;
  const fs::path loom_cfg = fs::path(dir) / kLoomConfigFile, hf_cfg = fs::path(dir) / kHfConfigFile;
  if (fs::exists(loom_cfg)) {
    m.config = model_config_from_json(read_json_file(loom_cfg.string()), loom_cfg.string());
    m.layout = ParamLayout::loom;
  } else if (fs::exists(hf_cfg)) {
    m.config = model_config_from_hf_json(read_json_file(hf_cfg.string()), hf_cfg.string());
    m.layout = ParamLayout::hf;
  } else {
    fail("model directory '", dir, "' has neither ", kLoomConfigFile, " (a loom model) nor ", kHfConfigFile,
         " (a Hugging Face model)");
  }
  m.weights = (fs::path(dir) / kWeightsFile).string();
  LOOM_REQUIRE(fs::exists(m.weights), "model directory '", dir, "' has no ", kWeightsFile);
  return m;
}

void save_model_dir(const std::string& dir, const ModelConfig& cfg, const Tensor& params, ParamLayout layout) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  LOOM_REQUIRE(!ec, "cannot create directory '", dir, "': ", ec.message());
  const bool hf = layout == ParamLayout::hf;
  save_params((fs::path(dir) / kWeightsFile).string(), param_specs(cfg), params, layout,
              hf ? std::map<std::string, std::string>{{"format", "pt"}} : std::map<std::string, std::string>{});
  write_json_file((fs::path(dir) / (hf ? kHfConfigFile : kLoomConfigFile)).string(),
                  hf ? hf_config_to_json(cfg) : model_config_to_json(cfg));
}

}  // namespace loom::model
