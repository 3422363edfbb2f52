// The kernel interface: every op the model and the optimizer use.
//
// Each op here is a thin dispatch (ggml's backend table): it checks its
// operands (shapes, dtypes, layout, and that every defined operand is on one
// device), then calls the op of the backend registered for that device
// (kernels/backend.h). The CPU backend (kernels/cpu/) is built in; a tensor
// on a device without a registered backend is a loom::Error naming the op,
// its operands and the backends this build has.
//
// Conventions (all ops, all backends):
// - Shapes in comments use llm.c letters: B batch, T sequence, C model dim,
//   NH heads, NKV key/value heads, HS head size, V vocab, N rows (leading dims
//   flattened), F feed-forward width, P tensor-parallel ranks.
// - Outputs come first, then inputs. The caller allocates every output
//   (memory is planned by the caller, kernels never allocate tensors).
// - Floating operands are f32, bf16 or f16 (IEEE binary16). The 16-bit types
//   are storage only: arithmetic is f32, accumulation is f32, and a result is
//   rounded once (RNE) on store. Wherever an op accepts bf16 it accepts f16
//   in the same roles. Statistics saved for backward (mean, rstd, lse) are
//   always f32. Gradients of bf16 / f16 operands may be f32 or the operand's
//   dtype.
// - Forward ops write (=) their outputs; an elementwise forward may run in
//   place (y is exactly x; a partial overlap is an error). Backward ops
//   ACCUMULATE (+=) into every gradient they are given, so gradient
//   accumulation and residual branches need no extra adds (llm.c); the caller
//   zeroes gradients. An undefined Tensor() gradient is skipped. Gradients
//   never alias inputs.
// - Results are bitwise reproducible for a given thread count. Every op but
//   the GEMMs (matmul, linear: oneDNN may split K across threads) also gives
//   the same bits for any thread count: its reductions use fixed blocks
//   combined in a fixed order.
// - Operands must be contiguous unless an op says otherwise, and every
//   defined operand of one call on the same device. Misuse (shape, dtype,
//   device, layout) throws loom::Error naming the op and the operands, e.g.
//   "linear_forward: x has 100 features but w expects 96 (x=f32(4, 100),
//   w=f32(32, 96))". Checks of the values themselves (a token id past the
//   vocabulary, a target outside [0, V)) are made by the backend, which reads
//   them anyway, with messages of the same form.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "core/tensor.h"
#include "kernels/quant.h"

namespace loom::kernels {

// ---- matmul / linear ------------------------------------------------------

// Empty when this CPU has a native bf16 GEMM, else the reason (oneDNN 2.6
// has them only with AVX-512, and not under an --isa cap below avx512).
// bf16 matmuls run either way: without one, their operands are widened to
// f32 (exact products, f32 sums, as f16's always are), which serves bf16
// weights on any CPU but is no faster than f32, so bf16 training asks this
// first and refuses. Probed once per process. A query, not an op: it has no
// backend entry.
std::string bf16_matmul_unsupported_reason();

struct MatmulOpts {
  bool trans_a = false;
  bool trans_b = false;
  float alpha = 1.f;
  float beta = 0.f;  // 1 accumulates into c
};

// c = alpha * op(a) @ op(b) + beta * c
// a: (M, K), or (K, M) with trans_a; b: (K, N), or (N, K) with trans_b; c: (M, N).
// Batched: c may have leading batch dims; a and b each have the same leading
// dims or are 2-D (then shared by every batch). a and b share a dtype; c has
// it too or is f32. f16 runs as an f32 GEMM on operands widened to f32
// (oneDNN 2.6 has no f16 GEMM on CPUs without AVX512-FP16).
void matmul(Tensor c, const Tensor& a, const Tensor& b, const MatmulOpts& opts = {});
// Gradients of c = alpha * op(a) @ op(b): da += alpha * dc @ op(b)^T (laid
// out as a), db likewise. An f32 dc with bf16 a, b is rounded to bf16 for the
// GEMM, as PyTorch autocast does; with f16 a, b the GEMM runs in f32 and dc
// is used as is.
void matmul_backward(Tensor da, Tensor db, const Tensor& dc, const Tensor& a, const Tensor& b,
                     const MatmulOpts& opts = {});

// y = x @ w^T + bias      x: (N, IC) (leading dims flattened)  w: (OC, IC)
// bias: (OC) or undefined  y: (N, OC). PyTorch / Hugging Face weight layout.
void linear_forward(Tensor y, const Tensor& x, const Tensor& w, const Tensor& bias);
// pre = linear_forward(x, w, bias), y = gelu(pre), y like pre and apart (GPT-2's
// c_fc): on the CPU the two ops' bits; on CUDA one cuBLASLt GEMM with the
// GELU_AUX_BIAS epilogue (GELU of the f32 sum; docs/numerics.md).
void linear_gelu_forward(Tensor y, Tensor pre, const Tensor& x, const Tensor& w, const Tensor& bias);
// linear_forward, batch invariant (the serving engine's GEMM): each element
// y[m][n] is computed by one fixed sequence of operations that depends on
// the input features IC alone, so a row's bits do not depend on how many rows
// the call has, which rows surround it, or the thread count (a general GEMM
// library picks its blocking and K splits from the shape and the threads).
// Slower than linear_forward for many rows, at least as fast for a few
// (BENCHMARKS.md). Same operands and checks as linear_forward.
void linear_forward_invariant(Tensor y, const Tensor& x, const Tensor& w, const Tensor& bias);
// y = x @ W^T + bias for weights stored quantized (llama.cpp's block formats,
// kernels/quant.h), never dequantized whole: the inference GEMV (N = 1) and
// GEMM of a model loaded from a quantized file.
// w: u8 (OC, quant_row_bytes(wtype, IC)), row n holding W's row n as blocks
// of wtype (a weight type of quant.h: q8_0, q4_0, ..., q6_K); x: (N, IC)
// f32 (leading dims flattened), IC a multiple of wtype's block size (32 or
// 256); bias: (OC) f32 or undefined; y: (N, OC) f32.
// Each row of x is quantized to quant_dot_type(wtype) (q8_0, q8_1 or q8_K) by
// quantize_row, as llama.cpp does, then y[m][n] = vec_dot(wtype, W row n,
// x row m) (+ bias[n], one f32 add): integer block sums (exact) scaled and
// accumulated in f32 in block order (quant.h). So y's bits are those of that
// scalar reference: a row's bits depend only on that row and W (batch
// invariant, any thread count) and are the same at every instruction-set
// level and on every CPU. The error against x @ dequantize(W)^T is the
// activations' quantization: each value moves by at most 0.57 d, d =
// max|x| / 127 of its block (d / 2 from rounding, q8_0's f16 scale adds
// 127 |f16(d) - d| <= 0.062 d), times |W| summed, plus f32 rounding. A NaN
// or Inf in x is a loom::Error naming its row (it cannot be quantized).
void linear_forward_quantized(Tensor y, const Tensor& x, const Tensor& w, QuantType wtype, const Tensor& bias);
// out (R, IC) f32 = rows [first_row, first_row + R) of the quantized weight
// w (u8 rows of quant_row_bytes(wtype, IC), as above), each as
// dequantize_row (kernels/quant.h) computes it: a tile of W for the GEMMs
// that read a frozen quantized weight a few rows at a time (QLoRA's
// forward and input gradient, model/lora.h), never the whole matrix.
void dequantize_rows(Tensor out, const Tensor& w, QuantType wtype, int64_t first_row);
// dx += dy @ w   dw += dy^T @ x   dbias += sum over rows of dy
void linear_backward(Tensor dx, Tensor dw, Tensor dbias, const Tensor& dy, const Tensor& x, const Tensor& w);

// ---- normalisation ---------------------------------------------------------

// y = (x - mean) * rstd * w + b over the last dim.
// x, y: (N, C)  w, b: (C)  mean, rstd: (N) f32 (may be undefined in inference)
void layernorm_forward(Tensor y, Tensor mean, Tensor rstd, const Tensor& x, const Tensor& w, const Tensor& b,
                       float eps);
void layernorm_backward(Tensor dx, Tensor dw, Tensor db, const Tensor& dy, const Tensor& x, const Tensor& w,
                        const Tensor& mean, const Tensor& rstd);

// y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps) (Llama).  rstd: (N) f32
void rmsnorm_forward(Tensor y, Tensor rstd, const Tensor& x, const Tensor& w, float eps);
void rmsnorm_backward(Tensor dx, Tensor dw, const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd);

// llm.c's fused residual: sum = a + b (sum may be a or b), then the norm of
// sum into y (apart from a, b, sum) and the statistics; the two ops' bits in
// one pass over the rows. a, b, sum: the norm's x's shape and dtype.
void add_layernorm_forward(Tensor sum, Tensor y, Tensor mean, Tensor rstd, const Tensor& a, const Tensor& b,
                           const Tensor& w, const Tensor& bias, float eps);
void add_rmsnorm_forward(Tensor sum, Tensor y, Tensor rstd, const Tensor& a, const Tensor& b, const Tensor& w,
                         float eps);

// ---- activations (elementwise, any shape) ---------------------------------

// GELU, tanh approximation (GPT-2; PyTorch approximate="tanh").
void gelu_forward(Tensor y, const Tensor& x);
void gelu_backward(Tensor dx, const Tensor& dy, const Tensor& x);
// SiLU: x * sigmoid(x).
void silu_forward(Tensor y, const Tensor& x);
void silu_backward(Tensor dx, const Tensor& dy, const Tensor& x);
// SwiGLU: y = silu(gate) * up     gate, up, y: (N, F)
void swiglu_forward(Tensor y, const Tensor& gate, const Tensor& up);
void swiglu_backward(Tensor dgate, Tensor dup, const Tensor& dy, const Tensor& gate, const Tensor& up);

// ---- rotary position embedding --------------------------------------------

// Hugging Face Llama convention (rotate_half): element i < HS/2 pairs with
// i + HS/2 and turns by angle pos * theta^(-2i/HS).
// x, y: (B, T, NH, HS), HS even   pos: (T) or (B, T) i32. y may be x.
void rope_forward(Tensor y, const Tensor& x, const Tensor& pos, float theta);
// dx += R(pos)^T dy
void rope_backward(Tensor dx, const Tensor& dy, const Tensor& pos, float theta);

// ---- softmax ---------------------------------------------------------------

// Over the last dim.  x, y: (N, D)
void softmax_forward(Tensor y, const Tensor& x);
// dx += y * (dy - sum(dy * y))
void softmax_backward(Tensor dx, const Tensor& dy, const Tensor& y);

// ---- embedding -------------------------------------------------------------

// y[b, t] = wte[tokens[b, t]] + wpe[pos_offset + t]
// tokens: (B, T) i32  wte: (V, C)  wpe: (maxT, C) or undefined (no learned positions)  y: (B, T, C)
// A token outside [0, V) or a position past maxT is a loom::Error.
void embedding_forward(Tensor y, const Tensor& tokens, const Tensor& wte, const Tensor& wpe, int64_t pos_offset = 0);
void embedding_backward(Tensor dwte, Tensor dwpe, const Tensor& dy, const Tensor& tokens, int64_t pos_offset = 0);
// Each token at its own position (a serving step's ragged rows, or
// sequences that start at different positions):
// y[b, t] = wte[tokens[b, t]] + wpe[positions[b, t]], rounded once as
// embedding_forward does, so positions pos_offset + t give its bits.
// positions: (B, T) i32, each in [0, maxT) (checked when wpe is defined).
void embedding_forward_at(Tensor y, const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                          const Tensor& positions);
// dwte as embedding_backward; dwpe[positions[b, t]] += dy[b, t], a
// scatter-add: each position's rows summed in (b, t) order, then added once,
// so positions pos_offset + t give embedding_backward's bits. positions as
// embedding_forward_at's (checked when dwpe is defined).
void embedding_backward_at(Tensor dwte, Tensor dwpe, const Tensor& dy, const Tensor& tokens,
                           const Tensor& positions);

// Vocab-parallel embedding (Megatron's VocabParallelEmbedding): wte holds
// rows [vocab_begin, vocab_begin + V_local) of the (padded) token table; a
// token outside that range contributes a zero row, so the sum over the tp
// ranks' outputs is the full embedding. The caller checks tokens against the
// whole vocabulary; here any token >= 0 is accepted.
// y[b, t] = (vocab_begin <= tok < vocab_begin + V_local ? wte[tok - vocab_begin] : 0)
//           + (wpe defined ? wpe[pos_offset + t] : 0)
// tokens: (B, T) i32  wte: (V_local, C)  wpe: (maxT, C) or undefined  y: (B, T, C)
void embedding_shard_forward(Tensor y, const Tensor& tokens, const Tensor& wte, int64_t vocab_begin,
                             const Tensor& wpe, int64_t pos_offset = 0);
// dwte += scatter-add of dy over the tokens in the shard's range;
// dwpe[pos_offset + t] += sum over b of dy[b, t]. Either may be undefined.
void embedding_shard_backward(Tensor dwte, Tensor dwpe, const Tensor& dy, const Tensor& tokens, int64_t vocab_begin,
                              int64_t pos_offset = 0);
// The shard ops with each token at its own position, as the _at ops above
// (context parallelism: a rank's tokens are two chunks of the sequence).
void embedding_shard_forward_at(Tensor y, const Tensor& tokens, const Tensor& wte, int64_t vocab_begin,
                                const Tensor& wpe, const Tensor& positions);
void embedding_shard_backward_at(Tensor dwte, Tensor dwpe, const Tensor& dy, const Tensor& tokens,
                                 int64_t vocab_begin, const Tensor& positions);

// ---- mixture of experts (model/moe.h) ----------------------------------------

// The router's choice: each token's k experts, the largest scores + bias
// first (bias: DeepSeek-V3's loss-free balancing bias, which changes which
// experts are chosen, never their weights), ties to the lower expert id;
// weight = the chosen experts' scores, divided by their sum (in double) when
// normalise (Mixtral's norm_topk_prob). scores: (N, E) f32  bias: (E) f32 or
// undefined  sel: (N, k) i32  weight: (N, k) f32, 1 <= k <= E; contiguous.
void moe_top_k(Tensor sel, Tensor weight, const Tensor& scores, const Tensor& bias, bool normalise);

// The router's scores: scores (N, E) f32 = each row of logits' softmax, or
// each logit's sigmoid (sigmoid); lse (N) f32 = each row's log-sum-exp
// either way (the z-loss's). In double, each result rounded once.
// logits: (N, E) f32, contiguous.
void moe_router_scores(Tensor scores, Tensor lse, const Tensor& logits, bool sigmoid);

// Capacity (Megatron's "probs" drop policy): keep (N, k) i32 <- 1 for each
// choice its expert keeps, else 0. Tokens are taken in groups of
// group_tokens consecutive tokens (N a multiple of it); in each group every
// expert keeps at most `capacity` of its choices (capacity < 0: all), those
// with the highest score for it (scores[t, sel[t, j]]), ties to the earlier
// choice in flat order. sel: (N, k) i32 in [0, E)  scores: (N, E) f32.
void moe_capacity(Tensor keep, const Tensor& sel, const Tensor& scores, int64_t group_tokens, int64_t capacity);

// The dispatch plan, in place: rows (N, k) i32 holds 1 (kept) or 0 (dropped)
// per choice on entry (moe_capacity's keep) and each kept choice's row in
// the dispatch buffer on return, -1 for a dropped one: rows ordered by
// expert, then by choice in flat order. counts (E) i64 <- each expert's kept
// choices. sel: (N, k) i32 in [0, E).
void moe_assign_rows(Tensor rows, Tensor counts, const Tensor& sel);

// The balancing losses' statistics per routing group of group_tokens
// consecutive tokens (N a multiple of it), over the router's choices before
// any drop: count[g, e] = choices of expert e, score_sum[g, e] = the sum over
// the group's tokens of e's normalised score (softmax: the score; sigmoid:
// the score over its row's sum, DeepSeek-V3's sequence-wise loss), summed in
// double in token order. count, score_sum: (N / group_tokens, E) f32
// sel: (N, k) i32 in [0, E)  scores: (N, E) f32.
void moe_group_stats(Tensor count, Tensor score_sum, const Tensor& sel, const Tensor& scores, int64_t group_tokens,
                     bool sigmoid);

// The router's backward (moe_router_backward): the logits' gradient from the
// combine weights' (dweight) through moe_top_k's normalisation and the
// scores, plus aux_scale x the gradient of the Switch / GShard loss (E sum_e
// f_e P_e per group, averaged over the groups; f from count, P a mean over
// group_tokens tokens of which the rank holds local_tokens consecutive ones
// per group) and z_scale x that of the z-loss (the mean over the N tokens of
// lse^2). Shapes as the forward ops': logits, scores (N, E) f32; lse (N)
// f32; sel (N, k) i32; weight, dweight (N, k) f32; count (G, E) f32 (may be
// undefined when aux_scale is 0), token t in group t / local_tokens.
struct MoeRouterGrad {
  Tensor logits, scores, lse, sel, weight, dweight, count;
  int64_t group_tokens = 0, local_tokens = 0;
  double aux_scale = 0, z_scale = 0;
  bool sigmoid = false, normalise = false;
};
// dlogits (N, E) f32 = the gradient (written, not accumulated: the router's
// logits have no other use), in double per token, rounded once.
void moe_router_backward(Tensor dlogits, const MoeRouterGrad& g);

// A token-choice MoE layer moves rows between the tokens and a dispatch
// buffer. rows: (N, k) i32, the dispatch row token t's j-th expert choice
// occupies, or -1 where the choice was dropped (over its expert's capacity);
// a row appears at most once. Row ids are checked against the buffer.
// xs[rows[t, j]] = x[t]        x: (N, C), xs: (R, C), same float dtype
void moe_dispatch(Tensor xs, const Tensor& x, const Tensor& rows);
// dx[t] += sum over j of dxs[rows[t, j]], in j order     dxs: (R, C), dx: (N, C), both f32
void moe_dispatch_backward(Tensor dx, const Tensor& dxs, const Tensor& rows);
// y[t] = sum over kept j, in j order, of weight[t, j] * ys[rows[t, j]],
// accumulated in f32 and rounded once; a token with every choice dropped
// gets 0.   ys: (R, C), y: (N, C) same float dtype; weight: (N, k) f32
void moe_combine(Tensor y, const Tensor& ys, const Tensor& rows, const Tensor& weight);
// The combine's backward for dy (N, C) f32: dys[rows[t, j]] = weight[t, j]
// * dy[t] (dys (R, C) f32; rows no choice holds are left as they were) and
// dweight[t, j] = dot(dy[t], ys[rows[t, j]]) (0 where dropped; (N, k) f32).
void moe_combine_backward(Tensor dys, Tensor dweight, const Tensor& dy, const Tensor& ys, const Tensor& rows,
                          const Tensor& weight);
// Grouped linear (the experts' GEMMs, one call for every expert): rows
// [offsets[g], offsets[g + 1]) of x go through w[g]: y[rows] = x[rows] @
// w[g]^T. offsets: w.size() + 1 ascending row ids from 0; rows past the last
// offset are left alone; an empty group costs nothing. x: (R, IC), every
// w[g]: (OC, IC), y: (R, OC), as linear_forward (invariant: as
// linear_forward_invariant, so a row's bits do not depend on the others).
void grouped_linear_forward(Tensor y, const Tensor& x, std::span<const Tensor> w, std::span<const int64_t> offsets,
                            bool invariant = false);
// dx[rows] += dy[rows] @ w[g], dw[g] += dy[rows]^T @ x[rows] (linear_backward
// per group; dx or every dw may be undefined).
void grouped_linear_backward(Tensor dx, std::span<const Tensor> dw, const Tensor& dy, const Tensor& x,
                             std::span<const Tensor> w, std::span<const int64_t> offsets);

// ---- attention ---------------------------------------------------------------

// Causal scaled-dot-product attention, flash-style: tiled with an online
// softmax, so no (T, T) matrix is ever materialised; scale = 1 / sqrt(HS).
// q: (B, Tq, NH, HS)  k, v: (B, Tk, NKV, HS), NH % NKV == 0 (GQA: head h
// reads kv head h / (NH / NKV)). Query t sits at position q_pos + t and
// sees keys 0 ..= that position. q_pos = kQueriesLast (the default): Tk - Tq,
// the queries are the last Tq of the keys' positions (Tk >= Tq: Tq == Tk in
// training, Tq < Tk when decoding against a cache). Otherwise q_pos >= 0 (a
// query sees key 0 at least); q_pos >= Tk - 1 makes every key visible to
// every query, a block of keys wholly in the queries' past (ring attention,
// parallel/cp.h). q, k, v may be strided along B and T (a view into a cache
// or a chunk of a longer sequence); each (b, t) row of heads is contiguous.
// out: (B, Tq, NH, HS)  lse: (B, NH, Tq) f32 log-sum-exp of the scaled
// scores, saved for backward (may be undefined in inference).
inline constexpr int64_t kQueriesLast = -1;
void attention_forward(Tensor out, Tensor lse, const Tensor& q, const Tensor& k, const Tensor& v,
                       int64_t q_pos = kQueriesLast);
// dq, dk, dv += the gradients of out for dout. out and lse are those of the
// whole attention the queries take part in: a block's backward with the
// full out and lse gives that block's share of the gradients (ring
// attention sums the shares).
void attention_backward(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& out, const Tensor& lse, int64_t q_pos = kQueriesLast);

// acc, acc_lse = the attention of the same queries over the keys of both
// parts, from acc, acc_lse (the running result over some keys) and out, lse
// (one more block of keys), by the log-sum-exp rule (ring attention's step,
// FlashAttention's online softmax):
//   m = max(acc_lse, lse), wa = exp(acc_lse - m), wb = exp(lse - m),
//   acc = (acc wa + out wb) / (wa + wb), acc_lse = m + log(wa + wb).
// A row with acc_lse = -inf (no keys yet) takes out, lse. All f32,
// contiguous. acc, out: (B, T, NH, HS)  acc_lse, lse: (B, NH, T).
void attention_merge(Tensor acc, Tensor acc_lse, const Tensor& out, const Tensor& lse);

// ---- paged attention (serving) ------------------------------------------------

// A paged KV cache (vLLM's PagedAttention) holds one layer's keys or values
// in fixed blocks: k_cache, v_cache: (NB, BS, NKV, HS), NB blocks of BS
// tokens. Token slot b * BS + o is offset o of physical block b.

// k_cache[slot[n]] = k[n], v_cache[slot[n]] = v[n] for each row n, cast to
// the caches' dtype (RNE) when it differs; a slot of -1 is padding and
// skipped. k, v: (N, NKV, HS)  slots: (N) i64  caches: (NB, BS, NKV, HS).
// Rows are written in order (a repeated slot keeps the last row). A slot
// outside [0, NB * BS) other than -1 is a loom::Error, raised before
// anything is written.
void kv_cache_write(Tensor k_cache, Tensor v_cache, const Tensor& k, const Tensor& v, const Tensor& slots);

// Causal attention of a ragged batch of S sequences over their paged K/V
// (written first by kv_cache_write); flash-style online softmax over the
// keys one cache block at a time; scale = 1 / sqrt(HS).
// q, out: (N, NH, HS), the query rows of the S sequences concatenated:
// sequence s owns rows [query_start[s], query_start[s + 1]), which are its
// last q_len = query_start[s + 1] - query_start[s] tokens, so its row j sits
// at position p = seq_lens[s] - q_len + j and sees keys 0 ..= p.
// query_start: (S + 1) i32, query_start[0] = 0, non-decreasing, ending at N.
// seq_lens: (S) i32, q_len <= seq_lens[s] <= max_blocks * BS: the tokens of
// s in the cache, this step's included. block_tables: (S, max_blocks) i32,
// the physical block of each logical block (only the first
// ceil(seq_lens[s] / BS) are read, each in [0, NB)). k_cache, v_cache:
// (NB, BS, NKV, HS) of one float dtype, which may differ from q's.
// NH % NKV == 0 (GQA: head h reads kv head h / (NH / NKV)).
// Batch invariant: a row's result depends only on its q, its position, its
// sequence's keys and values and BS, never on the other rows, S or the
// thread count (ops.h's reproducibility, extended across batches).
void paged_attention_forward(Tensor out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                             const Tensor& block_tables, const Tensor& seq_lens, const Tensor& query_start);

// ---- loss ------------------------------------------------------------------

// Mean cross-entropy of logits against targets, fused with its gradient and
// computed over chunks of the vocabulary (an online log-sum-exp), so no second
// full-size copy of the logits ever exists.
// logits: (N, V) (leading dims flattened)  targets: (N) i32, rows equal to
// ignore_index are skipped  losses: (N) f32 per-row loss (0 where ignored) or undefined.
// dlogits: logits' shape, f32 or logits' dtype, or undefined (loss only). It is WRITTEN, not
// accumulated, and may be logits itself (in place):
//   dlogits = dloss * (softmax(logits) - onehot(target)) / n_valid, 0 on ignored rows.
// Returns the mean loss over non-ignored rows (0 if there are none).
// A target outside [0, V) that is not ignore_index is a loom::Error.
float cross_entropy_forward_backward(Tensor dlogits, Tensor losses, const Tensor& logits, const Tensor& targets,
                                     int32_t ignore_index = -100, float dloss = 1.f);

// Vocab-parallel cross-entropy (Megatron's VocabParallelCrossEntropy), the
// per-rank halves. logits: (N, V_local) are columns [vocab_begin, vocab_begin
// + V_local) of the full logits, of which only the first `valid` (0 <= valid
// <= V_local) are real: the rest pad the vocabulary to a multiple of tp and
// are masked (they enter neither the sums nor the gradient). targets: (N) i32;
// rows equal to ignore_index are skipped.
// Stats: lse[n] = log(sum_{j < valid} exp(logits[n, j])) (-inf when valid is
// 0 or the row is ignored); target_logit[n] = logits[n, t - vocab_begin] when
// t = targets[n] lies in [vocab_begin, vocab_begin + valid), else 0. Both (N)
// f32. Over the ranks, the full row's log-sum-exp is the log-sum-exp of the
// ranks' lse and its target logit is the sum of their target_logit.
void cross_entropy_shard_stats(Tensor lse, Tensor target_logit, const Tensor& logits, const Tensor& targets,
                               int64_t vocab_begin, int64_t valid, int32_t ignore_index = -100);
// dlogits[n, j] = scale * (exp(logits[n, j] - lse[n]) - [j == targets[n] - vocab_begin]) for j < valid,
// 0 for the padded columns j >= valid and on ignored rows. lse: (N) f32, the
// full rows' log-sum-exp (combined over the ranks). dlogits: logits' shape,
// f32 or logits' dtype; WRITTEN, and may be logits itself (in place).
void cross_entropy_shard_backward(Tensor dlogits, const Tensor& logits, const Tensor& lse, const Tensor& targets,
                                  int64_t vocab_begin, int64_t valid, float scale, int32_t ignore_index = -100);

// The tp ranks' stats combined into the full rows' (Megatron's all-reduces
// of the max and the sum, done here on every rank's gathered pairs so each
// rank gets the same bits): for each row n, over the ranks r in order,
//   m = max_r lse_r[n];  lse[n] = m + log(sum_r exp(lse_r[n] - m)) (-inf when m is -inf)
//   target_logit[n] = sum_r target_logit_r[n]
// with the sums in double. A rank whose columns are all padding has lse_r =
// -inf and adds nothing. stats: (P, 2, N) f32, rank r's lse in stats[r, 0]
// and its target_logit in stats[r, 1] (the all-gather of each rank's packed
// pair). lse, target_logit: (N) f32, WRITTEN; they may be this rank's own
// inputs (they are read only from stats).
void cross_entropy_shard_combine(Tensor lse, Tensor target_logit, const Tensor& stats);
// The mean loss from the combined stats: over the rows whose target is not
// ignore_index, in row order, sum += double(lse[n]) - target_logit[n]; the
// sum over the count of those rows as f32 (0 if there are none).
// lse, target_logit: (N) f32  targets: (N) i32
float cross_entropy_shard_loss(const Tensor& lse, const Tensor& target_logit, const Tensor& targets,
                               int32_t ignore_index = -100);
// The number of targets (any shape, i32) that are not ignore_index: the
// n_valid a vocab-parallel backward divides by.
int64_t cross_entropy_count_valid(const Tensor& targets, int32_t ignore_index = -100);

// ---- optimizer and reductions ---------------------------------------------

// AdamW as in PyTorch (decoupled weight decay, bias correction):
//   p -= lr * wd * p;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// with g = grad * grad_scale (unscaling and clipping folded in).
struct AdamWConfig {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.f;
  int64_t step = 1;  // 1-based, after incrementing
  float grad_scale = 1.f;
};
// param, m, v: (N) f32 master state  grad: (N) f32, bf16 or f16
// param_copy: (N) bf16, f16 or f32 copy of the updated param (the compute weights
// under mixed precision), or undefined.
void adamw_step(Tensor param, Tensor m, Tensor v, const Tensor& grad, Tensor param_copy, const AdamWConfig& cfg);

// Sum of squares of all elements (f32, bf16 or f16), accumulated in double.
double sum_squares(const Tensor& t);
// Each tensor's ceil(numel / block) block sums of squares, tensors in order,
// sum i of t the bits of sum_squares(t[i block, min((i + 1) block, numel)));
// one call (a device waits once). block >= 1; sums.size(): all the blocks.
void sum_squares_blocks(std::span<double> sums, std::span<const Tensor> tensors, int64_t block);
// sqrt of the sum of squares over all the tensors.
double global_norm(std::span<const Tensor> tensors);
// False if any element is NaN or Inf (fp16 loss-scaling overflow check).
bool all_finite(const Tensor& t);
// t *= s in place.
void scale(Tensor t, float s);
// y = a + b (y may be a or b): residual adds.   Same shape, any float dtypes.
void add(Tensor y, const Tensor& a, const Tensor& b);
// y = a * b element for element, the f32 product rounded once (y may be a
// or b): a dropout mask applied.   Same shape, any float dtypes.
void mul(Tensor y, const Tensor& a, const Tensor& b);
// dst = src converted (f32, bf16, f16 in any direction; RNE), same shape.
void cast(Tensor dst, const Tensor& src);
// Every element = value.
void fill(Tensor t, float value);

// ---- data movement and ids --------------------------------------------------

// dst = src, element for element: the same dtype (any, integers too) and
// shape. Either may be a strided view (a slice of a larger tensor); dst must
// not overlap src unless it is exactly src (then nothing happens).
void copy(Tensor dst, const Tensor& src);

// dst[r][j] = src[r][columns[j]]: the same columns of every row, in the
// order columns gives (a cp rank's zig-zag positions of each sequence).
// dst: (R, J)  src: (R, S), one dtype (any), contiguous  columns: (J) i32.
// A column outside [0, S) is a loom::Error, raised before anything is written.
void gather_columns(Tensor dst, const Tensor& src, const Tensor& columns);
// t[i] = start + i.   t: (N) i32 or i64; every value must fit the dtype.
void arange(Tensor t, int64_t start = 0);

// The first id (in flat order) outside [0, limit) that is not ignore_index:
// its index and value; index -1 when every id is allowed.
struct IdOutside {
  int64_t index = -1;
  int32_t id = 0;
};
// ids: any shape, i32. ignore_index: an id allowed outside the range (-100
// for targets), or nullopt when none is (token ids).
IdOutside find_id_outside(const Tensor& ids, int64_t limit, std::optional<int32_t> ignore_index = std::nullopt);

}  // namespace loom::kernels
