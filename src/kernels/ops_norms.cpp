// LayerNorm and RMSNorm (ops.h): operand checks, then the backend's op.
#include "kernels/dispatch.h"
#include "kernels/ops.h"

namespace loom::kernels {
namespace {

// x: (..., C) float; y like x; w (and b if defined): (C) in x's dtype.
void check_norm_params(const char* op, Operand x, const Tensor& w, const Tensor& b) {
  require_contiguous(op, {x, {"w", w}});
  require_float(op, x);
  if (x.t.ndim() < 1) op_fail(op, {x}, x.name, " must have at least 1 dim");
  const int64_t C = x.t.size(-1);
  require_same_dtype(op, {"w", w}, x);
  require_shape(op, {"w", w}, Shape{C});
  if (b.defined()) {
    require_contiguous(op, {{"b", b}});
    require_same_dtype(op, {"b", b}, x);
    require_shape(op, {"b", b}, Shape{C});
  }
}

// A per-row statistic: f32 with one element per row of x (the op's input).
void check_stat(const char* op, Operand stat, Operand x) {
  require_contiguous(op, {stat});
  require_dtype(op, stat, DType::f32);
  if (stat.t.numel() != rows(x.t))
    op_fail(op, {stat, x}, stat.name, " must have one element per row of ", x.name, " (", rows(x.t), ")");
}

void check_forward(const char* op, const Tensor& y, Operand x) {
  require_contiguous(op, {{"y", y}});
  require_same_dtype(op, {"y", y}, x);
  require_same_shape(op, {"y", y}, x);
}

// dy like x, f32 or x's dtype; dx (if defined) likewise. Parameter gradients
// are checked by the callers with require_grad.
void check_backward(const char* op, const Tensor& dx, const Tensor& dy, const Tensor& x) {
  require_contiguous(op, {{"dy", dy}});
  require_grad_dtype(op, {"dy", dy}, x.dtype());
  require_same_shape(op, {"dy", dy}, {"x", x});
  require_grad(op, {"dx", dx}, {"x", x});
}

// The fused residual's add: a, b, sum alike (sum may be a or b, as in
// add), y apart from each.
void check_residual(const char* op, const Tensor& sum, const Tensor& y, const Tensor& a, const Tensor& b) {
  require_contiguous(op, {{"sum", sum}, {"a", a}, {"b", b}});
  require_same_dtype(op, {"a", a}, {"sum", sum});
  require_same_dtype(op, {"b", b}, {"sum", sum});
  require_same_shape(op, {"a", a}, {"sum", sum});
  require_same_shape(op, {"b", b}, {"sum", sum});
  require_no_partial_overlap(op, {"sum", sum}, {"a", a});
  require_no_partial_overlap(op, {"sum", sum}, {"b", b});
  require_no_overlap(op, {"y", y}, {"sum", sum});
  require_no_overlap(op, {"y", y}, {"a", a});
  require_no_overlap(op, {"y", y}, {"b", b});
}

}  // namespace

// x, y: (..., C)  w: (C)  b: (C) or undefined (no bias)  mean, rstd: one f32
// per row of x ((N) or x's leading shape), or undefined (inference).
void layernorm_forward(Tensor y, Tensor mean, Tensor rstd, const Tensor& x, const Tensor& w, const Tensor& b,
                       float eps) {
  constexpr const char* op = "layernorm_forward";
  check_norm_params(op, {"x", x}, w, b);
  check_forward(op, y, {"x", x});
  if (mean.defined()) check_stat(op, {"mean", mean}, {"x", x});
  if (rstd.defined()) check_stat(op, {"rstd", rstd}, {"x", x});
  backend_of(op, {{"y", y}, {"mean", mean}, {"rstd", rstd}, {"x", x}, {"w", w}, {"b", b}})
      .layernorm_forward(y, mean, rstd, x, w, b, eps);
}

void layernorm_backward(Tensor dx, Tensor dw, Tensor db, const Tensor& dy, const Tensor& x, const Tensor& w,
                        const Tensor& mean, const Tensor& rstd) {
  constexpr const char* op = "layernorm_backward";
  check_norm_params(op, {"x", x}, w, Tensor());
  check_backward(op, dx, dy, x);
  require_grad(op, {"dw", dw}, {"w", w});
  require_grad(op, {"db", db}, {"w", w});
  check_stat(op, {"mean", mean}, {"x", x});
  check_stat(op, {"rstd", rstd}, {"x", x});
  require_grads_apart(op, {{"dx", dx}, {"dw", dw}, {"db", db}},
                      {{"dy", dy}, {"x", x}, {"w", w}, {"mean", mean}, {"rstd", rstd}});
  backend_of(op, {{"dx", dx}, {"dw", dw}, {"db", db}, {"dy", dy}, {"x", x}, {"w", w}, {"mean", mean}, {"rstd", rstd}})
      .layernorm_backward(dx, dw, db, dy, x, w, mean, rstd);
}

// x, y: (..., C)  w: (C)  rstd: one f32 per row of x, or undefined.
void rmsnorm_forward(Tensor y, Tensor rstd, const Tensor& x, const Tensor& w, float eps) {
  constexpr const char* op = "rmsnorm_forward";
  check_norm_params(op, {"x", x}, w, Tensor());
  check_forward(op, y, {"x", x});
  if (rstd.defined()) check_stat(op, {"rstd", rstd}, {"x", x});
  backend_of(op, {{"y", y}, {"rstd", rstd}, {"x", x}, {"w", w}}).rmsnorm_forward(y, rstd, x, w, eps);
}

void rmsnorm_backward(Tensor dx, Tensor dw, const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd) {
  constexpr const char* op = "rmsnorm_backward";
  check_norm_params(op, {"x", x}, w, Tensor());
  check_backward(op, dx, dy, x);
  require_grad(op, {"dw", dw}, {"w", w});
  check_stat(op, {"rstd", rstd}, {"x", x});
  require_grads_apart(op, {{"dx", dx}, {"dw", dw}}, {{"dy", dy}, {"x", x}, {"w", w}, {"rstd", rstd}});
  backend_of(op, {{"dx", dx}, {"dw", dw}, {"dy", dy}, {"x", x}, {"w", w}, {"rstd", rstd}})
      .rmsnorm_backward(dx, dw, dy, x, w, rstd);
}

// sum = a + b, then layernorm_forward of sum: the checks of both.
void add_layernorm_forward(Tensor sum, Tensor y, Tensor mean, Tensor rstd, const Tensor& a, const Tensor& b,
                           const Tensor& w, const Tensor& bias, float eps) {
  constexpr const char* op = "add_layernorm_forward";
  check_norm_params(op, {"sum", sum}, w, bias);
  check_forward(op, y, {"sum", sum});
  check_residual(op, sum, y, a, b);
  if (mean.defined()) check_stat(op, {"mean", mean}, {"sum", sum});
  if (rstd.defined()) check_stat(op, {"rstd", rstd}, {"sum", sum});
  backend_of(op, {{"sum", sum}, {"y", y}, {"mean", mean}, {"rstd", rstd}, {"a", a}, {"b", b}, {"w", w}, {"bias", bias}})
      .add_layernorm_forward(sum, y, mean, rstd, a, b, w, bias, eps);
}

void add_rmsnorm_forward(Tensor sum, Tensor y, Tensor rstd, const Tensor& a, const Tensor& b, const Tensor& w,
                         float eps) {
  constexpr const char* op = "add_rmsnorm_forward";
  check_norm_params(op, {"sum", sum}, w, Tensor());
  check_forward(op, y, {"sum", sum});
  check_residual(op, sum, y, a, b);
  if (rstd.defined()) check_stat(op, {"rstd", rstd}, {"sum", sum});
  backend_of(op, {{"sum", sum}, {"y", y}, {"rstd", rstd}, {"a", a}, {"b", b}, {"w", w}})
      .add_rmsnorm_forward(sum, y, rstd, a, b, w, eps);
}

}  // namespace loom::kernels
