// The f / g operators of a tensor-parallel block (tensor_parallel.h) on the
// model's buffers; with no tp context each is the identity, so the
// single-process blocks run exactly the kernels they always did.
#include "core/error.h"
#include "kernels/ops.h"
#include "model/blocks.h"

namespace loom::model {

Tensor tp_enter(const Dims& d, const Tensor& x) {
  if (!d.tp.sp) return x;
  d.tp.ops->gather(d.tp.gathered, rows_of(x, d.C));
  return d.tp.gathered;
}

Tensor tp_enter_backward(const Dims& d, Tensor dfull) {
  if (!d.tp.ops) return dfull;
  if (!d.tp.sp) {
    d.tp.ops->reduce(dfull, dfull);
    return dfull;
  }
  d.tp.ops->reduce(d.tp.dlocal, rows_of(dfull, d.C));
  return d.tp.dlocal;
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
