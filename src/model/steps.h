// Internal to model/: the two steps a block delegates (DESIGN.md §8 "one
// block, three attentions"). Attention is the only step of a block that sees
// other tokens, so it is chosen by whoever runs the blocks: local causal
// flash attention over the call's own keys (training, LocalAttention here),
// paged attention over a serving step's ragged batch (paged_runner.cpp);
// next, ring or all-gather attention over the cp group. The MLP works on
// rows: each family has its own (GPT-2's GELU MLP, Llama's SwiGLU), and a
// mixture of experts is one more MLP step with its own dispatch, not another
// block.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "model/blocks.h"

namespace loom::model {

struct BlockContext;  // family.h

// One attention call of layer `layer` over the block's T new tokens of each
// of B sequences (a ragged batch is B = 1, T = its N tokens).
struct AttentionArgs {
  int64_t layer = 0;  // the model's index of the layer (a cache keeps one per layer)
  Tensor q, k, v;     // (B, T, NH, HS), (B, T, NKV, HS) x2: the new tokens' (Llama: after RoPE)
  Tensor pos;         // (T) i32, shared by every sequence, or (B, T): each token's position
  Tensor out, lse;    // (B, T, NH, HS); (B, NH, T) f32 log-sum-exp, for backward (undefined: inference)
};
// Backward's tensors: dout in, dq, dk, dv (like q, k, v, f32, zeroed by the
// caller) accumulated into.
struct AttentionGrads {
  Tensor dout, dq, dk, dv;
};

class AttentionStep {
 public:
  virtual ~AttentionStep() = default;
  // a.out (and a.lse) = causal attention of each new token over the keys
  // and values at its position and before.
  virtual void forward(const AttentionArgs& a) = 0;
  // g.dq, g.dk, g.dv += the gradients of forward's out for g.dout; a as in
  // the forward (with its out and lse).
  virtual void backward(const AttentionArgs& a, const AttentionGrads& g) = 0;
};

// Flash attention over the call's own k, v (kernels::attention_forward):
// every sequence of the batch starts at position 0 and holds all its tokens,
// so position t sees keys 0 ..= t.
class LocalAttention final : public AttentionStep {
 public:
  void forward(const AttentionArgs& a) override;
  void backward(const AttentionArgs& a, const AttentionGrads& g) override;
};

// A block's MLP: out (the rank's rows; the block adds the residual) =
// mlp(h), h the second norm's output (the rank's rows). Under tensor
// parallelism its first linears are column-parallel, entered through f, and
// its last row-parallel, left through g (blocks.h). It keeps what its
// backward reads in a (fc, up, act) and its gradients' scratch is s.
// c: the block call's context (family.h): its sizes c.d and layer.
class MlpStep {
 public:
  virtual ~MlpStep() = default;
  virtual void forward(Tensor out, const Tensor& h, const LayerWeights& w, LayerActs& a,
                       const BlockContext& c) const = 0;
  // Selective recompute (model.h): a.act again from the kept GEMM outputs.
  virtual void recompute(LayerActs& a) const = 0;
  // dy: the gradient of out (the rank's rows, unchanged). Weight gradients
  // += into g; returns the gradient of h, the rank's rows summed over tp
  // (column_parallel_backward's result: s.dnorm or d.par.tp.dlocal).
  virtual Tensor backward(const Tensor& dy, const Tensor& h, const LayerWeights& w, const LayerWeights& g,
                          const LayerActs& a, Scratch& s, const BlockContext& c) const = 0;
};

// GPT-2: mlp.c_proj(gelu(mlp.c_fc(h))), with biases (gpt2.cpp).
const MlpStep& gelu_mlp();
// Llama: down_proj(silu(gate_proj(h)) * up_proj(h)), no biases (llama.cpp).
const MlpStep& swiglu_mlp();

}  // namespace loom::model
