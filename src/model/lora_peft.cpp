// PEFT's adapter directory (lora.h): adapter_config.json and
// adapter_model.safetensors, written and read with Hugging Face peft's keys.
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/safetensors.h"
#include "model/config_json.h"
#include "model/lora.h"

namespace loom::model {

namespace fs = std::filesystem;

namespace {

// lora_param_specs with PEFT's keys for names.
std::vector<ParamSpec> peft_specs(const ModelConfig& cfg, const LoraConfig& lora) {
  std::vector<ParamSpec> specs = lora_param_specs(cfg, lora);
  for (ParamSpec& s : specs) s.name = peft_key(cfg, s.name);
  return specs;
}

// Fails unless `key` of the config is absent or one of the values that mean
// "not used".
void require_unused(const nlohmann::json& j, const char* key, const std::string& where, const char* what) {
  if (!j.contains(key)) return;
  const nlohmann::json& v = j[key];
  const bool unused = v.is_null() || v == false || (v.is_object() && v.empty()) || (v.is_array() && v.empty()) ||
                      (v.is_string() && v == "none");
  LOOM_REQUIRE(unused, where, ": ", key, " = ", v.dump(), " is not supported: loom's adapters have ", what);
}

}  // namespace

void save_peft_adapter(const std::string& dir, const ModelConfig& cfg, const LoraConfig& lora, const Tensor& adapters,
                       const std::string& base_model) {
  const std::vector<std::string> modules = lora_module_names(cfg, lora);
  fs::create_directories(dir);
  save_params((fs::path(dir) / kPeftWeightsFile).string(), peft_specs(cfg, lora), adapters, ParamLayout::loom,
              {{"format", "pt"}});
  const nlohmann::json j = {{"peft_type", "LORA"},
                            {"task_type", "CAUSAL_LM"},
                            {"base_model_name_or_path", base_model},
                            {"r", lora.rank},
                            {"lora_alpha", lora.alpha},
                            {"lora_dropout", lora.dropout},
                            {"target_modules", modules},
                            {"bias", "none"},
                            {"fan_in_fan_out", cfg.family == Family::gpt2},  // GPT-2's Conv1D base layers
                            {"init_lora_weights", true},
                            {"use_rslora", false},
                            {"use_dora", false},
                            {"modules_to_save", nullptr},
                            {"layers_to_transform", nullptr},
                            {"rank_pattern", nlohmann::json::object()},
                            {"alpha_pattern", nlohmann::json::object()},
                            {"inference_mode", true}};
  write_json_file((fs::path(dir) / kPeftConfigFile).string(), j);
}

namespace {

// init_lora_weights: true, false, "gaussian" and "eva" only start A and B
// differently, so the file is a plain adapter of the base. PiSSA, OLoRA,
// CorDA and LoftQ subtract their start from the base weights too: such a file
// (unless PEFT converted it on saving, when it writes true) adapts a base
// loom does not have.
void require_plain_init(const nlohmann::json& j, const std::string& where) {
  if (!j.contains("init_lora_weights")) return;
  const nlohmann::json& v = j["init_lora_weights"];
  LOOM_REQUIRE(v.is_boolean() || v == "gaussian" || v == "eva", where, ": init_lora_weights = ", v.dump(),
               " is not supported: such an adapter is relative to a base modified at its start (PEFT saves it as a ",
               "plain adapter with path_initial_model_for_weight_conversion); allowed are true, false, \"gaussian\" ",
               "and \"eva\"");
}

}  // namespace

LoraConfig read_peft_config(const std::string& dir, const ModelConfig& cfg, std::string* base_model) {
  const std::string where = (fs::path(dir) / kPeftConfigFile).string();
  LOOM_REQUIRE(fs::is_regular_file(where), "adapter '", dir, "' has no ", kPeftConfigFile,
               ": give a PEFT LoRA adapter directory (adapter_config.json and adapter_model.safetensors)");
  const nlohmann::json j = read_json_file(where);
  const std::string type = j.value("peft_type", std::string("?"));
  LOOM_REQUIRE(type == "LORA", where, ": peft_type = ", type, " is not supported: allowed is LORA");
  LOOM_REQUIRE(j.contains("r") && j["r"].is_number_integer() && j.contains("lora_alpha") && j["lora_alpha"].is_number(),
               where, ": r (an integer) and lora_alpha (a number) are required");
  require_unused(j, "bias", where, "no bias (bias = \"none\")");
  require_unused(j, "use_rslora", where, "the scale alpha / r (use_rslora = false)");
  require_unused(j, "use_dora", where, "no magnitude vector (use_dora = false)");
  require_unused(j, "rank_pattern", where, "one rank for every layer");
  require_unused(j, "alpha_pattern", where, "one alpha for every layer");
  require_unused(j, "layers_to_transform", where, "adapters on every layer");
  require_unused(j, "modules_to_save", where, "no fully trained modules beside them (modules_to_save = null)");
  require_unused(j, "layer_replication", where, "each layer its own base layer (layer_replication = null)");
  require_unused(j, "lora_bias", where, "no bias on lora_B (lora_bias = false)");
  require_unused(j, "exclude_modules", where, "every target module of every layer (exclude_modules = null)");
  require_unused(j, "trainable_token_indices", where, "no trained token rows (trainable_token_indices = null)");
  require_unused(j, "target_parameters", where, "linears as targets, not parameters (target_parameters = null)");
  require_plain_init(j, where);
  LoraConfig l;
  l.rank = j["r"].get<int64_t>();
  l.alpha = j["lora_alpha"].get<double>();
  const nlohmann::json& t = j.value("target_modules", nlohmann::json());
  LOOM_REQUIRE(t.is_array() && !t.empty(), where, ": target_modules = ", t.dump(),
               " is not supported: allowed is a list of module names (a regular expression is not)");
  l.targets.clear();
  for (const nlohmann::json& m : t) {
    LOOM_REQUIRE(m.is_string(), where, ": target_modules holds ", m.dump(), ": allowed are module names");
    l.targets.push_back(m.get<std::string>());
  }
  const nlohmann::json& base = j.value("base_model_name_or_path", nlohmann::json());
  const std::string base_name = base.is_string() ? base.get<std::string>() : std::string();
  check_peft_targets(cfg, l.targets, where, base_name);
  if (base_model) *base_model = base_name;
  return l;
}

void load_peft_adapter(const std::string& dir, const ModelConfig& cfg, const LoraConfig& lora, Tensor adapters) {
  const std::string path = (fs::path(dir) / kPeftWeightsFile).string();
  LOOM_REQUIRE(fs::is_regular_file(path), "adapter '", dir, "' has no ", kPeftWeightsFile);
  const io::SafetensorsFile file = io::SafetensorsFile::open(path);
  const std::vector<ParamSpec> specs = peft_specs(cfg, lora);
  std::set<std::string> names;
  for (const ParamSpec& s : specs) names.insert(s.name);
  for (const auto& [name, info] : file.tensors())
    LOOM_REQUIRE(names.count(name) > 0, path, ": tensor '", name, "' is not an adapter of ", kPeftConfigFile,
                 "'s target_modules on this ", family_name(cfg.family), " model (expected keys like '",
                 specs.front().name, "')");
  load_params(adapters, specs, file);
}

}  // namespace loom::model
