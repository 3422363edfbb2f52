// Internal to model/: per-layer views of weights, gradients and activations,
// and the GPT-2 / Llama block forward and backward (gpt2.cpp, llama.cpp).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/memory.h"
#include "core/tensor.h"
#include "model/config.h"
#include "model/params.h"
#include "model/tensor_parallel.h"

namespace loom::model {

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

// Sizes every block kernel call needs. Under tensor parallelism NH, NKV and
// F are this rank's (n_head / tp, ...), and the residual stream (block input
// and output, norms, res1) has Nl = N / tp rows under SP, else N.
struct Dims {
  int64_t B, T, C, NH, NKV, HS, F;
  float eps, theta;
  TpContext tp{};
  int64_t N() const { return B * T; }
  int64_t Q() const { return NH * HS; }    // q and attention output width
  int64_t KV() const { return NKV * HS; }  // k, v width
};

// f forward: the column-parallel linears' input, x itself, or under SP the
// rows gathered from every rank's shard x into d.tp.gathered.
Tensor tp_enter(const Dims& d, const Tensor& x);
// One column-parallel linear of a block: y = f(x) @ w^T + b, its output
// gradient dy, and where its weight (and bias) gradients accumulate.
struct ColumnLinear {
  Tensor dy, dw, db;  // db undefined: no bias
  Tensor w;
};
// Backward of the column-parallel linears that share one input f(x) (q, k,
// v; fc; gate and up), with f's backward: dx (N, C) f32, zeroed by the
// caller, receives the rank's partial input gradient, and the summed
// gradient of the rank's rows is returned (dx itself after an in-place
// all-reduce, or d.tp.dlocal under SP). Megatron's overlap: the input
// gradients are computed first and summed over tp while the weight gradients
// are; under SP, x's rows are gathered while the input gradients are
// computed (they do not read x). Without tp: the same kernels, plain.
Tensor column_parallel_backward(const Dims& d, Tensor dx, const Tensor& x, std::initializer_list<ColumnLinear> linears);
// A row-parallel linear and g: y (the rank's rows) = sum over ranks of
// x @ w^T, plus bias once (rank 0 adds it before the sum).
void tp_exit(const Dims& d, Tensor y, const Tensor& x, const Tensor& w, const Tensor& bias);
// g backward: the gradient of the row-parallel output for all N rows: dy
// itself, or under SP the shards gathered into d.tp.dfull.
Tensor tp_exit_backward(const Dims& d, const Tensor& dy);

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
};

// Embeddings, final norm and lm head; wpe, normf_b GPT-2 only; lm_head is
// wte when tied.
struct HeadWeights {
  Tensor wte, wpe, normf_w, normf_b, lm_head;  // (V, C), (maxT, C), (C), (C), (V, C)
};

// Views by name into a flat buffer (the parameters or the gradients) laid out
// by specs, which must outlive it. The buffer may hold only the elements from
// `base` on (one unit of the model: model.h), which then hold every name asked for.
class ParamViews {
 public:
  ParamViews(const std::vector<ParamSpec>& specs, Tensor flat, int64_t base = 0);
  void rebind(Tensor flat, int64_t base) { flat_ = flat, base_ = base; }
  Tensor operator()(const std::string& name) const;
  LayerWeights layer(const ModelConfig& cfg, int64_t i) const;
  // The embeddings and / or the head (a pipeline stage may hold either).
  HeadWeights head(const ModelConfig& cfg, bool embeddings = true, bool head = true) const;

 private:
  Tensor flat_;
  int64_t base_ = 0;
  std::unordered_map<std::string, const ParamSpec*> index_;
};

// What a block's backward needs from its forward.
struct LayerActs {
  Tensor norm1, mean1, rstd1;  // (B, T, C), (B*T), (B*T); mean1 GPT-2 only
  Tensor q, k, v;              // (B, T, NH, HS), (B, T, NKV, HS) x2; Llama q, k after RoPE
  // Decoding only (model/decoder.h): (B, P + T, NKV, HS) views of the KV
  // cache that attention reads, whose last T rows are k, v; undefined in
  // training, where attention reads k, v.
  Tensor k_ctx, v_ctx;
  Tensor att, lse;             // (B, T, NH, HS), (B, NH, T)
  Tensor res1;                 // (B, T, C) = x + attention branch
  Tensor norm2, mean2, rstd2;  // as norm1
  Tensor fc, up, act;          // (B, T, F): GPT-2 fc (pre-GELU), -, GELU(fc); Llama gate, up, SwiGLU
};

// Backward temporaries shared by every layer; each is zeroed before a kernel
// accumulates into it.
struct Scratch {
  Tensor dnorm;                // (B, T, C)
  Tensor dq, dk, dv;           // like q, k, v
  Tensor dq_rot, dk_rot;       // Llama: gradients wrt q, k after RoPE
  Tensor datt;                 // (B, T, NH, HS)
  Tensor dfc, dup, dact;       // (B, T, F)
};

// out = block(x)            x, out: (B, T, C)
void gpt2_block_forward(Tensor out, const Tensor& x, const LayerWeights& w, LayerActs& a, const Dims& d);
// On entry dres holds d out; on return d x. Parameter gradients += into g.
void gpt2_block_backward(Tensor dres, const Tensor& x, const LayerWeights& w, const LayerWeights& g,
                         const LayerActs& a, Scratch& s, const Dims& d);
// Selective recompute (model.h): rebuilds what the selective policy drops —
// norm outputs and statistics, attention output and lse, the activation
// function's output — from x and the kept q, k, v, res1, fc (and up). Bitwise
// what the forward wrote.
void gpt2_block_recompute(const Tensor& x, const LayerWeights& w, LayerActs& a, const Dims& d);
void llama_block_recompute(const Tensor& x, const LayerWeights& w, LayerActs& a, const Dims& d);
// pos: (T) i32 positions for RoPE.
void llama_block_forward(Tensor out, const Tensor& x, const LayerWeights& w, LayerActs& a, const Tensor& pos,
                         const Dims& d);
void llama_block_backward(Tensor dres, const Tensor& x, const LayerWeights& w, const LayerWeights& g,
                          const LayerActs& a, Scratch& s, const Tensor& pos, const Dims& d);

// A contiguous tensor's elements as (rows, cols).
inline Tensor rows_of(const Tensor& t, int64_t cols) { return t.reshape({t.numel() / cols, cols}); }

// What one micro-batch's forward leaves for its backward: a Model keeps
// `slots` of these (model.h; pipeline schedules keep several micro-batches
// in flight).
struct SlotActs {
  Tensor tokens, targets;          // (B, T) i32 copies
  std::vector<Tensor> resid;       // layers + 1 of (B, T, C): resid[0] the input, resid[l + 1] block l out
  std::vector<LayerActs> acts;
  Tensor normf, meanf, rstdf;      // (B, T, C), (B*T), (B*T) (the residual stream's rows)
  Tensor logits;                   // (B, T, V), or (B, T, Vl) this tp rank's vocabulary columns
  Tensor ce_lse, ce_target;        // tensor parallelism: (N) f32, the cross-entropy's lse and target logit
  bool has_targets = false, forward_done = false;
};

// Activations, scratch and per-layer views of one Model. The fields of the
// slot in use are copied (as views) into the ones below by use_slot.
struct ModelState {
  std::vector<OwnedTensor> owned;  // storage of everything below
  Dims dims{};
  std::vector<SlotActs> slots;
  Tensor tokens, targets, pos;     // the slot's; (T) i32 0..T-1
  std::vector<Tensor> resid;       // the slot's
  std::vector<LayerActs> acts;     // the slot's
  std::vector<LayerWeights> w, g;  // weights and gradients per layer
  Tensor normf, meanf, rstdf;      // the slot's
  Tensor logits;                   // the slot's
  Tensor dres, dnormf;             // residual stream rows x C, (B, T, C) f32: shared by every slot
  Scratch s;
  // Tensor parallelism: the rank's first vocabulary row and how many of its
  // rows are real (not padding); the cross-entropy's (N) f32 log-sum-exp and
  // target logit over all ranks (kept for backward); and under SP a zeroed
  // buffer for a unit's norm-weight gradients before they are summed over tp.
  int64_t vocab_begin = 0, vocab_valid = 0;
  Tensor ce_lse, ce_target;        // the slot's
  Tensor norm_grads;               // (4C) f32
  // Embeddings, final norm, lm head (the token embedding when tied).
  Tensor wte, wpe, normf_w, normf_b, lm_head;
  Tensor dwte, dwpe, dnormf_w, dnormf_b, dlm_head;
  // Name index of the parameters / gradients, rebound to a unit's buffer
  // when the model does not own them (model.h Storage).
  std::unique_ptr<ParamViews> param_views, grad_views;

  void use_slot(int k) {
    const SlotActs& a = slots[k];
    tokens = a.tokens, targets = a.targets, resid = a.resid, acts = a.acts;
    normf = a.normf, meanf = a.meanf, rstdf = a.rstdf, logits = a.logits, ce_lse = a.ce_lse, ce_target = a.ce_target;
  }
};

}  // namespace loom::model
