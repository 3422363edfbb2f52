// LoRA adapters as parameters (lora.h): which linears, their specs, the
// merge into the base and PEFT's key names.
#include "model/lora.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string_view>

#include "core/error.h"
#include "kernels/ops.h"

namespace loom::model {

namespace {

// A family's block linears in block order, with the target names that
// select each (loom's short name first, then Hugging Face's module name).
struct ModuleName {
  const char* module;
  std::vector<std::string_view> names;
};

const std::vector<ModuleName>& family_modules(Family f) {
  static const std::vector<ModuleName> gpt2 = {{"attn.c_attn", {"qkv", "c_attn"}},
                                               {"attn.c_proj", {"proj", "attn.c_proj", "c_proj"}},
                                               {"mlp.c_fc", {"fc", "c_fc"}},
                                               {"mlp.c_proj", {"fc_proj", "mlp.c_proj", "c_proj"}}};
  static const std::vector<ModuleName> llama = {
      {"self_attn.q_proj", {"q", "q_proj"}},   {"self_attn.k_proj", {"k", "k_proj"}},
      {"self_attn.v_proj", {"v", "v_proj"}},   {"self_attn.o_proj", {"o", "o_proj"}},
      {"mlp.gate_proj", {"gate", "gate_proj"}}, {"mlp.up_proj", {"up", "up_proj"}},
      {"mlp.down_proj", {"down", "down_proj"}}};
  return f == Family::gpt2 ? gpt2 : llama;
}

std::string allowed_targets(Family f) {
  std::string s;
  for (const ModuleName& m : family_modules(f))
    for (std::string_view n : m.names)
      if (s.find(concat(" ", n, ",")) == std::string::npos) s += concat(" ", n, ",");
  return s + " all-linear";
}

// (in, out) of a module of cfg's blocks.
LoraModule module_extents(const ModelConfig& cfg, const std::string& module) {
  const int64_t C = cfg.n_embd, F = cfg.d_ff, KV = cfg.kv_dim();
  if (module == "attn.c_attn") return {module, C, 3 * C};
  if (module == "mlp.c_fc" || module == "mlp.gate_proj" || module == "mlp.up_proj") return {module, C, F};
  if (module == "mlp.c_proj" || module == "mlp.down_proj") return {module, F, C};
  if (module == "self_attn.k_proj" || module == "self_attn.v_proj") return {module, C, KV};
  return {module, C, C};  // c_proj, q_proj, o_proj
}

std::string_view peft_prefix(const ModelConfig& cfg) {
  return cfg.family == Family::gpt2 ? "base_model.model.transformer." : "base_model.model.";
}

}  // namespace

std::string layer_prefix(const ModelConfig& cfg, int64_t layer) {
  return cfg.family == Family::gpt2 ? concat("h.", layer, ".") : concat("model.layers.", layer, ".");
}

void check_peft_targets(const ModelConfig& cfg, const std::vector<std::string>& targets, const std::string& where,
                        const std::string& base_model) {
  for (const std::string& t : targets) {
    bool known = t == "all-linear";
    for (const ModuleName& m : family_modules(cfg.family))
      known = known || t == m.module || std::find(m.names.begin(), m.names.end(), t) != m.names.end();
    LOOM_REQUIRE(known, where, ": target_modules holds '", t, "', which is not a linear of a ",
                 family_name(cfg.family), " block (allowed:", allowed_targets(cfg.family),
                 "): the adapter was made for another model",
                 base_model.empty() ? std::string() : concat(" (base_model_name_or_path = '", base_model, "')"));
  }
}

std::vector<LoraModule> lora_modules(const ModelConfig& cfg, const LoraConfig& lora) {
  LOOM_REQUIRE(!cfg.is_moe(), "lora: adapters on a mixture-of-experts model (model.n_expert = ", cfg.n_expert,
               ") are not supported yet: allowed are dense GPT-2 and Llama models");
  LOOM_REQUIRE(lora.rank >= 1, "lora.rank = ", lora.rank, " is invalid: allowed values are 1 to the smaller ",
               "extent of each targeted linear");
  LOOM_REQUIRE(std::isfinite(lora.alpha) && lora.alpha > 0, "lora.alpha = ", lora.alpha,
               " is invalid: allowed values are > 0 (the update is scaled by alpha / rank)");
  LOOM_REQUIRE(lora.dropout >= 0.0 && static_cast<float>(lora.dropout) < 1.f, "lora.dropout = ", lora.dropout,
               " is invalid: allowed values are 0 (none) to below 1 (the probability an adapter's input element is ",
               "dropped)");
  LOOM_REQUIRE(!lora.targets.empty(), "lora.targets is empty: allowed names are", allowed_targets(cfg.family));
  const std::vector<ModuleName>& modules = family_modules(cfg.family);
  std::vector<bool> chosen(modules.size(), false);
  for (const std::string& t : lora.targets) {
    bool known = t == "all-linear";
    for (size_t i = 0; i < modules.size(); ++i) {
      const auto& n = modules[i].names;
      const bool hit = t == "all-linear" || t == modules[i].module || std::find(n.begin(), n.end(), t) != n.end();
      chosen[i] = chosen[i] || hit;
      known = known || hit;
    }
    LOOM_REQUIRE(known, "lora.targets: '", t, "' is not a linear of a ", family_name(cfg.family),
                 " block: allowed names are", allowed_targets(cfg.family));
  }
  std::vector<LoraModule> out;
  for (size_t i = 0; i < modules.size(); ++i) {
    if (!chosen[i]) continue;
    out.push_back(module_extents(cfg, modules[i].module));
    const LoraModule& m = out.back();
    LOOM_REQUIRE(lora.rank <= std::min(m.in, m.out), "lora.rank = ", lora.rank, " is larger than ", m.name, " (",
                 m.out, " x ", m.in, "): allowed ranks are 1 to ", std::min(m.in, m.out),
                 " (a rank at the smaller extent already updates the whole matrix)");
  }
  return out;
}

namespace {

// Megatron's row-parallel linears (the rest of a block's are column-parallel).
bool row_parallel(const std::string& module) {
  return module == "attn.c_proj" || module == "mlp.c_proj" || module == "self_attn.o_proj" ||
         module == "mlp.down_proj";
}

}  // namespace

std::vector<ParamSpec> lora_param_specs(const ModelConfig& cfg, const LoraConfig& lora, TpRank tp, PpStage stage) {
  (void)param_count(cfg, tp, stage);  // what the base's own split allows (tp divides the heads, d_ff)
  const std::vector<LoraModule> modules = lora_modules(cfg, lora);
  std::vector<ParamSpec> specs;
  int64_t offset = 0;
  const auto add = [&](std::string name, Shape global, TpSplit split, ParamInit init, float bound) {
    ParamSpec s;
    s.name = std::move(name);
    s.global_shape = global, s.shape = global;
    s.split = split, s.tp = tp;
    if (split.dim >= 0) s.shape[split.dim] = global[split.dim] / tp.size;
    s.offset = offset, s.init = init, s.init_std = bound;
    offset += s.numel();
    specs.push_back(std::move(s));
  };
  const int64_t first = stage.first_layer, n = stage.layer_count(cfg.n_layer);
  for (int64_t l = first; l < first + n; ++l) {
    const std::string p = layer_prefix(cfg, l);
    for (const LoraModule& m : modules) {
      const bool row = row_parallel(m.name);
      const TpSplit cut_a = row ? TpSplit{1, 1, m.in} : TpSplit{};
      const TpSplit cut_b = row ? TpSplit{} : TpSplit{0, m.name == "attn.c_attn" ? 3 : 1, m.out};
      add(concat(p, m.name, ".lora_A.weight"), Shape{lora.rank, m.in}, cut_a,
          ParamInit::uniform, static_cast<float>(1.0 / std::sqrt(static_cast<double>(m.in))));
      add(concat(p, m.name, ".lora_B.weight"), Shape{m.out, lora.rank}, cut_b,
          ParamInit::zeros, 0.f);
    }
  }
  return specs;
}

std::vector<std::string> lora_module_names(const ModelConfig& cfg, const LoraConfig& lora) {
  std::vector<std::string> names;
  for (const LoraModule& m : lora_modules(cfg, lora)) names.push_back(m.name);
  return names;
}

int64_t lora_param_count(const ModelConfig& cfg, const LoraConfig& lora) {
  int64_t per_layer = 0;
  for (const LoraModule& m : lora_modules(cfg, lora)) per_layer += lora.rank * (m.in + m.out);
  return per_layer * cfg.n_layer;
}

std::vector<ParamSpec> trainable_param_specs(const ModelConfig& cfg, const LoraConfig& lora, TpRank tp, PpStage stage,
                                             EpRank ep) {
  if (!lora.enabled()) return param_specs(cfg, tp, stage, ep);
  return lora_param_specs(cfg, lora, tp, stage);
}

void lora_merge(Tensor base, const ModelConfig& cfg, const LoraConfig& lora, const Tensor& adapters) {
  const std::vector<ParamSpec> base_specs = param_specs(cfg), specs = lora_param_specs(cfg, lora);
  LOOM_CHECK(base.dtype() == DType::f32 && adapters.dtype() == DType::f32 && base.numel() == param_count(base_specs) &&
                 adapters.numel() == param_count(specs),
             "lora_merge: base ", base.str(), ", adapters ", adapters.str());
  std::map<std::string, const ParamSpec*> by_name;
  for (const ParamSpec& s : base_specs) by_name[s.name] = &s;
  const std::string_view a_suffix = ".lora_A.weight";
  for (size_t i = 0; i + 1 < specs.size(); i += 2) {
    const ParamSpec &a = specs[i], &b = specs[i + 1];
    const std::string module = a.name.substr(0, a.name.size() - a_suffix.size());
    const ParamSpec& w = *by_name.at(module + ".weight");
    // W (out, in) += scale * B (out, r) @ A (r, in)
    kernels::matmul(param_view(base, w), param_view(adapters, b), param_view(adapters, a),
                    {.alpha = lora.scale(), .beta = 1.f});
  }
}

std::string peft_key(const ModelConfig& cfg, const std::string& name) { return concat(peft_prefix(cfg), name); }

std::string from_peft_key(const ModelConfig& cfg, const std::string& key) {
  const std::string_view prefix = peft_prefix(cfg);
  const bool adapter = key.size() > prefix.size() && key.compare(0, prefix.size(), prefix) == 0 &&
                       (key.ends_with(".lora_A.weight") || key.ends_with(".lora_B.weight"));
  LOOM_REQUIRE(adapter, "PEFT adapter key '", key, "' is not a LoRA weight of a ", family_name(cfg.family),
               " model: expected '", prefix, "<module>.lora_A.weight' or '.lora_B.weight'");
  return key.substr(prefix.size());
}

}  // namespace loom::model
