// LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language
// Models"): a frozen base linear W (OC, IC) gains a trainable low-rank update,
//   y = x W^T + (alpha / r) (x A^T) B^T      A: (r, IC)   B: (OC, r)
// A starts Kaiming-uniform (bound 1 / sqrt(IC), what PEFT's
// kaiming_uniform_(a = sqrt(5)) gives), B at zero, so training starts from
// the base model exactly. Only A and B train: the base has no gradient and
// no optimizer state, and a Model built with LoraOptions (model.h) has the
// adapters as its parameters (param_specs, units, params, grads), so data
// parallelism, ZeRO, the optimizer and checkpoints see the adapters alone.
//
// Adapter names are the wrapped linear's Hugging Face module name with
// ".lora_A.weight" / ".lora_B.weight" (h.0.attn.c_attn.lora_A.weight,
// model.layers.0.self_attn.q_proj.lora_B.weight); PEFT's files prefix them
// with "base_model.model." (GPT-2: "base_model.model.transformer.").
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/memory.h"
#include "core/tensor.h"
#include "model/config.h"
#include "model/params.h"

namespace loom::model {

class ParamViews;    // model/blocks.h
class QuantWeights;  // model/quant_weights.h
struct ModelDir;     // model/config_json.h

struct LoraConfig {
  int64_t rank = 0;     // r; 0: no adapters (the model trains all its parameters)
  double alpha = 16.0;  // the update is scaled by alpha / r
  double dropout = 0.0;
  // Which linears of every block carry adapters (lora_modules): loom's short
  // names (q, k, v, o, gate, up, down; GPT-2 qkv, proj, fc, fc_proj), the
  // Hugging Face module names PEFT's target_modules use (q_proj, c_attn,
  // c_proj, ...), or "all-linear".
  std::vector<std::string> targets = {"all-linear"};

  bool enabled() const { return rank > 0; }
  float scale() const { return static_cast<float>(alpha / static_cast<double>(rank)); }
};

// One linear an adapter wraps: its module name within a block
// ("attn.c_attn", "self_attn.q_proj") and its extents.
struct LoraModule {
  std::string name;
  int64_t in = 0, out = 0;
};
// The block linears `lora` targets, in the block's order; an unknown target
// name, a rank of 0 or above a targeted linear's smaller extent, a dropout
// outside [0, 1) or a mixture-of-experts model is a loom::Error saying what
// is allowed.
std::vector<LoraModule> lora_modules(const ModelConfig& cfg, const LoraConfig& lora);
// Their module names ("attn.c_attn", ...): what PEFT's target_modules and a
// checkpoint's record of the adapters list.
std::vector<std::string> lora_module_names(const ModelConfig& cfg, const LoraConfig& lora);
// Layer i's prefix in Hugging Face names: "h.3." or "model.layers.3.".
std::string layer_prefix(const ModelConfig& cfg, int64_t layer);

// The adapters of a model, as parameters: for each layer of the stage, for
// each module, lora_A (r, in) then lora_B (out, r), packed from offset 0.
// Under tensor parallelism, tp rank tp.rank's slices, cut as the linear
// each wraps (DESIGN.md §5 TP): a column-parallel W's B by output rows
// (c_attn's in q, k, v blocks), a row-parallel W's A by input columns; the
// other matrix is whole on every rank (replicated). Validates like
// lora_modules, and the tp split like param_specs.
std::vector<ParamSpec> lora_param_specs(const ModelConfig& cfg, const LoraConfig& lora, TpRank tp = {},
                                        PpStage stage = {});
// param_count(lora_param_specs(cfg, lora)) (the whole model's adapters) in
// O(1) of n_layer; validates like lora_modules.
int64_t lora_param_count(const ModelConfig& cfg, const LoraConfig& lora);
// The parameters a run trains: the adapters when lora is enabled, else the
// model's own (param_specs).
std::vector<ParamSpec> trainable_param_specs(const ModelConfig& cfg, const LoraConfig& lora, TpRank tp = {},
                                             PpStage stage = {}, EpRank ep = {});

// The frozen weights an adapted model reads (model.h LoraOptions::base): a
// whole model's parameters, param_specs(cfg) order, in the dtype it computes
// in (f32, bf16 or f16), with views by name; with `quant` (QLoRA: a GGUF
// file's quantized linears, any block type of kernels/quant.h) those views
// are the blocks instead, which the model reads a tile of rows at a time (kernels::
// dequantize_rows), never whole, and the compute dtype is f32. flat() then
// holds only the other parameters (norms, biases, embeddings).
class FrozenWeights {
 public:
  // flat: param_specs(cfg, tp) order (the tp rank's slices).
  FrozenWeights(const ModelConfig& cfg, OwnedTensor flat, TpRank tp = {});
  // QLoRA: quant's blocks (made for the same tp rank), and the other
  // parameters' tp slices read from its GGUF file straight into a buffer of
  // their own from pool.
  FrozenWeights(const ModelConfig& cfg, std::unique_ptr<QuantWeights> quant, Pool& pool, TpRank tp = {});
  ~FrozenWeights();
  FrozenWeights(const FrozenWeights&) = delete;
  FrozenWeights& operator=(const FrozenWeights&) = delete;
  const ParamViews& views() const { return *views_; }
  Tensor flat() const { return flat_; }
  const QuantWeights* quant() const { return quant_.get(); }

 private:
  std::vector<ParamSpec> specs_;
  OwnedTensor flat_;
  std::unique_ptr<QuantWeights> quant_;
  std::unique_ptr<ParamViews> views_;
};

// A model directory's weights (loom, Hugging Face or GGUF: load_model_params)
// as frozen weights in `dtype`, from pools' params: a GGUF file's quantized
// linears stay quantized under f32 (QLoRA), and are dequantized into bf16 /
// f16 otherwise. Under tensor parallelism, the tp rank's slices (of a
// quantized weight: its blocks, QuantWeights). A base that does not fit in memory is a loom::Error
// with the numbers.
std::unique_ptr<FrozenWeights> load_frozen_base(const ModelDir& dir, DType dtype, Pools& pools, TpRank tp = {});
// What load_frozen_base(dir, dtype, ., tp) holds in pools[params], without
// reading a weight: bytes, and whether the base stays quantized (QLoRA).
struct FrozenBytes {
  int64_t bytes = 0;
  bool quantized = false;
};
FrozenBytes frozen_base_bytes(const ModelDir& dir, DType dtype, TpRank tp = {});

// W += (alpha / r) B A for every adapted linear: base (param_specs(cfg)
// order, f32) absorbs adapters (lora_param_specs order, f32). The merged
// model computes what the base with its adapters did (up to rounding).
void lora_merge(Tensor base, const ModelConfig& cfg, const LoraConfig& lora, const Tensor& adapters);

// PEFT's adapter directory (lora_peft.cpp), as Hugging Face's peft writes
// and reads it: adapter_config.json (peft_type LORA, r, lora_alpha,
// target_modules, ...) and adapter_model.safetensors (f32, PEFT's keys).
// save_peft_adapter writes both (the directory is created; files replaced
// atomically); adapters: (lora_param_count) f32 in lora_param_specs order.
void save_peft_adapter(const std::string& dir, const ModelConfig& cfg, const LoraConfig& lora, const Tensor& adapters,
                       const std::string& base_model);
// The LoraConfig of an adapter directory for a model of cfg. Options loom
// does not implement (a bias, rsLoRA or DoRA, per-layer ranks or alphas, some
// layers only, layer replication, excluded modules, modules_to_save, a regex
// for target_modules, an init that modifies the base, another peft_type) are a
// loom::Error naming the key and what is allowed, as are target modules cfg's
// family does not have (an adapter for another model); lora_dropout is read
// as 0 (it only acts in training). base_model: base_model_name_or_path, or "".
LoraConfig read_peft_config(const std::string& dir, const ModelConfig& cfg, std::string* base_model = nullptr);
// target_modules that are no linear of cfg's blocks: a loom::Error naming
// `where`, the module and the base model the adapter names.
void check_peft_targets(const ModelConfig& cfg, const std::vector<std::string>& targets, const std::string& where,
                        const std::string& base_model);
// adapters (f32, lora_param_specs(cfg, lora) order) from the directory's
// safetensors: every adapter present with its shape; a tensor that is none
// of them is a loom::Error naming it.
void load_peft_adapter(const std::string& dir, const ModelConfig& cfg, const LoraConfig& lora, Tensor adapters);
inline constexpr const char* kPeftConfigFile = "adapter_config.json";
inline constexpr const char* kPeftWeightsFile = "adapter_model.safetensors";

// PEFT's key for an adapter parameter, and back (a key that is no adapter
// of this family is a loom::Error naming it).
std::string peft_key(const ModelConfig& cfg, const std::string& name);
std::string from_peft_key(const ModelConfig& cfg, const std::string& key);

}  // namespace loom::model
