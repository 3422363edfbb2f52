// Argument checks shared by the ops (the dispatch layer, ops_*.cpp): each
// failure is a loom::Error that names the op and the operands involved (ops.h
// conventions). Also the helpers the CPU backend shares with them (rows,
// dispatch_float).
#pragma once

#include <initializer_list>
#include <string>
#include <utility>

#include "core/error.h"
#include "core/tensor.h"

namespace loom::kernels {

// A named operand, for messages: {"x", x}.
struct Operand {
  const char* name;
  const Tensor& t;
};

// "x=f32(4, 100), w=f32(32, 96)"
std::string describe(std::initializer_list<Operand> operands);

template <typename... Args>
[[noreturn]] void op_fail(const char* op, std::initializer_list<Operand> operands, Args&&... what) {
  throw Error(concat(op, ": ", std::forward<Args>(what)..., " (", describe(operands), ")"));
}

// Each operand is defined and contiguous. (Which device: backend_of,
// kernels/dispatch.h.)
void require_contiguous(const char* op, std::initializer_list<Operand> operands);
// y = x @ w^T's operands (ops.h linear_forward): contiguous, w (OC, IC) of
// x's float dtype, x (..., IC), y (..., OC) of x's dtype or f32, apart.
void require_linear(const char* op, Operand y, Operand x, Operand w);
// dtype is f32, bf16 or f16.
void require_float(const char* op, Operand x);
// b has a's dtype: "y has dtype f32 but x has bf16".
void require_same_dtype(const char* op, Operand b, Operand a);
void require_dtype(const char* op, Operand x, DType dtype);
void require_shape(const char* op, Operand x, const Shape& shape);
void require_same_shape(const char* op, Operand a, Operand b);
void require_ndim(const char* op, Operand x, int ndim);
// A gradient of an operand of dtype `of`: f32, or the same dtype as `of`.
void require_grad_dtype(const char* op, Operand grad, DType of);
// The gradient of operand `of`: skipped if undefined, else contiguous,
// shaped like `of` and typed per require_grad_dtype.
void require_grad(const char* op, Operand grad, Operand of);

// True if the two tensors' byte ranges intersect (empty tensors never do).
bool overlaps(const Tensor& a, const Tensor& b);
// `out` must not share memory with `in`.
void require_no_overlap(const char* op, Operand out, Operand in);
// Gradients never alias inputs (ops.h): each defined gradient shares no
// memory with any input nor with another gradient.
void require_grads_apart(const char* op, std::initializer_list<Operand> grads, std::initializer_list<Operand> inputs);
// `out` may be exactly `in` (same start and dtype: in place) but must not
// partly overlap it.
void require_no_partial_overlap(const char* op, Operand out, Operand in);

// Leading dims flattened: numel / size(-1).
inline int64_t rows(const Tensor& t) { return t.ndim() == 0 ? 1 : (t.size(-1) ? t.numel() / t.size(-1) : 0); }

// Calls f.template operator()<T>() with T = float, bf16 or f16 for a float
// dtype (validated before: require_float).
template <typename F>
decltype(auto) dispatch_float(DType dtype, F&& f) {
  switch (dtype) {
    case DType::f32: return f.template operator()<float>();
    case DType::bf16: return f.template operator()<bf16>();
    case DType::f16: return f.template operator()<f16>();
    default: LOOM_CHECK(false, "dispatch_float: dtype ", dtype_name(dtype), " reached a float kernel");
  }
}

}  // namespace loom::kernels
