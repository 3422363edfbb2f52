// Parameter specs: Hugging Face names, global shapes in loom's layout, and
// sharding-invariant initialisation (DESIGN.md §1.3, §4).
//
// Names follow the Hugging Face checkpoints, so safetensors import and export
// are rename-free:
//   GPT-2 (as in openai-community/gpt2's model.safetensors, no "transformer."
//   prefix): wte.weight, wpe.weight, h.{i}.ln_1.{weight,bias},
//   h.{i}.attn.c_attn.{weight,bias}, h.{i}.attn.c_proj.{weight,bias},
//   h.{i}.ln_2.{weight,bias}, h.{i}.mlp.c_fc.{weight,bias},
//   h.{i}.mlp.c_proj.{weight,bias}, ln_f.{weight,bias} [, lm_head.weight if untied].
//   Llama: model.embed_tokens.weight, model.layers.{i}.input_layernorm.weight,
//   model.layers.{i}.self_attn.{q,k,v,o}_proj.weight,
//   model.layers.{i}.post_attention_layernorm.weight,
//   model.layers.{i}.mlp.{gate,up,down}_proj.weight, model.norm.weight
//   [, lm_head.weight if untied].
// Every linear weight is stored (out, in) as kernels::linear_forward expects.
// HF GPT-2 uses Conv1D, whose weights are (in, out): those specs have
// hf_transposed set, and import/export must transpose them.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/safetensors.h"
#include "model/config.h"

namespace loom::model {

enum class ParamInit : uint8_t { normal, ones, zeros };

struct ParamSpec {
  std::string name;
  Shape shape;             // global shape, loom layout
  int64_t offset = 0;      // elements from the start of the flat parameter buffer
  ParamInit init = ParamInit::normal;
  float init_std = 0.f;    // for ParamInit::normal
  bool hf_transposed = false;  // HF stores it as shape reversed (GPT-2 Conv1D)

  int64_t numel() const { return shape.numel(); }
};

// Every parameter of the model in a fixed order (embeddings, layers, final
// norm, lm head), with offsets packing them contiguously. Validates cfg.
std::vector<ParamSpec> param_specs(const ModelConfig& cfg);
int64_t param_count(const std::vector<ParamSpec>& specs);

// Initialises rows [row_begin, row_begin + dst.size(0)) of the parameter:
// element at global flat index i gets init(seed, spec.name, i), so a shard
// computes exactly its slice of the whole. dst: contiguous f32 with the
// spec's shape except dim 0 (a 1-D spec is sliced along its only dim).
// normal: N(0, init_std) from Philox keyed by rng_key(name); ones; zeros.
void init_param(Tensor dst, const ParamSpec& spec, uint64_t seed, int64_t row_begin = 0);

// How tensors in a safetensors file are laid out: loom's (out, in) for every
// linear, or Hugging Face's (GPT-2 Conv1D weights transposed).
enum class ParamLayout : uint8_t { loom, hf };

// The whole-model operations on a flat parameter buffer, flat: (P) f32
// packed in spec order (Model::master_params(), or a Decoder's own weights).
// A view of one parameter, with its spec's shape (and flat's dtype: a bf16
// flat buffer gives bf16 views).
Tensor param_view(const Tensor& flat, const ParamSpec& spec);
void init_params(Tensor flat, const std::vector<ParamSpec>& specs, uint64_t seed);
// Reads every parameter by name; a missing tensor or a wrong shape or dtype
// (f32 only for now) is a loom::Error naming the file and tensor. Tensors
// the model does not use (HF GPT-2's attn.bias mask buffers) are ignored. In
// the hf layout, names may carry transformers' "transformer." prefix (what
// GPT2LMHeadModel.save_pretrained writes).
void load_params(Tensor flat, const std::vector<ParamSpec>& specs, const io::SafetensorsFile& file,
                 ParamLayout layout = ParamLayout::loom);
// Writes every parameter to a safetensors file at path (atomically), named as
// the specs name them, in the given layout.
void save_params(const std::string& path, const std::vector<ParamSpec>& specs, const Tensor& flat,
                 ParamLayout layout = ParamLayout::loom, const std::map<std::string, std::string>& metadata = {});

}  // namespace loom::model
