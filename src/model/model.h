// Model: one transformer (GPT-2 or Llama) with its parameters, gradients and
// activations laid out once for a (B, T) micro-batch (llm.c): the step
// allocates nothing.
//
//   Model m(cfg, B, T, pools);
//   m.init_params(seed);                 // or m.load_params(file)
//   m.zero_grads();
//   float loss = m.forward(tokens, targets);
//   m.backward();                        // grads += d loss / d params
//
// Mixed precision (DESIGN.md §6): built with compute = bf16 (or f16), the
// model holds its compute weights params() and its activations in that dtype, and owns the f32
// master weights master_params() (pools[master]) that init, load, save,
// checkpoints and the optimizer work on; params() is their rounding
// (sync_params, or AdamW's param_copy). Gradients are f32 either way, as are
// the norm statistics, attention lse and the backward scratch. Under f32,
// master_params() is params() itself.
//
// Recompute (DESIGN.md §4) trades compute for activation memory; every policy
// gives bitwise the same losses and gradients:
//   none       every block keeps what its backward reads.
//   selective  blocks keep only their GEMM outputs (q, k, v, the attention
//              residual, the MLP's fc / gate and up); backward reruns the
//              parts without a GEMM — norms, the attention core, the
//              activation function — into buffers shared by all layers
//              (torchtitan's op-level policy, which also saves only matmul
//              outputs; the attention core is Megatron's selective choice).
//   full       blocks keep only their input (the residual stream); backward
//              reruns the whole block forward into one shared set of buffers.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/memory.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/params.h"

namespace loom::model {

struct ModelState;  // activations and per-layer views (model/blocks.h)

enum class Recompute : uint8_t { none, selective, full };
std::string_view recompute_name(Recompute r);
// "none", "selective", "full"; anything else is a loom::Error listing them.
Recompute recompute_from_name(std::string_view name);

class Model {
 public:
  // Validates cfg; B, T >= 1 and T <= cfg.max_seq_len. Parameters and
  // gradients (zeroed) come from pools[params] / pools[grads], activations
  // and backward scratch from pools[activations]. Parameters are not
  // initialised: call init_params or load_params. compute: f32, bf16 or f16.
  Model(const ModelConfig& cfg, int64_t B, int64_t T, Pools& pools, DType compute = DType::f32,
        Recompute recompute = Recompute::none);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return cfg_; }
  int64_t batch_size() const { return B_; }
  int64_t seq_len() const { return T_; }
  const std::vector<ParamSpec>& param_specs() const { return specs_; }
  int64_t num_params() const { return params_.numel(); }
  DType compute_dtype() const { return params_.dtype(); }
  Recompute recompute() const { return recompute_; }
  // Bytes the activations pool holds for a model built with these arguments
  // (activations and backward scratch), from the same layout the
  // constructor allocates, without allocating.
  static int64_t activation_bytes(const ModelConfig& cfg, int64_t B, int64_t T, DType compute, Recompute recompute);

  // Every parameter (gradient) packed in spec order: (P) in the compute
  // dtype (gradients: f32). The optimizer may update it as one flat tensor.
  Tensor params() const { return params_; }
  Tensor grads() const { return grads_; }
  // (P) f32 master weights: params() under f32 compute, else their own buffer.
  Tensor master_params() const { return master_.defined() ? Tensor(master_) : Tensor(params_); }
  // params() = master_params() rounded to the compute dtype (a no-op under
  // f32): after anything but AdamW (which writes both) changes the master.
  void sync_params();
  // One parameter (compute dtype) or gradient by name, with its spec's shape;
  // unknown names are a loom::Error.
  Tensor param(const std::string& name) const;
  Tensor grad(const std::string& name) const;

  // Sharding-invariant init (params.h) of every parameter.
  void init_params(uint64_t seed);
  // model::load_params (params.h) into master_params().
  void load_params(const io::SafetensorsFile& file, ParamLayout layout = ParamLayout::loom);

  // tokens, targets: (B, T) i32. Returns the mean cross-entropy over targets
  // (entries equal to -100 are ignored), or 0 when targets is undefined
  // (logits only; backward is then not allowed).
  float forward(const Tensor& tokens, const Tensor& targets = Tensor());
  // (B, T, V) in the compute dtype; valid after forward until backward (which overwrites it
  // with its gradient).
  Tensor logits() const;
  // grads += d(dloss * loss) / d params for the last forward. dloss = 1 / k
  // averages k accumulated micro-batches.
  void backward(float dloss = 1.f);
  void zero_grads();

 private:
  ModelConfig cfg_;
  int64_t B_, T_;
  Recompute recompute_;
  std::vector<ParamSpec> specs_;
  OwnedTensor params_, grads_;
  OwnedTensor master_;  // (P) f32 under bf16 / f16 compute; undefined under f32
  std::unique_ptr<ModelState> state_;
  bool has_targets_ = false;
};

}  // namespace loom::model
