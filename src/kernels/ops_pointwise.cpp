// Activations, RoPE and softmax (ops.h): operand checks, then the backend's
// op.
#include <cmath>

#include "kernels/dispatch.h"
#include "kernels/ops.h"

namespace loom::kernels {
namespace {

// y = f(x), elementwise: y like x, in place allowed.
void check_unary_forward(const char* op, const Tensor& y, const Tensor& x) {
  require_contiguous(op, {{"y", y}, {"x", x}});
  require_float(op, {"x", x});
  require_dtype(op, {"y", y}, x.dtype());
  require_same_shape(op, {"y", y}, {"x", x});
  require_no_partial_overlap(op, {"y", y}, {"x", x});
}

// dx += dy * f'(x): dy like x (f32 or x's dtype), dx checked when defined.
void check_unary_backward(const char* op, const Tensor& dx, const Tensor& dy, const Tensor& x) {
  require_contiguous(op, {{"dy", dy}, {"x", x}});
  require_float(op, {"x", x});
  require_grad_dtype(op, {"dy", dy}, x.dtype());
  require_same_shape(op, {"dy", dy}, {"x", x});
  if (!dx.defined()) return;
  require_grad(op, {"dx", dx}, {"x", x});
  require_grads_apart(op, {{"dx", dx}}, {{"dy", dy}, {"x", x}});
}

void check_swiglu_inputs(const char* op, const Tensor& gate, const Tensor& up) {
  require_contiguous(op, {{"gate", gate}, {"up", up}});
  require_float(op, {"gate", gate});
  require_dtype(op, {"up", up}, gate.dtype());
  require_same_shape(op, {"up", up}, {"gate", gate});
}

// The input `in` (x or dy): (B, T, NH, HS) float, HS even; pos: (T) or (B, T) i32; theta > 0.
void check_rope(const char* op, Operand in, const Tensor& pos, float theta) {
  require_contiguous(op, {in, {"pos", pos}});
  require_float(op, in);
  require_ndim(op, in, 4);
  const int64_t B = in.t.size(0), T = in.t.size(1), HS = in.t.size(3);
  if (HS % 2 != 0) op_fail(op, {in}, in.name, " has odd head size ", HS, "; rope pairs i with i + HS/2");
  require_dtype(op, {"pos", pos}, DType::i32);
  const bool pos_ok = (pos.ndim() == 1 && pos.size(0) == T) || (pos.ndim() == 2 && pos.size(0) == B && pos.size(1) == T);
  if (!pos_ok) op_fail(op, {in, {"pos", pos}}, "pos must have shape (", T, ",) or (", B, ", ", T, ")");
  if (!(std::isfinite(theta) && theta > 0.f)) op_fail(op, {in}, "theta must be finite and > 0, got ", theta);
}

}  // namespace

void gelu_forward(Tensor y, const Tensor& x) {
  constexpr const char* op = "gelu_forward";
  check_unary_forward(op, y, x);
  backend_of(op, {{"y", y}, {"x", x}}).gelu_forward(y, x);
}

void gelu_backward(Tensor dx, const Tensor& dy, const Tensor& x) {
  constexpr const char* op = "gelu_backward";
  check_unary_backward(op, dx, dy, x);
  backend_of(op, {{"dx", dx}, {"dy", dy}, {"x", x}}).gelu_backward(dx, dy, x);
}

void silu_forward(Tensor y, const Tensor& x) {
  constexpr const char* op = "silu_forward";
  check_unary_forward(op, y, x);
  backend_of(op, {{"y", y}, {"x", x}}).silu_forward(y, x);
}

void silu_backward(Tensor dx, const Tensor& dy, const Tensor& x) {
  constexpr const char* op = "silu_backward";
  check_unary_backward(op, dx, dy, x);
  backend_of(op, {{"dx", dx}, {"dy", dy}, {"x", x}}).silu_backward(dx, dy, x);
}

void swiglu_forward(Tensor y, const Tensor& gate, const Tensor& up) {
  constexpr const char* op = "swiglu_forward";
  check_swiglu_inputs(op, gate, up);
  require_contiguous(op, {{"y", y}});
  require_dtype(op, {"y", y}, gate.dtype());
  require_same_shape(op, {"y", y}, {"gate", gate});
  require_no_partial_overlap(op, {"y", y}, {"gate", gate});
  require_no_partial_overlap(op, {"y", y}, {"up", up});
  backend_of(op, {{"y", y}, {"gate", gate}, {"up", up}}).swiglu_forward(y, gate, up);
}

void swiglu_backward(Tensor dgate, Tensor dup, const Tensor& dy, const Tensor& gate, const Tensor& up) {
  constexpr const char* op = "swiglu_backward";
  check_swiglu_inputs(op, gate, up);
  require_contiguous(op, {{"dy", dy}});
  require_grad(op, {"dy", dy}, {"gate", gate});
  require_grad(op, {"dgate", dgate}, {"gate", gate});
  require_grad(op, {"dup", dup}, {"gate", gate});
  require_grads_apart(op, {{"dgate", dgate}, {"dup", dup}}, {{"dy", dy}, {"gate", gate}, {"up", up}});
  backend_of(op, {{"dgate", dgate}, {"dup", dup}, {"dy", dy}, {"gate", gate}, {"up", up}})
      .swiglu_backward(dgate, dup, dy, gate, up);
}

void rope_forward(Tensor y, const Tensor& x, const Tensor& pos, float theta) {
  constexpr const char* op = "rope_forward";
  check_rope(op, {"x", x}, pos, theta);
  require_contiguous(op, {{"y", y}});
  require_dtype(op, {"y", y}, x.dtype());
  require_same_shape(op, {"y", y}, {"x", x});
  require_no_partial_overlap(op, {"y", y}, {"x", x});  // y == x (in place) is fine
  backend_of(op, {{"y", y}, {"x", x}, {"pos", pos}}).rope_forward(y, x, pos, theta);
}

void rope_backward(Tensor dx, const Tensor& dy, const Tensor& pos, float theta) {
  constexpr const char* op = "rope_backward";
  check_rope(op, {"dy", dy}, pos, theta);
  if (dx.defined()) {
    require_contiguous(op, {{"dx", dx}});
    require_float(op, {"dx", dx});
    require_same_shape(op, {"dx", dx}, {"dy", dy});
    require_grads_apart(op, {{"dx", dx}}, {{"dy", dy}});
  }
  backend_of(op, {{"dx", dx}, {"dy", dy}, {"pos", pos}}).rope_backward(dx, dy, pos, theta);
}

// x, y: (..., D), same dtype and shape; y may be x.
void softmax_forward(Tensor y, const Tensor& x) {
  constexpr const char* op = "softmax_forward";
  require_contiguous(op, {{"y", y}, {"x", x}});
  require_float(op, {"x", x});
  if (x.ndim() < 1) op_fail(op, {{"x", x}}, "x must have at least 1 dim");
  require_same_dtype(op, {"y", y}, {"x", x});
  require_same_shape(op, {"y", y}, {"x", x});
  require_no_partial_overlap(op, {"y", y}, {"x", x});
  backend_of(op, {{"y", y}, {"x", x}}).softmax_forward(y, x);
}

// y: (..., D)  dy, dx: like y, f32 or y's dtype.
void softmax_backward(Tensor dx, const Tensor& dy, const Tensor& y) {
  constexpr const char* op = "softmax_backward";
  require_contiguous(op, {{"dy", dy}, {"y", y}});
  require_float(op, {"y", y});
  if (y.ndim() < 1) op_fail(op, {{"y", y}}, "y must have at least 1 dim");
  require_grad_dtype(op, {"dy", dy}, y.dtype());
  require_same_shape(op, {"dy", dy}, {"y", y});
  if (dx.defined()) {
    require_contiguous(op, {{"dx", dx}});
    require_grad_dtype(op, {"dx", dx}, y.dtype());
    require_same_shape(op, {"dx", dx}, {"y", y});
    require_grads_apart(op, {{"dx", dx}}, {{"dy", dy}, {"y", y}});
  }
  backend_of(op, {{"dx", dx}, {"dy", dy}, {"y", y}}).softmax_backward(dx, dy, y);
}

}  // namespace loom::kernels
