// Llama block (Touvron et al. 2023; Hugging Face LlamaDecoderLayer):
//   r = x + o_proj(attention(rope(q_proj(h)), rope(k_proj(h)), v_proj(h))),  h = rmsnorm(x)
//   out = r + down_proj(silu(gate_proj(h2)) * up_proj(h2)),  h2 = rmsnorm(r)
// with grouped-query attention (NKV key/value heads) and no biases. Under
// tensor parallelism q/k/v and gate/up are column-parallel (a rank holds
// NH / tp query and NKV / tp key/value heads), o_proj and down_proj
// row-parallel, entered and left through f and g (tensor_parallel.h).
#include <string>

#include "core/error.h"
#include "kernels/ops.h"
#include "model/family.h"

namespace loom::model {

using namespace loom::kernels;

namespace {

class SwigluMlp final : public MlpStep {
 public:
  void forward(Tensor out, const Tensor& h, const LayerWeights& w, LayerActs& a,
               const BlockContext& c) const override {
    const Dims& d = c.d;
    const int64_t C = d.C, F = d.F;
    const Tensor h2 = rows_of(tp_enter(d, h), C);
    block_linear(d, rows_of(a.fc, F), h2, w.w_fc, Tensor(), w.lora_fc);  // gate (N, F)
    block_linear(d, rows_of(a.up, F), h2, w.w_up, Tensor(), w.lora_up);  // up (N, F)
    swiglu_forward(a.act, a.fc, a.up);
    tp_exit(d, out, rows_of(a.act, F), w.w_out, Tensor(), w.lora_out);
  }
  void recompute(LayerActs& a) const override { swiglu_forward(a.act, a.fc, a.up); }
  Tensor backward(const Tensor& dy, const Tensor& h, const LayerWeights& w, const LayerWeights& g,
                  const LayerActs& a, Scratch& s, const BlockContext& c) const override {
    const Dims& d = c.d;
    const int64_t C = d.C, F = d.F;
    fill(s.dact, 0.f);
    const Tensor dy_rows = rows_of(tp_exit_backward(d, dy), C);
    block_linear_backward(d, rows_of(s.dact, F), g.w_out, Tensor(), dy_rows, rows_of(a.act, F), w.w_out);
    lora_backward(d, rows_of(s.dact, F), g.lora_out, dy_rows, rows_of(a.act, F), w.lora_out, true);
    fill(s.dfc, 0.f), fill(s.dup, 0.f);
    swiglu_backward(s.dfc, s.dup, s.dact, a.fc, a.up);
    fill(s.dnorm, 0.f);
    return column_parallel_backward(d, s.dnorm, h,
                                    {{rows_of(s.dfc, F), g.w_fc, Tensor(), w.w_fc, w.lora_fc, g.lora_fc},
                                     {rows_of(s.dup, F), g.w_up, Tensor(), w.w_up, w.lora_up, g.lora_up}});
  }
};

void block_forward(Tensor out, const Tensor& x, const LayerWeights& w, LayerActs& a, const BlockContext& c) {
  const Dims& d = c.d;
  const int64_t C = d.C, Q = d.Q(), KV = d.KV();
  rmsnorm_forward(a.norm1, a.rstd1, x, w.norm1_w, d.eps);
  const Tensor h = rows_of(tp_enter(d, a.norm1), C);       // (N, C)
  block_linear(d, rows_of(a.q, Q), h, w.wq, Tensor(), w.lora_q);   // (N, NH*HS)
  block_linear(d, rows_of(a.k, KV), h, w.wk, Tensor(), w.lora_k);  // (N, NKV*HS)
  block_linear(d, rows_of(a.v, KV), h, w.wv, Tensor(), w.lora_v);
  rope_forward(a.q, a.q, c.pos, d.theta);  // in place: backward needs only pos
  rope_forward(a.k, a.k, c.pos, d.theta);
  c.attention.forward(attention_args(a, c));  // (B,T,NH,HS), lse (B,NH,T)
  tp_exit(d, a.res1, rows_of(a.att, Q), w.wo, Tensor(), w.lora_o);
  add_rmsnorm_forward(a.res1, a.norm2, a.rstd2, a.res1, x, w.norm2_w, d.eps);  // the residual too
  c.mlp.forward(out, a.norm2, w, a, c);
  add(out, out, a.res1);
}

void block_recompute(const Tensor& x, const LayerWeights& w, LayerActs& a, const BlockContext& c) {
  const Dims& d = c.d;
  rmsnorm_forward(a.norm1, a.rstd1, x, w.norm1_w, d.eps);
  c.attention.forward(attention_args(a, c));  // q, k were kept after RoPE
  rmsnorm_forward(a.norm2, a.rstd2, a.res1, w.norm2_w, d.eps);
  c.mlp.recompute(a);
}

void block_backward(Tensor dres, const Tensor& x, const LayerWeights& w, const LayerWeights& g, const LayerActs& a,
                    Scratch& s, const BlockContext& c) {
  const Dims& d = c.d;
  const int64_t C = d.C, Q = d.Q(), KV = d.KV();
  // MLP branch.
  const Tensor dn2 = c.mlp.backward(dres, a.norm2, w, g, a, s, c);
  rmsnorm_backward(dres, g.norm2_w, dn2, a.res1, w.norm2_w, a.rstd2);  // dres = d res1
  // Attention branch.
  fill(s.datt, 0.f);
  const Tensor dres_rows = rows_of(tp_exit_backward(d, dres), C);
  block_linear_backward(d, rows_of(s.datt, Q), g.wo, Tensor(), dres_rows, rows_of(a.att, Q), w.wo);
  lora_backward(d, rows_of(s.datt, Q), g.lora_o, dres_rows, rows_of(a.att, Q), w.lora_o, true);
  fill(s.dq_rot, 0.f), fill(s.dk_rot, 0.f), fill(s.dv, 0.f);
  c.attention.backward(attention_args(a, c), {s.datt, s.dq_rot, s.dk_rot, s.dv});
  fill(s.dq, 0.f), fill(s.dk, 0.f);
  rope_backward(s.dq, s.dq_rot, c.pos, d.theta);
  rope_backward(s.dk, s.dk_rot, c.pos, d.theta);
  fill(s.dnorm, 0.f);
  const Tensor dn1 = column_parallel_backward(d, s.dnorm, a.norm1,
                                              {{rows_of(s.dq, Q), g.wq, Tensor(), w.wq, w.lora_q, g.lora_q},
                                               {rows_of(s.dk, KV), g.wk, Tensor(), w.wk, w.lora_k, g.lora_k},
                                               {rows_of(s.dv, KV), g.wv, Tensor(), w.wv, w.lora_v, g.lora_v}});
  rmsnorm_backward(dres, g.norm1_w, dn1, x, w.norm1_w, a.rstd1);  // dres = d x
}

// A MoE layer's MLP (model/moe.h): the router, its bias and shared experts
// where the model has them, and the experts this ep rank holds (the
// consecutive ids its spec list names).
LayerWeights bind_moe(const ParamViews& v, const std::string& p, LayerWeights w) {
  const std::string m = p + "block_sparse_moe.";
  w.router = v(m + "gate.weight");
  if (v.has(m + "gate.e_score_correction_bias")) w.expert_bias = v(m + "gate.e_score_correction_bias");
  if (v.has(m + "shared_experts.gate_proj.weight")) {
    w.sh_gate = v(m + "shared_experts.gate_proj.weight"), w.sh_up = v(m + "shared_experts.up_proj.weight");
    w.sh_down = v(m + "shared_experts.down_proj.weight");
  }
  const int64_t E = w.router.size(0);
  for (int64_t e = 0; e < E; ++e) {
    const std::string x = concat(m, "experts.", e, ".");
    if (!v.has(x + "w1.weight")) continue;
    w.w1.push_back(v(x + "w1.weight")), w.w2.push_back(v(x + "w2.weight")), w.w3.push_back(v(x + "w3.weight"));
  }
  return w;
}

LayerWeights bind_layer(const ParamViews& v, int64_t i) {
  const std::string p = concat("model.layers.", i, ".");
  LayerWeights w;
  w.norm1_w = v(p + "input_layernorm.weight");
  w.wq = v(p + "self_attn.q_proj.weight"), w.wk = v(p + "self_attn.k_proj.weight");
  w.wv = v(p + "self_attn.v_proj.weight"), w.wo = v(p + "self_attn.o_proj.weight");
  w.norm2_w = v(p + "post_attention_layernorm.weight");
  if (v.has(p + "block_sparse_moe.gate.weight")) return bind_moe(v, p, w);
  w.w_fc = v(p + "mlp.gate_proj.weight"), w.w_up = v(p + "mlp.up_proj.weight");
  w.w_out = v(p + "mlp.down_proj.weight");
  return w;
}

// RMSNorm has no mean and no bias.
void norm_forward(Tensor y, Tensor, Tensor rstd, const Tensor& x, const Tensor& w, const Tensor&, float eps) {
  rmsnorm_forward(y, rstd, x, w, eps);
}
void norm_backward(Tensor dx, Tensor dw, Tensor, const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor&,
                   const Tensor& rstd) {
  rmsnorm_backward(dx, dw, dy, x, w, rstd);
}

}  // namespace

const MlpStep& swiglu_mlp() {
  static const SwigluMlp mlp;
  return mlp;
}

const BlockFamily& llama_family() {
  static const BlockFamily family{block_forward, block_recompute, block_backward,
                                  norm_forward,  norm_backward,   swiglu_mlp,
                                  bind_layer,    "model.embed_tokens.weight", nullptr,
                                  "model.norm.weight", nullptr};
  return family;
}

}  // namespace loom::model
