// Model memory layout (model_layout.h), what it costs before it is built
// (Model::activation_bytes, state_bytes, require_fits_memory) and the units
// of a spec list.
#include "model/model_layout.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <utility>

#include <unistd.h>

#include "core/error.h"
#include "core/memory.h"
#include "kernels/ops.h"
#include "model/moe.h"

namespace loom::model {

namespace {

// The residual stream's rows this rank holds: all N, or N / tp under SP
// (tensor_parallel.h), as (B, T, C) or (Nl, C).
Shape stream_shape(const Dims& d) {
  if (!d.par.tp.sp) return {d.B, d.T, d.C};
  return {d.N() / d.par.tp.size, d.C};
}

// Which MLPs a stage's layers have: dense, mixture of experts, or both.
struct LayerKinds {
  bool dense = true, moe = false;
  MoeSizes z;  // moe: a MoE layer's sizes
};

MoeAlloc moe_alloc(Allocator& alloc) {
  return [&alloc](Shape shape, DType dtype) { return alloc(shape, dtype); };
}

// The activations a block's backward reads that selective recompute drops
// (norm outputs and statistics, the attention core's output and lse, the
// activation function's output: a dense MLP's, a MoE layer's experts' and
// shared experts') for the layer kinds `k`: fields of a LayerActs with
// nothing else set.
LayerActs dropped_acts(Allocator& alloc, const Dims& d, bool gpt2, const LayerKinds& k) {
  const int64_t B = d.B, T = d.T, Nl = stream_shape(d).numel() / d.C;
  const DType f32 = DType::f32;  // norm statistics and lse
  LayerActs a;
  a.norm1 = alloc(stream_shape(d)), a.rstd1 = alloc({Nl}, f32);
  if (gpt2) a.mean1 = alloc({Nl}, f32);
  a.att = alloc({B, T, d.NH, d.HS}), a.lse = alloc({B, d.NH, T}, f32);
  a.norm2 = alloc(stream_shape(d)), a.rstd2 = alloc({Nl}, f32);
  if (gpt2) a.mean2 = alloc({Nl}, f32);
  if (k.dense) a.act = alloc({B, T, d.F});
  if (k.moe) moe_dropped_acts(a.moe, k.z, moe_alloc(alloc), alloc.compute);
  return a;
}

// `dropped` completed with the GEMM outputs every policy but full keeps per
// block (q, k, v, res1, fc, up; a MoE layer's router and expert buffers).
LayerActs with_kept_acts(LayerActs a, Allocator& alloc, const Dims& d, bool gpt2, const LayerKinds& k) {
  const int64_t B = d.B, T = d.T;
  a.q = alloc({B, T, d.NH, d.HS}), a.k = alloc({B, T, d.NKV, d.HS}), a.v = alloc({B, T, d.NKV, d.HS});
  a.res1 = alloc(stream_shape(d));
  if (k.dense) {
    a.fc = alloc({B, T, d.F});
    if (!gpt2) a.up = alloc({B, T, d.F});
  }
  if (k.moe) moe_kept_acts(a.moe, k.z, moe_alloc(alloc), alloc.compute);
  return a;
}

// One slot's activations; `shared`: what backward recomputes, shared by
// every layer and slot (undefined fields: none).
SlotActs slot_layout(Allocator& alloc, const Dims& d, bool gpt2, Recompute recompute, const LayerActs& shared,
                     int64_t vocab, const StageShape& stage, const ModelConfig& cfg, const LayerKinds& kinds) {
  const int64_t B = d.B, T = d.T, L = stage.layers;
  const int64_t Nl = stream_shape(d).numel() / d.C;
  const DType f32 = DType::f32;
  SlotActs a;
  if (stage.embedding) a.tokens = alloc({B, T}, DType::i32);
  if (stage.head) a.targets = alloc({B, T}, DType::i32);
  a.resid.reserve(static_cast<size_t>(L + 1)), a.acts.reserve(static_cast<size_t>(L));
  for (int64_t l = 0; l <= L; ++l) a.resid.push_back(alloc(stream_shape(d)));
  for (int64_t l = 0; l < L; ++l) {
    LayerKinds k = kinds;  // this layer's kind alone
    k.moe = cfg.is_moe_layer(stage.first_layer + l), k.dense = !k.moe;
    if (recompute == Recompute::full) a.acts.push_back(shared);  // every layer aliases one set
    else if (recompute == Recompute::selective) a.acts.push_back(with_kept_acts(shared, alloc, d, gpt2, k));
    else a.acts.push_back(with_kept_acts(dropped_acts(alloc, d, gpt2, k), alloc, d, gpt2, k));
  }
  if (stage.head) {
    a.normf = alloc(stream_shape(d)), a.rstdf = alloc({Nl}, f32);
    if (gpt2) a.meanf = alloc({Nl}, f32);
    a.logits = alloc({B, T, vocab});
    if (d.par.tp.size > 1) a.ce_lse = alloc({B * T}, f32), a.ce_target = alloc({B * T}, f32);
  }
  return a;
}

}  // namespace

void layout_activations(ModelState& st, Allocator& alloc, const ModelConfig& cfg, const ModelOptions& options,
                        const StageShape& stage) {
  st.dims.recompute_act = options.recompute == Recompute::selective;  // the MLP's activation is not kept
  const Dims& d = st.dims;
  const bool gpt2 = cfg.family == Family::gpt2;
  const int64_t B = d.B, T = d.T, C = d.C, NH = d.NH, NKV = d.NKV, HS = d.HS, F = d.F;
  const int64_t V = vocab_per_rank(cfg, options.tp.tp.size);  // this tp rank's vocabulary columns
  const int64_t Nl = stream_shape(d).numel() / C;
  const DType f32 = DType::f32;  // norm statistics, lse and backward scratch
  const Recompute recompute = options.recompute;

  st.pos = alloc({T}, DType::i32);
  if (gpt2 && options.cp.size > 1 && stage.embedding) st.pos_bt = alloc({B, T}, DType::i32);  // the wpe rows
  // The stage's layer kinds.
  LayerKinds kinds;
  kinds.moe = false, kinds.dense = false;
  for (int64_t l = 0; l < stage.layers; ++l) {
    const bool moe = cfg.is_moe_layer(stage.first_layer + l);
    kinds.moe |= moe, kinds.dense |= !moe;
    if (kinds.moe && kinds.dense) break;
  }
  // A routing group is routing_group whole sequences (cp: each rank holds 1 / cp of its tokens).
  if (kinds.moe)
    kinds.z = moe_sizes(cfg, B * T, B / cfg.routing_group, cfg.routing_group * T * options.cp.size,
                        options.tp.tp.size, options.ep.ep.size);
  // What backward recomputes is shared by every layer, and by every slot.
  LayerActs shared;
  if (recompute == Recompute::full) shared = with_kept_acts(dropped_acts(alloc, d, gpt2, kinds), alloc, d, gpt2, kinds);
  else if (recompute == Recompute::selective) shared = dropped_acts(alloc, d, gpt2, kinds);
  for (int k = 0; k < options.stage.slots; ++k)
    st.slots.push_back(slot_layout(alloc, d, gpt2, recompute, shared, V, stage, cfg, kinds));
  st.dres = alloc(stream_shape(d), f32);
  if (stage.head) st.dnormf = alloc({B, T, C}, f32);
  if (d.par.tp.sp) {
    TpContext& tp = st.dims.par.tp;
    st.norm_grads = alloc({4 * C}, f32);
    tp.gathered = alloc({B * T, C}), tp.partial = alloc({B * T, C});
    tp.dfull = alloc({B * T, C}, f32), tp.dlocal = alloc({Nl, C}, f32);
  }
  Scratch& s = st.s;
  s.dnorm = alloc({B, T, C}, f32);
  s.dq = alloc({B, T, NH, HS}, f32), s.dk = alloc({B, T, NKV, HS}, f32), s.dv = alloc({B, T, NKV, HS}, f32);
  if (!gpt2) s.dq_rot = alloc({B, T, NH, HS}, f32), s.dk_rot = alloc({B, T, NKV, HS}, f32);
  s.datt = alloc({B, T, NH, HS}, f32);
  if (kinds.dense) s.dfc = alloc({B, T, F}, f32), s.dact = alloc({B, T, F}, f32);
  if (kinds.dense && !gpt2) s.dup = alloc({B, T, F}, f32);
  if (kinds.moe) s.moe = moe_scratch(kinds.z, moe_alloc(alloc));
  if (const LoraConfig& lora = options.lora.config; lora.enabled()) {
    LoraContext& l = st.dims.lora;
    l.scale = lora.scale();
    l.u = alloc({B * T, lora.rank}), l.du = alloc({B * T, lora.rank}, f32);
    if (d.par.tp.size > 1) l.dwhole = alloc({lora.rank * C}, f32);
    if (lora.dropout > 0) {  // the widest adapted input: C, or this rank's F
      l.dropout = static_cast<float>(lora.dropout), l.seed = options.lora.seed;
      const int64_t IC = std::max(C, F);
      l.mask = alloc({B * T * IC}, f32), l.xdrop = alloc({B * T * IC}), l.dxdrop = alloc({B * T * IC}, f32);
    }
    if (options.lora.quantized_base || (options.lora.base != nullptr && options.lora.base->quant() != nullptr))
      l.wtile = alloc({kQuantTileRows * std::max(C, F)}, f32), l.ytile = alloc({B * T * kQuantTileRows}, f32);
  }
}

Dims dims_of(const ModelConfig& cfg, int64_t B, int64_t T, const TpOptions& tp) {
  const int t = tp.tp.size;
  Dims d{B, T, cfg.n_embd, cfg.n_head / t, cfg.n_kv_head / t, cfg.head_size(), cfg.d_ff / t, cfg.norm_eps,
         cfg.rope_theta};
  // A group of one rank gets no ops: its f / g are then the identity.
  d.par.tp.ops = t > 1 ? tp.ops : nullptr;
  d.par.tp.size = t;
  d.par.tp.sp = tp.sp();
  d.par.tp.rank = tp.tp.rank;
  return d;
}

void check_cp(int64_t T, const CpOptions& cp) {
  if (cp.size == 1) return;
  LOOM_REQUIRE(cp.attention != nullptr, "context parallelism over ", cp.size, " ranks needs its attention step");
  LOOM_REQUIRE(static_cast<int64_t>(cp.positions.size()) == T, "context parallelism: ", cp.positions.size(),
               " positions given for the rank's ", T, " tokens");
  for (const int32_t p : cp.positions)
    LOOM_REQUIRE(p >= 0 && p < T * cp.size, "context parallelism: position ", p, " is outside the sequence of ",
                 T * cp.size, " tokens");
}

void set_positions(ModelState& st, const CpOptions& cp) {
  if (cp.size == 1) return kernels::arange(st.pos);  // (T) i32 0..T-1
  const int64_t T = st.pos.numel();
  const Tensor positions(const_cast<int32_t*>(cp.positions.data()), DType::i32, {T});  // read only
  copy_tensor(st.pos, positions);
  if (!st.pos_bt.defined()) return;
  for (int64_t b = 0; b < st.pos_bt.size(0); ++b) copy_tensor(st.pos_bt.slice(0, b, 1).reshape({T}), positions);
}

void init_moe(ModelState& st, const ModelConfig& cfg, int64_t T, const ModelOptions& options) {
  const int64_t group_tokens = cfg.routing_group * T * options.cp.size;  // whole sequences over the cp ranks
  st.moe_run = std::make_unique<MoeRun>();
  MoeRun& run = *st.moe_run;
  run.cfg = &cfg, run.group_tokens = group_tokens, run.ep = options.ep;
  if (options.cp.size > 1) {
    run.cp = options.cp.routing, run.positions = options.cp.positions, run.seq_len = T * options.cp.size;
    run.cp_size = options.cp.size;
  }
  st.moe_mlp = std::make_unique<MoeMlp>(*st.moe_run);
}

void check_moe(const ModelConfig& cfg, int64_t B, const CpOptions& cp) {
  LOOM_REQUIRE(!cfg.is_moe() || cp.size == 1 || cp.routing != nullptr, "context parallelism (cp = ", cp.size,
               ") with a mixture-of-experts model needs the routing groups' collectives over the cp group");
  LOOM_REQUIRE(!cfg.is_moe() || B % cfg.routing_group == 0, "micro-batch of ", B,
               " sequences is not a multiple of model.routing_group = ", cfg.routing_group,
               ": capacity is counted per group of whole sequences, so a rank's micro-batch must hold whole groups");
}

void check_tp(int64_t T, const TpOptions& tp) {
  if (!tp.sp()) return;
  LOOM_REQUIRE(T % tp.tp.size == 0, "sequence length ", T, " is not divisible by parallel.tp = ", tp.tp.size,
               ": sequence parallelism splits each sequence's tokens across the tp ranks, so train.seq_len must be ",
               "a multiple of tp (or set parallel.sequence_parallel = false)");
}

std::string gib(double bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

namespace {

// The activation layout (layout_activations) of a stage of `layers` layers,
// counted without allocating: its bytes and tensors.
Allocator layout_count(const ModelConfig& cfg, int64_t B, int64_t T, const ModelOptions& options, int64_t layers) {
  ModelState st;
  st.dims = dims_of(cfg, B, T, options.tp);
  Allocator counter{nullptr, nullptr, options.compute};
  const PpStage& stage = options.stage.layers;
  layout_activations(st, counter, cfg, options,
                     {layers, stage.holds_embedding(), stage.holds_head(cfg.n_layer), stage.first_layer});
  return counter;
}

// f(n) for a stage of n layers from the counts of a few short stages: layers
// repeat with period moe_every (one MoE layer each; 1 for a dense model), so
// m more layers at the end always add the same. O(1) in n.
template <typename Count>
int64_t periodic_count(const ModelConfig& cfg, int64_t n, Count count) {
  const int64_t m = cfg.is_moe() ? cfg.moe_every : 1;
  if (n <= 2 * m) return count(n);
  const int64_t n0 = m + n % m, q = (n - n0) / m;
  const int64_t base = count(n0), period = count(n0 + m) - base;
  int64_t rest = 0, total = 0;
  LOOM_REQUIRE(!__builtin_mul_overflow(q, period, &rest) && !__builtin_add_overflow(base, rest, &total),
               "the activations of ", n, " layers are more than 2^63 bytes: lower model.n_layer, ",
               "train.micro_batch or train.seq_len");
  return total;
}

}  // namespace

int64_t trainable_count(const ModelConfig& cfg, const ModelOptions& options) {
  const int64_t P = model::param_count(cfg, options.tp.tp, options.stage.layers, options.ep.ep);  // validates
  const LoraOptions& lora = options.lora;
  if (!lora.config.enabled()) return P;
  LOOM_REQUIRE(options.cp.size == 1 && options.ep.ep.size == 1, "lora: context and expert parallelism of an adapted ",
               "model are not supported yet: allowed are parallel.cp = 1 and parallel.ep = 1");
  return param_count(lora_param_specs(cfg, lora.config, options.tp.tp, options.stage.layers));
}

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
int64_t Model::activation_bytes(const ModelConfig& cfg, int64_t B, int64_t T, const ModelOptions& options) {
  const StageOptions& stage = options.stage;
  (void)model::param_count(cfg, options.tp.tp, stage.layers, options.ep.ep);  // validates cfg, the splits, the stage
  LOOM_REQUIRE(stage.slots >= 1, "activation slots ", stage.slots, " is invalid: allowed values are >= 1");
  LOOM_REQUIRE(B >= 1 && T >= 1, "activation_bytes: batch ", B, " and sequence length ", T, " must be >= 1");
  check_tp(T, options.tp);
  return periodic_count(cfg, stage.layers.layer_count(cfg.n_layer),
                        [&](int64_t n) { return layout_count(cfg, B, T, options, n).bytes; });
}

int64_t Model::stream_numel(const ModelConfig& cfg, int64_t B, int64_t T, const ModelOptions& options) {
  return stream_shape(dims_of(cfg, B, T, options.tp)).numel();
}

ModelBytes Model::state_bytes(const ModelConfig& cfg, int64_t B, int64_t T, const ModelOptions& options) {
  const TpOptions& tp = options.tp;
  const Storage& storage = options.storage;
  const int64_t P = trainable_count(cfg, options);
  ModelBytes b;
  if (storage.params) b.params = P * static_cast<int64_t>(dtype_size(options.compute));
  if (storage.master && options.compute != DType::f32) b.master = P * 4;
  if (storage.grads) b.grads = P * 4;
  b.activations = activation_bytes(cfg, B, T, options);
  // Per layer, from the types' sizes (heap overheads left out): its specs
  // and their name index, its weight and gradient views, its activation
  // records (one per slot) and tensors, each of which takes at least one
  // aligned block.
  ModelConfig one = cfg, two = cfg;  // every layer counted as a MoE layer (the larger) in a MoE model
  one.n_layer = 1, two.n_layer = 2, one.moe_every = 1, two.moe_every = 1;
  const auto specs =
      static_cast<int64_t>(model::param_specs(two, tp.tp).size() - model::param_specs(one, tp.tp).size());
  ModelOptions moe_options = options;
  moe_options.stage.layers = {};
  const int64_t tensors = layout_count(two, B, T, moe_options, 2).tensors -
                          layout_count(two, B, T, moe_options, 1).tensors;
  const auto size = [](size_t n) { return static_cast<int64_t>(n); };
  const int64_t views = (storage.params ? 1 : 0) + (storage.grads ? 1 : 0);
  const int64_t per_layer = specs * (size(sizeof(ParamSpec)) + 2 * size(sizeof(std::pair<std::string, void*>))) +
                            views * size(sizeof(LayerWeights)) + options.stage.slots * size(sizeof(LayerActs)) +
                            tensors * (size(sizeof(OwnedTensor)) + size(kAlignment));
  b.host = options.stage.layers.layer_count(cfg.n_layer) * per_layer;
  return b;
}

// The units of a stage's spec list, in one pass: a unit starts at the first
// parameter of each part, the embeddings, every layer and a MoE layer's
// experts, the head (where a later stage's copy of a tied embedding belongs).
std::vector<Unit> model_units(const ModelConfig& cfg, const std::vector<ParamSpec>& specs) {
  std::vector<Unit> units;
  int64_t part_of_unit = 0;  // -1 embeddings, 2 l layer l (+ 1 its experts), 2 n_layer the head
  for (const ParamSpec& s : specs) {
    int64_t layer = 0;
    const ParamPart part = s.pp_copy ? ParamPart::head : param_part(cfg, s.name, &layer);
    const int64_t p = part == ParamPart::embedding ? -1
                      : part == ParamPart::head    ? 2 * cfg.n_layer
                                                   : 2 * layer + (is_expert_param(s.name) ? 1 : 0);
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

std::vector<Unit> lora_units(const ModelConfig& cfg, const std::vector<ParamSpec>& specs, PpStage stage) {
  std::vector<Unit> units;
  if (stage.holds_embedding()) units.push_back({});  // the embeddings: no adapters
  const int64_t first = stage.first_layer, n = stage.layer_count(cfg.n_layer);
  int64_t offset = 0;
  size_t i = 0;
  for (int64_t l = first; l < first + n; ++l) {  // each layer's adapters, in spec order
    units.push_back({offset, offset});
    for (int64_t layer = 0; i < specs.size() && param_part(cfg, specs[i].name, &layer) == ParamPart::layer &&
                            layer == l;
         ++i)
      offset = units.back().end = specs[i].offset + specs[i].numel();
  }
  LOOM_CHECK(i == specs.size(), "adapter ", i < specs.size() ? specs[i].name : "", " is out of model order");
  if (stage.holds_head(cfg.n_layer)) units.push_back({offset, offset});  // the head: no adapters
  return units;
}

}  // namespace loom::model
