// The f / g operators of a tensor-parallel block (tensor_parallel.h) on the
// model's buffers; with no tp context each is the identity, so the
// single-process blocks compute exactly what they always did.
#include <memory>

#include "core/error.h"
#include "kernels/ops.h"
#include "model/blocks.h"

namespace loom::model {

Tensor tp_enter(const Dims& d, const Tensor& x) {
  if (!d.tp.sp) return x;
  d.tp.ops->gather(d.tp.gathered, rows_of(x, d.C));
  return d.tp.gathered;
}

Tensor column_parallel_backward(const Dims& d, Tensor dx, const Tensor& x, std::initializer_list<ColumnLinear> linears) {
  const int64_t C = d.C;
  std::unique_ptr<TpPending> gathering;
  Tensor input = x;  // what the linears read in forward: x's rows gathered under SP
  if (d.tp.sp) {
    gathering = d.tp.ops->start_gather(d.tp.gathered, rows_of(x, C));
    input = d.tp.gathered;
  }
  const Tensor in = rows_of(input, C), dx_rows = rows_of(dx, C);
  for (const ColumnLinear& l : linears) kernels::linear_backward(dx_rows, Tensor(), Tensor(), l.dy, in, l.w);
  if (gathering) gathering->wait();
  std::unique_ptr<TpPending> summing;
  Tensor summed = dx;
  if (d.tp.ops != nullptr) {
    if (d.tp.sp) summed = d.tp.dlocal;
    summing = d.tp.ops->start_reduce(summed, d.tp.sp ? dx_rows : dx);
  }
  for (const ColumnLinear& l : linears) kernels::linear_backward(Tensor(), l.dw, l.db, l.dy, in, l.w);
  if (summing) summing->wait();
  return summed;
}

void tp_exit(const Dims& d, Tensor y, const Tensor& x, const Tensor& w, const Tensor& bias) {
  const int64_t C = d.C;
  if (!d.tp.ops) return kernels::linear_forward(rows_of(y, C), x, w, bias);
  const Tensor once = d.tp.rank == 0 ? bias : Tensor();  // the sum adds rank 0's bias only
  if (!d.tp.sp) {
    kernels::linear_forward(rows_of(y, C), x, w, once);
    d.tp.ops->reduce(y, y);
    return;
  }
  kernels::linear_forward(d.tp.partial, x, w, once);
  d.tp.ops->reduce(rows_of(y, C), d.tp.partial);
}

Tensor tp_exit_backward(const Dims& d, const Tensor& dy) {
  if (!d.tp.sp) return dy;
  d.tp.ops->gather(d.tp.dfull, rows_of(dy, d.C));
  return d.tp.dfull;
}

}  // namespace loom::model
