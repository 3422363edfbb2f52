// ModelConfig as JSON, in loom's own form and in Hugging Face's config.json,
// and model directories (a config plus model.safetensors) in either form.
//
// loom model dir:  loom_config.json  {"family": "gpt2", "n_layer": 12, ...}:
//                  the DESIGN.md §7 [model] keys, all written;
//                  model.safetensors in loom's layout (params.h names).
// HF model dir:    config.json (GPT2Config, LlamaConfig or MixtralConfig keys),
//                  model.safetensors in HF's layout (GPT-2 Conv1D transposed),
//                  or its shards and model.safetensors.index.json;
//                  generation_config.json's eos_token_id, if any.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "model/params.h"

namespace loom::model {

inline constexpr const char* kLoomConfigFile = "loom_config.json";
inline constexpr const char* kHfConfigFile = "config.json";
inline constexpr const char* kWeightsFile = "model.safetensors";
inline constexpr const char* kHfGenerationConfigFile = "generation_config.json";

// Every [model] key but preset.
nlohmann::json model_config_to_json(const ModelConfig& cfg);
// Keys as in a config's [model] section: "preset" (optional) first, then the
// explicit keys over it; absent keys keep ModelConfig's defaults. An unknown
// key, a value of the wrong type or an invalid config is a loom::Error that
// starts with `where` (e.g. the file) and names the key.
ModelConfig model_config_from_json(const nlohmann::json& j, const std::string& where);
// A preset with "key=value" overrides of its [model] keys, as the --set
// options of init-model and bench train take them (numbers and true/false
// as JSON values, anything else, a family name, as a string); an item
// without '=' and the errors of model_config_from_json (a bad preset among
// them) start with `where`, the command.
ModelConfig model_config_from_sets(const std::string& preset, const std::vector<std::string>& sets,
                                   const std::string& where);

// Hugging Face config.json: GPT2Config ("model_type": "gpt2"), LlamaConfig
// ("llama") or MixtralConfig ("mixtral"), with "architectures" and
// "torch_dtype": "float32". A MoE model transformers' Mixtral cannot
// represent (require_hf_exportable) is a loom::Error.
nlohmann::json hf_config_to_json(const ModelConfig& cfg);
// A MoE model with moe_every != 1, shared experts, a sigmoid router, an
// expert bias or norm_topk_prob = false is a loom::Error starting with
// `where` and naming the key: transformers' Mixtral computes none of them.
void require_hf_exportable(const ModelConfig& cfg, const std::string& where);
// Reads the keys loom's models need; HF defaults apply where HF has one
// (GPT-2 n_inner = 4 n_embd, Llama num_key_value_heads = num_attention_heads,
// rope_theta 10000, Mixtral's 1e6; rope_theta also from transformers v5's
// rope_parameters). A key that changes what transformers computes and that
// loom does not implement (RoPE scaling, partial rotary, a sliding window
// shorter than the context, biases in Llama, another activation, GPT-2's
// other attention scalings, loom's MoE keys transformers' Mixtral ignores
// set to what it would not compute) is a loom::Error naming where and the key.
ModelConfig model_config_from_hf_json(const nlohmann::json& j, const std::string& where);
// The end-of-sequence ids of an HF model directory, as transformers' generate
// and vLLM stop at them: generation_config.json's eos_token_id (an id or a
// list), else config.json's; none: empty. An id outside the vocabulary is a
// loom::Error naming the file.
std::vector<int32_t> hf_eos_token_ids(const std::string& dir, int64_t vocab_size);

// Reads a JSON file; a missing or unparsable file is a loom::Error naming it.
nlohmann::json read_json_file(const std::string& path);
// Writes JSON (indented) atomically: path + ".tmp", then rename.
void write_json_file(const std::string& path, const nlohmann::json& j);

struct ModelDir {
  ModelConfig config;
  // Path of model.safetensors, of the .gguf file, or (an HF sharded checkpoint)
  // of model.safetensors.index.json, the shards beside it.
  std::string weights;
  ParamLayout layout = ParamLayout::loom;
  bool gguf = false;    // weights is a GGUF file (model/gguf_model.h): config and tensors from it
  bool sharded = false;  // weights is a shard index (io/safetensors_index.h)
  // Ids that end a sequence besides the tokenizer's end-of-text
  // (hf_eos_token_ids: an HF dir's generation_config.json).
  std::vector<int32_t> eos_token_ids;
};
// Recognises a loom dir (loom_config.json) or else an HF dir (config.json),
// or a .gguf file (as ollama and llama.cpp take a model); neither, missing
// weights (model.safetensors, or in an HF dir the shard index
// model.safetensors.index.json), or a path that is no directory (e.g. the
// config file itself) is a loom::Error naming the path and what to give.
ModelDir load_model_dir(const std::string& dir);
// Whether path names a GGUF file by its extension, in any case (MODEL.GGUF),
// as llama.cpp and ollama take one.
bool is_gguf_path(const std::string& path);
// flat (P) f32 = the model's parameters in param_specs(dir.config) order,
// from its safetensors file, its shards or its GGUF file (dequantized).
void load_model_params(const ModelDir& dir, Tensor flat);
// Where `command` (convert, init-model) writes a new model: --out must not
// be the input model's directory (`input`: the --model path, a directory or a
// file in it; empty: none), however spelled (symlinks, trailing slashes), nor
// hold a model of either format (any of loom_config.json, config.json,
// model.safetensors), nor be a file. Else a loom::Error naming the path and
// what to do; nothing is written.
void require_new_model_dir(const std::string& out, const std::string& command, const std::string& input = "");
// Writes dir/<config> and dir/model.safetensors (creating dir) for a model
// whose flat (P) f32 parameters follow param_specs(cfg), in either form.
// A new dir is written as a staging directory next to it (.NAME.save-PID-N,
// core/staged_dir.h) and renamed, so a failure or a kill midway leaves no dir
// (a kill may leave the staging directory behind).
// In an existing dir each file is replaced atomically, the config last.
void save_model_dir(const std::string& dir, const ModelConfig& cfg, const Tensor& params, ParamLayout layout);
// The same in loom's layout, the parameters read a part at a time
// (save_params_streamed).
void save_model_dir(const std::string& dir, const ModelConfig& cfg, const FlatReader& read);

}  // namespace loom::model
