#include "kernels/validate.h"

#include <cstdint>
#include <iterator>

namespace loom::kernels {

std::string describe(std::initializer_list<Operand> operands) {
  std::string s;
  for (const Operand& o : operands) {
    if (!s.empty()) s += ", ";
    s += o.name;
    s += "=";
    s += o.t.defined() ? o.t.str() : std::string("undefined");
  }
  return s;
}

void require_contiguous(const char* op, std::initializer_list<Operand> operands) {
  for (const Operand& o : operands) {
    if (!o.t.defined()) op_fail(op, {o}, o.name, " is required");
    if (!o.t.is_contiguous()) op_fail(op, {o}, o.name, " must be contiguous");
  }
}

void require_float(const char* op, Operand x) {
  if (!dtype_is_float(x.t.dtype()))
    op_fail(op, {x}, x.name, " has dtype ", dtype_name(x.t.dtype()), ", expected f32, bf16 or f16");
}

void require_same_dtype(const char* op, Operand b, Operand a) {
  if (b.t.dtype() != a.t.dtype())
    op_fail(op, {b, a}, b.name, " has dtype ", dtype_name(b.t.dtype()), " but ", a.name, " has ",
            dtype_name(a.t.dtype()));
}

void require_dtype(const char* op, Operand x, DType dtype) {
  if (x.t.dtype() != dtype)
    op_fail(op, {x}, x.name, " has dtype ", dtype_name(x.t.dtype()), ", expected ", dtype_name(dtype));
}

void require_shape(const char* op, Operand x, const Shape& shape) {
  if (!(x.t.shape() == shape)) op_fail(op, {x}, x.name, " must have shape ", shape.str());
}

void require_same_shape(const char* op, Operand a, Operand b) {
  if (!(a.t.shape() == b.t.shape())) op_fail(op, {a, b}, a.name, " and ", b.name, " must have the same shape");
}

void require_ndim(const char* op, Operand x, int ndim) {
  if (x.t.ndim() != ndim) op_fail(op, {x}, x.name, " must have ", ndim, " dims");
}

void require_grad_dtype(const char* op, Operand grad, DType of) {
  if (grad.t.dtype() != DType::f32 && grad.t.dtype() != of)
    op_fail(op, {grad}, grad.name, " has dtype ", dtype_name(grad.t.dtype()), ", expected f32",
            of == DType::f32 ? "" : concat(" or ", dtype_name(of)));
}

void require_grad(const char* op, Operand grad, Operand of) {
  if (!grad.t.defined()) return;
  require_contiguous(op, {grad});
  require_same_shape(op, grad, of);
  require_grad_dtype(op, grad, of.t.dtype());
}

bool overlaps(const Tensor& a, const Tensor& b) {
  // Compared as integers: relational operators on pointers into different
  // objects are unspecified.
  const auto a0 = reinterpret_cast<uintptr_t>(a.data()), b0 = reinterpret_cast<uintptr_t>(b.data());
  return a.nbytes() > 0 && b.nbytes() > 0 && a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

void require_no_overlap(const char* op, Operand out, Operand in) {
  if (overlaps(out.t, in.t)) op_fail(op, {out, in}, out.name, " must not overlap ", in.name);
}

void require_grads_apart(const char* op, std::initializer_list<Operand> grads, std::initializer_list<Operand> inputs) {
  for (auto g = grads.begin(); g != grads.end(); ++g) {
    if (!g->t.defined()) continue;
    for (const Operand& in : inputs) require_no_overlap(op, *g, in);
    for (auto h = std::next(g); h != grads.end(); ++h) require_no_overlap(op, *g, *h);
  }
}

void require_no_partial_overlap(const char* op, Operand out, Operand in) {
  const bool in_place = out.t.data() == in.t.data() && out.t.dtype() == in.t.dtype();
  if (overlaps(out.t, in.t) && !in_place)
    op_fail(op, {out, in}, out.name, " overlaps ", in.name, " (only exact in-place use is allowed)");
}

}  // namespace loom::kernels
