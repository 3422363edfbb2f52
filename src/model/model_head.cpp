// Model (model.h): the parts around the blocks — the micro-batch's inputs,
// the embeddings, the final norm, the lm head and the loss (loss.h). Under
// tensor parallelism the embedding and the head are vocab-parallel
// (tensor_parallel.h).
#include <cstring>
#include <optional>

#include "core/error.h"
#include "core/memory.h"
#include "kernels/ops.h"
#include "model/model.h"
#include "model/model_state.h"
#include "model/units.h"

namespace loom::model {

using namespace loom::kernels;

namespace {

// A batch lives on the host (a data loader's) or on the model's device.
void check_batch(const char* what, const Tensor& t, int64_t B, int64_t T, Device model) {
  LOOM_REQUIRE(t.dtype() == DType::i32 && t.ndim() == 2 && t.size(0) == B && t.size(1) == T && t.is_contiguous() &&
                   (t.device().is_cpu() || t.device() == model),
               "Model::forward: ", what, " is ", t.str(), " on ", device_name(t.device()), ", expected contiguous i32(",
               B, ", ", T, ") (the batch and sequence length the model was built for) on the host",
               model.is_cpu() ? "" : " or " + device_name(model));
}

// Under tensor parallelism the kernels see only a vocabulary shard, so the
// model checks ids against the whole vocabulary itself.
void check_ids(const char* what, const Tensor& t, int64_t V, bool allow_ignore) {
  const kernels::IdOutside bad =
      kernels::find_id_outside(t, V, allow_ignore ? std::optional<int32_t>(-100) : std::nullopt);
  LOOM_REQUIRE(bad.index < 0, "Model::forward: ", what, " ", bad.id, " at index ", bad.index,
               " is outside the vocabulary: allowed ids are 0 to ", V - 1, allow_ignore ? " (or -100: ignored)" : "");
}

}  // namespace

// Checks and copies the micro-batch's tokens (first stage) and targets (last
// stage) into the slot.
void Model::take_inputs(SlotActs& a, const Tensor& tokens, const Tensor& targets) {
  const bool tp = options_.tp.active();
  LOOM_REQUIRE(!tp || options_.tp.ops != nullptr, "Model::forward: tensor parallelism (tp = ", options_.tp.tp.size,
               ") needs its collectives (TpOptions::ops)");
  if (has_embedding_) {
    check_batch("tokens", tokens, B_, T_, a.tokens.device());
    if (tp) check_ids("token", tokens, cfg_.vocab_size, false);
    copy_tensor(a.tokens, tokens);  // from the host or the model's device
  }
  LOOM_REQUIRE(has_head_ || !targets.defined(), "Model::forward: targets given to a pipeline stage without the ",
               "head (layers ", first_layer_, " to ", first_layer_ + n_layers_ - 1, "): they go to the last stage");
  if (targets.defined()) {
    check_batch("targets", targets, B_, T_, a.targets.device());
    if (tp) check_ids("target", targets, cfg_.vocab_size, true);
    copy_tensor(a.targets, targets);
  }
}

void Model::embed_forward(SlotActs& a) {
  const ModelState& st = *state_;
  const Dims& d = st.dims;
  const TpContext& tp = d.par.tp;
  const BoundUnit bound(unit_source(), Pass::forward, Need::params, 0);
  const HeadWeights w = head_params(true, false);
  // Under cp (pos_bt defined) the tokens' wpe rows are at their positions in the whole sequence.
  const bool at = st.pos_bt.defined();
  if (!tp.ops) {
    if (at) embedding_forward_at(a.resid[0], a.tokens, w.wte, w.wpe, st.pos_bt);
    else embedding_forward(a.resid[0], a.tokens, w.wte, w.wpe);  // (B,T,C); Llama: no wpe
    return;
  }
  // Each token's row lives on one rank: partial sums (wpe added once), reduced by g.
  const Tensor partial = tp.sp ? tp.partial.reshape({B_, T_, d.C}) : a.resid[0];
  const Tensor wpe = tp.rank == 0 ? w.wpe : Tensor();
  if (at) embedding_shard_forward_at(partial, a.tokens, w.wte, st.vocab.begin, wpe, st.pos_bt);
  else embedding_shard_forward(partial, a.tokens, w.wte, st.vocab.begin, wpe);
  tp.ops->reduce(a.resid[0], partial);
}

void Model::head_forward(SlotActs& a) {
  const ModelState& st = *state_;
  const Dims& d = st.dims;
  const BoundUnit bound(unit_source(), Pass::forward, Need::params, head_unit(), tied_unit());
  const HeadWeights w = head_params(false, true);
  const int64_t V = a.logits.size(2);
  st.family->norm_forward(a.normf, a.meanf, a.rstdf, a.resid[static_cast<size_t>(n_layers_)], w.normf_w, w.normf_b,
                          d.eps);
  // (N, V) or this rank's (N, Vl) columns; under SP from the gathered rows.
  block_linear(d, rows_of(a.logits, V), rows_of(tp_enter(d, a.normf), d.C), w.lm_head, Tensor());
}

float Model::loss_forward(SlotActs& a, std::optional<float> dloss) {
  const HeadLoss l{a.logits, a.targets, a.ce_lse, a.ce_target};
  if (!dloss) return model::loss_forward(state_->dims, state_->vocab, l);
  const float loss = model::loss_forward_backward(state_->dims, state_->vocab, l, *dloss);
  a.loss_dloss = dloss;  // once the logits hold the gradient
  return loss;
}

// The loss's gradient through the lm head and the final norm into
// stage_grad(): the first part of the last stage's backward.
void Model::head_backward(SlotActs& a, float dloss) {
  ModelState& st = *state_;
  const Dims& d = st.dims;
  const bool sp = d.par.tp.sp;
  const int64_t V = a.logits.size(2), C = d.C;
  const BoundUnit bound(unit_source(), Pass::backward, Need::both, head_unit(), tied_unit());
  const HeadWeights w = head_params(false, true), g = head_grads(false, true);
  // dlogits overwrite the logits in place: (B, T, V) or the rank's (B, T, Vl)
  // (unless the forward, given this dloss, already did).
  if (!a.loss_dloss) model::loss_backward(d, st.vocab, {a.logits, a.targets, a.ce_lse, a.ce_target}, dloss);
  a.loss_dloss.reset();
  fill(st.dnormf, 0.f);
  // The vocab-parallel head is column-parallel (tied: its gradient adds into
  // dwte); dnormf: the rank's rows, summed over tp.
  const Tensor dnormf =
      column_parallel_backward(d, st.dnormf, a.normf, {{rows_of(a.logits, V), g.lm_head, Tensor(), w.lm_head, {}, {}}});
  fill(st.dres, 0.f);
  if (sp) fill(st.norm_grads, 0.f);
  const Tensor dnw = sp ? st.norm_grads.slice(0, 0, C) : g.normf_w;
  const Tensor dnb = sp && g.normf_b.defined() ? st.norm_grads.slice(0, C, C) : g.normf_b;
  st.family->norm_backward(st.dres, dnw, dnb, dnormf, a.resid[static_cast<size_t>(n_layers_)], w.normf_w, a.meanf,
                           a.rstdf);
  if (sp) sum_norm_grads(d, st.norm_grads, {g.normf_w, g.normf_b, Tensor(), Tensor()});
}

void Model::embed_backward(SlotActs& a) {
  const ModelState& st = *state_;
  const Dims& d = st.dims;
  const BoundUnit bound(unit_source(), Pass::backward, Need::grads, 0);
  const HeadWeights g = head_grads(true, false);
  if (!g.wte.defined()) return;  // frozen (an adapted model's base)
  const bool at = st.pos_bt.defined();  // cp: wpe rows at the tokens' positions
  if (!d.par.tp.ops) {
    if (at) embedding_backward_at(g.wte, g.wpe, st.dres, a.tokens, st.pos_bt);
    else embedding_backward(g.wte, g.wpe, st.dres, a.tokens);
    return;
  }
  // Every rank sees all rows' gradient: its vocabulary rows, and the whole
  // (identical) wpe gradient.
  const Tensor dy = tp_exit_backward(d, st.dres).reshape({B_, T_, d.C});
  if (at) embedding_shard_backward_at(g.wte, g.wpe, dy, a.tokens, st.vocab.begin, st.pos_bt);
  else embedding_shard_backward(g.wte, g.wpe, dy, a.tokens, st.vocab.begin);
}

}  // namespace loom::model
