// loom convert: a model directory between loom's format (loom_config.json,
// loom layout) and Hugging Face's (config.json, HF layout: GPT-2 Conv1D
// weights transposed, no lm_head when tied), with the model's tokenizer as
// tokenizer.json + tokenizer_config.json (its chat template included), or to
// a GGUF file (llama.cpp's layout, quantized on request), and `loom
// init-model`, which writes a freshly initialised model directory.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "core/log.h"
#include "core/memory.h"
#include "cli/model_tokenizer.h"
#include "model/lora.h"
#include "io/gguf.h"
#include "model/config_json.h"
#include "model/gguf_model.h"
#include "serve/store/chat_template.h"
#include "text/tokenizer_files.h"

namespace loom::cli {
namespace {

struct ConvertArgs {
  std::string to, model_dir, out;
  std::string quantize = "f32", tokenizer, name;
  std::string adapter;  // loom lora merge: the PEFT adapter directory
  std::string dtype = "fp32";  // loom lora merge: the merged weights' dtype (fp32 | bf16)
  bool print_error = false;  // loom quantize: the error table
};

// Per tensor, the quantization error of the file just written: the
// parameters read back from it against the ones written, as the RMS of the
// difference over the RMS of the values (0 for a tensor stored exactly).
void print_quantization_error(const model::ModelDir& dir, const Tensor& params, const std::string& path) {
  Pools pools;
  const OwnedTensor back = pools[MemTag::params].empty(DType::f32, params.shape());
  const io::GgufFile f = io::GgufFile::open(path);
  model::load_params_from_gguf(back, dir.config, f);
  std::printf("%-44s %-7s %12s\n", "tensor", "type", "rel. error");
  for (const model::ParamSpec& s : model::param_specs(dir.config)) {
    const float* a = params.data_as<const float>() + s.offset;
    const float* b = back.data_as<const float>() + s.offset;
    double diff = 0, norm = 0;
    for (int64_t i = 0; i < s.numel(); ++i) {
      diff += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
      norm += double(a[i]) * a[i];
    }
    const std::string g = model::gguf_tensor_name(dir.config, s.name);
    const std::string type(io::ggml_type_traits(f.tensor(g).type).name);
    std::printf("%-44s %-7s %12.3e\n", g.c_str(), type.c_str(), norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff));
  }
}

// --to gguf: one file llama.cpp and ollama load (model/gguf_model.h), the
// tokenizer's keys included.
void run_convert_to_gguf(const ConvertArgs& args) {
  namespace fs = std::filesystem;
  LOOM_REQUIRE(fs::path(args.out).extension() == ".gguf", "convert --to gguf: --out '", args.out,
               "' must be a file name ending in .gguf");
  std::error_code ec;
  LOOM_REQUIRE(!fs::exists(args.out, ec), "convert --to gguf: --out '", args.out,
               "' exists: convert never writes over a file; give a new name or delete it first");
  const model::GgufWeights weights = model::gguf_weights_from_name(args.quantize);
  const model::ModelDir dir = model::load_model_dir(args.model_dir);
  std::string tokenizer_from;
  const std::unique_ptr<text::Tokenizer> tok = model_tokenizer(dir, args.tokenizer, &tokenizer_from);
  Pools pools;
  const std::vector<model::ParamSpec> specs = model::param_specs(dir.config);
  const OwnedTensor params = pools[MemTag::params].empty(DType::f32, {model::param_count(specs)});
  model::load_model_params(dir, params);
  const std::string name = !args.name.empty() ? args.name : fs::path(args.out).stem().string();
  io::GgufWriter w;
  model::gguf_add_model(w, dir.config, params, weights, name);
  gguf_add_tokenizer(w, *tok, dir.config.vocab_size);
  // The model's chat template (an HF dir's tokenizer_config.json, a GGUF
  // file's own), as llama.cpp and ollama read it.
  const serve::ChatTemplate chat = serve::ChatTemplate::for_model_dir(args.model_dir);
  if (!chat.is_plain) w.add("tokenizer.chat_template", io::GgufValue::string(chat.source));
  w.write(args.out);
  if (args.print_error) print_quantization_error(dir, params, args.out);
  log_info("wrote ", args.out, " (", model::family_name(dir.config.family), ", ", args.quantize, " weights, ",
           specs.size(), " parameter tensors, tokenizer from ", tokenizer_from, ", ", fs::file_size(args.out) >> 20,
           " MiB)");
}

// The tokenizer written beside the converted model: --tokenizer's (an error
// there is the user's), else the model's own or the default, when it can be
// read (else a warning, and none) and fits the model's vocab_size (else none).
std::unique_ptr<text::Tokenizer> tokenizer_to_write(const ConvertArgs& args, const model::ModelDir& dir,
                                                    std::string* from) {
  std::unique_ptr<text::Tokenizer> tok;
  try {
    tok = model_tokenizer(dir, args.tokenizer, from);
  } catch (const loom::Error& e) {
    if (!args.tokenizer.empty()) throw;
    log_warn("convert: no tokenizer written: ", e.what(), " (give --tokenizer)");
    return nullptr;
  }
  LOOM_REQUIRE(tok->vocab_size() <= dir.config.vocab_size || args.tokenizer.empty(), "convert: --tokenizer ", *from,
               " has ", tok->vocab_size(), " tokens, more than the model's vocab_size ", dir.config.vocab_size);
  if (tok->vocab_size() > dir.config.vocab_size) {  // the default is not this model's tokenizer
    log_info("convert: no tokenizer written: ", *from, " has ", tok->vocab_size(), " tokens, more than the model's ",
             "vocab_size ", dir.config.vocab_size, " (give --tokenizer)");
    return nullptr;
  }
  return tok;
}

void write_tokenizer_files(const ConvertArgs& args, const model::ModelDir& dir, const text::Tokenizer& tok,
                           const std::string& from) {
  const serve::ChatTemplate chat = serve::ChatTemplate::for_model_dir(
      dir.gguf ? dir.weights : std::filesystem::path(dir.weights).parent_path().string());
  const text::TokenizerConfigExtras extras{.chat_template = chat.is_plain ? std::string() : chat.source,
                                           .model_max_length = dir.config.max_seq_len};
  if (text::save_hf_tokenizer_files(args.out, tok, extras))
    log_info("wrote ", text::kHfTokenizerFile, " and ", text::kHfTokenizerConfigFile, " (tokenizer from ", from,
             chat.is_plain ? "" : ", chat template from " + chat.origin, ")");
  else
    log_warn("convert: no tokenizer written: a tokenizer of kind '", tok.kind(), "' (", from,
             ") has no tokenizer.json form in loom");
}

void run_convert(const ConvertArgs& args) {
  if (args.to == "gguf") return run_convert_to_gguf(args);
  model::require_new_model_dir(args.out, "convert", args.model_dir);
  const model::ModelDir dir = model::load_model_dir(args.model_dir);
  std::string tokenizer_from;
  const std::unique_ptr<text::Tokenizer> tok = tokenizer_to_write(args, dir, &tokenizer_from);
  const model::ParamLayout to = args.to == "hf" ? model::ParamLayout::hf : model::ParamLayout::loom;
  Pools pools;
  const std::vector<model::ParamSpec> specs = model::param_specs(dir.config);
  const OwnedTensor params = pools[MemTag::params].empty(DType::f32, {model::param_count(specs)});
  model::load_model_params(dir, params);
  model::save_model_dir(args.out, dir.config, params, to);
  log_info("wrote ", args.to, " model directory ", args.out, " (", specs.size(), " tensors, ",
           model::param_count(specs), " parameters)");
  if (tok) write_tokenizer_files(args, dir, *tok, tokenizer_from);
}

// loom lora merge: W += (alpha / r) B A into a copy of the base (f32).
void run_lora_merge(const ConvertArgs& args) {
  model::require_new_model_dir(args.out, "lora merge", args.model_dir);
  const model::ModelDir dir = model::load_model_dir(args.model_dir);
  std::string base_named;
  const model::LoraConfig lora = model::read_peft_config(args.adapter, dir.config, &base_named);
  std::string tokenizer_from;
  const std::unique_ptr<text::Tokenizer> tok = tokenizer_to_write(args, dir, &tokenizer_from);
  Pools pools;
  OwnedTensor params = pools[MemTag::params].empty(DType::f32, {model::param_count(dir.config)});
  const OwnedTensor adapters = pools[MemTag::params].empty(DType::f32, {model::lora_param_count(dir.config, lora)});
  model::load_peft_adapter(args.adapter, dir.config, lora, adapters);
  model::load_model_params(dir, params);
  model::lora_merge(params, dir.config, lora, adapters);  // in f32, then rounded once to the dtype asked for
  if (args.dtype == "bf16")
    params = model::params_in_dtype(std::move(params), DType::bf16, pools[MemTag::params]);
  model::save_model_dir(args.out, dir.config, params, args.to == "hf" ? model::ParamLayout::hf : model::ParamLayout::loom);
  log_info("wrote ", args.to, " model directory ", args.out, ": ", args.model_dir, " with the adapter ", args.adapter,
           " merged (rank ", lora.rank, ", alpha ", lora.alpha, ")",
           base_named.empty() || base_named == args.model_dir ? "" : "; the adapter names its base '" + base_named + "'");
  if (tok) write_tokenizer_files(args, dir, *tok, tokenizer_from);
}

struct InitArgs {
  std::string preset, out;
  std::vector<std::string> sets;  // key=value over the preset
  std::string format = "loom";
  uint64_t seed = 0;
};

void run_init(const InitArgs& args) {
  const model::ModelConfig cfg = model::model_config_from_sets(args.preset, args.sets, "init-model");
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

namespace {

// loom lora merge.
void add_lora_command(CLI::App& app) {
  CLI::App* lora = app.add_subcommand("lora", "LoRA adapters (PEFT's adapter directories) and their base models");
  lora->require_subcommand(1);
  CLI::App* merge = lora->add_subcommand(
      "merge", "Write the base model with an adapter merged into its weights (W + alpha / r B A, computed in f32, "
               "written in --dtype): a model directory that generate, serve and quantize take as any other");
  auto margs = std::make_shared<ConvertArgs>();
  margs->to = "loom";
  merge->add_option("--base", margs->model_dir, "the base model: a loom or Hugging Face directory, or a .gguf file")
      ->required();
  merge->add_option("--adapter", margs->adapter,
                    "the adapter: a PEFT directory (adapter_config.json, adapter_model.safetensors), as loom train "
                    "writes with [lora]")
      ->required();
  merge->add_option("--out", margs->out, "the new model directory")->required();
  merge->add_option("--to", margs->to, "output format: loom or hf")->capture_default_str()->check(
      CLI::IsMember({"hf", "loom"}));
  merge->add_option("--tokenizer", margs->tokenizer, kTokenizerHelp);
  merge->add_option("--dtype", margs->dtype, "the merged weights: fp32 or bf16")->capture_default_str()->check(
      CLI::IsMember({"fp32", "bf16"}));
  merge->callback([margs] { run_lora_merge(*margs); });
}

}  // namespace

void add_convert_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "convert", "Convert a model directory between loom's format and Hugging Face's (the input's is detected)");
  auto args = std::make_shared<ConvertArgs>();
  cmd->add_option("--to", args->to,
                  "output format: hf (config.json), loom (loom_config.json) or gguf (one file for llama.cpp and ollama)")
      ->required()
      ->check(CLI::IsMember({"hf", "loom", "gguf"}));
  cmd->add_option("--model", args->model_dir, "input model directory, or a .gguf file")->required();
  cmd->add_option("--out", args->out,
                  "output directory: new, or one without a model (created if missing); with --to gguf a new .gguf file")
      ->required();
  cmd->add_option("--quantize", args->quantize,
                  "--to gguf: the weight matrices' type: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_K, q4_K, "
                  "q5_K, q6_K, or q4_K_M / q5_K_M (llama.cpp's mixes: q4_K / q5_K, q6_K for the output and some "
                  "ffn_down / attn_v); norms and biases stay f32")
      ->capture_default_str();
  cmd->add_option("--tokenizer", args->tokenizer,
                  std::string("the tokenizer the output carries (--to hf, loom: as tokenizer.json + "
                              "tokenizer_config.json): ") + kTokenizerHelp);
  cmd->add_option("--name", args->name, "--to gguf: general.name (default: the file's name)");
  cmd->callback([args] { run_convert(*args); });

  CLI::App* quantize = app.add_subcommand(
      "quantize", "Write a model (a loom or Hugging Face directory, or a .gguf file) as a GGUF file of quantized "
                  "weights, and print each tensor's quantization error (as convert --to gguf --quantize TYPE)");
  auto qargs = std::make_shared<ConvertArgs>();
  qargs->to = "gguf";
  qargs->print_error = true;
  quantize->add_option("model", qargs->model_dir, "input model directory, or a .gguf file")->required();
  quantize->add_option("out", qargs->out, "the new .gguf file")->required();
  quantize->add_option("--type", qargs->quantize,
                       "f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_K, q4_K, q5_K, q6_K, q4_K_M or q5_K_M "
                       "(see convert --quantize)")
      ->required();
  quantize->add_option("--tokenizer", qargs->tokenizer, kTokenizerHelp);
  quantize->add_option("--name", qargs->name, "general.name (default: the file's name)");
  quantize->callback([qargs] { run_convert(*qargs); });

  add_lora_command(app);

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
