// Mixture-of-experts row movement (ops.h): gathers and scatters of whole
// rows by the (N, k) row table, one token per loop iteration (each token's
// rows are its own, so tokens run in parallel and every result is the same
// for any thread count). Sums over a token's choices run in j order in f32.
#include <algorithm>
#include <numeric>
#include <span>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/rows.h"
#include "kernels/cpu/scratch.h"

namespace loom::kernels::cpu::LOOM_ISA {
namespace {

// Every row id is -1 or in [0, R), and no row is used twice.
void check_row_ids(const char* op, const Tensor& rows, int64_t R) {
  const int32_t* r = rows.data_as<int32_t>();
  const int64_t k = rows.size(1);
  std::vector<char> used(static_cast<size_t>(R), 0);
  for (int64_t i = 0; i < rows.numel(); ++i) {
    if (r[i] == -1) continue;
    if (r[i] < 0 || r[i] >= R)
      fail(op, ": rows[", i / k, ", ", i % k, "] = ", r[i], " is outside the ", R,
           "-row buffer: allowed -1 (dropped) or [0, ", R, ")");
    if (used[static_cast<size_t>(r[i])]++)
      fail(op, ": rows[", i / k, ", ", i % k, "] = ", r[i], " is used by two choices: each row holds one");
  }
}

bool parallel(int64_t N, int64_t C, int64_t k) { return N * C * k >= kMinParallel; }

}  // namespace

// scores: (N, E)  bias: (E) or undefined  sel, weight: (N, k). One token at
// a time (E is small: 8 to 64 experts), in the calling thread.
void moe_top_k(Tensor sel, Tensor weight, const Tensor& scores, const Tensor& bias, bool normalise) {
  const int64_t N = scores.size(0), E = scores.size(1), k = sel.size(1);
  const float* p = scores.data_as<const float>();
  const float* b = bias.defined() ? bias.data_as<const float>() : nullptr;
  int32_t* s = sel.data_as<int32_t>();
  float* w = weight.data_as<float>();
  int32_t* order = thread_scratch<int32_t>(ScratchSlot::a, static_cast<size_t>(E));
  float* key = thread_scratch<float>(ScratchSlot::b, static_cast<size_t>(E));
  for (int64_t t = 0; t < N; ++t, p += E) {
    for (int64_t e = 0; e < E; ++e) key[e] = p[e] + (b != nullptr ? b[e] : 0.f);
    std::iota(order, order + E, 0);
    std::partial_sort(order, order + k, order + E,
                      [&](int32_t x, int32_t y) { return key[x] > key[y] || (key[x] == key[y] && x < y); });
    double sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += p[order[j]];
    for (int64_t j = 0; j < k; ++j) {
      s[t * k + j] = order[j];
      w[t * k + j] = static_cast<float>(normalise ? p[order[j]] / sum : p[order[j]]);
    }
  }
}

void moe_dispatch(Tensor xs, const Tensor& x, const Tensor& rows) {
  check_row_ids("moe_dispatch", rows, xs.size(0));
  const int64_t N = x.size(0), C = x.size(1), k = rows.size(1);
  const int32_t* r = rows.data_as<int32_t>();
  const size_t bytes = static_cast<size_t>(C) * dtype_size(x.dtype());
  const char* src = static_cast<const char*>(x.data());
  char* dst = static_cast<char*>(xs.data());
#pragma omp parallel for schedule(static) if (parallel(N, C, k))
  for (int64_t t = 0; t < N; ++t)
    for (int64_t j = 0; j < k; ++j)
      if (const int32_t row = r[t * k + j]; row >= 0) std::copy_n(src + t * bytes, bytes, dst + row * bytes);
}

void moe_dispatch_backward(Tensor dx, const Tensor& dxs, const Tensor& rows) {
  check_row_ids("moe_dispatch_backward", rows, dxs.size(0));
  const int64_t N = dx.size(0), C = dx.size(1), k = rows.size(1);
  const int32_t* r = rows.data_as<int32_t>();
  const float* src = dxs.data_as<float>();
  float* dst = dx.data_as<float>();
#pragma omp parallel for schedule(static) if (parallel(N, C, k))
  for (int64_t t = 0; t < N; ++t)
    for (int64_t j = 0; j < k; ++j)
      if (const int32_t row = r[t * k + j]; row >= 0) {
        const float* g = src + row * C;
        float* o = dst + t * C;
        for (int64_t c = 0; c < C; ++c) o[c] += g[c];
      }
}

void moe_combine(Tensor y, const Tensor& ys, const Tensor& rows, const Tensor& weight) {
  check_row_ids("moe_combine", rows, ys.size(0));
  const int64_t N = y.size(0), C = y.size(1), k = rows.size(1);
  const int32_t* r = rows.data_as<int32_t>();
  const float* w = weight.data_as<float>();
#pragma omp parallel for schedule(static) if (parallel(N, C, k))
  for (int64_t t = 0; t < N; ++t) {
    std::vector<float> acc(static_cast<size_t>(C), 0.f), buf(static_cast<size_t>(C));
    for (int64_t j = 0; j < k; ++j) {
      const int32_t row = r[t * k + j];
      if (row < 0) continue;
      const float* v = load_row(ys, row, C, buf.data());
      const float wj = w[t * k + j];
      for (int64_t c = 0; c < C; ++c) acc[static_cast<size_t>(c)] += wj * v[c];
    }
    store_span(y, t * C, C, acc.data(), Store::write);
  }
}

void moe_combine_backward(Tensor dys, Tensor dweight, const Tensor& dy, const Tensor& ys, const Tensor& rows,
                          const Tensor& weight) {
  check_row_ids("moe_combine_backward", rows, ys.size(0));
  const int64_t N = dy.size(0), C = dy.size(1), k = rows.size(1);
  const int32_t* r = rows.data_as<int32_t>();
  const float* w = weight.data_as<float>();
  const float* g = dy.data_as<float>();
  float* dst = dys.data_as<float>();
  float* dw = dweight.data_as<float>();
#pragma omp parallel for schedule(static) if (parallel(N, C, k))
  for (int64_t t = 0; t < N; ++t) {
    std::vector<float> buf(static_cast<size_t>(C));
    const float* gt = g + t * C;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t row = r[t * k + j];
      if (row < 0) {
        dw[t * k + j] = 0.f;
        continue;
      }
      const float* v = load_row(ys, row, C, buf.data());
      const float wj = w[t * k + j];
      double dot = 0;
      float* o = dst + static_cast<int64_t>(row) * C;
      for (int64_t c = 0; c < C; ++c) {
        dot += static_cast<double>(gt[c]) * v[c];
        o[c] = wj * gt[c];
      }
      dw[t * k + j] = static_cast<float>(dot);
    }
  }
}

// The experts' GEMMs: the backend's linear over each group's rows (oneDNN,
// itself threaded); empty groups cost nothing.
void grouped_linear_forward(Tensor y, const Tensor& x, std::span<const Tensor> w, std::span<const int64_t> offsets,
                            bool invariant) {
  for (size_t g = 0; g < w.size(); ++g) {
    const int64_t n = offsets[g + 1] - offsets[g];
    if (n == 0) continue;
    const Tensor yg = y.slice(0, offsets[g], n), xg = x.slice(0, offsets[g], n);
    if (invariant) linear_forward_invariant(yg, xg, w[g], Tensor());
    else linear_forward(yg, xg, w[g], Tensor());
  }
}

void grouped_linear_backward(Tensor dx, std::span<const Tensor> dw, const Tensor& dy, const Tensor& x,
                             std::span<const Tensor> w, std::span<const int64_t> offsets) {
  for (size_t g = 0; g < w.size(); ++g) {
    const int64_t at = offsets[g], n = offsets[g + 1] - offsets[g];
    if (n == 0) continue;
    linear_backward(dx.defined() ? dx.slice(0, at, n) : Tensor(), dw.empty() ? Tensor() : dw[g], Tensor(),
                    dy.slice(0, at, n), x.slice(0, at, n), w[g]);
  }
}

}  // namespace loom::kernels::cpu::LOOM_ISA
