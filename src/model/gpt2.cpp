// GPT-2 block (pre-LN, Radford et al. 2019):
//   r = x + c_proj(attention(c_attn(ln_1(x))))
//   out = r + mlp.c_proj(gelu(mlp.c_fc(ln_2(r))))
// Under tensor parallelism c_attn and mlp.c_fc are column-parallel, the
// c_proj's row-parallel, entered and left through f and g
// (tensor_parallel.h); x, r, out and the norms are the rank's rows.
#include <string>

#include "core/error.h"
#include "kernels/ops.h"
#include "model/family.h"

namespace loom::model {

using namespace loom::kernels;

namespace {

class GeluMlp final : public MlpStep {
 public:
  void forward(Tensor out, const Tensor& h, const LayerWeights& w, LayerActs& a,
               const BlockContext& c) const override {
    const Dims& d = c.d;
    const int64_t C = d.C, F = d.F;
    block_linear_gelu(d, rows_of(a.act, F), rows_of(a.fc, F), rows_of(tp_enter(d, h), C), w.w_fc, w.b_fc,
                      w.lora_fc);  // (N, F)
    tp_exit(d, out, rows_of(a.act, F), w.w_out, w.b_out, w.lora_out);
  }
  void recompute(LayerActs& a) const override { gelu_forward(a.act, a.fc); }
  Tensor backward(const Tensor& dy, const Tensor& h, const LayerWeights& w, const LayerWeights& g,
                  const LayerActs& a, Scratch& s, const BlockContext& c) const override {
    const Dims& d = c.d;
    const int64_t C = d.C, F = d.F;
    fill(s.dact, 0.f);
    const Tensor dy_rows = rows_of(tp_exit_backward(d, dy), C);
    block_linear_backward(d, rows_of(s.dact, F), g.w_out, g.b_out, dy_rows, rows_of(a.act, F), w.w_out);
    lora_backward(d, rows_of(s.dact, F), g.lora_out, dy_rows, rows_of(a.act, F), w.lora_out, true);
    fill(s.dfc, 0.f);
    gelu_backward(s.dfc, s.dact, a.fc);
    fill(s.dnorm, 0.f);
    return column_parallel_backward(d, s.dnorm, h,
                                    {{rows_of(s.dfc, F), g.w_fc, g.b_fc, w.w_fc, w.lora_fc, g.lora_fc}});
  }
};

void block_forward(Tensor out, const Tensor& x, const LayerWeights& w, LayerActs& a, const BlockContext& c) {
  const Dims& d = c.d;
  const int64_t C = d.C, Q = d.Q();
  layernorm_forward(a.norm1, a.mean1, a.rstd1, x, w.norm1_w, w.norm1_b, d.eps);
  const Tensor h = rows_of(tp_enter(d, a.norm1), C);  // (N, C)
  // c_attn as three linears over its row blocks: q, k, v land contiguous in
  // the (B, T, NH, HS) layout attention wants, with no split copy.
  block_linear(d, rows_of(a.q, Q), h, w.wq, w.bq, w.lora_q);  // (N, C) @ (Q, C)^T
  block_linear(d, rows_of(a.k, Q), h, w.wk, w.bk, w.lora_k);
  block_linear(d, rows_of(a.v, Q), h, w.wv, w.bv, w.lora_v);
  c.attention.forward(attention_args(a, c));                      // (B,T,NH,HS), lse (B,NH,T)
  tp_exit(d, a.res1, rows_of(a.att, Q), w.wo, w.bo, w.lora_o);  // (rows, C)
  add_layernorm_forward(a.res1, a.norm2, a.mean2, a.rstd2, a.res1, x, w.norm2_w, w.norm2_b, d.eps);  // the residual too
  c.mlp.forward(out, a.norm2, w, a, c);
  add(out, out, a.res1);
}

void block_recompute(const Tensor& x, const LayerWeights& w, LayerActs& a, const BlockContext& c) {
  const Dims& d = c.d;
  layernorm_forward(a.norm1, a.mean1, a.rstd1, x, w.norm1_w, w.norm1_b, d.eps);
  c.attention.forward(attention_args(a, c));
  layernorm_forward(a.norm2, a.mean2, a.rstd2, a.res1, w.norm2_w, w.norm2_b, d.eps);
  c.mlp.recompute(a);
}

void block_backward(Tensor dres, const Tensor& x, const LayerWeights& w, const LayerWeights& g, const LayerActs& a,
                    Scratch& s, const BlockContext& c) {
  const Dims& d = c.d;
  const int64_t C = d.C, Q = d.Q();
  // MLP branch; the residual path passes dres through unchanged.
  const Tensor dn2 = c.mlp.backward(dres, a.norm2, w, g, a, s, c);
  layernorm_backward(dres, g.norm2_w, g.norm2_b, dn2, a.res1, w.norm2_w, a.mean2, a.rstd2);  // dres = d res1
  // Attention branch.
  fill(s.datt, 0.f);
  const Tensor dres_rows = rows_of(tp_exit_backward(d, dres), C);
  block_linear_backward(d, rows_of(s.datt, Q), g.wo, g.bo, dres_rows, rows_of(a.att, Q), w.wo);
  lora_backward(d, rows_of(s.datt, Q), g.lora_o, dres_rows, rows_of(a.att, Q), w.lora_o, true);
  fill(s.dq, 0.f), fill(s.dk, 0.f), fill(s.dv, 0.f);
  c.attention.backward(attention_args(a, c), {s.datt, s.dq, s.dk, s.dv});
  fill(s.dnorm, 0.f);
  const Tensor dn1 = column_parallel_backward(d, s.dnorm, a.norm1,
                                              {{rows_of(s.dq, Q), g.wq, g.bq, w.wq, w.lora_q, g.lora_q},
                                               {rows_of(s.dk, Q), g.wk, g.bk, w.wk, w.lora_k, g.lora_k},
                                               {rows_of(s.dv, Q), g.wv, g.bv, w.wv, w.lora_v, g.lora_v}});
  layernorm_backward(dres, g.norm1_w, g.norm1_b, dn1, x, w.norm1_w, a.mean1, a.rstd1);  // dres = d x
}

LayerWeights bind_layer(const ParamViews& v, int64_t i) {
  const std::string p = concat("h.", i, ".");
  LayerWeights w;
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

void norm_forward(Tensor y, Tensor mean, Tensor rstd, const Tensor& x, const Tensor& w, const Tensor& b, float eps) {
  layernorm_forward(y, mean, rstd, x, w, b, eps);
}
void norm_backward(Tensor dx, Tensor dw, Tensor db, const Tensor& dy, const Tensor& x, const Tensor& w,
                   const Tensor& mean, const Tensor& rstd) {
  layernorm_backward(dx, dw, db, dy, x, w, mean, rstd);
}

}  // namespace

const MlpStep& gelu_mlp() {
  static const GeluMlp mlp;
  return mlp;
}

const BlockFamily& gpt2_family() {
  static const BlockFamily family{block_forward, block_recompute, block_backward, norm_forward, norm_backward,
                                  gelu_mlp,      bind_layer,      "wte.weight",   "wpe.weight", "ln_f.weight",
                                  "ln_f.bias"};
  return family;
}

}  // namespace loom::model
