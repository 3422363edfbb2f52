// LoRA inside a block (blocks.h, model/lora.h): the adapter's forward and
// backward beside its frozen linear, and which adapter sits on which of a
// family's linears.
#include <utility>

#include "core/error.h"
#include "kernels/ops.h"
#include "model/blocks.h"
#include "model/config_json.h"
#include "model/lora.h"
#include "model/model.h"

namespace loom::model {

namespace {

// u = scale (x A^T): (N, r) in the compute dtype.
Tensor lora_down(const Dims& d, const Tensor& x, const LoraPair& p) {
  const Tensor u = d.lora.u.slice(0, 0, x.size(0));
  kernels::linear_forward(u, x, p.a, Tensor());
  kernels::scale(u, d.lora.scale);
  return u;
}

}  // namespace

void lora_forward(const Dims& d, Tensor y, const Tensor& x, const LoraPair& p) {
  if (!p.defined()) return;
  LOOM_CHECK(d.lora.u.defined() && x.size(0) <= d.lora.u.size(0), "lora_forward: ", x.str(), " with buffer ",
             d.lora.u.str());
  const Tensor u = lora_down(d, x, p);
  kernels::matmul(y, u, p.b, {.trans_b = true, .beta = 1.f});  // y (N, OC) += u (N, r) @ B^T
}

void lora_backward(const Dims& d, Tensor dx, const LoraPair& g, const Tensor& dy, const Tensor& x,
                   const LoraPair& p) {
  if (!p.defined()) return;
  const Tensor u = lora_down(d, x, p);  // the forward's bits again
  const Tensor du = d.lora.du.slice(0, 0, x.size(0));
  kernels::fill(du, 0.f);
  kernels::linear_backward(du, g.b, Tensor(), dy, u, p.b);  // du = dy B, dB += dy^T u
  kernels::scale(du, d.lora.scale);                        // d(x A^T) = scale du
  kernels::linear_backward(dx, g.a, Tensor(), du, x, p.a);  // dx += du A, dA += du^T x
}

FrozenWeights::FrozenWeights(const ModelConfig& cfg, OwnedTensor flat)
    : specs_(param_specs(cfg)), flat_(std::move(flat)) {
  LOOM_CHECK(flat_.numel() == param_count(specs_) && flat_.ndim() == 1, "FrozenWeights: ", Tensor(flat_).str(),
             " for ", param_count(specs_), " parameters");
  views_ = std::make_unique<ParamViews>(specs_, flat_);
}
FrozenWeights::~FrozenWeights() = default;

std::unique_ptr<FrozenWeights> load_frozen_base(const ModelDir& dir, DType dtype, Pools& pools) {
  const int64_t P = param_count(dir.config);
  require_fits_memory(pools, static_cast<double>(P) * 4.0, concat("the base model '", dir.weights, "' (", P,
                      " parameters, read in f32)"), "fine-tune a smaller base model");
  OwnedTensor flat = pools[MemTag::params].empty(DType::f32, {P});
  load_model_params(dir, flat);
  return std::make_unique<FrozenWeights>(dir.config, params_in_dtype(std::move(flat), dtype, pools[MemTag::params]));
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
