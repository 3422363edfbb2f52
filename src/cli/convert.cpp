// loom convert: a model directory between loom's format (loom_config.json,
// loom layout) and Hugging Face's (config.json, HF layout: GPT-2 Conv1D
// weights transposed, no lm_head when tied), and `loom init-model`, which
// writes a freshly initialised model directory.
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "core/log.h"
#include "core/memory.h"
#include "io/safetensors.h"
#include "model/config_json.h"

namespace loom::cli {
namespace {

struct ConvertArgs {
  std::string to, model_dir, out;
};

void run_convert(const ConvertArgs& args) {
  model::require_new_model_dir(args.out, "convert", args.model_dir);
  const model::ModelDir dir = model::load_model_dir(args.model_dir);
  const model::ParamLayout to = args.to == "hf" ? model::ParamLayout::hf : model::ParamLayout::loom;
  Pools pools;
  const std::vector<model::ParamSpec> specs = model::param_specs(dir.config);
  const OwnedTensor params = pools[MemTag::params].empty(DType::f32, {model::param_count(specs)});
  model::load_params(params, specs, io::SafetensorsFile::open(dir.weights), dir.layout);
  model::save_model_dir(args.out, dir.config, params, to);
  log_info("wrote ", args.to, " model directory ", args.out, " (", specs.size(), " tensors, ",
           model::param_count(specs), " parameters)");
}

struct InitArgs {
  std::string preset, out;
  std::vector<std::string> sets;  // key=value over the preset
  std::string format = "loom";
  uint64_t seed = 0;
};

void run_init(const InitArgs& args) {
  nlohmann::json j = {{"preset", args.preset}};
  for (const std::string& kv : args.sets) {
    const size_t eq = kv.find('=');
    LOOM_REQUIRE(eq != std::string::npos && eq > 0, "--set '", kv, "' is not key=value (e.g. vocab_size=50257)");
    const std::string key = kv.substr(0, eq), value = kv.substr(eq + 1);
    // Numbers and true/false as JSON, anything else (a family name) as a string.
    j[key] = nlohmann::json::accept(value) ? nlohmann::json::parse(value) : nlohmann::json(value);
  }
  const model::ModelConfig cfg = model::model_config_from_json(j, "init-model");
  model::require_new_model_dir(args.out, "init-model");
  Pools pools;
  const std::vector<model::ParamSpec> specs = model::param_specs(cfg);
  const OwnedTensor params = pools[MemTag::params].empty(DType::f32, {model::param_count(specs)});
  model::init_params(params, specs, args.seed);
  model::save_model_dir(args.out, cfg, params,
                        args.format == "hf" ? model::ParamLayout::hf : model::ParamLayout::loom);
  log_info("wrote ", args.format, " model directory ", args.out, " (", args.preset, ", seed ", args.seed, ")");
}

}  // namespace

void add_convert_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "convert", "Convert a model directory between loom's format and Hugging Face's (the input's is detected)");
  auto args = std::make_shared<ConvertArgs>();
  cmd->add_option("--to", args->to, "output format: hf (config.json) or loom (loom_config.json)")
      ->required()
      ->check(CLI::IsMember({"hf", "loom"}));
  cmd->add_option("--model", args->model_dir, "input model directory")->required();
  cmd->add_option("--out", args->out, "output directory: new, or one without a model (created if missing)")
      ->required();
  cmd->callback([args] { run_convert(*args); });

  CLI::App* init = app.add_subcommand(
      "init-model", "Write a freshly initialised model directory from a preset (e.g. to try generate or convert)");
  auto iargs = std::make_shared<InitArgs>();
  init->add_option("--preset", iargs->preset, "model preset: gpt2-124m, gpt2-350m, llama-110m, gpt2-tiny, llama-tiny")
      ->required();
  init->add_option("--out", iargs->out, "output directory: new, or one without a model (created if missing)")
      ->required();
  init->add_option("--set", iargs->sets, "key=value overriding a [model] key of the preset (e.g. vocab_size=50257)");
  init->add_option("--seed", iargs->seed, "initialisation seed")->capture_default_str();
  init->add_option("--format", iargs->format, "hf or loom")->check(CLI::IsMember({"hf", "loom"}))->capture_default_str();
  init->callback([iargs] { run_init(*iargs); });
}

}  // namespace loom::cli
