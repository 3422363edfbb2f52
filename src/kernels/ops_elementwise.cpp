// add, cast, fill and the data movement ops (ops.h): operand checks, then the
// backend's op.
#include <cstdint>
#include <limits>

#include "kernels/dispatch.h"
#include "kernels/ops.h"

namespace loom::kernels {
namespace {

// Bytes [first, last) holding a view's elements (strides are >= 0; slices
// and reshapes never make negative ones). Empty for no element.
struct ByteSpan {
  uintptr_t first = 0, last = 0;
};
ByteSpan byte_span(const Tensor& t) {
  if (t.numel() == 0) return {};
  int64_t last_element = 0;
  for (int d = 0; d < t.ndim(); ++d) last_element += (t.size(d) - 1) * t.stride(d);
  const auto first = reinterpret_cast<uintptr_t>(t.data());  // compared as integers (validate.cpp: overlaps)
  return {first, first + static_cast<uintptr_t>((last_element + 1) * static_cast<int64_t>(dtype_size(t.dtype())))};
}

// The same elements in the same places: a copy onto itself.
bool same_view(const Tensor& a, const Tensor& b) {
  if (a.data() != b.data() || !(a.shape() == b.shape())) return false;
  for (int d = 0; d < a.ndim(); ++d)
    if (a.size(d) > 1 && a.stride(d) != b.stride(d)) return false;
  return true;
}

void require_defined(const char* op, std::initializer_list<Operand> operands) {
  for (const Operand& o : operands)
    if (!o.t.defined()) op_fail(op, {o}, o.name, " is required");
}

}  // namespace

namespace {

// add's and mul's operands: contiguous floats of one shape, y a or b or apart from both.
void check_binary(const char* op, const Tensor& y, const Tensor& a, const Tensor& b) {
  require_contiguous(op, {{"y", y}, {"a", a}, {"b", b}});
  require_float(op, {"y", y});
  require_float(op, {"a", a});
  require_float(op, {"b", b});
  require_same_shape(op, {"a", a}, {"b", b});
  require_same_shape(op, {"y", y}, {"a", a});
  require_no_partial_overlap(op, {"y", y}, {"a", a});
  require_no_partial_overlap(op, {"y", y}, {"b", b});
}

}  // namespace

void mul(Tensor y, const Tensor& a, const Tensor& b) {
  check_binary("mul", y, a, b);
  backend_of("mul", {{"y", y}, {"a", a}, {"b", b}}).mul(y, a, b);
}

void add(Tensor y, const Tensor& a, const Tensor& b) {
  check_binary("add", y, a, b);
  backend_of("add", {{"y", y}, {"a", a}, {"b", b}}).add(y, a, b);
}

void cast(Tensor dst, const Tensor& src) {
  constexpr const char* op = "cast";
  require_contiguous(op, {{"dst", dst}, {"src", src}});
  require_float(op, {"dst", dst});
  require_float(op, {"src", src});
  require_same_shape(op, {"dst", dst}, {"src", src});
  require_no_partial_overlap(op, {"dst", dst}, {"src", src});
  backend_of(op, {{"dst", dst}, {"src", src}}).cast(dst, src);
}

void fill(Tensor t, float value) {
  require_contiguous("fill", {{"t", t}});
  require_float("fill", {"t", t});
  backend_of("fill", {{"t", t}}).fill(t, value);
}

// dst, src: the same shape and dtype, any strides.
void copy(Tensor dst, const Tensor& src) {
  constexpr const char* op = "copy";
  require_defined(op, {{"dst", dst}, {"src", src}});
  require_same_dtype(op, {"dst", dst}, {"src", src});
  require_same_shape(op, {"dst", dst}, {"src", src});
  const ByteSpan d = byte_span(dst), s = byte_span(src);
  if (d.first < s.last && s.first < d.last && !same_view(dst, src))
    op_fail(op, {{"dst", dst}, {"src", src}}, "dst overlaps src (only a copy onto the very same view is allowed)");
  backend_of(op, {{"dst", dst}, {"src", src}}).copy(dst, src);
}

void gather_columns(Tensor dst, const Tensor& src, const Tensor& columns) {
  constexpr const char* op = "gather_columns";
  require_contiguous(op, {{"dst", dst}, {"src", src}, {"columns", columns}});
  require_same_dtype(op, {"dst", dst}, {"src", src});
  require_ndim(op, {"dst", dst}, 2), require_ndim(op, {"src", src}, 2);
  require_dtype(op, {"columns", columns}, DType::i32);
  require_shape(op, {"columns", columns}, Shape{dst.size(1)});
  if (dst.size(0) != src.size(0))
    op_fail(op, {{"dst", dst}, {"src", src}}, "dst has ", dst.size(0), " rows, src has ", src.size(0));
  backend_of(op, {{"dst", dst}, {"src", src}, {"columns", columns}}).gather_columns(dst, src, columns);
}

// t: (N) i32 or i64; start .. start + N - 1 must fit t's dtype.
void arange(Tensor t, int64_t start) {
  constexpr const char* op = "arange";
  require_contiguous(op, {{"t", t}});
  require_ndim(op, {"t", t}, 1);
  if (t.dtype() != DType::i32 && t.dtype() != DType::i64)
    op_fail(op, {{"t", t}}, "t has dtype ", dtype_name(t.dtype()), ", expected i32 or i64");
  const int64_t n = t.numel();
  int64_t last = start;
  const bool fits = n == 0 || (!__builtin_add_overflow(start, n - 1, &last) &&
                               (t.dtype() == DType::i64 || (start >= std::numeric_limits<int32_t>::min() &&
                                                            last <= std::numeric_limits<int32_t>::max())));
  if (!fits)
    op_fail(op, {{"t", t}}, "values ", start, " + [0, ", n, ") do not fit ", dtype_name(t.dtype()));
  backend_of(op, {{"t", t}}).arange(t, start);
}

// ids: any shape, i32; limit >= 0.
IdOutside find_id_outside(const Tensor& ids, int64_t limit, std::optional<int32_t> ignore_index) {
  constexpr const char* op = "find_id_outside";
  require_contiguous(op, {{"ids", ids}});
  require_dtype(op, {"ids", ids}, DType::i32);
  if (limit < 0) op_fail(op, {{"ids", ids}}, "limit ", limit, " is negative: ids lie in [0, limit)");
  return backend_of(op, {{"ids", ids}}).find_id_outside(ids, limit, ignore_index);
}

}  // namespace loom::kernels
