// Attention (ops.h): operand checks, then the backend's op.
#include "kernels/dispatch.h"
#include "kernels/ops.h"

namespace loom::kernels {
namespace {

// (b, t) rows of heads contiguous: stride 1 along HS and HS along heads
// (a dim of extent 1 may have any stride).
void require_rows_of_heads(const char* op, Operand x) {
  const Tensor& t = x.t;
  const bool ok = (t.size(3) <= 1 || t.stride(3) == 1) && (t.size(2) <= 1 || t.stride(2) == t.size(3));
  if (!ok)
    op_fail(op, {x}, x.name, "'s rows of heads must be contiguous: strides along (heads, HS) must be (", t.size(3),
            ", 1), got (", t.stride(2), ", ", t.stride(3), ")");
}

// q: (B, Tq, NH, HS) float  k, v: (B, Tk, NKV, HS) in q's dtype, NH % NKV
// == 0, each (b, t) row of heads contiguous; Tk >= Tq for kQueriesLast, else
// q_pos >= 0.
void check_qkv(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, int64_t q_pos) {
  const std::initializer_list<Operand> all = {{"q", q}, {"k", k}, {"v", v}};
  for (const Operand& o : all) {
    if (!o.t.defined()) op_fail(op, {o}, o.name, " is required");
    require_ndim(op, o, 4);
  }
  require_float(op, {"q", q});
  require_dtype(op, {"k", k}, q.dtype());
  require_dtype(op, {"v", v}, q.dtype());
  require_same_shape(op, {"k", k}, {"v", v});
  const int64_t B = q.size(0), Tq = q.size(1), NH = q.size(2), HS = q.size(3), Tk = k.size(1), NKV = k.size(2);
  if (k.size(0) != B) op_fail(op, all, "q has batch ", B, " but k has batch ", k.size(0));
  if (k.size(3) != HS) op_fail(op, all, "q has head size ", HS, " but k has head size ", k.size(3));
  if (HS < 1) op_fail(op, all, "head size must be at least 1");
  if (NKV < 1 || NH % NKV != 0)
    op_fail(op, all, "q has ", NH, " heads, not a multiple of the ", NKV, " kv heads of k and v");
  if (q_pos == kQueriesLast && Tk < Tq)
    op_fail(op, all, "k has ", Tk, " positions, fewer than the ", Tq, " queries of q");
  if (q_pos != kQueriesLast && q_pos < 0)
    op_fail(op, all, "q_pos = ", q_pos, ": the first query's position must be at least 0 (or kQueriesLast)");
  for (const Operand& o : all) require_rows_of_heads(op, o);
}

}  // namespace

// out: (B, Tq, NH, HS) like q, contiguous   lse: (B, NH, Tq) f32 or undefined
void attention_forward(Tensor out, Tensor lse, const Tensor& q, const Tensor& k, const Tensor& v, int64_t q_pos) {
  constexpr const char* op = "attention_forward";
  check_qkv(op, q, k, v, q_pos);
  require_contiguous(op, {{"out", out}});
  require_dtype(op, {"out", out}, q.dtype());
  require_shape(op, {"out", out}, q.shape());
  if (lse.defined()) {
    require_contiguous(op, {{"lse", lse}});
    require_dtype(op, {"lse", lse}, DType::f32);
    require_shape(op, {"lse", lse}, Shape{q.size(0), q.size(2), q.size(1)});
  }
  backend_of(op, {{"out", out}, {"lse", lse}, {"q", q}, {"k", k}, {"v", v}}).attention_forward(out, lse, q, k, v, q_pos);
}

// dq: like q  dk, dv: like k  (f32 or the input's dtype, contiguous, or undefined)
// dout, out: (B, Tq, NH, HS) contiguous   lse: (B, NH, Tq) f32 from attention_forward
void attention_backward(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& out, const Tensor& lse, int64_t q_pos) {
  constexpr const char* op = "attention_backward";
  check_qkv(op, q, k, v, q_pos);
  require_contiguous(op, {{"dout", dout}, {"out", out}, {"lse", lse}});
  require_float(op, {"out", out});
  require_same_shape(op, {"out", out}, {"q", q});
  require_same_shape(op, {"dout", dout}, {"q", q});
  require_grad_dtype(op, {"dout", dout}, out.dtype());
  require_dtype(op, {"lse", lse}, DType::f32);
  require_shape(op, {"lse", lse}, Shape{q.size(0), q.size(2), q.size(1)});
  require_grad(op, {"dq", dq}, {"q", q});
  require_grad(op, {"dk", dk}, {"k", k});
  require_grad(op, {"dv", dv}, {"v", v});
  require_grads_apart(op, {{"dq", dq}, {"dk", dk}, {"dv", dv}},
                      {{"dout", dout}, {"q", q}, {"k", k}, {"v", v}, {"out", out}, {"lse", lse}});
  backend_of(op, {{"dq", dq}, {"dk", dk}, {"dv", dv}, {"dout", dout}, {"q", q}, {"k", k}, {"v", v}, {"out", out},
                  {"lse", lse}})
      .attention_backward(dq, dk, dv, dout, q, k, v, out, lse, q_pos);
}

void attention_merge(Tensor acc, Tensor acc_lse, const Tensor& out, const Tensor& lse) {
  constexpr const char* op = "attention_merge";
  require_contiguous(op, {{"acc", acc}, {"acc_lse", acc_lse}, {"out", out}, {"lse", lse}});
  for (const Operand& o : {Operand{"acc", acc}, Operand{"acc_lse", acc_lse}, Operand{"out", out}, Operand{"lse", lse}})
    require_dtype(op, o, DType::f32);
  require_ndim(op, {"acc", acc}, 4);
  require_shape(op, {"out", out}, acc.shape());
  const Shape rows{acc.size(0), acc.size(2), acc.size(1)};
  require_shape(op, {"acc_lse", acc_lse}, rows);
  require_shape(op, {"lse", lse}, rows);
  backend_of(op, {{"acc", acc}, {"acc_lse", acc_lse}, {"out", out}, {"lse", lse}}).attention_merge(acc, acc_lse, out, lse);
}

}  // namespace loom::kernels
