// LoRA inside a block (blocks.h, model/lora.h): the adapter's forward and
// backward beside its frozen linear, and which adapter sits on which of a
// family's linears.
#include <map>
#include <string>
#include <utility>

#include "core/error.h"
#include "core/log.h"
#include "kernels/ops.h"
#include "model/blocks.h"
#include "model/config_json.h"
#include "model/lora.h"
#include "model/model.h"
#include "model/quant_weights.h"

namespace loom::model {

namespace {

// u = scale (x A^T): (N, r) in the compute dtype.
Tensor lora_down(const Dims& d, const Tensor& x, const LoraPair& p) {
  const Tensor u = d.lora.u.slice(0, 0, x.size(0));
  kernels::linear_forward(u, x, p.a, Tensor());
  kernels::scale(u, d.lora.scale);
  return u;
}

// Serving (LoraPair::served): each run of rows gets its adapter's update,
// every GEMM row-wise (linear_forward_invariant where the step is batch
// invariant), so a row's bits depend on its adapter alone, not on which
// adapters its step's other rows use (the SGMV idea, one run at a time).
void served_lora_forward(const Dims& d, const Tensor& y, const Tensor& x, const LoraPair* served) {
  const auto gemm = d.batch_invariant ? kernels::linear_forward_invariant : kernels::linear_forward;
  const int64_t OC = y.size(1);
  for (const LoraRun& run : d.lora.runs) {
    const LoraPair& p = served[run.adapter];
    if (run.adapter == 0 || !p.a.defined()) continue;
    const int64_t n = run.end - run.begin, r = p.a.size(0);
    LOOM_CHECK(n * r <= d.lora.u.numel() && n * OC <= d.lora.ybuf.numel(), "served_lora_forward: ", n, " rows of ",
               r, " and ", OC, " with buffers ", d.lora.u.str(), ", ", d.lora.ybuf.str());
    const Tensor u = d.lora.u.flatten().slice(0, 0, n * r).reshape({n, r});
    const Tensor up = d.lora.ybuf.flatten().slice(0, 0, n * OC).reshape({n, OC});
    const Tensor rows = y.slice(0, run.begin, n);
    gemm(u, x.slice(0, run.begin, n), p.a, Tensor());
    kernels::scale(u, d.lora.scales[static_cast<size_t>(run.adapter)]);
    gemm(up, u, p.b, Tensor());
    kernels::add(rows, rows, up);
  }
}

}  // namespace

void lora_forward(const Dims& d, Tensor y, const Tensor& x, const LoraPair& p) {
  if (p.served != nullptr) return served_lora_forward(d, y, x, p.served);
  if (!p.defined()) return;
  LOOM_CHECK(d.lora.u.defined() && x.size(0) <= d.lora.u.size(0), "lora_forward: ", x.str(), " with buffer ",
             d.lora.u.str());
  const Tensor u = lora_down(d, x, p);
  kernels::matmul(y, u, p.b, {.trans_b = true, .beta = 1.f});  // y (N, OC) += u (N, r) @ B^T
}

// Under tp: `partial`'s gradient (+= by f) into a zeroed buffer, summed
// over tp, then added into whole (undefined: not trained).
template <typename F>
void add_summed_over_tp(const Dims& d, const Tensor& whole, const Tensor& like, F f) {
  const Tensor buf = d.lora.dwhole.slice(0, 0, like.numel()).reshape(like.shape());
  kernels::fill(buf, 0.f);
  f(buf);
  d.par.tp.ops->all_reduce_sum(buf);
  if (whole.defined()) kernels::add(whole, whole, buf);
}

void lora_backward(const Dims& d, Tensor dx, const LoraPair& g, const Tensor& dy, const Tensor& x, const LoraPair& p,
                   bool row) {
  if (!p.defined()) return;
  const bool tp = d.par.tp.ops != nullptr;
  const Tensor u = lora_down(d, x, p);  // the forward's bits again (under a row-parallel W: this rank's part)
  const Tensor du = d.lora.du.slice(0, 0, x.size(0));
  kernels::fill(du, 0.f);
  if (tp && row)  // dB = dy^T (sum over ranks of u): summed over tp
    add_summed_over_tp(d, g.b, p.b, [&](const Tensor& db) { kernels::linear_backward(du, db, Tensor(), dy, u, p.b); });
  else
    kernels::linear_backward(du, g.b, Tensor(), dy, u, p.b);  // du = dy B, dB += dy^T u
  kernels::scale(du, d.lora.scale);                          // d(x A^T) = scale du
  if (tp && !row)  // du is this rank's part (its rows of B): dA summed over tp
    add_summed_over_tp(d, g.a, p.a, [&](const Tensor& da) { kernels::linear_backward(dx, da, Tensor(), du, x, p.a); });
  else
    kernels::linear_backward(dx, g.a, Tensor(), du, x, p.a);  // dx += du A, dA += du^T x
}

FrozenWeights::FrozenWeights(const ModelConfig& cfg, OwnedTensor flat, TpRank tp)
    : specs_(param_specs(cfg, tp)), flat_(std::move(flat)) {
  LOOM_CHECK(flat_.numel() == param_count(specs_) && flat_.ndim() == 1, "FrozenWeights: ", Tensor(flat_).str(),
             " for ", param_count(specs_), " parameters");
  views_ = std::make_unique<ParamViews>(specs_, flat_);
}

FrozenWeights::FrozenWeights(const ModelConfig& cfg, const Tensor& full, std::unique_ptr<QuantWeights> quant,
                             Pool& pool)
    : quant_(std::move(quant)) {
  const std::vector<ParamSpec> all = param_specs(cfg);
  LOOM_CHECK(full.dtype() == DType::f32 && full.numel() == param_count(all), "FrozenWeights: ", full.str());
  int64_t offset = 0;
  for (const ParamSpec& s : all) {
    if (quant_->holds(s.name)) continue;  // its blocks stand in
    specs_.push_back(s);
    specs_.back().offset = offset;
    offset += s.numel();
  }
  flat_ = pool.empty(DType::f32, {offset});
  std::map<std::string, const ParamSpec*> by_name;
  for (const ParamSpec& s : all) by_name[s.name] = &s;
  for (const ParamSpec& s : specs_) kernels::copy(param_view(flat_, s), param_view(full, *by_name.at(s.name)));
  views_ = std::make_unique<ParamViews>(specs_, flat_);
  for (const std::string& name : quant_->names())  // a tied head ("lm_head.weight") reads wte's f32 rows
    if (by_name.count(name) > 0) views_->substitute(name, quant_->blocks(name));
}
FrozenWeights::~FrozenWeights() = default;

std::unique_ptr<FrozenWeights> load_frozen_base(const ModelDir& dir, DType dtype, Pools& pools, TpRank tp) {
  const ModelConfig& cfg = dir.config;
  const int64_t P = param_count(cfg);
  require_fits_memory(pools, static_cast<double>(P) * 4.0, concat("the base model '", dir.weights, "' (", P,
                      " parameters, read in f32)"), "fine-tune a smaller base model");
  Pool& params = pools[MemTag::params];
  // What is read on the way (f32 before a cast or a slice, the f32 places
  // of quantized linears, never written) stays out of the params tag.
  MemoryTracker tracker;
  Pool staging(MemTag::workspace, Device::cpu(), tracker);
  const bool sliced = tp.size > 1, direct = !sliced && dtype == DType::f32;
  if (dir.gguf && direct) {
    ServingWeights w = load_serving_weights(dir, DType::f32, false, "lora.base", params, &staging);
    if (w.quant) return std::make_unique<FrozenWeights>(cfg, w.params, std::move(w.quant), params);
    return std::make_unique<FrozenWeights>(cfg, std::move(w.params));
  }
  if (dir.gguf && sliced)
    log_warn("lora.base '", dir.weights, "': under parallel.tp = ", tp.size, " its weights are dequantized (the blocks ",
             "of a quantized base are not split over tp ranks yet: QLoRA runs with tp = 1)");
  OwnedTensor whole = (direct ? params : staging).empty(DType::f32, {P});
  load_model_params(dir, whole);
  if (direct) return std::make_unique<FrozenWeights>(cfg, std::move(whole));
  OwnedTensor local;
  if (sliced) {
    local = (dtype == DType::f32 ? params : staging).empty(DType::f32, {param_count(cfg, tp)});
    tp_slice(local, cfg, tp, whole);
  } else {
    local = std::move(whole);
  }
  if (dtype != DType::f32) local = params_in_dtype(std::move(local), dtype, params);
  return std::make_unique<FrozenWeights>(cfg, std::move(local), tp);
}

LayerWeights with_lora(LayerWeights w, const ParamViews& adapters, const ModelConfig& cfg, int64_t i) {
  const std::string p = layer_prefix(cfg, i);
  const auto pair = [&](const char* module) {
    const std::string a = concat(p, module, ".lora_A.weight"), b = concat(p, module, ".lora_B.weight");
    if (!adapters.has(a)) return LoraPair{};
    return LoraPair{adapters(a), adapters(b)};
  };
  if (cfg.family == Family::gpt2) {
    const LoraPair qkv = pair("attn.c_attn");
    if (qkv.defined()) {
      const int64_t C = qkv.b.size(0) / 3;
      w.lora_q = {qkv.a, qkv.b.slice(0, 0, C)};
      w.lora_k = {qkv.a, qkv.b.slice(0, C, C)};
      w.lora_v = {qkv.a, qkv.b.slice(0, 2 * C, C)};
    }
    w.lora_o = pair("attn.c_proj");
    w.lora_fc = pair("mlp.c_fc");
    w.lora_out = pair("mlp.c_proj");
    return w;
  }
  w.lora_q = pair("self_attn.q_proj"), w.lora_k = pair("self_attn.k_proj"), w.lora_v = pair("self_attn.v_proj");
  w.lora_o = pair("self_attn.o_proj");
  w.lora_fc = pair("mlp.gate_proj"), w.lora_up = pair("mlp.up_proj"), w.lora_out = pair("mlp.down_proj");
  return w;
}

}  // namespace loom::model
