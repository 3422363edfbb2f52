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

namespace {

// scores (N, E) f32 and the router's choices sel (N, k) i32 of the same tokens.
void check_choices(const char* op, const Tensor& sel, const Tensor& scores) {
  require_contiguous(op, {{"sel", sel}, {"scores", scores}});
  require_dtype(op, {"sel", sel}, DType::i32), require_dtype(op, {"scores", scores}, DType::f32);
  require_ndim(op, {"sel", sel}, 2), require_ndim(op, {"scores", scores}, 2);
  if (sel.size(0) != scores.size(0))
    op_fail(op, {{"sel", sel}, {"scores", scores}}, "sel has ", sel.size(0), " tokens, scores has ", scores.size(0));
}

// group_tokens > 0 and a divisor of the N tokens.
void check_groups(const char* op, int64_t group_tokens, const Tensor& sel) {
  if (group_tokens <= 0 || sel.size(0) % group_tokens != 0)
    op_fail(op, {{"sel", sel}}, "routing groups of ", group_tokens, " tokens cannot split ", sel.size(0),
            " tokens: group_tokens must be positive and divide them");
}

void check_f32(const char* op, Operand t, const Shape& shape) {
  require_contiguous(op, {t});
  require_dtype(op, t, DType::f32);
  require_shape(op, t, shape);
}

}  // namespace

void moe_router_scores(Tensor scores, Tensor lse, const Tensor& logits, bool sigmoid) {
  constexpr const char* op = "moe_router_scores";
  require_contiguous(op, {{"logits", logits}});
  require_dtype(op, {"logits", logits}, DType::f32);
  require_ndim(op, {"logits", logits}, 2);
  check_f32(op, {"scores", scores}, logits.shape());
  check_f32(op, {"lse", lse}, Shape{logits.size(0)});
  require_no_overlap(op, {"scores", scores}, {"logits", logits});
  backend_of(op, {{"scores", scores}, {"lse", lse}, {"logits", logits}})
      .moe_router_scores(scores, lse, logits, sigmoid);
}

void moe_capacity(Tensor keep, const Tensor& sel, const Tensor& scores, int64_t group_tokens, int64_t capacity) {
  constexpr const char* op = "moe_capacity";
  check_choices(op, sel, scores);
  check_groups(op, group_tokens, sel);
  require_contiguous(op, {{"keep", keep}});
  require_dtype(op, {"keep", keep}, DType::i32);
  require_same_shape(op, {"keep", keep}, {"sel", sel});
  require_no_overlap(op, {"keep", keep}, {"sel", sel});
  backend_of(op, {{"keep", keep}, {"sel", sel}, {"scores", scores}})
      .moe_capacity(keep, sel, scores, group_tokens, capacity);
}

void moe_assign_rows(Tensor rows, Tensor counts, const Tensor& sel) {
  constexpr const char* op = "moe_assign_rows";
  require_contiguous(op, {{"rows", rows}, {"counts", counts}, {"sel", sel}});
  require_dtype(op, {"rows", rows}, DType::i32), require_dtype(op, {"sel", sel}, DType::i32);
  require_dtype(op, {"counts", counts}, DType::i64);
  require_ndim(op, {"sel", sel}, 2), require_ndim(op, {"counts", counts}, 1);
  require_same_shape(op, {"rows", rows}, {"sel", sel});
  require_no_overlap(op, {"rows", rows}, {"sel", sel});
  backend_of(op, {{"rows", rows}, {"counts", counts}, {"sel", sel}}).moe_assign_rows(rows, counts, sel);
}

void moe_group_stats(Tensor count, Tensor score_sum, const Tensor& sel, const Tensor& scores, int64_t group_tokens,
                     bool sigmoid) {
  constexpr const char* op = "moe_group_stats";
  check_choices(op, sel, scores);
  check_groups(op, group_tokens, sel);
  const Shape shape{sel.size(0) / group_tokens, scores.size(1)};
  check_f32(op, {"count", count}, shape), check_f32(op, {"score_sum", score_sum}, shape);
  require_no_overlap(op, {"count", count}, {"score_sum", score_sum});
  backend_of(op, {{"count", count}, {"score_sum", score_sum}, {"sel", sel}, {"scores", scores}})
      .moe_group_stats(count, score_sum, sel, scores, group_tokens, sigmoid);
}

void moe_router_backward(Tensor dlogits, const MoeRouterGrad& g) {
  constexpr const char* op = "moe_router_backward";
  check_choices(op, g.sel, g.scores);
  const int64_t N = g.scores.size(0), E = g.scores.size(1), k = g.sel.size(1);
  check_f32(op, {"logits", g.logits}, g.scores.shape());
  check_f32(op, {"dlogits", dlogits}, g.scores.shape());
  check_f32(op, {"lse", g.lse}, Shape{N});
  check_f32(op, {"weight", g.weight}, Shape{N, k}), check_f32(op, {"dweight", g.dweight}, Shape{N, k});
  if (g.aux_scale != 0) {
    if (!g.count.defined()) fail(op, ": aux_scale = ", g.aux_scale, " needs the groups' counts (count)");
    if (g.local_tokens <= 0 || N % g.local_tokens != 0 || g.group_tokens < g.local_tokens)
      op_fail(op, {{"scores", g.scores}}, "groups of ", g.local_tokens, " local tokens (", g.group_tokens,
              " in all) cannot split ", N, " tokens");
    check_f32(op, {"count", g.count}, Shape{N / g.local_tokens, E});
  }
  require_grads_apart(op, {{"dlogits", dlogits}},
                      {{"logits", g.logits}, {"scores", g.scores}, {"lse", g.lse}, {"weight", g.weight},
                       {"dweight", g.dweight}});
  backend_of(op, {{"dlogits", dlogits}, {"logits", g.logits}, {"scores", g.scores}, {"lse", g.lse}, {"sel", g.sel},
                  {"weight", g.weight}, {"dweight", g.dweight}, {"count", g.count}})
      .moe_router_backward(dlogits, g);
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
