// The f / g operators of a tensor-parallel block (tensor_parallel.h) on the
// model's buffers, and the SP sum of the norm weights' gradients; with no tp
// context each f / g is the identity, so the single-process blocks compute
// exactly what they always did.
#include <algorithm>
#include <array>
#include <memory>

#include "core/error.h"
#include "kernels/ops.h"
#include "model/blocks.h"
#include "model/quant_weights.h"

namespace loom::model {

Tensor tp_enter(const Dims& d, const Tensor& x) {
  const TpContext& tp = d.par.tp;
  if (!tp.sp) return x;
  tp.ops->gather(tp.gathered, rows_of(x, d.C));
  return tp.gathered;
}

Tensor column_parallel_backward(const Dims& d, Tensor dx, const Tensor& x, std::initializer_list<ColumnLinear> linears) {
  const TpContext& tp = d.par.tp;
  const int64_t C = d.C;
  std::unique_ptr<TpPending> gathering;
  Tensor input = x;  // what the linears read in forward: x's rows gathered under SP
  if (tp.sp) {
    gathering = tp.ops->start_gather(tp.gathered, rows_of(x, C));
    input = tp.gathered;
  }
  const Tensor in = rows_of(input, C), dx_rows = rows_of(dx, C);
  for (const ColumnLinear& l : linears) block_linear_backward(d, dx_rows, Tensor(), Tensor(), l.dy, in, l.w);
  if (gathering) gathering->wait();
  // Adapters read x (their u = x A^T): after the gather, before the sum.
  for (const ColumnLinear& l : linears) lora_backward(d, dx_rows, l.dlora, l.dy, in, l.lora);
  std::unique_ptr<TpPending> summing;
  Tensor summed = dx;
  if (tp.ops != nullptr) {
    if (tp.sp) summed = tp.dlocal;
    summing = tp.ops->start_reduce(summed, tp.sp ? dx_rows : dx);
  }
  for (const ColumnLinear& l : linears)
    if (l.dw.defined() || l.db.defined()) kernels::linear_backward(Tensor(), l.dw, l.db, l.dy, in, l.w);
  if (summing) summing->wait();
  return summed;
}

namespace {

// QLoRA's GEMMs on a quantized frozen weight W (OC, IC): f(r0, R, tile) for
// each tile of R rows from r0, dequantized into d.lora.wtile, so W is never
// whole in f32.
template <typename F>
void for_each_row_tile(const Dims& d, const Tensor& w, int64_t IC, F f) {
  const kernels::QuantType type = d.quant->type_of(w);
  for (int64_t r0 = 0; r0 < w.size(0); r0 += kQuantTileRows) {
    const int64_t R = std::min(kQuantTileRows, w.size(0) - r0);
    const Tensor tile = d.lora.wtile.slice(0, 0, R * IC).reshape({R, IC});
    kernels::dequantize_rows(tile, w, type, r0);
    f(r0, R, tile);
  }
}

// y (N, OC) = x @ W^T + bias, its columns a tile at a time.
void linear_forward_tiles(const Dims& d, Tensor y, const Tensor& x, const Tensor& w, const Tensor& bias) {
  const int64_t N = x.size(0);
  for_each_row_tile(d, w, x.size(1), [&](int64_t r0, int64_t R, const Tensor& tile) {
    const Tensor yt = d.lora.ytile.slice(0, 0, N * R).reshape({N, R});
    kernels::linear_forward(yt, x, tile, bias.defined() ? bias.slice(0, r0, R) : Tensor());
    kernels::copy(y.slice(1, r0, R), yt);
  });
}

// dx (N, IC) += dy (N, OC) @ W, over the same tiles.
void linear_backward_tiles(const Dims& d, Tensor dx, const Tensor& dy, const Tensor& x, const Tensor& w) {
  const int64_t N = dy.size(0);
  for_each_row_tile(d, w, dx.size(1), [&](int64_t r0, int64_t R, const Tensor& tile) {
    const Tensor dyt = d.lora.ytile.slice(0, 0, N * R).reshape({N, R});
    kernels::copy(dyt, dy.slice(1, r0, R));
    kernels::linear_backward(dx, Tensor(), Tensor(), dyt, x, tile);
  });
}

}  // namespace

void block_linear_backward(const Dims& d, Tensor dx, Tensor dw, Tensor db, const Tensor& dy, const Tensor& x,
                           const Tensor& w) {
  if (w.dtype() != DType::u8) return kernels::linear_backward(dx, dw, db, dy, x, w);
  LOOM_CHECK(d.lora.wtile.defined() && !dw.defined() && !db.defined(), "block_linear_backward: quantized weight ",
             w.str(), " is frozen, and only an adapted model (QLoRA) differentiates through one");
  if (dx.defined()) linear_backward_tiles(d, dx, dy, x, w);
}

void block_linear(const Dims& d, Tensor y, const Tensor& x, const Tensor& w, const Tensor& bias,
                  const LoraPair& lora) {
  if (w.dtype() == DType::u8) {
    LOOM_CHECK(d.quant != nullptr, "block_linear: weight ", w.str(), " is quantized, but no QuantWeights was given");
    if (d.lora.wtile.defined()) linear_forward_tiles(d, y, x, w, bias);
    else kernels::linear_forward_quantized(y, x, w, d.quant->type_of(w), bias);
  } else if (d.batch_invariant) {
    kernels::linear_forward_invariant(y, x, w, bias);
  } else {
    kernels::linear_forward(y, x, w, bias);
  }
  lora_forward(d, y, x, lora);
}

void block_linear_gelu(const Dims& d, Tensor act, Tensor y, const Tensor& x, const Tensor& w, const Tensor& bias,
                       const LoraPair& lora) {
  if (w.dtype() != DType::u8 && !d.batch_invariant && !d.recompute_act && !lora.defined())
    return kernels::linear_gelu_forward(act, y, x, w, bias);
  block_linear(d, y, x, w, bias, lora);
  kernels::gelu_forward(act, y);
}

void tp_exit(const Dims& d, Tensor y, const Tensor& x, const Tensor& w, const Tensor& bias, const LoraPair& lora) {
  const TpContext& tp = d.par.tp;
  const int64_t C = d.C;
  if (!tp.ops) return block_linear(d, rows_of(y, C), x, w, bias, lora);
  const Tensor once = tp.rank == 0 ? bias : Tensor();  // the sum adds rank 0's bias only
  if (!tp.sp) {
    block_linear(d, rows_of(y, C), x, w, once, lora);
    tp.ops->reduce(y, y);
    return;
  }
  block_linear(d, tp.partial, x, w, once, lora);
  tp.ops->reduce(rows_of(y, C), tp.partial);
}

Tensor tp_exit_backward(const Dims& d, const Tensor& dy) {
  const TpContext& tp = d.par.tp;
  if (!tp.sp) return dy;
  tp.ops->gather(tp.dfull, rows_of(dy, d.C));
  return tp.dfull;
}

LayerWeights with_norm_grads_in(LayerWeights g, const Tensor& buf, int64_t C) {
  kernels::fill(buf, 0.f);
  Tensor* norms[] = {&g.norm1_w, &g.norm1_b, &g.norm2_w, &g.norm2_b};
  for (int i = 0; i < 4; ++i)
    if (norms[i]->defined()) *norms[i] = buf.slice(0, i * C, C);
  return g;
}

void sum_norm_grads(const Dims& d, const Tensor& buf, const std::array<Tensor, 4>& real) {
  d.par.tp.ops->all_reduce_sum(buf);
  for (int i = 0; i < 4; ++i)
    if (real[i].defined()) kernels::add(real[i], real[i], buf.slice(0, i * d.C, d.C));
}

}  // namespace loom::model
