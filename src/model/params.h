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
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "core/memory.h"
#include "core/tensor.h"
#include "io/safetensors.h"
#include "io/safetensors_index.h"
#include "model/config.h"

namespace loom::model {

// uniform: U(-init_std, init_std) (LoRA's A, model/lora.h).
enum class ParamInit : uint8_t { normal, ones, zeros, uniform };

// Tensor parallelism (DESIGN.md §5 TP, Megatron): the rank of a tp group of
// `size` ranks whose slice of the model a spec list describes.
struct TpRank {
  int size = 1;
  int rank = 0;
};

// How a tensor-parallel rank's parameter is cut from the global one.
//   dim -1  replicated: every tp rank holds all of it (norms, wpe, the
//           row-parallel biases, which rank 0 alone adds before the sum).
//   dim 0   rows: column-parallel weights and biases (c_attn, c_fc, q/k/v,
//           gate/up) and the vocab-parallel embedding and lm head.
//   dim 1   columns: row-parallel weights (attn.c_proj, mlp.c_proj, o_proj,
//           down_proj).
// The split dim is `blocks` equal blocks (GPT-2's fused c_attn: q, k and v),
// each cut into tp contiguous pieces; rank r holds piece r of every block,
// in block order. `extent` is the split dim's global extent padded to a
// multiple of blocks x tp: the vocabulary rounded up (V = 50257 at tp = 2 is
// 50258 rows); global indices past the real extent are padding — zero
// weights whose logits the loss masks out, so they never train.
struct TpSplit {
  int dim = -1;
  int64_t blocks = 1;
  int64_t extent = 0;
};

struct ParamSpec {
  std::string name;
  Shape shape;             // this tp rank's shape, loom layout (= global_shape without tp)
  int64_t offset = 0;      // elements from the start of the (rank's) flat parameter buffer
  ParamInit init = ParamInit::normal;
  float init_std = 0.f;    // for ParamInit::normal
  bool hf_transposed = false;  // HF stores it as shape reversed (GPT-2 Conv1D)
  Shape global_shape;      // the whole parameter's shape, loom layout
  TpSplit split;
  TpRank tp;
  bool pp_copy = false;    // a later pipeline stage's copy of a tied embedding (PpStage)

  int64_t numel() const { return shape.numel(); }
  int64_t global_numel() const { return global_shape.numel(); }
  bool replicated() const { return split.dim < 0; }
};

// Expert parallelism (DESIGN.md §5 EP): the rank of an ep group of `size`
// ranks, which holds experts [rank E / size, (rank + 1) E / size) of every
// MoE layer (by their global names: block_sparse_moe.experts.{e}.*).
struct EpRank {
  int size = 1;
  int rank = 0;
};

// Pipeline parallelism (DESIGN.md §5 PP): the contiguous layers a pipeline
// stage holds, [first_layer, first_layer + n_layers) (n_layers -1: to the
// last layer). The first stage (first_layer 0) also holds the embeddings,
// the last one the final norm and lm head; with tied embeddings (GPT-2) a
// last stage that is not also the first holds its own copy of wte.weight
// for the head, after the final norm (Megatron's embedding copy: it is
// initialised like stage 0's and its gradient is summed with stage 0's).
struct PpStage {
  int64_t first_layer = 0;
  int64_t n_layers = -1;

  // Of a model of n_layer layers: the layers the stage holds, and whether
  // it holds the embeddings (the first stage) and the head (the last).
  int64_t layer_count(int64_t n_layer) const { return n_layers < 0 ? n_layer - first_layer : n_layers; }
  bool holds_embedding() const { return first_layer == 0; }
  bool holds_head(int64_t n_layer) const { return first_layer + layer_count(n_layer) == n_layer; }
};

// Every parameter of the model in a fixed order (embeddings, layers, final
// norm, lm head), with offsets packing them contiguously. Validates cfg.
// With tp.size > 1, the specs of tp rank tp.rank: the shapes are its slices
// and the offsets pack those (every rank's list has the same names in the
// same order). A tp size that does not divide model.n_head,
// model.n_kv_head or model.d_ff is a loom::Error saying what must divide what.
// With a pipeline stage, only the stage's parameters (above), packed from
// offset 0; a stage outside the model's layers, or with no layer, is a
// loom::Error. The work is linear in the stage's layers.
// With ep.size > 1, only the ep rank's experts of each MoE layer (a dense
// model, or ep not dividing model.n_expert, is a loom::Error).
std::vector<ParamSpec> param_specs(const ModelConfig& cfg, TpRank tp = {}, PpStage stage = {}, EpRank ep = {});
// Whether a parameter belongs to a layer (and which), the embeddings or the
// head (final norm, lm head): by its Hugging Face name.
enum class ParamPart : uint8_t { embedding, layer, head };
ParamPart param_part(const ModelConfig& cfg, const std::string& name, int64_t* layer = nullptr);
// A MoE layer's expert weight (block_sparse_moe.experts.{e}.*): split over
// ep, reduced over the expert-dp group, a unit of its own (model.h Units).
bool is_expert_param(const std::string& name);
int64_t param_count(const std::vector<ParamSpec>& specs);
// param_count(param_specs(cfg, tp, stage)) without building the list: O(1)
// in n_layer, so a model's size can be checked before anything loops over
// its layers. Validates like param_specs.
int64_t param_count(const ModelConfig& cfg, TpRank tp = {}, PpStage stage = {}, EpRank ep = {});
// The parameters one token's forward reads: param_count(cfg) less, in each
// MoE layer, the n_expert - top_k experts it does not choose (a dense model:
// every parameter). What model FLOPs per token are counted from.
int64_t active_param_count(const ModelConfig& cfg);
// The vocabulary rows each tp rank holds: vocab_size rounded up to a
// multiple of tp, divided by tp.
int64_t vocab_per_rank(const ModelConfig& cfg, int tp);

// Where a rank's elements sit in the global tensor: the rank's flat elements
// [local, local + count) (row-major over spec.shape) are the global tensor's
// flat elements [global, global + count) (row-major over global_shape), or
// padding (global = -1). The runs cover the local tensor in order; a
// replicated spec is one run.
struct ShardRun {
  int64_t local = 0, global = 0, count = 0;
};
std::vector<ShardRun> shard_runs(const ParamSpec& spec);

// One parameter's runs, copied with kernels::copy between a rank's flat f32
// buffer (the parameter at spec.offset in it) and the whole parameter's flat
// f32 elements (whole_param: global_shape's numel). place_runs writes the
// rank's elements into whole_param (padding skipped); take_runs writes them
// out of whole_param into the rank's buffer (padding 0).
void place_runs(Tensor whole_param, const Tensor& local, const ParamSpec& spec);
void take_runs(Tensor local, const ParamSpec& spec, const Tensor& whole_param);

// Between the whole model's flat buffer (param_specs(cfg)) and tp ranks'
// (param_specs(cfg, {tp, r})), f32: tp_slice copies rank tp.rank's elements
// out of global (padding 0); tp_assemble fills global from every rank's
// buffer (ranks[r] for rank r; replicated parameters from rank 0).
void tp_slice(Tensor local, const ModelConfig& cfg, TpRank tp, const Tensor& global);
void tp_assemble(Tensor global, const ModelConfig& cfg, int tp, std::span<const Tensor> ranks);

// Initialises rows [row_begin, row_begin + dst.size(0)) of the rank's
// parameter: the element at global flat index i gets init(seed, spec.name,
// i), so a slice (of a tp rank, or of its rows) computes exactly its part of
// the whole. Padding is 0. dst: contiguous f32 with the spec's shape except
// dim 0 (a 1-D spec is sliced along its only dim).
// normal: N(0, init_std) from Philox keyed by rng_key(name); uniform:
// U(-init_std, init_std) likewise; ones; zeros.
void init_param(Tensor dst, const ParamSpec& spec, uint64_t seed, int64_t row_begin = 0);

// How tensors in a safetensors file are laid out: loom's (out, in) for every
// linear, or Hugging Face's (GPT-2 Conv1D weights transposed).
enum class ParamLayout : uint8_t { loom, hf };

// The whole-model operations on a flat parameter buffer, flat: (P) f32
// packed in spec order (Model::master_params(), or the serving engine's weights).
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
// The same from a sharded checkpoint, each tensor from the shard its index
// names (a missing one is an error naming the index).
void load_params(Tensor flat, const std::vector<ParamSpec>& specs, const io::SafetensorsShards& shards,
                 ParamLayout layout = ParamLayout::hf);
// A flat f32 buffer in the dtype a model is served in: flat itself for f32,
// else a copy in dtype (bf16 / f16, rounded once) from pool, flat released.
OwnedTensor params_in_dtype(OwnedTensor flat, DType dtype, Pool& pool);
// Writes every parameter to a safetensors file at path (atomically), named as
// the specs name them, in the given layout.
void save_params(const std::string& path, const std::vector<ParamSpec>& specs, const Tensor& flat,
                 ParamLayout layout = ParamLayout::loom, const std::map<std::string, std::string>& metadata = {});
// The same in loom's layout with the parameters read a part at a time:
// read(flat, out) puts flat elements [flat, flat + out.numel()) in out (f32),
// as a run whose weights do not fit in memory at once writes them.
using FlatReader = std::function<void(int64_t flat, Tensor out)>;
void save_params_streamed(const std::string& path, const std::vector<ParamSpec>& specs, const FlatReader& read);

}  // namespace loom::model
