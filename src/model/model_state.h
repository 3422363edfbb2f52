// Internal to model/: what a Model allocates beside its parameters — each
// activation slot's tensors, the backward scratch shared by every slot — and
// the views, steps and family table it runs its layers with.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "core/memory.h"
#include "core/tensor.h"
#include "model/blocks.h"
#include "model/family.h"
#include "model/loss.h"
#include "model/moe.h"
#include "model/steps.h"

namespace loom::model {

// What one micro-batch's forward leaves for its backward: a Model keeps
// `slots` of these (model.h; pipeline schedules keep several micro-batches
// in flight). forward and backward are handed the slot they work on.
struct SlotActs {
  Tensor tokens, targets;          // (B, T) i32 copies
  std::vector<Tensor> resid;       // layers + 1 of (B, T, C): resid[0] the input, resid[l + 1] block l out
  std::vector<LayerActs> acts;
  Tensor normf, meanf, rstdf;      // (B, T, C), (B*T), (B*T) (the residual stream's rows)
  Tensor logits;                   // (B, T, V), or (B, T, Vl) this tp rank's vocabulary columns
  Tensor ce_lse, ce_target;        // tensor parallelism: (N) f32, the cross-entropy's lse and target logit
  bool has_targets = false, forward_done = false;
  std::optional<float> loss_dloss;  // the forward already wrote logits = d(loss_dloss * loss) / d logits
  std::vector<int64_t> samples;  // Stage::set_samples: the slot's sequences' global indices, or none
  std::vector<int64_t> drawn;    // those the last forward drew with, which its backward draws again
};

struct ModelState {
  std::vector<OwnedTensor> owned;  // storage of everything below
  Dims dims{};
  const BlockFamily* family = nullptr;  // looked up once from cfg.family
  LocalAttention attention;             // the blocks' attention step (training: local flash attention)
  // MoE models: what the MoE layers share, and their MLP step (model/moe.h).
  std::unique_ptr<MoeRun> moe_run;
  std::unique_ptr<MoeMlp> moe_mlp;
  std::vector<SlotActs> slots;
  Tensor pos;                      // (T) i32 0..T-1, or the cp rank's tokens' (ModelOptions::cp): every sequence's
  Tensor pos_bt;                   // (B, T) i32: pos for each sequence, GPT-2 under cp (the embedding's wpe rows)
  // The model's own views (where it owns the buffers, model.h Storage).
  std::vector<LayerWeights> w, g;  // weights and gradients per layer
  HeadWeights head_w, head_g;      // embeddings, final norm, lm head (the token embedding when tied)
  Tensor dres, dnormf;             // residual stream rows x C, (B, T, C) f32: shared by every slot
  Scratch s;
  VocabShard vocab;                // tensor parallelism: the rank's vocabulary rows (loss.h)
  // Under SP a zeroed buffer for a unit's norm-weight gradients before they
  // are summed over tp (blocks.h with_norm_grads_in).
  Tensor norm_grads;               // (4C) f32
  // Name index of the parameters / gradients, rebound to the units' buffers
  // the hooks lend when the model does not own them (units.h).
  std::unique_ptr<ParamViews> param_views, grad_views;
};

}  // namespace loom::model
