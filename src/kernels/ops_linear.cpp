// matmul and linear (ops.h): operand checks, then the backend's op.
#include <string>

#include "kernels/cpu/matmul_onednn.h"
#include "kernels/dispatch.h"
#include "kernels/ops.h"

namespace loom::kernels {
namespace {

bool same_leading_dims(const Tensor& x, const Tensor& c) {
  for (int d = 0; d + 2 < c.ndim(); ++d)
    if (x.size(d) != c.size(d)) return false;
  return true;
}

std::string matrix_str(int64_t r, int64_t c) { return concat("(", r, ", ", c, ")"); }

// Checks c = op(a) @ op(b) per ops.h (c may be named dc in backward).
void check_matmul(const char* op, Operand c, Operand a, Operand b, const MatmulOpts& o) {
  require_contiguous(op, {c, a, b});
  require_float(op, a);
  require_float(op, c);
  if (a.t.dtype() != b.t.dtype()) op_fail(op, {a, b}, a.name, " and ", b.name, " must share a dtype");
  if (c.t.dtype() != a.t.dtype() && c.t.dtype() != DType::f32)
    op_fail(op, {c, a}, c.name, " has dtype ", dtype_name(c.t.dtype()), ", expected f32 or ", a.name, "'s ",
            dtype_name(a.t.dtype()));
  const int nd = c.t.ndim();
  if (nd < 2) op_fail(op, {c}, c.name, " must have at least 2 dims");
  for (Operand x : {a, b}) {
    if (x.t.ndim() != 2 && x.t.ndim() != nd)
      op_fail(op, {c, x}, x.name, " must have 2 dims or as many as ", c.name, " (", nd, ")");
    if (x.t.ndim() == nd && !same_leading_dims(x.t, c.t))
      op_fail(op, {c, x}, "batch dims of ", x.name, " and ", c.name, " differ");
  }
  if (nd > 2 && a.t.ndim() == 2 && b.t.ndim() == 2)
    op_fail(op, {c, a, b}, c.name, " is batched but neither ", a.name, " nor ", b.name, " is");
  const int64_t m = a.t.size(o.trans_a ? -1 : -2), ka = a.t.size(o.trans_a ? -2 : -1);
  const int64_t kb = b.t.size(o.trans_b ? -1 : -2), n = b.t.size(o.trans_b ? -2 : -1);
  if (ka != kb)
    op_fail(op, {a, b}, "op(", a.name, ") is ", matrix_str(m, ka), " but op(", b.name, ") is ", matrix_str(kb, n),
            ": inner dims differ (trans_a=", o.trans_a, ", trans_b=", o.trans_b, ")");
  if (c.t.size(-2) != m || c.t.size(-1) != n)
    op_fail(op, {c, a, b}, c.name, " must end in ", matrix_str(m, n), " = op(", a.name, ") @ op(", b.name, ")");
  if (overlaps(c.t, a.t) || overlaps(c.t, b.t)) op_fail(op, {c, a, b}, c.name, " must not overlap its inputs");
}

}  // namespace

// x: (..., IC) with y or dy: (..., OC) of the same leading dims, w: (OC, IC).
void require_linear(const char* op, Operand y, Operand x, Operand w) {
  require_contiguous(op, {y, x, w});
  require_float(op, x);
  require_float(op, y);
  require_ndim(op, w, 2);
  if (x.t.ndim() < 1) op_fail(op, {x}, x.name, " must have at least 1 dim");
  if (w.t.dtype() != x.t.dtype()) op_fail(op, {x, w}, x.name, " and ", w.name, " must share a dtype");
  if (y.t.dtype() != x.t.dtype() && y.t.dtype() != DType::f32)
    op_fail(op, {y, x}, y.name, " has dtype ", dtype_name(y.t.dtype()), ", expected f32 or ", x.name, "'s ",
            dtype_name(x.t.dtype()));
  if (x.t.size(-1) != w.t.size(1))
    op_fail(op, {x, w}, x.name, " has ", x.t.size(-1), " features but ", w.name, " expects ", w.t.size(1));
  Shape expect = x.t.shape();
  expect[expect.ndim() - 1] = w.t.size(0);
  require_shape(op, y, expect);
  if (overlaps(y.t, x.t) || overlaps(y.t, w.t)) op_fail(op, {y, x, w}, y.name, " must not overlap its inputs");
}

void matmul(Tensor c, const Tensor& a, const Tensor& b, const MatmulOpts& opts) {
  constexpr const char* op = "matmul";
  check_matmul(op, {"c", c}, {"a", a}, {"b", b}, opts);
  backend_of(op, {{"c", c}, {"a", a}, {"b", b}}).matmul(c, a, b, opts);
}

void matmul_backward(Tensor da, Tensor db, const Tensor& dc, const Tensor& a, const Tensor& b,
                     const MatmulOpts& opts) {
  constexpr const char* op = "matmul_backward";
  check_matmul(op, {"dc", dc}, {"a", a}, {"b", b}, opts);
  require_grad(op, {"da", da}, {"a", a});
  require_grad(op, {"db", db}, {"b", b});
  require_grads_apart(op, {{"da", da}, {"db", db}}, {{"dc", dc}, {"a", a}, {"b", b}});
  backend_of(op, {{"da", da}, {"db", db}, {"dc", dc}, {"a", a}, {"b", b}}).matmul_backward(da, db, dc, a, b, opts);
}

namespace {

// The forward's checks: require_linear and the bias.
void check_linear_forward(const char* op, const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& bias) {
  require_linear(op, {"y", y}, {"x", x}, {"w", w});
  if (bias.defined()) {
    require_contiguous(op, {{"bias", bias}});
    require_shape(op, {"bias", bias}, {w.size(0)});
    if (bias.dtype() != DType::f32 && bias.dtype() != w.dtype())
      op_fail(op, {{"bias", bias}, {"w", w}}, "bias has dtype ", dtype_name(bias.dtype()), ", expected f32 or w's ",
              dtype_name(w.dtype()));
  }
}

}  // namespace

void linear_forward(Tensor y, const Tensor& x, const Tensor& w, const Tensor& bias) {
  constexpr const char* op = "linear_forward";
  check_linear_forward(op, y, x, w, bias);
  backend_of(op, {{"y", y}, {"x", x}, {"w", w}, {"bias", bias}}).linear_forward(y, x, w, bias);
}

void linear_gelu_forward(Tensor y, Tensor pre, const Tensor& x, const Tensor& w, const Tensor& bias) {
  constexpr const char* op = "linear_gelu_forward";
  check_linear_forward(op, pre, x, w, bias);
  require_contiguous(op, {{"y", y}});
  require_same_dtype(op, {"y", y}, {"pre", pre});
  require_same_shape(op, {"y", y}, {"pre", pre});
  require_no_overlap(op, {"y", y}, {"pre", pre});
  require_no_overlap(op, {"y", y}, {"x", x});
  require_no_overlap(op, {"y", y}, {"w", w});
  backend_of(op, {{"y", y}, {"pre", pre}, {"x", x}, {"w", w}, {"bias", bias}}).linear_gelu_forward(y, pre, x, w, bias);
}

void linear_forward_invariant(Tensor y, const Tensor& x, const Tensor& w, const Tensor& bias) {
  constexpr const char* op = "linear_forward_invariant";
  check_linear_forward(op, y, x, w, bias);
  backend_of(op, {{"y", y}, {"x", x}, {"w", w}, {"bias", bias}}).linear_forward_invariant(y, x, w, bias);
}

void linear_backward(Tensor dx, Tensor dw, Tensor dbias, const Tensor& dy, const Tensor& x, const Tensor& w) {
  constexpr const char* op = "linear_backward";
  require_linear(op, {"dy", dy}, {"x", x}, {"w", w});
  require_grad(op, {"dx", dx}, {"x", x});
  require_grad(op, {"dw", dw}, {"w", w});
  if (dbias.defined()) {
    require_contiguous(op, {{"dbias", dbias}});
    require_float(op, {"dbias", dbias});
    require_shape(op, {"dbias", dbias}, {w.size(0)});
  }
  require_grads_apart(op, {{"dx", dx}, {"dw", dw}, {"dbias", dbias}}, {{"dy", dy}, {"x", x}, {"w", w}});
  backend_of(op, {{"dx", dx}, {"dw", dw}, {"dbias", dbias}, {"dy", dy}, {"x", x}, {"w", w}})
      .linear_backward(dx, dw, dbias, dy, x, w);
}

std::string bf16_matmul_unsupported_reason() { return cpu::onednn_bf16_unsupported_reason(); }

}  // namespace loom::kernels
