// linear_forward_quantized (ops.h): operand checks, then the backend's op.
#include "kernels/dispatch.h"
#include "kernels/ops.h"
#include "kernels/quant.h"

namespace loom::kernels {
namespace {

// w's type is a weight type, IC a whole number of its blocks and w's rows
// exactly one row of IC values in it.
void check_quantized_weight(const char* op, const Tensor& x, const Tensor& w, QuantType wtype) {
  if (quant_is_activation_type(wtype))
    op_fail(op, {{"x", x}, {"w", w}}, "wtype ", quant_name(wtype), " is an activation type, not a weight type ",
            "(allowed: q8_0, q4_0, q4_1, q5_0, q5_1, q2_K, q3_K, q4_K, q5_K, q6_K)");
  if (w.dtype() != DType::u8)
    op_fail(op, {{"w", w}}, "w has dtype ", dtype_name(w.dtype()), ", expected u8 (the bytes of ", quant_name(wtype),
            " blocks)");
  require_ndim(op, {"w", w}, 2);
  const int64_t IC = x.size(-1), block = quant_block_size(wtype);
  if (IC % block != 0)
    op_fail(op, {{"x", x}, {"w", w}}, "x has ", IC, " features, not a multiple of ", quant_name(wtype),
            "'s block size ", block);
  const auto row_bytes = static_cast<int64_t>(quant_row_bytes(wtype, IC));
  if (w.size(1) != row_bytes)
    op_fail(op, {{"x", x}, {"w", w}}, "w's rows hold ", w.size(1), " bytes, but ", IC, " features of ",
            quant_name(wtype), " take ", row_bytes, " (", IC / block, " blocks of ", quant_block_bytes(wtype), ")");
}

}  // namespace

void linear_forward_quantized(Tensor y, const Tensor& x, const Tensor& w, QuantType wtype, const Tensor& bias) {
  constexpr const char* op = "linear_forward_quantized";
  require_contiguous(op, {{"y", y}, {"x", x}, {"w", w}});
  require_dtype(op, {"x", x}, DType::f32);
  require_dtype(op, {"y", y}, DType::f32);
  if (x.ndim() < 1) op_fail(op, {{"x", x}}, "x must have at least 1 dim");
  check_quantized_weight(op, x, w, wtype);
  Shape expect = x.shape();
  expect[expect.ndim() - 1] = w.size(0);
  require_shape(op, {"y", y}, expect);
  if (bias.defined()) {
    require_contiguous(op, {{"bias", bias}});
    require_dtype(op, {"bias", bias}, DType::f32);
    require_shape(op, {"bias", bias}, {w.size(0)});
    require_no_overlap(op, {"y", y}, {"bias", bias});
  }
  require_no_overlap(op, {"y", y}, {"x", x});
  require_no_overlap(op, {"y", y}, {"w", w});
  backend_of(op, {{"y", y}, {"x", x}, {"w", w}, {"bias", bias}}).linear_forward_quantized(y, x, w, wtype, bias);
}

void dequantize_rows(Tensor out, const Tensor& w, QuantType wtype, int64_t first_row) {
  constexpr const char* op = "dequantize_rows";
  require_contiguous(op, {{"out", out}, {"w", w}});
  require_dtype(op, {"out", out}, DType::f32);
  require_ndim(op, {"out", out}, 2);
  check_quantized_weight(op, out, w, wtype);
  if (first_row < 0 || first_row + out.size(0) > w.size(0))
    op_fail(op, {{"out", out}, {"w", w}}, "rows [", first_row, ", ", first_row + out.size(0), ") are outside w's ",
            w.size(0), " rows");
  backend_of(op, {{"out", out}, {"w", w}}).dequantize_rows(out, w, wtype, first_row);
}

}  // namespace loom::kernels
