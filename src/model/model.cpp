// Model assembly: memory layout, parameter views, embedding, final norm, lm
// head and loss around the per-family blocks (gpt2.cpp, llama.cpp).
#include "model/model.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include <unistd.h>

#include "core/error.h"
#include "kernels/ops.h"
#include "model/blocks.h"

namespace loom::model {

using namespace loom::kernels;

namespace {

const ParamSpec& find_spec(const std::vector<ParamSpec>& specs, const std::string& name) {
  for (const ParamSpec& s : specs)
    if (s.name == name) return s;
  fail("model has no parameter '", name, "': names follow Hugging Face (e.g. '", specs.front().name, "', ",
       specs.size(), " parameters in all)");
}

// Allocates activation tensors from one pool and keeps their storage; the
// default dtype is the compute dtype. Without a pool it only counts bytes
// (Model::activation_bytes) and hands out tensors with no data.
struct Allocator {
  Pool* pool;
  std::vector<OwnedTensor>* owned;
  DType compute;
  int64_t bytes = 0, tensors = 0;
  Tensor operator()(Shape shape) { return (*this)(shape, compute); }
  Tensor operator()(Shape shape, DType dtype) {
    shape.validate();
    bytes += shape.numel() * static_cast<int64_t>(dtype_size(dtype));
    ++tensors;
    if (!pool) return Tensor(nullptr, dtype, shape);
    owned->push_back(pool->empty(dtype, shape));
    return owned->back();
  }
};

// The activations a block's backward reads that selective recompute drops
// (norm outputs and statistics, the attention core's output and lse, the
// activation function's output): fields of a LayerActs with nothing else set.
// The residual stream's rows this rank holds: all N, or N / tp under SP
// (tensor_parallel.h), as (B, T, C) or (Nl, C).
Shape stream_shape(const Dims& d) {
  if (!d.tp.sp) return {d.B, d.T, d.C};
  return {d.N() / d.tp.size, d.C};
}

LayerActs dropped_acts(Allocator& alloc, const Dims& d, bool gpt2) {
  const int64_t B = d.B, T = d.T, Nl = stream_shape(d).numel() / d.C;
  const DType f32 = DType::f32;  // norm statistics and lse
  LayerActs a;
  a.norm1 = alloc(stream_shape(d)), a.rstd1 = alloc({Nl}, f32);
  if (gpt2) a.mean1 = alloc({Nl}, f32);
  a.att = alloc({B, T, d.NH, d.HS}), a.lse = alloc({B, d.NH, T}, f32);
  a.norm2 = alloc(stream_shape(d)), a.rstd2 = alloc({Nl}, f32);
  if (gpt2) a.mean2 = alloc({Nl}, f32);
  a.act = alloc({B, T, d.F});
  return a;
}

// `dropped` completed with the GEMM outputs every policy but full keeps per
// block (q, k, v, res1, fc, up).
LayerActs with_kept_acts(LayerActs a, Allocator& alloc, const Dims& d, bool gpt2) {
  const int64_t B = d.B, T = d.T;
  a.q = alloc({B, T, d.NH, d.HS}), a.k = alloc({B, T, d.NKV, d.HS}), a.v = alloc({B, T, d.NKV, d.HS});
  a.res1 = alloc(stream_shape(d));
  a.fc = alloc({B, T, d.F});
  if (!gpt2) a.up = alloc({B, T, d.F});
  return a;
}

// Activations (st.resid, st.acts, final norm, logits) and backward scratch
// of a (B, T) micro-batch under a recompute policy (model.h).
// layers: the stage's (all of them without pipeline parallelism); slots:
// micro-batches whose activations it keeps at once (model.h); embedding /
// head: whether the stage holds them (only then tokens / the final norm,
// logits and targets are kept).
void layout_activations(ModelState& st, Allocator& alloc, const ModelConfig& cfg, Recompute recompute,
                        int64_t vocab, int64_t layers, int slots, bool embedding, bool head) {
  const Dims& d = st.dims;
  const bool gpt2 = cfg.family == Family::gpt2;
  const int64_t B = d.B, T = d.T, C = d.C, NH = d.NH, NKV = d.NKV, HS = d.HS, F = d.F;
  const int64_t L = layers, V = vocab;  // V: this tp rank's vocabulary columns
  const int64_t Nl = stream_shape(d).numel() / C;
  const DType f32 = DType::f32;  // norm statistics, lse and backward scratch

  st.pos = alloc({T}, DType::i32);
  // What backward recomputes is shared by every layer, and by every slot.
  LayerActs shared;
  if (recompute == Recompute::full) shared = with_kept_acts(dropped_acts(alloc, d, gpt2), alloc, d, gpt2);
  else if (recompute == Recompute::selective) shared = dropped_acts(alloc, d, gpt2);
  for (int k = 0; k < slots; ++k) {
    SlotActs a;
    if (embedding) a.tokens = alloc({B, T}, DType::i32);
    if (head) a.targets = alloc({B, T}, DType::i32);
    a.resid.reserve(static_cast<size_t>(L + 1)), a.acts.reserve(static_cast<size_t>(L));
    for (int64_t l = 0; l <= L; ++l) a.resid.push_back(alloc(stream_shape(d)));
    for (int64_t l = 0; l < L; ++l) {
      if (recompute == Recompute::full) a.acts.push_back(shared);  // every layer aliases one set
      else if (recompute == Recompute::selective) a.acts.push_back(with_kept_acts(shared, alloc, d, gpt2));
      else a.acts.push_back(with_kept_acts(dropped_acts(alloc, d, gpt2), alloc, d, gpt2));
    }
    if (head) {
      a.normf = alloc(stream_shape(d)), a.rstdf = alloc({Nl}, f32);
      if (gpt2) a.meanf = alloc({Nl}, f32);
      a.logits = alloc({B, T, V});
      if (d.tp.size > 1) a.ce_lse = alloc({B * T}, f32), a.ce_target = alloc({B * T}, f32);
    }
    st.slots.push_back(std::move(a));
  }
  st.dres = alloc(stream_shape(d), f32);
  if (head) st.dnormf = alloc({B, T, C}, f32);
  if (d.tp.sp) {
    st.norm_grads = alloc({4 * C}, f32);
    st.dims.tp.gathered = alloc({B * T, C}), st.dims.tp.partial = alloc({B * T, C});
    st.dims.tp.dfull = alloc({B * T, C}, f32), st.dims.tp.dlocal = alloc({Nl, C}, f32);
  }
  Scratch& s = st.s;
  s.dnorm = alloc({B, T, C}, f32);
  s.dq = alloc({B, T, NH, HS}, f32), s.dk = alloc({B, T, NKV, HS}, f32), s.dv = alloc({B, T, NKV, HS}, f32);
  if (!gpt2) s.dq_rot = alloc({B, T, NH, HS}, f32), s.dk_rot = alloc({B, T, NKV, HS}, f32);
  s.datt = alloc({B, T, NH, HS}, f32);
  s.dfc = alloc({B, T, F}, f32), s.dact = alloc({B, T, F}, f32);
  if (!gpt2) s.dup = alloc({B, T, F}, f32);
  st.use_slot(0);
}

Dims dims_of(const ModelConfig& cfg, int64_t B, int64_t T, const TpOptions& tp) {
  const int t = tp.tp.size;
  Dims d{B, T, cfg.n_embd, cfg.n_head / t, cfg.n_kv_head / t, cfg.head_size(), cfg.d_ff / t, cfg.norm_eps,
         cfg.rope_theta};
  d.tp.ops = t > 1 ? tp.ops : nullptr;
  d.tp.size = t;
  d.tp.sp = tp.sp();
  d.tp.rank = tp.tp.rank;
  return d;
}

// Sizes the model cannot split: heads and d_ff are checked by param_specs;
// SP splits every sequence's tokens.
void check_tp(int64_t T, const TpOptions& tp) {
  if (!tp.sp()) return;
  LOOM_REQUIRE(T % tp.tp.size == 0, "sequence length ", T, " is not divisible by parallel.tp = ", tp.tp.size,
               ": sequence parallelism splits each sequence's tokens across the tp ranks, so train.seq_len must be ",
               "a multiple of tp (or set parallel.sequence_parallel = false)");
}

void check_batch(const char* what, const Tensor& t, int64_t B, int64_t T) {
  LOOM_REQUIRE(t.dtype() == DType::i32 && t.ndim() == 2 && t.size(0) == B && t.size(1) == T && t.is_contiguous() &&
                   t.device().is_cpu(),
               "Model::forward: ", what, " is ", t.str(), ", expected contiguous CPU i32(", B, ", ", T,
               ") (the batch and sequence length the model was built for)");
}

}  // namespace

ParamViews::ParamViews(const std::vector<ParamSpec>& specs, Tensor flat, int64_t base) : flat_(flat), base_(base) {
  for (const ParamSpec& s : specs) index_.emplace(s.name, &s);
}

Tensor ParamViews::operator()(const std::string& name) const {
  auto it = index_.find(name);
  LOOM_CHECK(it != index_.end(), "no parameter ", name);
  const ParamSpec& spec = *it->second;
  LOOM_CHECK(spec.offset >= base_ && spec.offset + spec.numel() <= base_ + flat_.numel(), "parameter ", name,
             " is outside the bound unit");
  return flat_.slice(0, spec.offset - base_, spec.numel()).reshape(spec.shape);
}

LayerWeights ParamViews::layer(const ModelConfig& cfg, int64_t i) const {
  const ParamViews& v = *this;
  LayerWeights w;
  if (cfg.family == Family::gpt2) {
    const std::string p = concat("h.", i, ".");
    w.norm1_w = v(p + "ln_1.weight"), w.norm1_b = v(p + "ln_1.bias");
    const Tensor qkv = v(p + "attn.c_attn.weight"), qkv_b = v(p + "attn.c_attn.bias");
    const int64_t C = qkv.size(0) / 3;  // a tp rank's q, k, v rows: n_embd / tp each
    w.wq = qkv.slice(0, 0, C), w.wk = qkv.slice(0, C, C), w.wv = qkv.slice(0, 2 * C, C);
    w.bq = qkv_b.slice(0, 0, C), w.bk = qkv_b.slice(0, C, C), w.bv = qkv_b.slice(0, 2 * C, C);
    w.wo = v(p + "attn.c_proj.weight"), w.bo = v(p + "attn.c_proj.bias");
    w.norm2_w = v(p + "ln_2.weight"), w.norm2_b = v(p + "ln_2.bias");
    w.w_fc = v(p + "mlp.c_fc.weight"), w.b_fc = v(p + "mlp.c_fc.bias");
    w.w_out = v(p + "mlp.c_proj.weight"), w.b_out = v(p + "mlp.c_proj.bias");
    return w;
  }
  const std::string p = concat("model.layers.", i, ".");
  w.norm1_w = v(p + "input_layernorm.weight");
  w.wq = v(p + "self_attn.q_proj.weight"), w.wk = v(p + "self_attn.k_proj.weight");
  w.wv = v(p + "self_attn.v_proj.weight"), w.wo = v(p + "self_attn.o_proj.weight");
  w.norm2_w = v(p + "post_attention_layernorm.weight");
  w.w_fc = v(p + "mlp.gate_proj.weight"), w.w_up = v(p + "mlp.up_proj.weight");
  w.w_out = v(p + "mlp.down_proj.weight");
  return w;
}

HeadWeights ParamViews::head(const ModelConfig& cfg, bool embeddings, bool head) const {
  const ParamViews& v = *this;
  const bool gpt2 = cfg.family == Family::gpt2;
  const char* wte = gpt2 ? "wte.weight" : "model.embed_tokens.weight";
  HeadWeights h;
  if (embeddings) {
    h.wte = v(wte);
    if (gpt2) h.wpe = v("wpe.weight");
  }
  if (head) {
    if (gpt2) h.normf_b = v("ln_f.bias");
    h.normf_w = v(gpt2 ? "ln_f.weight" : "model.norm.weight");
    h.lm_head = v(cfg.tie_embeddings ? wte : "lm_head.weight");  // a later stage's own copy of wte when tied
  }
  return h;
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

namespace {

// The activation layout (layout_activations) of a stage of `layers` layers,
// counted without allocating: its bytes and tensors.
Allocator layout_count(const ModelConfig& cfg, int64_t B, int64_t T, DType compute, Recompute recompute,
                       const TpOptions& tp, const StageOptions& stage, int64_t layers) {
  ModelState st;
  st.dims = dims_of(cfg, B, T, tp);
  Allocator counter{nullptr, nullptr, compute};
  const int64_t first = stage.layers.first_layer;
  const bool head = stage.layers.n_layers < 0 || first + stage.layers.n_layers == cfg.n_layer;
  layout_activations(st, counter, cfg, recompute, vocab_per_rank(cfg, tp.tp.size), layers, stage.slots, first == 0,
                     head);
  return counter;
}

int64_t stage_layers(const ModelConfig& cfg, const PpStage& stage) {
  return stage.n_layers < 0 ? cfg.n_layer - stage.first_layer : stage.n_layers;
}

std::string gib(double bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

}  // namespace

int64_t host_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return INT64_MAX;  // unknown: nothing to check against
  return static_cast<int64_t>(pages) * static_cast<int64_t>(page);
}

// Without this check the OS would overcommit, and kill the process only once
// the pages are touched.
void require_fits_memory(const Pools& pools, double bytes, std::string_view what, std::string_view advice) {
  const auto host = static_cast<double>(host_memory_bytes());
  const auto in_use = static_cast<double>(pools.report().current_total);
  LOOM_REQUIRE(bytes + in_use <= host, what, " needs ", gib(bytes), " but this machine has ", gib(host),
               " of memory, ", gib(in_use), " of it already in use: allowed are runs whose state fits in memory; ",
               advice);
}

// Every layer adds the same activations, so a stage of n layers takes a
// one-layer stage's bytes plus n - 1 layers' (O(1) in n_layer); the
// constructor checks its real layout against this.
int64_t Model::activation_bytes(const ModelConfig& cfg, int64_t B, int64_t T, DType compute, Recompute recompute,
                                const TpOptions& tp, const StageOptions& stage) {
  (void)model::param_count(cfg, tp.tp, stage.layers);  // validates cfg, the tp split and the stage
  LOOM_REQUIRE(stage.slots >= 1, "activation slots ", stage.slots, " is invalid: allowed values are >= 1");
  LOOM_REQUIRE(B >= 1 && T >= 1, "activation_bytes: batch ", B, " and sequence length ", T, " must be >= 1");
  check_tp(T, tp);
  const int64_t one = layout_count(cfg, B, T, compute, recompute, tp, stage, 1).bytes;
  const int64_t per_layer = layout_count(cfg, B, T, compute, recompute, tp, stage, 2).bytes - one;
  const int64_t layers = stage_layers(cfg, stage.layers);
  int64_t rest = 0, bytes = 0;
  LOOM_REQUIRE(!__builtin_mul_overflow(layers - 1, per_layer, &rest) && !__builtin_add_overflow(one, rest, &bytes),
               "the activations of ", layers, " layers for ", B, " x ", T, " tokens are more than 2^63 bytes: ",
               "lower model.n_layer, train.micro_batch or train.seq_len");
  return bytes;
}

ModelBytes Model::state_bytes(const ModelConfig& cfg, int64_t B, int64_t T, DType compute, Recompute recompute,
                              const Storage& storage, const TpOptions& tp, const StageOptions& stage) {
  const int64_t P = model::param_count(cfg, tp.tp, stage.layers);
  ModelBytes b;
  if (storage.params) b.params = P * static_cast<int64_t>(dtype_size(compute));
  if (storage.master && compute != DType::f32) b.master = P * 4;
  if (storage.grads) b.grads = P * 4;
  b.activations = activation_bytes(cfg, B, T, compute, recompute, tp, stage);
  // Per layer, from the types' sizes (heap overheads left out): its specs
  // and their name index, its weight and gradient views, its activation
  // records (the slots' and the one in use) and tensors, each of which takes
  // at least one aligned block.
  ModelConfig one = cfg, two = cfg;
  one.n_layer = 1, two.n_layer = 2;
  const auto specs =
      static_cast<int64_t>(model::param_specs(two, tp.tp).size() - model::param_specs(one, tp.tp).size());
  const int64_t tensors = layout_count(cfg, B, T, compute, recompute, tp, stage, 2).tensors -
                          layout_count(cfg, B, T, compute, recompute, tp, stage, 1).tensors;
  const auto size = [](size_t n) { return static_cast<int64_t>(n); };
  const int64_t views = (storage.params ? 1 : 0) + (storage.grads ? 1 : 0);
  const int64_t per_layer = specs * (size(sizeof(ParamSpec)) + 2 * size(sizeof(std::pair<std::string, void*>))) +
                            views * size(sizeof(LayerWeights)) + (stage.slots + 1) * size(sizeof(LayerActs)) +
                            tensors * (size(sizeof(OwnedTensor)) + size(kAlignment));
  b.host = stage_layers(cfg, stage.layers) * per_layer;
  return b;
}

// The units of a stage's spec list, in one pass: a unit starts at the first
// parameter of each part, the embeddings, every layer, the head (where a
// later stage's copy of a tied embedding belongs).
std::vector<Unit> model_units(const ModelConfig& cfg, const std::vector<ParamSpec>& specs) {
  std::vector<Unit> units;
  int64_t part_of_unit = 0;  // -1 embeddings, l layer l, n_layer the head
  for (const ParamSpec& s : specs) {
    int64_t layer = 0;
    const ParamPart part = s.pp_copy ? ParamPart::head : param_part(cfg, s.name, &layer);
    const int64_t p = part == ParamPart::embedding ? -1 : part == ParamPart::head ? cfg.n_layer : layer;
    if (units.empty() || p != part_of_unit) {
      LOOM_CHECK(units.empty() || (p > part_of_unit && units.back().end == s.offset), "parameter ", s.name,
                 " is out of model order");
      units.push_back({s.offset, s.offset});
      part_of_unit = p;
    }
    units.back().end = s.offset + s.numel();
  }
  return units;
}

Model::Model(const ModelConfig& cfg, int64_t B, int64_t T, Pools& pools, DType compute, Recompute recompute,
             const Storage& storage, const TpOptions& tp, const StageOptions& stage)
    : cfg_(cfg),
      B_(B),
      T_(T),
      recompute_(recompute),
      compute_(compute),
      storage_(storage),
      tp_(tp),
      state_(std::make_unique<ModelState>()) {
  const int64_t P = model::param_count(cfg, tp.tp, stage.layers);  // validates, O(1) in n_layer
  LOOM_REQUIRE(stage.slots >= 1, "activation slots ", stage.slots, " is invalid: allowed values are >= 1");
  first_layer_ = stage.layers.first_layer;
  n_layers_ = stage_layers(cfg, stage.layers);
  has_embedding_ = first_layer_ == 0;
  has_head_ = first_layer_ + n_layers_ == cfg.n_layer;
  LOOM_REQUIRE(B >= 1, "batch size ", B, " is invalid: allowed values are >= 1");
  LOOM_REQUIRE(T >= 1 && T <= cfg.max_seq_len, "sequence length ", T, " is invalid: allowed values are 1 to ",
               "model.max_seq_len = ", cfg.max_seq_len);
  LOOM_REQUIRE(compute == DType::f32 || compute == DType::bf16 || compute == DType::f16, "model compute dtype ",
               dtype_name(compute), " is not supported: allowed are f32, bf16 and f16");
  check_tp(T, tp);
  memory_ = state_bytes(cfg, B, T, compute, recompute, storage, tp, stage);
  const ModelBytes& need = memory_;
  // In double: an absurd model's bytes would overflow int64.
  const auto bytes = [](int64_t n) { return static_cast<double>(n); };
  require_fits_memory(pools,
                      bytes(need.params) + bytes(need.master) + bytes(need.grads) + bytes(need.activations) +
                          bytes(need.host),
                      concat("model of ", P, " parameters on this rank (model.n_layer = ", cfg.n_layer, ", n_embd = ",
                             cfg.n_embd, "; parameters ", gib(bytes(need.params + need.master)), ", gradients ",
                             gib(bytes(need.grads)), ", activations of ", B, " x ", T, " tokens ",
                             gib(bytes(need.activations)), ", per-layer bookkeeping ", gib(bytes(need.host)), ")"),
                      "lower model.n_layer, model.n_embd, train.micro_batch or train.seq_len, or split the model over "
                      "more ranks (parallel.tp, parallel.pp, parallel.zero_stage)");
  specs_ = model::param_specs(cfg, tp.tp, stage.layers);
  units_ = model_units(cfg, specs_);
  LOOM_CHECK(param_count(specs_) == P && static_cast<int64_t>(units_.size()) == has_embedding_ + n_layers_ + has_head_,
             "the stage's ", specs_.size(), " parameters make ", units_.size(), " units for ", n_layers_, " layers");
  if (storage.params) params_ = pools[MemTag::params].empty(compute, {P});
  if (storage.master && compute != DType::f32) master_ = pools[MemTag::master].empty(DType::f32, {P});
  if (storage.grads) grads_ = pools[MemTag::grads].zeros(DType::f32, {P});

  ModelState& st = *state_;
  st.dims = dims_of(cfg, B, T, tp);
  Allocator alloc{&pools[MemTag::activations], &st.owned, compute};
  const int64_t Vl = vocab_per_rank(cfg, tp.tp.size);
  layout_activations(st, alloc, cfg, recompute, Vl, n_layers_, stage.slots, has_embedding_, has_head_);
  LOOM_CHECK(alloc.bytes == need.activations, "activations: the layout took ", alloc.bytes, " bytes, ",
             "activation_bytes predicted ", need.activations);
  st.vocab_begin = tp.tp.rank * Vl;
  st.vocab_valid = std::clamp<int64_t>(cfg.vocab_size - st.vocab_begin, 0, Vl);
  for (int64_t t = 0; t < T; ++t) st.pos.data_as<int32_t>()[t] = static_cast<int32_t>(t);

  st.param_views = std::make_unique<ParamViews>(specs_, params_);
  st.grad_views = std::make_unique<ParamViews>(specs_, grads_);
  const ParamViews &pv = *st.param_views, &gv = *st.grad_views;
  if (storage.params) {
    for (int64_t j = 0; j < n_layers_; ++j) st.w.push_back(pv.layer(cfg, first_layer_ + j));
    const HeadWeights w = pv.head(cfg, has_embedding_, has_head_);
    st.wte = w.wte, st.wpe = w.wpe, st.normf_w = w.normf_w, st.normf_b = w.normf_b, st.lm_head = w.lm_head;
  }
  if (storage.grads) {
    for (int64_t j = 0; j < n_layers_; ++j) st.g.push_back(gv.layer(cfg, first_layer_ + j));
    const HeadWeights g = gv.head(cfg, has_embedding_, has_head_);
    st.dwte = g.wte, st.dwpe = g.wpe, st.dnormf_w = g.normf_w, st.dnormf_b = g.normf_b, st.dlm_head = g.lm_head;
  }
}

int Model::slots() const { return static_cast<int>(state_->slots.size()); }

const SlotActs& Model::slot_acts(int slot) const {
  LOOM_REQUIRE(slot >= 0 && slot < slots(), "activation slot ", slot, " is invalid: this model has ", slots(),
               " (0 to ", slots() - 1, ")");
  return state_->slots[slot];
}

Tensor Model::stage_input(int slot) const {
  LOOM_REQUIRE(!has_embedding_, "Model::stage_input: the first stage reads tokens, not activations");
  return slot_acts(slot).resid[0];
}
Tensor Model::stage_output(int slot) const {
  LOOM_REQUIRE(!has_head_, "Model::stage_output: the last stage ends in the loss, not activations");
  return slot_acts(slot).resid[n_layers_];
}
Tensor Model::stage_grad() const { return state_->dres; }

Model::~Model() = default;

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

Tensor Model::unit_params(int unit, Pass pass) {
  const Unit& u = units_[unit];
  if (storage_.params) return params_.slice(0, u.begin, u.numel());
  LOOM_REQUIRE(hooks_ != nullptr, "Model: built without its parameters, and no hooks are set to provide them");
  Tensor t = hooks_->acquire_params(unit, pass);
  LOOM_CHECK(t.dtype() == compute_ && t.numel() == u.numel() && t.is_contiguous(), "hooks gave unit ", unit,
             " parameters ", t.str(), ", expected ", u.numel(), " contiguous ", dtype_name(compute_));
  return t;
}

void Model::release(int unit) {
  if (!storage_.params) hooks_->release_params(unit);
}

Tensor Model::unit_grads(int unit) {
  const Unit& u = units_[unit];
  if (storage_.grads) return grads_.slice(0, u.begin, u.numel());
  LOOM_REQUIRE(hooks_ != nullptr, "Model: built without its gradients, and no hooks are set to provide them");
  Tensor t = hooks_->acquire_grads(unit);
  LOOM_CHECK(t.dtype() == DType::f32 && t.numel() == u.numel() && t.is_contiguous(), "hooks gave unit ", unit,
             " gradients ", t.str(), ", expected ", u.numel(), " contiguous f32");
  return t;
}

void Model::grads_done(int unit) {
  if (hooks_) hooks_->grads_ready(unit);
}

namespace {
const char* embedding_name(const ModelConfig& c) {
  return c.family == Family::gpt2 ? "wte.weight" : "model.embed_tokens.weight";
}
const char* final_norm_name(const ModelConfig& c) { return c.family == Family::gpt2 ? "ln_f.weight" : "model.norm.weight"; }
}  // namespace

HeadWeights Model::bind_embeddings() {
  ParamViews& pv = *state_->param_views;
  pv.rebind(unit_params(0, Pass::forward), units_[0].begin);
  HeadWeights w;
  w.wte = pv(embedding_name(cfg_));
  if (cfg_.family == Family::gpt2) w.wpe = pv("wpe.weight");
  return w;
}

HeadWeights Model::bind_head(Pass pass) {
  ParamViews& pv = *state_->param_views;
  const int head = head_unit();
  HeadWeights w;
  pv.rebind(unit_params(head, pass), units_[head].begin);
  w.normf_w = pv(final_norm_name(cfg_));
  if (cfg_.family == Family::gpt2) w.normf_b = pv("ln_f.bias");
  if (!cfg_.tie_embeddings) {
    w.lm_head = pv("lm_head.weight");
  } else if (!has_embedding_) {  // the stage's own copy, in the head unit
    w.lm_head = pv(embedding_name(cfg_));
  } else {
    pv.rebind(unit_params(0, pass), units_[0].begin);
    w.lm_head = pv(embedding_name(cfg_));
  }
  return w;
}

void Model::release_head() {
  release(head_unit());
  if (cfg_.tie_embeddings && has_embedding_) release(0);
}

HeadWeights Model::bind_head_grads() {
  ParamViews& gv = *state_->grad_views;
  const int head = head_unit();
  HeadWeights g;
  gv.rebind(unit_grads(head), units_[head].begin);
  g.normf_w = gv(final_norm_name(cfg_));
  if (cfg_.family == Family::gpt2) g.normf_b = gv("ln_f.bias");
  if (!cfg_.tie_embeddings) {
    g.lm_head = gv("lm_head.weight");
  } else if (!has_embedding_) {
    g.lm_head = gv(embedding_name(cfg_));
  } else {
    gv.rebind(unit_grads(0), units_[0].begin);
    g.lm_head = gv(embedding_name(cfg_));
  }
  return g;
}

HeadWeights Model::bind_embedding_grads() {
  ParamViews& gv = *state_->grad_views;
  gv.rebind(unit_grads(0), units_[0].begin);
  HeadWeights g;
  g.wte = gv(embedding_name(cfg_));
  if (cfg_.family == Family::gpt2) g.wpe = gv("wpe.weight");
  return g;
}

namespace {

// Under tensor parallelism the kernels see only a vocabulary shard, so the
// model checks ids against the whole vocabulary itself.
void check_ids(const char* what, const Tensor& t, int64_t V, bool allow_ignore) {
  const int32_t* p = t.data_as<int32_t>();
  for (int64_t i = 0; i < t.numel(); ++i)
    LOOM_REQUIRE((p[i] >= 0 && p[i] < V) || (allow_ignore && p[i] == -100), "Model::forward: ", what, " ", p[i],
                 " at index ", i, " is outside the vocabulary: allowed ids are 0 to ", V - 1,
                 allow_ignore ? " (or -100: ignored)" : "");
}

// Under SP a norm weight's gradient from the rank's rows is partial: the
// block writes it into `buf` (zeroed) instead, which is then summed over tp
// and added to the real gradient (sum_norm_grads).
LayerWeights with_norm_grads_in(LayerWeights g, const Tensor& buf, int64_t C) {
  fill(buf, 0.f);
  Tensor* norms[] = {&g.norm1_w, &g.norm1_b, &g.norm2_w, &g.norm2_b};
  for (int i = 0; i < 4; ++i)
    if (norms[i]->defined()) *norms[i] = buf.slice(0, i * C, C);
  return g;
}
void sum_norm_grads(const Dims& d, const Tensor& buf, const std::array<Tensor, 4>& real) {
  d.tp.ops->all_reduce_sum(buf);
  for (int i = 0; i < 4; ++i)
    if (real[i].defined()) add(real[i], real[i], buf.slice(0, i * d.C, d.C));
}

}  // namespace

float Model::forward(const Tensor& tokens, const Tensor& targets, int slot) {
  (void)slot_acts(slot);  // checks it
  ModelState& st = *state_;
  st.use_slot(slot);
  bool& has_targets_ = st.slots[slot].has_targets;
  bool& forward_done_ = st.slots[slot].forward_done;
  const Dims& d = st.dims;
  const bool gpt2 = cfg_.family == Family::gpt2;
  const bool tp = tp_.active();
  LOOM_REQUIRE(!tp || tp_.ops != nullptr, "Model::forward: tensor parallelism (tp = ", tp_.tp.size,
               ") needs its collectives (TpOptions::ops)");
  if (has_embedding_) {
    check_batch("tokens", tokens, B_, T_);
    if (tp) check_ids("token", tokens, cfg_.vocab_size, false);
    std::memcpy(st.tokens.data(), tokens.data(), tokens.nbytes());
  }
  LOOM_REQUIRE(has_head_ || !targets.defined(), "Model::forward: targets given to a pipeline stage without the ",
               "head (layers ", first_layer_, " to ", first_layer_ + n_layers_ - 1, "): they go to the last stage");
  if (targets.defined()) {
    check_batch("targets", targets, B_, T_);
    if (tp) check_ids("target", targets, cfg_.vocab_size, true);
    std::memcpy(st.targets.data(), targets.data(), targets.nbytes());
  }
  has_targets_ = targets.defined();  // the slot is live once its inputs are checked
  forward_done_ = true;
  const int L = static_cast<int>(n_layers_);  // the stage's layers: all without pipeline parallelism
  const int64_t C = d.C, V = has_head_ ? st.logits.size(2) : 0;
  const bool own = storage_.params;
  ParamViews& pv = *st.param_views;
  HeadWeights w{st.wte, st.wpe, st.normf_w, st.normf_b, st.lm_head};
  if (has_embedding_) {  // later stages find their input in stage_input()
    if (!own) w = bind_embeddings();
    if (!tp) {
      embedding_forward(st.resid[0], st.tokens, w.wte, w.wpe);  // (B,T,C); Llama: no wpe
    } else {  // each token's row lives on one rank: partial sums (wpe added once), reduced by g
      const Tensor partial = d.tp.sp ? d.tp.partial.reshape({B_, T_, C}) : st.resid[0];
      embedding_shard_forward(partial, st.tokens, w.wte, st.vocab_begin, d.tp.rank == 0 ? w.wpe : Tensor());
      tp_.ops->reduce(st.resid[0], partial);
    }
    if (!own) release(0);
  }
  for (int l = 0; l < L; ++l) {
    const int unit = layer_unit(l);
    LayerWeights bound;
    if (!own) pv.rebind(unit_params(unit, Pass::forward), units_[unit].begin), bound = pv.layer(cfg_, first_layer_ + l);
    const LayerWeights& lw = own ? st.w[l] : bound;
    if (gpt2) gpt2_block_forward(st.resid[l + 1], st.resid[l], lw, st.acts[l], d);
    else llama_block_forward(st.resid[l + 1], st.resid[l], lw, st.acts[l], st.pos, d);
    if (!own) release(unit);
  }
  if (!has_head_) return 0.f;  // the output waits in stage_output()
  if (!own) w = bind_head(Pass::forward);
  const Tensor& x = st.resid[L];
  if (gpt2) layernorm_forward(st.normf, st.meanf, st.rstdf, x, w.normf_w, w.normf_b, d.eps);
  else rmsnorm_forward(st.normf, st.rstdf, x, w.normf_w, d.eps);
  // (N, V) or this rank's (N, Vl) columns; under SP from the gathered rows.
  linear_forward(rows_of(st.logits, V), rows_of(tp_enter(d, st.normf), C), w.lm_head, Tensor());
  if (!own) release_head();
  if (!has_targets_) return 0.f;
  if (!tp) return cross_entropy_forward_backward(Tensor(), Tensor(), st.logits, st.targets);
  // Vocab-parallel cross-entropy: the full rows' log-sum-exp and target
  // logit from every rank's columns; loss = mean of lse - target.
  const Tensor targets_n = st.targets.reshape({B_ * T_});
  cross_entropy_shard_stats(st.ce_lse, st.ce_target, rows_of(st.logits, V), targets_n, st.vocab_begin,
                            st.vocab_valid);
  tp_.ops->combine_cross_entropy(st.ce_lse, st.ce_target);
  const int32_t* tg = st.targets.data_as<int32_t>();
  const float *lse = st.ce_lse.data_as<float>(), *tl = st.ce_target.data_as<float>();
  double sum = 0;
  int64_t n_valid = 0;
  for (int64_t i = 0; i < B_ * T_; ++i)
    if (tg[i] != -100) sum += static_cast<double>(lse[i]) - tl[i], ++n_valid;
  return n_valid == 0 ? 0.f : static_cast<float>(sum / static_cast<double>(n_valid));
}
Tensor Model::logits(int slot) const { return slot_acts(slot).logits; }

void Model::backward(float dloss, int slot) {
  (void)slot_acts(slot);
  ModelState& st = *state_;
  SlotActs& sl = st.slots[slot];
  LOOM_REQUIRE(has_head_ ? sl.has_targets : sl.forward_done, "Model::backward: the last forward",
               slots() > 1 ? concat(" of slot ", slot) : std::string(),
               " had no targets (or backward already ran): call forward(tokens, targets) first");
  sl.has_targets = false, sl.forward_done = false;
  st.use_slot(slot);
  const Dims& d = st.dims;
  const bool gpt2 = cfg_.family == Family::gpt2;
  const bool tp = tp_.active(), sp = d.tp.sp;
  const int64_t C = d.C;
  const int L = static_cast<int>(n_layers_);
  const bool own = storage_.params, own_grads = storage_.grads;
  ParamViews &pv = *st.param_views, &gv = *st.grad_views;
  HeadWeights w{st.wte, st.wpe, st.normf_w, st.normf_b, st.lm_head};
  HeadWeights g{st.dwte, st.dwpe, st.dnormf_w, st.dnormf_b, st.dlm_head};
  if (has_head_) backward_head(dloss, w, g);  // else stage_grad() holds the output's gradient
  for (int l = L - 1; l >= 0; --l) {
    const int unit = layer_unit(l);
    LayerWeights bound_w, bound_g;
    if (!own) pv.rebind(unit_params(unit, Pass::backward), units_[unit].begin), bound_w = pv.layer(cfg_, first_layer_ + l);
    if (!own_grads) gv.rebind(unit_grads(unit), units_[unit].begin), bound_g = gv.layer(cfg_, first_layer_ + l);
    const LayerWeights& lw = own ? st.w[l] : bound_w;
    const LayerWeights& lg_real = own_grads ? st.g[l] : bound_g;
    const LayerWeights lg = sp ? with_norm_grads_in(lg_real, st.norm_grads, C) : lg_real;
    // Under full recompute the block's output is rewritten with the same bits.
    if (recompute_ == Recompute::full) {
      if (gpt2) gpt2_block_forward(st.resid[l + 1], st.resid[l], lw, st.acts[l], d);
      else llama_block_forward(st.resid[l + 1], st.resid[l], lw, st.acts[l], st.pos, d);
    } else if (recompute_ == Recompute::selective) {
      if (gpt2) gpt2_block_recompute(st.resid[l], lw, st.acts[l], d);
      else llama_block_recompute(st.resid[l], lw, st.acts[l], d);
    }
    if (gpt2) gpt2_block_backward(st.dres, st.resid[l], lw, lg, st.acts[l], st.s, d);
    else llama_block_backward(st.dres, st.resid[l], lw, lg, st.acts[l], st.s, st.pos, d);
    if (sp) sum_norm_grads(d, st.norm_grads, {lg_real.norm1_w, lg_real.norm1_b, lg_real.norm2_w, lg_real.norm2_b});
    if (!own) release(unit);
    grads_done(unit);
  }
  if (!has_embedding_) return;  // stage_grad() holds the input's gradient
  if (!own_grads) g = bind_embedding_grads();
  if (!tp) {
    embedding_backward(g.wte, g.wpe, st.dres, st.tokens);
  } else {  // every rank sees all rows' gradient: its vocabulary rows, and the whole (identical) wpe gradient
    const Tensor dy = tp_exit_backward(d, st.dres).reshape({B_, T_, C});
    embedding_shard_backward(g.wte, g.wpe, dy, st.tokens, st.vocab_begin);
  }
  grads_done(0);
}

// The loss's gradient through the lm head and the final norm into
// stage_grad(): the first part of the last stage's backward.
void Model::backward_head(float dloss, HeadWeights w, HeadWeights g) {
  ModelState& st = *state_;
  const Dims& d = st.dims;
  const bool gpt2 = cfg_.family == Family::gpt2;
  const bool tp = tp_.active(), sp = d.tp.sp;
  const int64_t V = st.logits.size(2), C = d.C;
  const int L = static_cast<int>(n_layers_);
  const bool own = storage_.params, own_grads = storage_.grads;
  if (!own) w = bind_head(Pass::backward);
  if (!own_grads) g = bind_head_grads();
  // dlogits overwrite the logits in place: (B, T, V) or the rank's (B, T, Vl)
  if (!tp) {
    cross_entropy_forward_backward(st.logits, Tensor(), st.logits, st.targets, -100, dloss);
  } else {
    const Tensor targets_n = st.targets.reshape({B_ * T_});
    int64_t n_valid = 0;
    for (int64_t i = 0; i < B_ * T_; ++i) n_valid += targets_n.data_as<int32_t>()[i] != -100;
    const float scale = n_valid == 0 ? 0.f : dloss / static_cast<float>(n_valid);
    cross_entropy_shard_backward(rows_of(st.logits, V), rows_of(st.logits, V), st.ce_lse, targets_n,
                                 st.vocab_begin, st.vocab_valid, scale);
  }
  fill(st.dnormf, 0.f);
  // The vocab-parallel head is column-parallel (tied: its gradient adds into
  // dwte); dnormf: the rank's rows, summed over tp.
  const Tensor dnormf =
      column_parallel_backward(d, st.dnormf, st.normf, {{rows_of(st.logits, V), g.lm_head, Tensor(), w.lm_head}});
  fill(st.dres, 0.f);
  const Tensor& x = st.resid[L];
  if (sp) fill(st.norm_grads, 0.f);
  const Tensor dnw = sp ? st.norm_grads.slice(0, 0, C) : g.normf_w;
  const Tensor dnb = sp && gpt2 ? st.norm_grads.slice(0, C, C) : g.normf_b;
  if (gpt2) layernorm_backward(st.dres, dnw, dnb, dnormf, x, w.normf_w, st.meanf, st.rstdf);
  else rmsnorm_backward(st.dres, dnw, dnormf, x, w.normf_w, st.rstdf);
  if (sp) sum_norm_grads(d, st.norm_grads, {g.normf_w, gpt2 ? g.normf_b : Tensor(), Tensor(), Tensor()});
  if (!own) release_head();
  grads_done(head_unit());
}

void Model::zero_grads() {
  if (grads_.defined()) fill(grads_, 0.f);
}

}  // namespace loom::model
