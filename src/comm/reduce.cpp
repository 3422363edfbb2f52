#include "comm/reduce.h"

#include <algorithm>

#include "core/error.h"

namespace loom::comm {
namespace {

template <typename T>
void reduce_typed(T* dst, const T* src, int64_t n, ReduceOp op) {
  if (op == ReduceOp::max) {
    for (int64_t i = 0; i < n; ++i) dst[i] = std::max(dst[i], src[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
  }
}

}  // namespace

void reduce_into(void* dst, const void* src, int64_t n, DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::f32: return reduce_typed(static_cast<float*>(dst), static_cast<const float*>(src), n, op);
    case DType::i32: return reduce_typed(static_cast<int32_t*>(dst), static_cast<const int32_t*>(src), n, op);
    case DType::i64: return reduce_typed(static_cast<int64_t*>(dst), static_cast<const int64_t*>(src), n, op);
    default: LOOM_CHECK(false, "reduce_into: dtype ", dtype_name(dtype), " is reduced through f32");
  }
}

void divide_by(void* buf, int64_t n, DType dtype, int divisor) {
  LOOM_CHECK(dtype == DType::f32, "divide_by: dtype ", dtype_name(dtype));
  float* x = static_cast<float*>(buf);
  const float d = static_cast<float>(divisor);
  for (int64_t i = 0; i < n; ++i) x[i] /= d;
}

void bf16_to_f32(float* dst, const bf16* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = from_bf16(src[i]);
}

void f32_to_bf16(bf16* dst, const float* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = to_bf16(src[i]);
}

}  // namespace loom::comm
