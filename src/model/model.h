// Model: one transformer (GPT-2 or Llama) with its parameters, gradients and
// activations laid out once for a (B, T) micro-batch (llm.c): the step
// allocates nothing.
//
//   Model m(cfg, B, T, pools);           // or Model(cfg, B, T, pools, {.compute = DType::bf16, ...})
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
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/memory.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/expert_parallel.h"
#include "model/lora.h"
#include "model/params.h"
#include "model/stage.h"
#include "model/tensor_parallel.h"

namespace loom::model {

struct ModelState;    // activations and per-layer views (model/model_state.h)
struct SlotActs;      // one micro-batch's activations (model/model_state.h)
struct LayerWeights;  // one layer's weights (model/blocks.h)
struct HeadWeights;   // embeddings, final norm, lm head (model/blocks.h)
struct BlockContext;  // what a block call runs with (model/family.h)
class AttentionStep;  // the blocks' attention (model/steps.h)
struct UnitSource;    // where the units live (model/units.h)

enum class Recompute : uint8_t { none, selective, full };

// Units (DESIGN.md §5 DP/ZeRO): the contiguous ranges of the flat parameter
// buffer that the model reads together, in spec order: unit 0 the embeddings
// (wte, wpe / embed_tokens), then each layer's, the last the final norm (and
// lm_head when untied). A dense layer is one unit; a MoE layer two, its
// attention, norms and router, then its experts (the parameters expert
// parallelism reduces over another group). Forward reads them in order (and
// 0 again for a tied head); backward finishes their gradients in reverse. A
// pipeline stage's units are its parts in the same order: [embeddings], its
// layers, [head] (a later stage's head unit holds its copy of a tied wte).
struct Unit {
  int64_t begin = 0, end = 0;  // elements of the flat parameter buffer
  int64_t numel() const { return end - begin; }
};
enum class Pass : uint8_t { forward, backward };
// The units of a stage's spec list (param_specs(cfg, tp, stage)), in one
// pass over it.
std::vector<Unit> model_units(const ModelConfig& cfg, const std::vector<ParamSpec>& specs);
// The units of an adapted model's spec list (lora_param_specs): the same
// count and order as its base's (for a pipeline stage: the stage's), the
// embeddings' and the head's empty (they carry no adapters), each layer's
// its adapters.
std::vector<Unit> lora_units(const ModelConfig& cfg, const std::vector<ParamSpec>& specs, PpStage stage = {});

// What data parallelism (parallel/dp.h) plugs into a Model: where the
// parameters and gradients of a model that does not own them live, and when
// gradients are complete.
class StepHooks {
 public:
  virtual ~StepHooks() = default;
  // Only for a model built without its parameters (Storage::params = false):
  // unit u's parameters, (numel) in the compute dtype, which the model reads
  // until release_params(u). A unit may be acquired again before release
  // (a tied lm head reads unit 0 while the head is acquired).
  virtual Tensor acquire_params(int unit, Pass pass) = 0;
  virtual void release_params(int unit) = 0;
  // Only for a model built without its gradients (Storage::grads = false):
  // the (numel) f32 buffer backward adds unit u's gradients into, zeroed by
  // the hooks at the start of each backward. Called again before
  // grads_ready(u) (a tied head and the embedding both add into unit 0), it
  // returns the same buffer.
  virtual Tensor acquire_grads(int unit) = 0;
  // Unit u's gradients of this backward are complete (order L + 1, ..., 0).
  virtual void grads_ready(int unit) = 0;
  // Only for a model that holds its parameters (Storage::params): called
  // before the model reads unit u's, which may still be arriving (a
  // parameter-server worker's pull, parallel/ps.h). Default: nothing.
  virtual void params_needed(int /*unit*/) {}
};

// Which parameter state a Model allocates itself. ZeRO shards the rest
// (parallel/dp.h): stage 1 the master weights, stage 2 also the gradients,
// stage 3 also the parameters. A model without its own parameters or
// gradients needs hooks (set_hooks) before forward.
struct Storage {
  bool params = true;
  bool master = true;  // f32 master weights under bf16 / f16 compute
  bool grads = true;
};
// A pipeline stage's layers (params.h) and how many micro-batches' activations
// it keeps at once: forward(..., slot) writes slot `slot`, backward(..., slot)
// reads it (a pipeline schedule keeps several micro-batches in flight; the
// backward scratch is shared). Default: the whole model, one slot.
struct StageOptions {
  PpStage layers;
  int slots = 1;
};

// One call a model makes to its StepHooks in a pass. A model that owns its
// parameters makes no params calls, one that owns its gradients no grads
// calls.
struct HookEvent {
  enum class Call : uint8_t { acquire_params, release_params, acquire_grads, grads_ready };
  Call call = Call::acquire_params;
  int unit = 0;
  friend bool operator==(const HookEvent&, const HookEvent&) = default;
};

// Bytes a Model takes from its pools, by tag (Model::state_bytes), and the
// host memory its per-layer bookkeeping takes beside them (spec list, views,
// activation records: a lower bound from the types' sizes).
struct ModelBytes {
  int64_t params = 0, master = 0, grads = 0, activations = 0;
  int64_t host = 0;
};

// The host's physical memory, which every pool of this process draws from
// (INT64_MAX where the system does not say).
int64_t host_memory_bytes();
// Checked before a large allocation (DESIGN.md §1.4): `bytes` more beside
// what pools hold must fit in host_memory_bytes(), else a loom::Error
// "<what> needs N GiB but this machine has M GiB of memory, K GiB of it
// already in use: ...; <advice>".
void require_fits_memory(const Pools& pools, double bytes, std::string_view what, std::string_view advice);

std::string_view recompute_name(Recompute r);
// "none", "selective", "full"; anything else is a loom::Error listing them.
Recompute recompute_from_name(std::string_view name);

// Context parallelism (DESIGN.md §5 CP, parallel/cp.h): the model holds T
// of each sequence's size·T tokens — its rank's chunks — at `positions` in
// the whole sequence (GPT-2's wpe rows, Llama's RoPE angles), and runs its
// blocks with `attention`, the step that sees the other ranks' keys (it
// must outlive the model). Every other layer works on the rank's own tokens.
// size 1: the whole sequence, positions 0..T-1, local flash attention.
struct CpOptions {
  int size = 1;
  std::vector<int32_t> positions;      // (T), each in [0, size·T); required when size > 1
  AttentionStep* attention = nullptr;  // required when size > 1
  RoutingGroupOps* routing = nullptr;  // a MoE model's routing over the cp group: required when size > 1
};

// A mixture-of-experts model's routing since Model::reset_moe_stats
// (model/moe.h), counted by training forwards (not serving, not a full
// recompute's second forward).
struct MoeStats {
  int64_t layer_forwards = 0;       // MoE layer forwards (MoE layers x micro-batches)
  double aux_loss = 0, z_loss = 0;  // their sums, before the coefficients (aux: 1 is perfect balance)
  int64_t choices = 0, dropped = 0;  // token choices routed, and dropped over capacity
  std::vector<int64_t> load;        // (n_layer x n_expert): each layer's choices per expert, before drops
};

// How a Model is built beside its config and micro-batch shape; the same
// options give Model::activation_bytes and state_bytes. compute: f32, bf16
// or f16 (see above). tp: this rank's slice under tensor (and sequence)
// parallelism (tensor_parallel.h); param_specs(), params and gradients are
// then the rank's slices, logits() its vocabulary columns. cp: the rank's
// tokens under context parallelism (T is then the rank's). stage: the
// pipeline stage's layers and activation slots (default: the whole model,
// one slot).
// LoRA (model/lora.h): with config.enabled() the model's parameters —
// param_specs(), units, params, master weights, gradients, init and load —
// are the adapters (lora_param_specs), and `base` supplies every other
// weight, frozen: views by the base's own names (param_specs(cfg)) in the
// compute dtype (lora.h FrozenWeights), which must outlive the model. Nothing computes a gradient
// of the base: its embeddings' backward is skipped, its norms and linears
// pass gradients through without keeping their own.
struct LoraOptions {
  LoraConfig config;
  const FrozenWeights* base = nullptr;
  uint64_t seed = 0;  // keys config.dropout's masks (with each element's sample, position, linear, feature)
  // A quantized base (QLoRA) without `base` at hand: the layout counts the
  // tiles its linears are dequantized into (Model::state_bytes for plans).
  bool quantized_base = false;
};

struct ModelOptions {
  DType compute = DType::f32;
  Recompute recompute = Recompute::none;
  Storage storage{};
  TpOptions tp{};
  StageOptions stage{};
  CpOptions cp{};
  EpOptions ep{};  // this rank's experts under expert parallelism (model/expert_parallel.h)
  LoraOptions lora{};
};

class Model final : public Stage {
 public:
  // Validates cfg; B, T >= 1 and T <= cfg.max_seq_len. Parameters and
  // gradients (zeroed) come from pools[params] / pools[grads], activations
  // and backward scratch from pools[activations]. Parameters are not
  // initialised: call init_params or load_params. A model whose
  // state_bytes, with what pools already hold, exceed the host's physical
  // memory is a loom::Error that says how much it needs and has, raised
  // before anything loops over its layers or allocates.
  //
  // A stage (ModelOptions::stage) without the embeddings reads its input
  // activations from stage_input() (filled by the caller before forward);
  // one without the head leaves its output in stage_output() and, before
  // backward, reads the output's gradient from stage_grad(), where backward
  // leaves the input's gradient. Its units are then [embeddings], its
  // layers, [head].
  Model(const ModelConfig& cfg, int64_t B, int64_t T, Pools& pools, const ModelOptions& options = {});
  ~Model() override;
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return cfg_; }
  const ModelOptions& options() const { return options_; }
  int64_t batch_size() const { return B_; }
  int64_t seq_len() const { return T_; }
  const std::vector<ParamSpec>& param_specs() const { return specs_; }
  int64_t num_params() const { return units_.back().end; }
  DType compute_dtype() const { return options_.compute; }
  Recompute recompute() const { return options_.recompute; }
  // Bytes the activations pool holds for a model built with these arguments
  // (activations and backward scratch), from the same layout the
  // constructor allocates, without allocating (options.storage is unused).
  static int64_t activation_bytes(const ModelConfig& cfg, int64_t B, int64_t T, const ModelOptions& options = {});
  // The residual stream's elements per micro-batch on this rank — what
  // stage_input, stage_output and stage_grad hold, and so a pipeline
  // message: B T C, or B T C / tp under sequence parallelism.
  static int64_t stream_numel(const ModelConfig& cfg, int64_t B, int64_t T, const ModelOptions& options = {});
  // Everything the constructor takes from the pools (parameters, master
  // weights, gradients as Storage asks, activations) and its bookkeeping,
  // O(1) in n_layer: what it checks against memory before building anything.
  static ModelBytes state_bytes(const ModelConfig& cfg, int64_t B, int64_t T, const ModelOptions& options = {});
  // What this model took: state_bytes of its arguments.
  const ModelBytes& memory() const { return memory_; }
  // The hook calls of one pass of a model holding `stage`, in order
  // (model/units.h): forward the embeddings, each layer (its MoE experts
  // after it), the head (reading unit 0 again when tied); backward the head
  // (with the tied embedding beside it), each layer from the last, the
  // embeddings (gradients only). What ZeRO-3's gathers prefetch by and
  // ZeRO-2's bucket buffers follow, so what loom plan simulates them with.
  static std::vector<HookEvent> hook_events(const ModelConfig& cfg, Pass pass, const StageOptions& stage = {});
  const TpOptions& tensor_parallel() const { return options_.tp; }
  bool adapted() const { return options_.lora.config.enabled(); }

  // The pipeline stage (stage.h): its first layer and layer count; whether
  // it holds the embeddings (first stage) and the head (last stage); its
  // input activations (not the first stage), output activations (not the
  // last), and the gradient buffer (see the constructor): the residual
  // stream's shape, compute dtype (stage_grad: f32).
  int64_t first_layer() const override { return first_layer_; }
  int64_t num_layers() const override { return n_layers_; }
  bool has_embedding() const override { return has_embedding_; }
  bool has_head() const override { return has_head_; }
  Tensor stage_input(int slot = 0) const override;
  Tensor stage_output(int slot = 0) const override;
  Tensor stage_grad() const override;
  int slots() const override;

  const std::vector<Unit>& units() const { return units_; }
  // The unit of local layer l, and its experts' unit (-1: a dense layer).
  int layer_unit(int64_t local_layer) const { return layer_units_[static_cast<size_t>(local_layer)]; }
  int expert_unit(int64_t local_layer) const { return expert_units_[static_cast<size_t>(local_layer)]; }
  const Storage& storage() const { return options_.storage; }
  // Hooks stay with the model until replaced (nullptr: none); they must
  // outlive every forward and backward that uses them.
  void set_hooks(StepHooks* hooks) { hooks_ = hooks; }

  // Every parameter (gradient) packed in spec order: (P) in the compute
  // dtype (gradients: f32). The optimizer may update it as one flat tensor.
  // Undefined where Storage left them out.
  Tensor params() const { return params_; }
  Tensor grads() const { return grads_; }
  // MoE models: the routing statistics since the last reset (model.h
  // MoeStats; empty for a dense model).
  const MoeStats& moe_stats() const;
  void reset_moe_stats();
  // false: the forwards that follow are an evaluation's (loom eval, the val
  // loss): MoE layers keep every routing choice (no capacity, as serving and
  // transformers' Mixtral do) and count no statistics. A training forward
  // (true, the default) drops choices past capacity_factor.
  void set_training(bool training);

  // (P) f32 master weights: params() under f32 compute, else their own
  // buffer (undefined when Storage::master is false).
  Tensor master_params() const {
    if (options_.compute != DType::f32) return master_;
    return params_;
  }
  // params() = master_params() rounded to the compute dtype (a no-op under
  // f32): after anything but AdamW (which writes both) changes the master.
  void sync_params();
  // One parameter (compute dtype) or gradient by name, with its spec's shape;
  // unknown names are a loom::Error.
  Tensor param(const std::string& name) const;
  Tensor grad(const std::string& name) const;

  // Sharding-invariant init (params.h) of every parameter. Both need the
  // model's own master weights (or f32 parameters).
  void init_params(uint64_t seed);
  // model::load_params (params.h) into master_params().
  void load_params(const io::SafetensorsFile& file, ParamLayout layout = ParamLayout::loom);

  // tokens, targets: (B, T) i32. Returns the mean cross-entropy over targets
  // (entries equal to -100 are ignored), or 0 when targets is undefined
  // (logits only; backward is then not allowed).
  // slot: which activation slot (StageOptions) keeps this micro-batch's
  // activations for its backward. dloss: Stage::forward's (the backward's,
  // given ahead so that the loss and its gradient take one pass).
  float forward(const Tensor& tokens, const Tensor& targets = Tensor(), int slot = 0,
                std::optional<float> dloss = std::nullopt) override;
  // (B, T, V) in the compute dtype — under tensor parallelism (B, T, Vl),
  // this rank's vocabulary columns, padding included; valid after a forward
  // without dloss until backward (both overwrite it with its gradient).
  Tensor logits(int slot = 0) const;
  // grads += d(dloss * loss) / d params for the last forward. dloss = 1 / k
  // averages k accumulated micro-batches; a forward given dloss must be
  // followed by the same (a loom::Error otherwise).
  void backward(float dloss = 1.f, int slot = 0) override;
  // Stage::set_samples: B indices or none. Only LoRA dropout draws.
  void set_samples(std::span<const int64_t> samples, int slot = 0) override;
  void zero_grads();

 private:
  const SlotActs& slot_acts(int slot) const;  // checks slot
  SlotActs& slot_acts(int slot);
  int head_unit() const { return static_cast<int>(units_.size()) - 1; }
  // Unit 0 when the head reads the embeddings' unit (tied, first stage), else -1.
  int tied_unit() const { return cfg_.tie_embeddings && has_embedding_ ? 0 : -1; }
  // The units' buffers and the hooks that lend them (model/units.h).
  UnitSource unit_source() const;
  // The weights (gradients) of what a BoundUnit bound: the model's own
  // views, or views by name into the buffers the hooks lent.
  LayerWeights bind_layer_params(const ParamViews& v, int64_t local_layer) const;
  LayerWeights bind_layer_grads(const ParamViews& v, int64_t local_layer) const;
  HeadWeights bind_head_params(const ParamViews& v, bool embeddings, bool head) const;
  HeadWeights bind_head_grads(const ParamViews& v, bool embeddings, bool head) const;
  LayerWeights layer_params(int64_t local_layer) const;
  LayerWeights layer_grads(int64_t local_layer) const;
  HeadWeights head_params(bool embeddings, bool head) const;
  HeadWeights head_grads(bool embeddings, bool head) const;
  BlockContext block_context(int64_t local_layer) const;
  // The passes' parts (model.cpp, model_head.cpp).
  void take_inputs(SlotActs& a, const Tensor& tokens, const Tensor& targets);
  void embed_forward(SlotActs& a);
  void layer_forward(SlotActs& a, int64_t l);
  void head_forward(SlotActs& a);
  float loss_forward(SlotActs& a, std::optional<float> dloss);
  void head_backward(SlotActs& a, float dloss);
  void layer_backward(SlotActs& a, int64_t l);
  void embed_backward(SlotActs& a);

  ModelConfig cfg_;
  int64_t B_, T_;
  ModelOptions options_;
  std::vector<ParamSpec> specs_;
  std::vector<Unit> units_;
  std::vector<int> layer_units_, expert_units_;  // per local layer (units())
  ModelBytes memory_;
  StepHooks* hooks_ = nullptr;
  OwnedTensor params_, grads_;
  OwnedTensor master_;  // (P) f32 under bf16 / f16 compute; undefined under f32
  std::unique_ptr<ModelState> state_;
  int64_t first_layer_ = 0, n_layers_ = 0;
  bool has_embedding_ = true, has_head_ = true;
};

}  // namespace loom::model
