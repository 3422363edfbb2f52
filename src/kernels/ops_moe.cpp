// Mixture-of-experts row movement and the grouped linear (ops.h): operand
// checks, then the backend's op (the row ids themselves are checked by the
// backend, which reads them).
#include <cstdint>
#include <span>

#include "kernels/dispatch.h"
#include "kernels/ops.h"

namespace loom::kernels {
namespace {

// rows (N, k) i32 for x (N, C); buf (R, C) a float buffer of x's columns.
void check_rows(const char* op, Operand buf, Operand x, const Tensor& rows) {
  require_contiguous(op, {buf, x, {"rows", rows}});
  require_float(op, buf), require_float(op, x);
  require_dtype(op, {"rows", rows}, DType::i32);
  require_ndim(op, {"rows", rows}, 2), require_ndim(op, buf, 2), require_ndim(op, x, 2);
  if (rows.size(0) != x.t.size(0))
    op_fail(op, {{"rows", rows}, x}, "rows has ", rows.size(0), " tokens, ", x.name, " has ", x.t.size(0));
  if (buf.t.size(1) != x.t.size(1))
    op_fail(op, {buf, x}, buf.name, " has ", buf.t.size(1), " columns, ", x.name, " has ", x.t.size(1));
}

void check_weight(const char* op, const Tensor& weight, const Tensor& rows) {
  require_contiguous(op, {{"weight", weight}});
  require_dtype(op, {"weight", weight}, DType::f32);
  require_same_shape(op, {"weight", weight}, {"rows", rows});
}

// offsets: groups + 1 ascending ids from 0, the last <= rows.
void check_offsets(const char* op, std::span<const int64_t> offsets, size_t groups, int64_t rows) {
  if (offsets.size() != groups + 1)
    fail(op, ": ", offsets.size(), " offsets for ", groups, " groups: expected groups + 1");
  if (offsets.empty() || offsets[0] != 0) fail(op, ": offsets must start at 0");
  for (size_t g = 0; g < groups; ++g)
    if (offsets[g + 1] < offsets[g] || offsets[g + 1] > rows)
      fail(op, ": offsets[", g + 1, "] = ", offsets[g + 1], " is out of order or past the ", rows,
           " rows (offsets[", g, "] = ", offsets[g], ")");
}

}  // namespace

void moe_top_k(Tensor sel, Tensor weight, const Tensor& scores, const Tensor& bias, bool normalise) {
  constexpr const char* op = "moe_top_k";
  require_contiguous(op, {{"sel", sel}, {"weight", weight}, {"scores", scores}});
  require_dtype(op, {"scores", scores}, DType::f32);
  require_ndim(op, {"scores", scores}, 2);
  require_dtype(op, {"sel", sel}, DType::i32);
  require_ndim(op, {"sel", sel}, 2);
  check_weight(op, weight, sel);
  const int64_t N = scores.size(0), E = scores.size(1), k = sel.size(1);
  if (sel.size(0) != N)
    op_fail(op, {{"sel", sel}, {"scores", scores}}, "sel has ", sel.size(0), " tokens, scores has ", N);
  if (k < 1 || k > E) op_fail(op, {{"sel", sel}, {"scores", scores}}, "k = ", k, " must be in [1, ", E, "]");
  if (bias.defined()) {
    require_contiguous(op, {{"bias", bias}});
    require_dtype(op, {"bias", bias}, DType::f32);
    require_shape(op, {"bias", bias}, Shape{E});
  }
  backend_of(op, {{"sel", sel}, {"weight", weight}, {"scores", scores}, {"bias", bias}})
      .moe_top_k(sel, weight, scores, bias, normalise);
}

void moe_dispatch(Tensor xs, const Tensor& x, const Tensor& rows) {
  constexpr const char* op = "moe_dispatch";
  check_rows(op, {"xs", xs}, {"x", x}, rows);
  require_same_dtype(op, {"xs", xs}, {"x", x});
  require_no_overlap(op, {"xs", xs}, {"x", x});
  backend_of(op, {{"xs", xs}, {"x", x}, {"rows", rows}}).moe_dispatch(xs, x, rows);
}

void moe_dispatch_backward(Tensor dx, const Tensor& dxs, const Tensor& rows) {
  constexpr const char* op = "moe_dispatch_backward";
  check_rows(op, {"dxs", dxs}, {"dx", dx}, rows);
  require_dtype(op, {"dx", dx}, DType::f32), require_dtype(op, {"dxs", dxs}, DType::f32);
  require_no_overlap(op, {"dx", dx}, {"dxs", dxs});
  backend_of(op, {{"dx", dx}, {"dxs", dxs}, {"rows", rows}}).moe_dispatch_backward(dx, dxs, rows);
}

void moe_combine(Tensor y, const Tensor& ys, const Tensor& rows, const Tensor& weight) {
  constexpr const char* op = "moe_combine";
  check_rows(op, {"ys", ys}, {"y", y}, rows);
  check_weight(op, weight, rows);
  require_same_dtype(op, {"y", y}, {"ys", ys});
  require_no_overlap(op, {"y", y}, {"ys", ys});
  backend_of(op, {{"y", y}, {"ys", ys}, {"rows", rows}, {"weight", weight}}).moe_combine(y, ys, rows, weight);
}

void moe_combine_backward(Tensor dys, Tensor dweight, const Tensor& dy, const Tensor& ys, const Tensor& rows,
                          const Tensor& weight) {
  constexpr const char* op = "moe_combine_backward";
  check_rows(op, {"ys", ys}, {"dy", dy}, rows);
  check_weight(op, weight, rows);
  require_dtype(op, {"dy", dy}, DType::f32), require_dtype(op, {"dys", dys}, DType::f32);
  require_same_shape(op, {"dys", dys}, {"ys", ys});
  require_contiguous(op, {{"dys", dys}, {"dweight", dweight}});
  require_dtype(op, {"dweight", dweight}, DType::f32);
  require_same_shape(op, {"dweight", dweight}, {"rows", rows});
  require_grads_apart(op, {{"dys", dys}, {"dweight", dweight}}, {{"dy", dy}, {"ys", ys}, {"weight", weight}});
  backend_of(op, {{"dys", dys}, {"dweight", dweight}, {"dy", dy}, {"ys", ys}, {"rows", rows}, {"weight", weight}})
      .moe_combine_backward(dys, dweight, dy, ys, rows, weight);
}

void grouped_linear_forward(Tensor y, const Tensor& x, std::span<const Tensor> w, std::span<const int64_t> offsets,
                            bool invariant) {
  constexpr const char* op = "grouped_linear_forward";
  check_offsets(op, offsets, w.size(), x.size(0));
  for (const Tensor& wg : w) require_linear(op, {"y", y}, {"x", x}, {"w[g]", wg});
  backend_of(op, {{"y", y}, {"x", x}}).grouped_linear_forward(y, x, w, offsets, invariant);
}

void grouped_linear_backward(Tensor dx, std::span<const Tensor> dw, const Tensor& dy, const Tensor& x,
                             std::span<const Tensor> w, std::span<const int64_t> offsets) {
  constexpr const char* op = "grouped_linear_backward";
  check_offsets(op, offsets, w.size(), x.size(0));
  if (!dw.empty() && dw.size() != w.size()) fail(op, ": ", dw.size(), " weight gradients for ", w.size(), " weights");
  for (size_t g = 0; g < w.size(); ++g) {
    require_linear(op, {"dy", dy}, {"x", x}, {"w[g]", w[g]});
    if (!dw.empty()) require_grad(op, {"dw[g]", dw[g]}, {"w[g]", w[g]});
  }
  require_grad(op, {"dx", dx}, {"x", x});
  backend_of(op, {{"dx", dx}, {"dy", dy}, {"x", x}}).grouped_linear_backward(dx, dw, dy, x, w, offsets);
}

}  // namespace loom::kernels
