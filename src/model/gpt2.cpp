// GPT-2 block (pre-LN, Radford et al. 2019):
//   r = x + c_proj(attention(c_attn(ln_1(x))))
//   out = r + mlp.c_proj(gelu(mlp.c_fc(ln_2(r))))
// Under tensor parallelism c_attn and mlp.c_fc are column-parallel, the
// c_proj's row-parallel, entered and left through f and g
// (tensor_parallel.h); x, r, out and the norms are the rank's rows.
#include "kernels/ops.h"
#include "model/blocks.h"

namespace loom::model {

using namespace loom::kernels;

void gpt2_block_forward(Tensor out, const Tensor& x, const LayerWeights& w, LayerActs& a, const Dims& d) {
  const int64_t C = d.C, F = d.F, Q = d.Q();
  layernorm_forward(a.norm1, a.mean1, a.rstd1, x, w.norm1_w, w.norm1_b, d.eps);
  const Tensor h = rows_of(tp_enter(d, a.norm1), C);  // (N, C)
  // c_attn as three linears over its row blocks: q, k, v land contiguous in
  // the (B, T, NH, HS) layout attention wants, with no split copy.
  linear_forward(rows_of(a.q, Q), h, w.wq, w.bq);  // (N, C) @ (Q, C)^T
  linear_forward(rows_of(a.k, Q), h, w.wk, w.bk);
  linear_forward(rows_of(a.v, Q), h, w.wv, w.bv);
  // Decoding reads the whole cache (k_ctx, v_ctx); training reads k, v.
  attention_forward(a.att, a.lse, a.q, a.k_ctx.defined() ? a.k_ctx : a.k,
                    a.v_ctx.defined() ? a.v_ctx : a.v);  // (B,T,NH,HS), lse (B,NH,T)
  tp_exit(d, a.res1, rows_of(a.att, Q), w.wo, w.bo);     // (rows, C)
  add(a.res1, a.res1, x);
  layernorm_forward(a.norm2, a.mean2, a.rstd2, a.res1, w.norm2_w, w.norm2_b, d.eps);
  linear_forward(rows_of(a.fc, F), rows_of(tp_enter(d, a.norm2), C), w.w_fc, w.b_fc);  // (N, F)
  gelu_forward(a.act, a.fc);
  tp_exit(d, out, rows_of(a.act, F), w.w_out, w.b_out);
  add(out, out, a.res1);
}

void gpt2_block_recompute(const Tensor& x, const LayerWeights& w, LayerActs& a, const Dims& d) {
  layernorm_forward(a.norm1, a.mean1, a.rstd1, x, w.norm1_w, w.norm1_b, d.eps);
  attention_forward(a.att, a.lse, a.q, a.k, a.v);
  layernorm_forward(a.norm2, a.mean2, a.rstd2, a.res1, w.norm2_w, w.norm2_b, d.eps);
  gelu_forward(a.act, a.fc);
}

void gpt2_block_backward(Tensor dres, const Tensor& x, const LayerWeights& w, const LayerWeights& g,
                         const LayerActs& a, Scratch& s, const Dims& d) {
  const int64_t C = d.C, F = d.F, Q = d.Q();
  // MLP branch; the residual path passes dres through unchanged.
  fill(s.dact, 0.f);
  linear_backward(rows_of(s.dact, F), g.w_out, g.b_out, rows_of(tp_exit_backward(d, dres), C), rows_of(a.act, F),
                  w.w_out);
  fill(s.dfc, 0.f);
  gelu_backward(s.dfc, s.dact, a.fc);
  fill(s.dnorm, 0.f);
  const Tensor dn2 = column_parallel_backward(d, s.dnorm, a.norm2, {{rows_of(s.dfc, F), g.w_fc, g.b_fc, w.w_fc}});
  layernorm_backward(dres, g.norm2_w, g.norm2_b, dn2, a.res1, w.norm2_w, a.mean2, a.rstd2);  // dres = d res1
  // Attention branch.
  fill(s.datt, 0.f);
  linear_backward(rows_of(s.datt, Q), g.wo, g.bo, rows_of(tp_exit_backward(d, dres), C), rows_of(a.att, Q), w.wo);
  fill(s.dq, 0.f), fill(s.dk, 0.f), fill(s.dv, 0.f);
  attention_backward(s.dq, s.dk, s.dv, s.datt, a.q, a.k, a.v, a.att, a.lse);
  fill(s.dnorm, 0.f);
  const Tensor dn1 = column_parallel_backward(d, s.dnorm, a.norm1,
                                              {{rows_of(s.dq, Q), g.wq, g.bq, w.wq},
                                               {rows_of(s.dk, Q), g.wk, g.bk, w.wk},
                                               {rows_of(s.dv, Q), g.wv, g.bv, w.wv}});
  layernorm_backward(dres, g.norm1_w, g.norm1_b, dn1, x, w.norm1_w, a.mean1, a.rstd1);  // dres = d x
}

}  // namespace loom::model
