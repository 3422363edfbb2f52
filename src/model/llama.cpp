// Llama block (Touvron et al. 2023; Hugging Face LlamaDecoderLayer):
//   r = x + o_proj(attention(rope(q_proj(h)), rope(k_proj(h)), v_proj(h))),  h = rmsnorm(x)
//   out = r + down_proj(silu(gate_proj(h2)) * up_proj(h2)),  h2 = rmsnorm(r)
// with grouped-query attention (NKV key/value heads) and no biases. Under
// tensor parallelism q/k/v and gate/up are column-parallel (a rank holds
// NH / tp query and NKV / tp key/value heads), o_proj and down_proj
// row-parallel, entered and left through f and g (tensor_parallel.h).
#include "kernels/ops.h"
#include "model/blocks.h"

namespace loom::model {

using namespace loom::kernels;

void llama_block_forward(Tensor out, const Tensor& x, const LayerWeights& w, LayerActs& a, const Tensor& pos,
                         const Dims& d) {
  const int64_t C = d.C, F = d.F, Q = d.Q(), KV = d.KV();
  rmsnorm_forward(a.norm1, a.rstd1, x, w.norm1_w, d.eps);
  const Tensor h = rows_of(tp_enter(d, a.norm1), C);       // (N, C)
  linear_forward(rows_of(a.q, Q), h, w.wq, Tensor());      // (N, NH*HS)
  linear_forward(rows_of(a.k, KV), h, w.wk, Tensor());     // (N, NKV*HS)
  linear_forward(rows_of(a.v, KV), h, w.wv, Tensor());
  rope_forward(a.q, a.q, pos, d.theta);  // in place: backward needs only pos
  rope_forward(a.k, a.k, pos, d.theta);
  // Decoding reads the whole cache (k_ctx, v_ctx); training reads k, v.
  attention_forward(a.att, a.lse, a.q, a.k_ctx.defined() ? a.k_ctx : a.k,
                    a.v_ctx.defined() ? a.v_ctx : a.v);  // (B,T,NH,HS), lse (B,NH,T)
  tp_exit(d, a.res1, rows_of(a.att, Q), w.wo, Tensor());
  add(a.res1, a.res1, x);
  rmsnorm_forward(a.norm2, a.rstd2, a.res1, w.norm2_w, d.eps);
  const Tensor h2 = rows_of(tp_enter(d, a.norm2), C);
  linear_forward(rows_of(a.fc, F), h2, w.w_fc, Tensor());  // gate (N, F)
  linear_forward(rows_of(a.up, F), h2, w.w_up, Tensor());  // up (N, F)
  swiglu_forward(a.act, a.fc, a.up);
  tp_exit(d, out, rows_of(a.act, F), w.w_out, Tensor());
  add(out, out, a.res1);
}

void llama_block_recompute(const Tensor& x, const LayerWeights& w, LayerActs& a, const Dims& d) {
  rmsnorm_forward(a.norm1, a.rstd1, x, w.norm1_w, d.eps);
  attention_forward(a.att, a.lse, a.q, a.k, a.v);  // q, k were kept after RoPE
  rmsnorm_forward(a.norm2, a.rstd2, a.res1, w.norm2_w, d.eps);
  swiglu_forward(a.act, a.fc, a.up);
}

void llama_block_backward(Tensor dres, const Tensor& x, const LayerWeights& w, const LayerWeights& g,
                          const LayerActs& a, Scratch& s, const Tensor& pos, const Dims& d) {
  const int64_t C = d.C, F = d.F, Q = d.Q(), KV = d.KV();
  // MLP branch.
  fill(s.dact, 0.f);
  linear_backward(rows_of(s.dact, F), g.w_out, Tensor(), rows_of(tp_exit_backward(d, dres), C), rows_of(a.act, F),
                  w.w_out);
  fill(s.dfc, 0.f), fill(s.dup, 0.f);
  swiglu_backward(s.dfc, s.dup, s.dact, a.fc, a.up);
  fill(s.dnorm, 0.f);
  const Tensor dn2 = column_parallel_backward(
      d, s.dnorm, a.norm2, {{rows_of(s.dfc, F), g.w_fc, Tensor(), w.w_fc}, {rows_of(s.dup, F), g.w_up, Tensor(), w.w_up}});
  rmsnorm_backward(dres, g.norm2_w, dn2, a.res1, w.norm2_w, a.rstd2);  // dres = d res1
  // Attention branch.
  fill(s.datt, 0.f);
  linear_backward(rows_of(s.datt, Q), g.wo, Tensor(), rows_of(tp_exit_backward(d, dres), C), rows_of(a.att, Q), w.wo);
  fill(s.dq_rot, 0.f), fill(s.dk_rot, 0.f), fill(s.dv, 0.f);
  attention_backward(s.dq_rot, s.dk_rot, s.dv, s.datt, a.q, a.k, a.v, a.att, a.lse);
  fill(s.dq, 0.f), fill(s.dk, 0.f);
  rope_backward(s.dq, s.dq_rot, pos, d.theta);
  rope_backward(s.dk, s.dk_rot, pos, d.theta);
  fill(s.dnorm, 0.f);
  const Tensor dn1 = column_parallel_backward(d, s.dnorm, a.norm1,
                                              {{rows_of(s.dq, Q), g.wq, Tensor(), w.wq},
                                               {rows_of(s.dk, KV), g.wk, Tensor(), w.wk},
                                               {rows_of(s.dv, KV), g.wv, Tensor(), w.wv}});
  rmsnorm_backward(dres, g.norm1_w, dn1, x, w.norm1_w, a.rstd1);  // dres = d x
}

}  // namespace loom::model
