// CPU matmul and linear (ops.h, checked by ../ops_linear.cpp): the backward
// formulas and the bias gradient here; every GEMM goes to oneDNN
// (matmul_onednn.cpp).
//
// Backend choice, measured on this project's machine (AMD EPYC Zen 4, 2
// threads, GFLOP/s, best of 2 runs of `loom bench kernels --openblas`;
// BENCHMARKS.md has the commands and every case):
//   f32   oneDNN 2.6.3 brgemm avx512_core vs OpenBLAS 0.3.21 cblas_sgemm:
//           2048^3                              214 vs 200
//           GPT-2 fc fwd (512x768 @ 768x3072)   219 vs 209
//           GPT-2 lm-head dW (50257x512^T @ 512x768)  203 vs 209
//         over the 18 f32 cases oneDNN / OpenBLAS is 0.95-1.10 (median
//         1.05): a tie within the machine's run-to-run noise (up to 17%);
//         both run near the 2 cores' f32 FMA peak.
//   bf16  oneDNN only: Debian's OpenBLAS 0.3.21 is built without
//         BUILD_BFLOAT16, so cblas_sbgemm is declared in <cblas.h> but not
//         exported by libopenblas.so.0 (it does not link). oneDNN runs brgemm
//         avx512_core_bf16 (vdpbf16ps, f32 accumulation): 423 at 2048^3,
//         1.97x its f32.
//   f16   oneDNN 2.6 has no f16 matmul on this CPU (primitive creation is
//         unimplemented: it needs AVX512-FP16), and OpenBLAS has no hgemm. So
//         f16 operands are widened to f32 in scratch and the f32 GEMM runs
//         (f32 accumulation, exact products): 197-204 at 2048^3 against
//         201-213 for f32 in the same runs (the widening costs ~3%). Not
//         bf16: that would throw away 3 of f16's 11 significand bits.
// So oneDNN for every dtype: one backend, one primitive cache, one code path
// to test, and f32 on par with OpenBLAS.
//
// Accumulation: beta = 1 is oneDNN's sum post-op, which reads c in its own
// dtype (f32 or bf16), adds in f32 and writes back, so the += convention of
// the backward ops needs no temporary. Two per-thread workspaces (scratch.h
// slots a and b) remain:
// (1) a backward GEMM whose operands mix f32 and bf16 (dc or dy is f32 while
// a, b, x, w are bf16, e.g. the f32 logits of a bf16 LM head) first rounds
// the f32 operand to bf16, as PyTorch autocast does, because oneDNN's bf16
// GEMM takes both inputs in bf16 (f16 operands instead are all widened to
// f32 in slot a, see gemm_widened); (2) the bf16 or f16 gradient of an operand
// shared by every batch sums the per-batch GEMMs in f32 and is rounded once.
#include <algorithm>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/matmul_onednn.h"
#include "kernels/cpu/rows.h"
#include "kernels/cpu/scratch.h"

namespace loom::kernels::cpu::LOOM_ISA {
namespace {

int64_t leading(const Tensor& t) {  // product of all but the last two dims
  int64_t n = 1;
  for (int d = 0; d + 2 < t.ndim(); ++d) n *= t.size(d);
  return n;
}

// t: (..., C) -> (prod(...), C); explicit extents, so empty tensors work too.
Tensor as_matrix(const Tensor& t) {
  int64_t rows = 1;
  for (int d = 0; d + 1 < t.ndim(); ++d) rows *= t.size(d);
  return t.reshape({rows, t.size(-1)});
}

// f32 -> bf16 copy of a GEMM operand whose partner is bf16 (see the top).
// Uses scratch slot a (accumulate holds slot b around it).
Tensor bf16_workspace(const Tensor& t) {
  const int64_t n = t.numel();
  const float* src = t.data_as<float>();
  bf16* dst = thread_scratch<bf16>(ScratchSlot::a, static_cast<size_t>(n));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i] = to_bf16(src[i]);
  return Tensor(dst, DType::bf16, t.shape());
}

void gemm(Tensor c, Tensor a, Tensor b, bool ta, bool tb, float alpha, float beta, const Tensor& bias = {});

// The 16-bit dtype GEMMs take through f32: f16 always, bf16 where oneDNN
// has no bf16 GEMM (below AVX-512).
bool widened(const Tensor& t) {
  if (!t.defined()) return false;
  if (t.dtype() == DType::f16) return true;
  return t.dtype() == DType::bf16 && !onednn_bf16_unsupported_reason().empty();
}

// dst = src as f32 (src f16 or bf16, contiguous), in parallel when large.
void widen_half(float* dst, const Tensor& src) {
  constexpr int64_t kPiece = 4096;
  const int64_t n = src.numel(), pieces = (n + kPiece - 1) / kPiece;
  dispatch_float(src.dtype(), [&]<typename T>() {
    const T* s = src.data_as<const T>();
#pragma omp parallel for schedule(static) if (n >= kMinParallel)
    for (int64_t p = 0; p < pieces; ++p)
      span_to_f32(dst + p * kPiece, s + p * kPiece, std::min(kPiece, n - p * kPiece));
  });
}

// The widened GEMM (see the top): every f16 operand, and every bf16 one
// without a bf16 GEMM, is widened to f32 in one scratch request (slot a;
// accumulate holds slot b around it), the f32 GEMM runs, and a 16-bit c is
// rounded once from its f32 result (which started from c itself when beta
// != 0, as oneDNN's sum post-op reads c).
void gemm_widened(Tensor c, Tensor a, Tensor b, bool ta, bool tb, float alpha, float beta, Tensor bias) {
  // An f32 operand beside a bf16 one is rounded to bf16 values first, as the
  // bf16 GEMM's path rounds it (gemm): the same gradient at every level.
  const bool round_a = a.dtype() == DType::f32 && b.dtype() == DType::bf16;
  const bool round_b = a.dtype() == DType::bf16 && b.dtype() == DType::f32;
  const auto need = [](const Tensor& t, bool round = false) { return widened(t) || round ? t.numel() : int64_t{0}; };
  const int64_t na = need(a, round_a), nb = need(b, round_b), nc = need(c), nbias = need(bias);
  float* ws = thread_scratch<float>(ScratchSlot::a, static_cast<size_t>(na + nb + nc + nbias));
  const auto widen = [&](Tensor& t, int64_t n, bool round = false) {
    if (round) {
      const float* src = t.data_as<const float>();
#pragma omp parallel for schedule(static) if (n >= kMinParallel)
      for (int64_t i = 0; i < n; ++i) ws[i] = from_bf16(to_bf16(src[i]));
    } else if (widened(t)) {  // (an empty 16-bit operand too: it must leave as f32, or gemm comes back here)
      widen_half(ws, t);
    } else {
      return;
    }
    t = Tensor(ws, DType::f32, t.shape());
    ws += n;
  };
  const Tensor c16 = c;  // c's own memory and dtype
  if (widened(c) && beta == 0.f) {  // c's old contents are not read
    c = Tensor(ws, DType::f32, c.shape());
    ws += nc;
  } else {
    widen(c, nc);
  }
  widen(a, na, round_a);
  widen(b, nb, round_b);
  widen(bias, nbias);
  gemm(c, a, b, ta, tb, alpha, beta, bias);
  if (!nc) return;
  const float* r = c.data_as<const float>();
  constexpr int64_t kPiece = 4096;
  const int64_t pieces = (nc + kPiece - 1) / kPiece;
  dispatch_float(c16.dtype(), [&]<typename T>() {
    T* out = c16.data_as<T>();
#pragma omp parallel for schedule(static) if (nc >= kMinParallel)
    for (int64_t p = 0; p < pieces; ++p)
      span_from_f32(out + p * kPiece, r + p * kPiece, std::min(kPiece, nc - p * kPiece));
  });
}

// c = alpha * op(a) @ op(b) (+ bias) + beta * c on validated operands; a and
// b may mix f32 and bf16 (backward), the f32 one is then rounded to bf16, or
// f32 and f16 (widened to f32 by gemm_widened, as is anything f16, and
// bf16 without a bf16 GEMM).
void gemm(Tensor c, Tensor a, Tensor b, bool ta, bool tb, float alpha, float beta, const Tensor& bias) {
  if (widened(a) || widened(b) || widened(c) || widened(bias))
    return gemm_widened(c, a, b, ta, tb, alpha, beta, bias);
  if (a.dtype() == DType::f32 && b.dtype() == DType::bf16) a = bf16_workspace(a);
  if (a.dtype() == DType::bf16 && b.dtype() == DType::f32) b = bf16_workspace(b);
  Gemm g;
  g.c = c.data();
  g.a = a.data();
  g.b = b.data();
  g.bias = bias.defined() ? bias.data() : nullptr;
  g.ab = a.dtype();
  g.c_dtype = c.dtype();
  g.bias_dtype = bias.dtype();
  g.batch = leading(c);
  g.m = c.size(-2);
  g.n = c.size(-1);
  g.k = a.size(ta ? -2 : -1);
  g.a_batched = a.ndim() > 2;
  g.b_batched = b.ndim() > 2;
  g.trans_a = ta;
  g.trans_b = tb;
  g.alpha = alpha;
  g.beta = beta;
  gemm_run(g);
}

Tensor matrix_of_batch(const Tensor& t, int64_t i) {  // t: (..., R, C) -> batch i as (R, C)
  if (t.ndim() == 2) return t;
  return t.reshape({leading(t), t.size(-2), t.size(-1)}).slice(0, i, 1).reshape({t.size(-2), t.size(-1)});
}

// out += alpha * op(x) @ op(y). When out is one matrix but x and y are
// batched (the gradient of an operand shared across batches), the batches'
// products are summed into out.
void accumulate(Tensor out, const Tensor& x, const Tensor& y, bool tx, bool ty, float alpha) {
  if (out.ndim() > 2 || (x.ndim() == 2 && y.ndim() == 2)) return gemm(out, x, y, tx, ty, alpha, 1.f);
  if (tx && !ty && x.ndim() > 2 && y.ndim() > 2) {
    // sum_i x_i^T y_i = [x_0; x_1; ...]^T [y_0; y_1; ...]: one GEMM, K = batch * rows.
    return gemm(out, as_matrix(x), as_matrix(y), true, false, alpha, 1.f);
  }
  // One GEMM per batch, += into out. A bf16 or f16 out would be rounded
  // after each batch, so the sum goes through an f32 workspace and is
  // rounded once.
  Tensor sum = out;
  float* workspace = nullptr;
  if (out.dtype() != DType::f32) {
    workspace = thread_scratch<float>(ScratchSlot::b, static_cast<size_t>(out.numel()));
    std::fill_n(workspace, out.numel(), 0.f);
    sum = Tensor(workspace, DType::f32, out.shape());
  }
  const int64_t batch = std::max(leading(x), leading(y));
  for (int64_t i = 0; i < batch; ++i)
    gemm(sum, matrix_of_batch(x, i), matrix_of_batch(y, i), tx, ty, alpha, 1.f);
  if (out.dtype() != DType::f32)
    dispatch_float(out.dtype(), [&]<typename T>() { span_add_f32(out.data_as<T>(), workspace, out.numel()); });
}

template <typename TD, typename TB>
void bias_grad(TB* dbias, const TD* dy, int64_t rows, int64_t oc) {
  constexpr int64_t kBlock = 128;  // columns per task: the partial sums stay in registers/L1
  const int64_t blocks = (oc + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t c0 = blk * kBlock, len = std::min(kBlock, oc - c0);
    float acc[kBlock] = {};
    for (int64_t r = 0; r < rows; ++r) {
      const TD* row = dy + r * oc + c0;
      for (int64_t j = 0; j < len; ++j) acc[j] += to_f32(row[j]);
    }
    for (int64_t j = 0; j < len; ++j) dbias[c0 + j] = from_f32<TB>(to_f32(dbias[c0 + j]) + acc[j]);
  }
}

}  // namespace

void matmul(Tensor c, const Tensor& a, const Tensor& b, const MatmulOpts& opts) {
  gemm(c, a, b, opts.trans_a, opts.trans_b, opts.alpha, opts.beta);
}

// c = alpha op(a) op(b):  d op(a) = alpha dc op(b)^T,  d op(b) = alpha op(a)^T dc;
// with trans_a (trans_b) the gradient of a (b) is the transpose of that.
void matmul_backward(Tensor da, Tensor db, const Tensor& dc, const Tensor& a, const Tensor& b,
                     const MatmulOpts& opts) {
  const float alpha = opts.alpha;
  if (da.defined()) {
    if (!opts.trans_a) accumulate(da, dc, b, false, !opts.trans_b, alpha);  // da = dc op(b)^T
    else accumulate(da, b, dc, opts.trans_b, true, alpha);                  // da = op(b) dc^T
  }
  if (db.defined()) {
    if (!opts.trans_b) accumulate(db, a, dc, !opts.trans_a, false, alpha);  // db = op(a)^T dc
    else accumulate(db, dc, a, true, opts.trans_a, alpha);                  // db = dc^T op(a)
  }
}

// y (N, OC) = x (N, IC) @ w^T (IC, OC) + bias
void linear_forward(Tensor y, const Tensor& x, const Tensor& w, const Tensor& bias) {
  gemm(as_matrix(y), as_matrix(x), w, false, true, 1.f, 0.f, bias);
}

// The GEMM, then the activation: the two ops' bits (the CUDA backend fuses
// them into the GEMM's epilogue, where the sum would otherwise go out to
// memory and back).
void linear_gelu_forward(Tensor y, Tensor pre, const Tensor& x, const Tensor& w, const Tensor& bias) {
  linear_forward(pre, x, w, bias);
  gelu_forward(y, pre);
}

void linear_backward(Tensor dx, Tensor dw, Tensor dbias, const Tensor& dy, const Tensor& x, const Tensor& w) {
  const int64_t oc = w.size(0);
  const Tensor dy2 = as_matrix(dy);  // (N, OC)
  // Would gemm round an f32 dy to bf16 for the GEMM into out with `other`?
  const auto rounds = [&](const Tensor& out, const Tensor& other) {
    return out.defined() && dy2.dtype() == DType::f32 && other.dtype() == DType::bf16 && !widened(out) &&
           !widened(other);
  };
  // Where both GEMMs would, dy is rounded once, here: the same bits, one
  // pass over dy fewer (a bf16 run's every linear but the LM head).
  const Tensor dy_ab = rounds(dx, w) && rounds(dw, x) ? bf16_workspace(dy2) : dy2;
  if (dx.defined()) gemm(as_matrix(dx), dy_ab, w, false, false, 1.f, 1.f);  // dx += dy @ w
  if (dw.defined()) gemm(dw, dy_ab, as_matrix(x), true, false, 1.f, 1.f);   // dw += dy^T @ x
  if (dbias.defined()) {
    dispatch_float(dy.dtype(), [&]<typename TD>() {
      dispatch_float(dbias.dtype(), [&]<typename TB>() {
        bias_grad(dbias.data_as<TB>(), dy.data_as<TD>(), dy2.size(0), oc);
      });
    });
  }
}

}  // namespace loom::kernels::cpu::LOOM_ISA
