// Internal to model/: per-layer views of weights, gradients and activations,
// the sizes and parallel collectives a block runs with, and the f / g helpers
// of tensor parallelism (tensor_parallel.cpp). The blocks themselves
// (gpt2.cpp, llama.cpp) and the steps they call are in family.h and steps.h.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"
#include "model/params.h"
#include "model/tensor_parallel.h"

namespace loom::model {

class QuantWeights;  // model/quant_weights.h
class ParamViews;    // below

// Tensor parallelism inside a block (tensor_parallel.h): the collectives
// and the shared buffers sequence parallelism moves rows through.
struct TpContext {
  TensorParallelOps* ops = nullptr;  // null: no tensor parallelism
  int size = 1, rank = 0;
  bool sp = false;
  Tensor gathered;  // SP: (N, C) compute dtype, a column-parallel input gathered from the row shards
  Tensor partial;   // SP: (N, C) compute dtype, a row-parallel output before its reduce-scatter
  Tensor dfull;     // SP: (N, C) f32, a row shard's gradient gathered to every row
  Tensor dlocal;    // SP: (N / tp, C) f32, a column-parallel input's gradient reduced to the rank's rows
};

// The collectives the model's layers run across ranks, grouped: model/ owns
// the interfaces (tensor_parallel.h), parallel/ implements them. Tensor
// parallelism's now; context parallelism's K/V exchange and expert
// parallelism's dispatch join as members (their steps, steps.h, hold them).
// parallel_ops (model_layout.cpp) is the one place that decides from a
// model's options which are live: an axis of one rank gets no ops, and its
// helpers (the f / g below) are then the identity.
struct ParallelOps {
  TpContext tp;
};

// A LoRA adapter on a block linear (model/lora.h): a (r, IC), b (OC, r);
// undefined a: the linear has none. In a LayerWeights of gradients, where
// the adapter's gradients accumulate.
struct LoraPair {
  Tensor a, b;
  // Serving several adapters at once (PagedRunner): this linear's pair in
  // each adapter, by adapter id (served[0]: the base, none), each applied
  // to the rows LoraContext::runs give it; a and b are then undefined.
  const LoraPair* served = nullptr;
  // LoRA dropout's key for this linear's input (its layer and its module:
  // GPT-2's q, k and v share c_attn's), and whether the linear is
  // row-parallel under tp (its input is then this rank's columns).
  uint32_t key = 0;
  bool row = false;
  bool defined() const { return a.defined() || served != nullptr; }
};
// Rows [begin, end) of a serving step use adapter `adapter` (0: none).
struct LoraRun {
  int64_t begin = 0, end = 0;
  int32_t adapter = 0;
};
// What the adapters run with: their scale alpha / r, and two buffers every
// adapted linear shares in turn: u = scale (x A^T) (N, r) compute dtype, and
// its gradient du (N, r) f32.
struct LoraContext {
  float scale = 0.f;
  Tensor u, du;
  // QLoRA (a quantized base, lora.h FrozenWeights): a tile of W's rows
  // dequantized, (kQuantTileRows, max(C, F)) f32, and a GEMM's output on it,
  // (N, kQuantTileRows) f32; undefined otherwise (then a quantized weight is
  // the serving runner's: kernels::linear_forward_quantized).
  Tensor wtile, ytile;
  // Tensor parallelism: the gradient of the adapter matrix every tp rank
  // holds whole (a column-parallel linear's A, a row-parallel one's B),
  // partial on each rank until summed over tp: (r C) f32.
  Tensor dwhole;
  // Serving (LoraPair::served): the step's rows in runs of one adapter,
  // each adapter's scale by id, and compute-dtype buffers of rows x the
  // widest adapted linear's input (xbuf: an adapter's runs gathered) and
  // output (ybuf: its update before it is added); u then holds (rows x
  // largest rank) elements.
  std::span<const LoraRun> runs{};
  std::span<const float> scales{};
  Tensor xbuf, ybuf;
  // Dropout on the adapters' input (training): its probability, the run's
  // seed, and the global sample index of each of the step's B sequences
  // (the data loader's; empty: no dropout, as in evaluation), which with
  // the position, the linear and the feature key each element's mask, so
  // every layout draws the same one. Buffers of N x widest adapted input:
  // mask f32, xdrop (x masked) compute dtype, dxdrop f32.
  float dropout = 0.f;
  uint64_t seed = 0;
  std::span<const int64_t> samples{};
  Tensor mask, xdrop, dxdrop;
};
inline constexpr int64_t kQuantTileRows = 128;

// Sizes every block kernel call needs. Under tensor parallelism NH, NKV and
// F are this rank's (n_head / tp, ...), and the residual stream (block input
// and output, norms, res1) has Nl = N / tp rows under SP, else N.
struct Dims {
  int64_t B, T, C, NH, NKV, HS, F;
  float eps, theta;
  ParallelOps par{};
  // The blocks' linears batch invariant (kernels::linear_forward_invariant:
  // a row's bits do not depend on the other rows): the serving runner's
  // choice; training runs oneDNN's GEMM.
  bool batch_invariant = false;
  // Recompute::selective: the backward recomputes the MLP's activation from
  // its saved input, so the forward computes it the same way (GELU not fused
  // into the GEMM, whose epilogue reads the unrounded sum).
  bool recompute_act = false;
  // Weights held in quantized blocks (u8 tensors: model/quant_weights.h),
  // which block_linear multiplies with linear_forward_quantized; serving only.
  const QuantWeights* quant = nullptr;
  LoraContext lora{};  // a model with adapters (model/lora.h)
  int64_t N() const { return B * T; }
  int64_t Q() const { return NH * HS; }    // q and attention output width
  int64_t KV() const { return NKV * HS; }  // k, v width
};

// A block's forward linear, y = x @ w^T + bias: linear_forward, or
// linear_forward_invariant when d.batch_invariant; then the adapter's update
// when `lora` has one (lora_forward).
void block_linear(const Dims& d, Tensor y, const Tensor& x, const Tensor& w, const Tensor& bias,
                  const LoraPair& lora = {});
// block_linear into y, then act = gelu(y): one op (kernels::linear_gelu_forward,
// the GEMM's epilogue on a GPU) when nothing comes between the two, i.e. a
// plain weight, no adapter, no batch-invariant GEMM and no selective recompute.
void block_linear_gelu(const Dims& d, Tensor act, Tensor y, const Tensor& x, const Tensor& w, const Tensor& bias,
                       const LoraPair& lora = {});
// LoRA (lora_block.cpp): y += scale (x A^T) B^T, x (N, IC), y (N, OC);
// nothing when p is undefined.
void lora_forward(const Dims& d, Tensor y, const Tensor& x, const LoraPair& p);
// Its backward, dy (N, OC) f32: g.b += dy^T u, dx += scale (dy B) A and
// g.a += scale (dy B)^T x, u = scale (x A^T) recomputed (N r IC flops, as
// cheap as keeping it). dx (N, IC) f32. Under tensor parallelism the wrapped
// linear is column- or row-parallel (`row`), and the gradient of the
// matrix every rank holds whole is summed over tp before it is added.
void lora_backward(const Dims& d, Tensor dx, const LoraPair& g, const Tensor& dy, const Tensor& x, const LoraPair& p,
                   bool row = false);
// LoRA dropout (d.lora.dropout > 0 with d.lora.samples): the mask of p's
// input, (N = B T, IC) f32, 0 where an element is dropped and 1 / (1 -
// dropout) where kept, each element's draw keyed by d.lora.seed, p.key,
// its row's global sample and position and its global feature (a
// row-parallel linear's columns under tp start at rank x IC).
void lora_dropout_mask(const Dims& d, const Tensor& mask, const LoraPair& p);

// f forward: the column-parallel linears' input, x itself, or under SP the
// rows gathered from every rank's shard x into d.par.tp.gathered.
Tensor tp_enter(const Dims& d, const Tensor& x);
// One column-parallel linear of a block: y = f(x) @ w^T + b, its output
// gradient dy, and where its weight (and bias) gradients accumulate.
struct ColumnLinear {
  Tensor dy, dw, db;  // db undefined: no bias; dw undefined: a frozen weight
  Tensor w;
  LoraPair lora, dlora;  // the linear's adapter and its gradients (undefined: none)
};
// Backward of the column-parallel linears that share one input f(x) (q, k,
// v; fc; gate and up), with f's backward: dx (N, C) f32, zeroed by the
// caller, receives the rank's partial input gradient, and the summed
// gradient of the rank's rows is returned (dx itself after an in-place
// all-reduce, or d.par.tp.dlocal under SP). Megatron's overlap: the input
// gradients are computed first and summed over tp while the weight gradients
// are; under SP, x's rows are gathered while the input gradients are
// computed (they do not read x). Without tp: the same kernels, plain.
Tensor column_parallel_backward(const Dims& d, Tensor dx, const Tensor& x, std::initializer_list<ColumnLinear> linears);
// linear_backward (kernels/ops.h), or for a quantized frozen weight (QLoRA:
// dw undefined) dx += dy @ W a tile of W's rows at a time.
void block_linear_backward(const Dims& d, Tensor dx, Tensor dw, Tensor db, const Tensor& dy, const Tensor& x,
                           const Tensor& w);
// A row-parallel linear and g: y (the rank's rows) = sum over ranks of
// x @ w^T, plus bias once (rank 0 adds it before the sum), plus the
// adapter's update when `lora` has one.
void tp_exit(const Dims& d, Tensor y, const Tensor& x, const Tensor& w, const Tensor& bias, const LoraPair& lora = {});
// g backward: the gradient of the row-parallel output for all N rows: dy
// itself, or under SP the shards gathered into d.par.tp.dfull.
Tensor tp_exit_backward(const Dims& d, const Tensor& dy);

// What a MoE layer's forward keeps for its backward (model/moe.h), for N
// tokens (the tp group's, gathered under SP), k choices each, of E experts,
// and R rows at most on this ep rank's experts. Buffers hold their most
// rows; a call uses its leading rows. Under ep = 1 xe aliases xs and ys
// aliases ye (the dispatch order is the experts' order).
struct MoeActs {
  Tensor logits;           // (N, E) compute dtype: the router's
  Tensor logits32, scores;  // (N, E) f32: the logits, softmax / sigmoid scores
  Tensor lse;              // (N) f32: the logits' log-sum-exp (z-loss)
  Tensor sel, weight;      // (N, k) i32 experts chosen, f32 combine weights
  Tensor rows;             // (N, k) i32: each choice's dispatch row, -1 dropped
  Tensor bias32;           // (E) f32: the balancing bias, widened for moe_top_k
  Tensor count, score_sum;  // (groups, E) f32: training's balancing statistics (moe_group_stats)
  Tensor counts;           // (2E) i64: rows sent to each expert, received per (source rank, local expert)
  std::vector<int64_t> plan;  // (2E + 1) on the host: counts, then the rows the rank's experts computed
  Tensor xs, ys;           // (N k, C): rows in dispatch order (by expert, then token), and their outputs
  Tensor xr;               // (R, C): ep > 1, rows as received (by source rank), then their outputs
  Tensor xe, ye;           // (R, C): the rank's rows in its experts' order, and the experts' outputs
  Tensor fc, up, act;      // (R, F): the experts' gate, up, SwiGLU
  Tensor sh_fc, sh_up, sh_act;  // (N, Fs): the shared experts'
  Tensor sh_out;           // (N, C): the shared experts' output
};

// A MoE layer's backward temporaries (f32), shared by every layer.
struct MoeScratch {
  Tensor dys, dxs;         // (N k, C): the combine's gradient by dispatch row; the rows' input gradient
  Tensor dyr;              // (R, C): ep > 1, as exchanged (by source rank)
  Tensor dye, dxe;         // (R, C): in the experts' order
  Tensor dfc, dup, dact;   // (R, F)
  Tensor sh_dfc, sh_dup, sh_dact;  // (N, Fs)
  Tensor dlogits;          // (N, E)
  Tensor dweight;          // (N, k)
};

// Views into the parameter (or gradient) buffer; undefined where the family
// has no such tensor (Llama: biases, w_up's GPT-2 counterpart).
struct LayerWeights {
  Tensor norm1_w, norm1_b;  // (C): ln_1 / input_layernorm
  Tensor wq, wk, wv;        // (C, C), (NKV*HS, C), (NKV*HS, C); GPT-2: row blocks of c_attn
  Tensor bq, bk, bv;        // (C), (C), (C); GPT-2 only
  Tensor wo, bo;            // (C, C), (C): c_proj / o_proj
  Tensor norm2_w, norm2_b;  // (C): ln_2 / post_attention_layernorm
  Tensor w_fc, b_fc;        // (F, C), (F): GPT-2 c_fc; Llama gate_proj (no bias)
  Tensor w_up;              // (F, C): Llama up_proj
  Tensor w_out, b_out;      // (C, F), (C): GPT-2 mlp.c_proj; Llama down_proj (no bias)
  // A MoE layer's MLP (model/moe.h; the dense fields above undefined):
  Tensor router;                 // (E, C) block_sparse_moe.gate
  Tensor expert_bias;            // (E) its loss-free balancing bias (undefined without)
  Tensor sh_gate, sh_up, sh_down;  // shared experts (Fs, C), (Fs, C), (C, Fs); undefined without
  std::vector<Tensor> w1, w2, w3;  // the rank's experts: gate (F, C), down (C, F), up (F, C)
  // LoRA adapters (model/lora.h) on the linears above, undefined where none:
  // GPT-2's c_attn adapter is lora_q, lora_k and lora_v sharing its A, each
  // with its row block of B; lora_fc is on w_fc (c_fc / gate_proj), lora_out
  // on w_out (mlp.c_proj / down_proj).
  LoraPair lora_q, lora_k, lora_v, lora_o, lora_fc, lora_up, lora_out;
};

// w with the adapters of layer i from `adapters` (views of an adapted
// model's parameters or gradients, lora_param_specs' names) filled in.
LayerWeights with_lora(LayerWeights w, const ParamViews& adapters, const ModelConfig& cfg, int64_t i);

// Embeddings, final norm and lm head; wpe, normf_b GPT-2 only; lm_head is
// wte when tied.
struct HeadWeights {
  Tensor wte, wpe, normf_w, normf_b, lm_head;  // (V, C), (maxT, C), (C), (C), (V, C)
};

// Under SP a norm weight's gradient from the rank's rows is partial: a block
// writes it into `buf` (zeroed here) instead, which sum_norm_grads then sums
// over tp and adds to the real gradients (norm1_w, norm1_b, norm2_w, norm2_b;
// undefined ones skipped).
LayerWeights with_norm_grads_in(LayerWeights g, const Tensor& buf, int64_t C);
void sum_norm_grads(const Dims& d, const Tensor& buf, const std::array<Tensor, 4>& real);

// Views by name into a flat buffer (the parameters or the gradients) laid out
// by specs, which must outlive it. Bound to the whole buffer, or to the
// buffers of one or two units (model.h; a unit's buffer holds the elements
// from its `base` on): a tied head reads the embeddings' unit beside its own.
class ParamViews {
 public:
  ParamViews(const std::vector<ParamSpec>& specs, Tensor flat);
  // Binds one unit's buffer in place of what was bound; bind_also adds a second.
  void bind(Tensor flat, int64_t base) { ranges_.assign(1, {flat, base}); }
  void bind_also(Tensor flat, int64_t base) { ranges_.push_back({flat, base}); }
  // `name` views t from now on instead of its place in the buffer (a
  // quantized weight's blocks: model/quant_weights.h).
  void substitute(const std::string& name, Tensor t) { substitutes_[name] = t; }
  Tensor operator()(const std::string& name) const;
  bool has(const std::string& name) const;
  LayerWeights layer(const ModelConfig& cfg, int64_t i) const;
  // The embeddings and / or the head (a pipeline stage may hold either).
  HeadWeights head(const ModelConfig& cfg, bool embeddings = true, bool head = true) const;

 private:
  struct Range {
    Tensor flat;
    int64_t base = 0;
  };
  std::vector<Range> ranges_;
  std::unordered_map<std::string, const ParamSpec*> index_;
  std::unordered_map<std::string, Tensor> substitutes_;
};

// What a block's backward needs from its forward.
struct LayerActs {
  Tensor norm1, mean1, rstd1;  // (B, T, C), (B*T), (B*T); mean1 GPT-2 only
  Tensor q, k, v;              // (B, T, NH, HS), (B, T, NKV, HS) x2; Llama q, k after RoPE
  Tensor att, lse;             // (B, T, NH, HS), (B, NH, T)
  Tensor res1;                 // (B, T, C) = x + attention branch
  Tensor norm2, mean2, rstd2;  // as norm1
  Tensor fc, up, act;          // (B, T, F): GPT-2 fc (pre-GELU), -, GELU(fc); Llama gate, up, SwiGLU
  MoeActs moe;                 // a MoE layer's (model/moe.h)
};

// Backward temporaries shared by every layer; each is zeroed before a kernel
// accumulates into it.
struct Scratch {
  Tensor dnorm;                // (B, T, C)
  Tensor dq, dk, dv;           // like q, k, v
  Tensor dq_rot, dk_rot;       // Llama: gradients wrt q, k after RoPE
  Tensor datt;                 // (B, T, NH, HS)
  Tensor dfc, dup, dact;       // (B, T, F)
  MoeScratch moe;              // MoE layers' (model/moe.h)
};

// A contiguous tensor's elements as (rows, cols).
inline Tensor rows_of(const Tensor& t, int64_t cols) { return t.reshape({t.numel() / cols, cols}); }

}  // namespace loom::model
