// Internal to model/: a family's block and everything else that differs
// between GPT-2 and Llama when a model runs, as one table looked up once
// from cfg.family (block_family): the code that runs the layers, the final
// norm and the weight binding never asks which family it runs (only the
// memory layout, model_layout.cpp, asks what tensors a family keeps).
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "model/blocks.h"
#include "model/config.h"
#include "model/steps.h"

namespace loom::model {

// What a block call needs besides its weights and activations: the sizes and
// collectives (d), which layer it is, its tokens' positions, and the
// attention and MLP steps its caller chose (steps.h).
struct BlockContext {
  const Dims& d;
  AttentionStep& attention;
  const MlpStep& mlp;
  Tensor pos;          // (T) i32 shared by every sequence, or (B, T): RoPE's angles and the attention step's
  int64_t layer = 0;   // the model's index of the layer
};

// The attention step's view of a block's activations.
inline AttentionArgs attention_args(const LayerActs& a, const BlockContext& c) {
  return {c.layer, a.q, a.k, a.v, c.pos, a.att, a.lse};
}

struct BlockFamily {
  // out = block(x)            x, out: (B, T, C), the rank's rows
  void (*forward)(Tensor out, const Tensor& x, const LayerWeights& w, LayerActs& a, const BlockContext& c);
  // Selective recompute (model.h): rebuilds what the selective policy drops
  // — norm outputs and statistics, attention output and lse, the MLP's
  // activation — from x and the kept q, k, v, res1 and the MLP's GEMM
  // outputs. Bitwise what the forward wrote.
  void (*recompute)(const Tensor& x, const LayerWeights& w, LayerActs& a, const BlockContext& c);
  // On entry dres holds d out; on return d x. Parameter gradients += into g.
  void (*backward)(Tensor dres, const Tensor& x, const LayerWeights& w, const LayerWeights& g, const LayerActs& a,
                   Scratch& s, const BlockContext& c);
  // The family's norm (LayerNorm with bias / RMSNorm), as the final norm
  // runs it: y = norm(x) over rows, with its statistics (mean LayerNorm
  // only; mean, rstd and b may be undefined where unused).
  void (*norm_forward)(Tensor y, Tensor mean, Tensor rstd, const Tensor& x, const Tensor& w, const Tensor& b,
                       float eps);
  // dx += d x, dw (db) += the weight (bias) gradients.
  void (*norm_backward)(Tensor dx, Tensor dw, Tensor db, const Tensor& dy, const Tensor& x, const Tensor& w,
                        const Tensor& mean, const Tensor& rstd);
  // The family's MLP step.
  const MlpStep& (*mlp)();
  // Layer i's weights by their Hugging Face names (params.h).
  LayerWeights (*bind_layer)(const ParamViews& v, int64_t i);
  // Names of the embeddings and final norm; null where the family has none.
  const char* embedding_name;   // wte.weight / model.embed_tokens.weight
  const char* position_name;    // wpe.weight (GPT-2)
  const char* final_norm_name;  // ln_f.weight / model.norm.weight
  const char* final_bias_name;  // ln_f.bias (GPT-2)
};

const BlockFamily& gpt2_family();   // gpt2.cpp
const BlockFamily& llama_family();  // llama.cpp
const BlockFamily& block_family(Family f);

}  // namespace loom::model
