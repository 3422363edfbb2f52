// Model (model.h): construction, parameters, and the forward and backward
// passes over the stage's parts — embeddings and head in model_head.cpp, the
// memory layout in model_layout.cpp, the blocks behind the family table
// (family.h).
#include "model/model.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <string>
#include <utility>

#include "core/error.h"
#include "kernels/ops.h"
#include "model/model_layout.h"
#include "model/model_state.h"
#include "model/units.h"

namespace loom::model {

using namespace loom::kernels;

namespace {

const ParamSpec& find_spec(const std::vector<ParamSpec>& specs, const std::string& name) {
  for (const ParamSpec& s : specs)
    if (s.name == name) return s;
  fail("model has no parameter '", name, "': names follow Hugging Face (e.g. '", specs.front().name, "', ",
       specs.size(), " parameters in all)");
}

// In double: an absurd model's bytes would overflow int64.
double bytes(int64_t n) { return static_cast<double>(n); }
double total_bytes(const ModelBytes& b) {
  return bytes(b.params) + bytes(b.master) + bytes(b.grads) + bytes(b.activations) + bytes(b.host);
}

// What the memory check says a model of P parameters takes.
std::string footprint(const ModelConfig& cfg, int64_t B, int64_t T, int64_t P, const ModelBytes& need) {
  return concat("model of ", P, " parameters on this rank (model.n_layer = ", cfg.n_layer, ", n_embd = ", cfg.n_embd,
                "; parameters ", gib(bytes(need.params + need.master)), ", gradients ", gib(bytes(need.grads)),
                ", activations of ", B, " x ", T, " tokens ", gib(bytes(need.activations)), ", per-layer bookkeeping ",
                gib(bytes(need.host)), ")");
}

// Numbers the layers' units after the embeddings' (model.h Units): each
// layer's, then a MoE layer's experts'. Returns the count so far.
int number_layer_units(const ModelConfig& cfg, int64_t first, int64_t layers, bool embedding, std::vector<int>& unit,
                       std::vector<int>& experts) {
  int next = embedding ? 1 : 0;
  for (int64_t l = 0; l < layers; ++l) {
    unit.push_back(next++);
    experts.push_back(cfg.is_moe_layer(first + l) ? next++ : -1);
  }
  return next;
}

// An adapted model's base, which it must have; QLoRA (lora.h FrozenWeights):
// the blocks read the base's quantized linears.
void use_quantized_base(Dims& d, const ModelOptions& options) {
  const LoraOptions& lora = options.lora;
  if (!lora.config.enabled()) return;
  LOOM_REQUIRE(lora.base != nullptr, "an adapted model needs its base's weights (LoraOptions::base)");
  if (lora.base->quant() == nullptr) return;
  LOOM_REQUIRE(options.compute == DType::f32, "a quantized base model (QLoRA) trains with f32 compute, not ",
               dtype_name(options.compute), ": set train.dtype = fp32");
  d.quant = lora.base->quant();
}

}  // namespace

std::vector<HookEvent> Model::hook_events(const ModelConfig& cfg, Pass pass, const StageOptions& stage) {
  using Call = HookEvent::Call;
  const int64_t first = stage.layers.first_layer, n = stage.layers.layer_count(cfg.n_layer);
  const bool embedding = stage.layers.holds_embedding(), head = stage.layers.holds_head(cfg.n_layer);
  std::vector<int> layer, experts;
  const int head_unit = number_layer_units(cfg, first, n, embedding, layer, experts);
  const int tied = cfg.tie_embeddings && embedding ? 0 : -1;
  std::vector<HookEvent> out;
  // A BoundUnit's calls (units.cpp): parameters, then (backward) gradients,
  // each for the unit, the tied unit, the experts; then the releases in the
  // same order; then the experts' and the unit's gradients ready.
  const auto bound = [&](int unit, int tied_unit, int experts_unit, bool params, bool grads) {
    std::vector<int> units = {unit};
    if (tied_unit >= 0) units.push_back(tied_unit);
    if (experts_unit >= 0) units.push_back(experts_unit);
    if (params) for (int u : units) out.push_back({Call::acquire_params, u});
    if (grads) for (int u : units) out.push_back({Call::acquire_grads, u});
    if (params) for (int u : units) out.push_back({Call::release_params, u});
    if (!grads) return;
    if (experts_unit >= 0) out.push_back({Call::grads_ready, experts_unit});
    out.push_back({Call::grads_ready, unit});
  };
  if (pass == Pass::forward) {
    if (embedding) bound(0, -1, -1, true, false);
    for (int64_t l = 0; l < n; ++l) bound(layer[static_cast<size_t>(l)], -1, experts[static_cast<size_t>(l)], true, false);
    if (head) bound(head_unit, tied, -1, true, false);
    return out;
  }
  if (head) bound(head_unit, tied, -1, true, true);
  for (int64_t l = n; l-- > 0;) bound(layer[static_cast<size_t>(l)], -1, experts[static_cast<size_t>(l)], true, true);
  if (embedding) bound(0, -1, -1, false, true);
  return out;
}

std::string_view recompute_name(Recompute r) {
  switch (r) {
    case Recompute::none: return "none";
    case Recompute::selective: return "selective";
    case Recompute::full: return "full";
  }
  return "?";
}

Recompute recompute_from_name(std::string_view name) {
  for (Recompute r : {Recompute::none, Recompute::selective, Recompute::full})
    if (recompute_name(r) == name) return r;
  fail("recompute policy '", name, "' is unknown: allowed values are none, selective, full");
}

Model::Model(const ModelConfig& cfg, int64_t B, int64_t T, Pools& pools, const ModelOptions& options)
    : cfg_(cfg), B_(B), T_(T), options_(options), state_(std::make_unique<ModelState>()) {
  const DType compute = options.compute;
  const StageOptions& stage = options.stage;
  const int64_t P = trainable_count(cfg, options);  // validates, O(1) in n_layer
  LOOM_REQUIRE(stage.slots >= 1, "activation slots ", stage.slots, " is invalid: allowed values are >= 1");
  first_layer_ = stage.layers.first_layer;
  n_layers_ = stage.layers.layer_count(cfg.n_layer);
  has_embedding_ = stage.layers.holds_embedding();
  has_head_ = stage.layers.holds_head(cfg.n_layer);
  LOOM_REQUIRE(B >= 1, "batch size ", B, " is invalid: allowed values are >= 1");
  LOOM_REQUIRE(options.cp.size >= 1, "context-parallel size ", options.cp.size, " is invalid: allowed values are >= 1");
  LOOM_REQUIRE(T >= 1 && T * options.cp.size <= cfg.max_seq_len, "sequence length ", T * options.cp.size,
               options.cp.size > 1 ? concat(" (", T, " tokens on each of ", options.cp.size, " cp ranks)") : "",
               " is invalid: allowed values are 1 to model.max_seq_len = ", cfg.max_seq_len);
  LOOM_REQUIRE(compute == DType::f32 || compute == DType::bf16 || compute == DType::f16, "model compute dtype ",
               dtype_name(compute), " is not supported: allowed are f32, bf16 and f16");
  check_tp(T, options.tp);
  check_cp(T, options.cp);
  check_moe(cfg, B, options.cp);
  memory_ = state_bytes(cfg, B, T, options);
  const ModelBytes& need = memory_;
  require_fits_memory(pools, total_bytes(need), footprint(cfg, B, T, P, need),
                      "lower model.n_layer, model.n_embd, train.micro_batch or train.seq_len, or split the model over "
                      "more ranks (parallel.tp, parallel.pp, parallel.zero_stage)");
  specs_ = trainable_param_specs(cfg, options.lora.config, options.tp.tp, stage.layers, options.ep.ep);
  units_ = adapted() ? lora_units(cfg, specs_, stage.layers) : model_units(cfg, specs_);
  const int unit_count = number_layer_units(cfg, first_layer_, n_layers_, has_embedding_, layer_units_, expert_units_);
  LOOM_CHECK(param_count(specs_) == P && static_cast<int64_t>(units_.size()) == unit_count + has_head_,
             "the stage's ", specs_.size(), " parameters make ", units_.size(), " units for ", n_layers_, " layers");
  const Storage& storage = options.storage;
  if (storage.params) params_ = pools[MemTag::params].empty(compute, {P});
  if (storage.master && compute != DType::f32) master_ = pools[MemTag::master].empty(DType::f32, {P});
  if (storage.grads) grads_ = pools[MemTag::grads].zeros(DType::f32, {P});

  ModelState& st = *state_;
  st.dims = dims_of(cfg, B, T, options.tp);
  use_quantized_base(st.dims, options);
  st.family = &block_family(cfg.family);
  if (cfg.is_moe()) init_moe(st, cfg_, T, options);
  Allocator alloc{&pools[MemTag::activations], &st.owned, compute};
  layout_activations(st, alloc, cfg, options, {n_layers_, has_embedding_, has_head_, first_layer_});
  LOOM_CHECK(alloc.bytes == need.activations, "activations: the layout took ", alloc.bytes, " bytes, ",
             "activation_bytes predicted ", need.activations);
  const int64_t Vl = vocab_per_rank(cfg, options.tp.tp.size);
  st.vocab.begin = options.tp.tp.rank * Vl;
  st.vocab.valid = std::clamp<int64_t>(cfg.vocab_size - st.vocab.begin, 0, Vl);
  set_positions(st, options.cp);

  st.param_views = std::make_unique<ParamViews>(specs_, params_);
  st.grad_views = std::make_unique<ParamViews>(specs_, grads_);
  const ParamViews &pv = *st.param_views, &gv = *st.grad_views;
  if (storage.params) {
    for (int64_t j = 0; j < n_layers_; ++j) st.w.push_back(bind_layer_params(pv, j));
    st.head_w = bind_head_params(pv, has_embedding_, has_head_);
  }
  if (storage.grads) {
    for (int64_t j = 0; j < n_layers_; ++j) st.g.push_back(bind_layer_grads(gv, j));
    st.head_g = bind_head_grads(gv, has_embedding_, has_head_);
  }
}

Model::~Model() = default;

int Model::slots() const { return static_cast<int>(state_->slots.size()); }

const SlotActs& Model::slot_acts(int slot) const {
  LOOM_REQUIRE(slot >= 0 && slot < slots(), "activation slot ", slot, " is invalid: this model has ", slots(),
               " (0 to ", slots() - 1, ")");
  return state_->slots[static_cast<size_t>(slot)];
}
SlotActs& Model::slot_acts(int slot) { return const_cast<SlotActs&>(std::as_const(*this).slot_acts(slot)); }

Tensor Model::stage_input(int slot) const {
  LOOM_REQUIRE(!has_embedding_, "Model::stage_input: the first stage reads tokens, not activations");
  return slot_acts(slot).resid[0];
}
Tensor Model::stage_output(int slot) const {
  LOOM_REQUIRE(!has_head_, "Model::stage_output: the last stage ends in the loss, not activations");
  return slot_acts(slot).resid[static_cast<size_t>(n_layers_)];
}
Tensor Model::stage_grad() const { return state_->dres; }
Tensor Model::logits(int slot) const { return slot_acts(slot).logits; }

Tensor Model::param(const std::string& name) const {
  LOOM_REQUIRE(params_.defined(), "Model::param: the model does not own its parameters (ZeRO-3 shards them)");
  return param_view(params_, find_spec(specs_, name));
}
Tensor Model::grad(const std::string& name) const {
  LOOM_REQUIRE(grads_.defined(), "Model::grad: the model does not own its gradients (ZeRO-2/3 shard them)");
  return param_view(grads_, find_spec(specs_, name));
}

void Model::init_params(uint64_t seed) {
  LOOM_REQUIRE(master_params().defined(), "Model::init_params: the model does not own its master weights");
  model::init_params(master_params(), specs_, seed);
  sync_params();
}

void Model::load_params(const io::SafetensorsFile& file, ParamLayout layout) {
  LOOM_REQUIRE(master_params().defined(), "Model::load_params: the model does not own its master weights");
  model::load_params(master_params(), specs_, file, layout);
  sync_params();
}

void Model::sync_params() {
  if (master_.defined() && params_.defined()) cast(params_, master_);
}

void Model::zero_grads() {
  if (grads_.defined()) fill(grads_, 0.f);
}

UnitSource Model::unit_source() const {
  return {&units_, options_.storage, hooks_, options_.compute, state_->param_views.get(), state_->grad_views.get()};
}

// An adapted model's weights are its base's with its adapters beside them;
// its gradients are the adapters' alone.
LayerWeights Model::bind_layer_params(const ParamViews& v, int64_t l) const {
  if (!adapted()) return v.layer(cfg_, first_layer_ + l);
  return with_lora(options_.lora.base->views().layer(cfg_, first_layer_ + l), v, cfg_, first_layer_ + l);
}
LayerWeights Model::bind_layer_grads(const ParamViews& v, int64_t l) const {
  if (!adapted()) return v.layer(cfg_, first_layer_ + l);
  return with_lora(LayerWeights{}, v, cfg_, first_layer_ + l);
}
HeadWeights Model::bind_head_params(const ParamViews& v, bool embeddings, bool head) const {
  return (adapted() ? options_.lora.base->views() : v).head(cfg_, embeddings, head);
}
HeadWeights Model::bind_head_grads(const ParamViews& v, bool embeddings, bool head) const {
  if (adapted()) return HeadWeights{};
  return v.head(cfg_, embeddings, head);
}

LayerWeights Model::layer_params(int64_t l) const {
  if (options_.storage.params) return state_->w[static_cast<size_t>(l)];
  return bind_layer_params(*state_->param_views, l);
}
LayerWeights Model::layer_grads(int64_t l) const {
  if (options_.storage.grads) return state_->g[static_cast<size_t>(l)];
  return bind_layer_grads(*state_->grad_views, l);
}
HeadWeights Model::head_params(bool embeddings, bool head) const {
  if (options_.storage.params) return state_->head_w;
  return bind_head_params(*state_->param_views, embeddings, head);
}
HeadWeights Model::head_grads(bool embeddings, bool head) const {
  if (options_.storage.grads) return state_->head_g;
  return bind_head_grads(*state_->grad_views, embeddings, head);
}

BlockContext Model::block_context(int64_t l) const {
  ModelState& st = *state_;
  AttentionStep& attention = options_.cp.attention ? *options_.cp.attention : st.attention;
  const MlpStep& mlp = cfg_.is_moe_layer(first_layer_ + l) ? *st.moe_mlp : st.family->mlp();
  return {st.dims, attention, mlp, st.pos, first_layer_ + l};
}

const MoeStats& Model::moe_stats() const {
  static const MoeStats kNone;
  return state_->moe_run ? state_->moe_run->stats : kNone;
}

void Model::reset_moe_stats() {
  if (state_->moe_run) state_->moe_run->stats = {};
}

void Model::set_training(bool training) {
  if (state_->moe_run) state_->moe_run->training = training;
}

void Model::set_samples(std::span<const int64_t> samples, int slot) {
  LOOM_REQUIRE(samples.empty() || static_cast<int64_t>(samples.size()) == B_, "Model::set_samples: ", samples.size(),
               " sample indices for a batch of ", B_, " sequences");
  slot_acts(slot).samples.assign(samples.begin(), samples.end());
}

float Model::forward(const Tensor& tokens, const Tensor& targets, int slot, std::optional<float> dloss) {
  SlotActs& a = slot_acts(slot);
  // The slot's last forward is forgotten first, and this one counts once it
  // has finished: if it throws, backward refuses rather than finishing either.
  a.has_targets = a.forward_done = false;
  a.loss_dloss.reset();
  a.drawn = a.samples;
  state_->dims.lora.samples = a.drawn;  // LoRA dropout's keys (none: no dropout)
  take_inputs(a, tokens, targets);
  if (has_embedding_) embed_forward(a);  // later stages find their input in stage_input()
  for (int64_t l = 0; l < n_layers_; ++l) layer_forward(a, l);
  float loss = 0.f;
  if (has_head_) {  // else the output waits in stage_output()
    head_forward(a);
    if (targets.defined()) loss = loss_forward(a, dloss);
  }
  a.has_targets = targets.defined(), a.forward_done = true;
  return loss;
}

void Model::backward(float dloss, int slot) {
  SlotActs& a = slot_acts(slot);
  LOOM_REQUIRE(has_head_ ? a.has_targets : a.forward_done, "Model::backward: the last forward",
               slots() > 1 ? concat(" of slot ", slot) : std::string(),
               " had no targets, did not finish, or has had its backward: call forward(tokens, targets) first");
  LOOM_REQUIRE(!a.loss_dloss || std::bit_cast<uint32_t>(*a.loss_dloss) == std::bit_cast<uint32_t>(dloss),
               "Model::backward: dloss ", dloss, " differs from the ", *a.loss_dloss,
               " its forward was given (the logits already hold the loss's gradient for that one)");
  a.has_targets = false, a.forward_done = false;
  state_->dims.lora.samples = a.drawn;  // the forward's masks again
  if (state_->moe_run) state_->moe_run->dloss = dloss;  // the MoE layers' balancing losses scale with it
  if (has_head_) head_backward(a, dloss);  // else stage_grad() holds the output's gradient
  for (int64_t l = n_layers_ - 1; l >= 0; --l) layer_backward(a, l);
  if (has_embedding_) embed_backward(a);  // else stage_grad() holds the input's gradient
}

void Model::layer_forward(SlotActs& a, int64_t l) {
  const BoundUnit bound(unit_source(), Pass::forward, Need::params, layer_unit(l), -1, expert_unit(l));
  const size_t i = static_cast<size_t>(l);
  state_->family->forward(a.resid[i + 1], a.resid[i], layer_params(l), a.acts[i], block_context(l));
}

void Model::layer_backward(SlotActs& a, int64_t l) {
  ModelState& st = *state_;
  const Dims& d = st.dims;
  const BlockFamily& f = *st.family;
  const bool sp = d.par.tp.sp;
  const size_t i = static_cast<size_t>(l);
  const BoundUnit bound(unit_source(), Pass::backward, Need::both, layer_unit(l), -1, expert_unit(l));
  const LayerWeights w = layer_params(l), g_real = layer_grads(l);
  const LayerWeights g = sp ? with_norm_grads_in(g_real, st.norm_grads, d.C) : g_real;
  const BlockContext c = block_context(l);
  // Under full recompute the block's output is rewritten with the same bits
  // (and a MoE layer's routing is not counted twice).
  if (options_.recompute == Recompute::full) {
    if (st.moe_run) st.moe_run->recomputing = true;
    f.forward(a.resid[i + 1], a.resid[i], w, a.acts[i], c);
    if (st.moe_run) st.moe_run->recomputing = false;
  }
  else if (options_.recompute == Recompute::selective) f.recompute(a.resid[i], w, a.acts[i], c);
  f.backward(st.dres, a.resid[i], w, g, a.acts[i], st.s, c);
  if (sp) sum_norm_grads(d, st.norm_grads, {g_real.norm1_w, g_real.norm1_b, g_real.norm2_w, g_real.norm2_b});
}

}  // namespace loom::model
