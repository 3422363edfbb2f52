// LayerNorm (GPT-2) and RMSNorm (Llama) over the last dim, forward and
// backward (ops.h). Rows are independent: each row is loaded as f32 (the
// tensor's own memory when it is f32, a per-thread buffer when it is bf16 or f16),
// computed in f32, then stored in the operand's dtype.
//
// dw/db are sums over rows. They are reduced deterministically: rows are cut
// into at most kMaxBlocks fixed blocks (a function of N only, not of the
// thread count), each block sums its rows in order into its own partial row,
// and the partials are added in block order. So every run gives the same
// bits for any thread count or schedule.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/lane_sum.h"
#include "kernels/cpu/rows.h"
#include "kernels/cpu/scratch.h"

namespace loom::kernels::cpu::LOOM_ISA {
namespace {

constexpr int64_t kMaxBlocks = 64;
constexpr int64_t kColChunk = 256;  // columns per task when combining partials

// Fixed row blocks: block k covers [begin(k), begin(k + 1)).
struct RowBlocks {
  int64_t n_rows, n_blocks;
  explicit RowBlocks(int64_t rows) : n_rows(rows), n_blocks(std::min(rows, kMaxBlocks)) {}
  int64_t begin(int64_t k) const { return k * n_rows / n_blocks; }
};

// grads[g] += sum over blocks of partial[k][g] (in block order), for each
// defined gradient g. partial: (n_blocks, n_grads, C) f32.
void add_partials(std::initializer_list<Tensor> grads, const float* partial, int64_t n_blocks, int64_t C) {
  const int64_t n_grads = static_cast<int64_t>(grads.size());
  const int64_t n_chunks = (C + kColChunk - 1) / kColChunk;
#pragma omp parallel for collapse(2) schedule(static) if (n_blocks * n_grads * C >= kMinParallel)
  for (int64_t g = 0; g < n_grads; ++g) {
    for (int64_t chunk = 0; chunk < n_chunks; ++chunk) {
      const Tensor& grad = grads.begin()[g];
      if (!grad.defined()) continue;
      const int64_t c0 = chunk * kColChunk, n = std::min(kColChunk, C - c0);
      float acc[kColChunk] = {};
      for (int64_t k = 0; k < n_blocks; ++k) {
        const float* p = partial + (k * n_grads + g) * C + c0;
        for (int64_t i = 0; i < n; ++i) acc[i] += p[i];
      }
      store_span(grad, c0, n, acc, Store::add);
    }
  }
}

// n_rows f32 rows of C floats for each thread of a region, reserved by the
// calling thread before the region in its scratch slot b (slot a holds the
// backward's partial sums). Inside the region, mine() gives the thread's rows.
class ScratchRows {
 public:
  struct Rows {
    float* buf;
    int64_t C;
    float* row(int64_t i) const { return buf + i * C; }
  };
  ScratchRows(int64_t n_rows, int64_t C) : slices_(ScratchSlot::b, static_cast<size_t>(n_rows * C)), C_(C) {}
  Rows mine() const { return {slices_.mine(), C_}; }

 private:
  ThreadSlices<float> slices_;
  int64_t C_;
};

// One row of LayerNorm: yr = (xr - m) * rs * wf + bf, m and rs its mean and
// 1 / std. Sums in a fixed 16-lane order (lane_sum.h): the same bits at every
// instruction-set level, as serving needs; two passes: no cancellation for
// rows with a large mean.
void layernorm_row(float* yr, float& m, float& rs, const float* xr, const float* wf, const float* bf, float eps,
                   int64_t C) {
  m = lanes_sum(xr, C, [](auto v) { return v; }) / static_cast<float>(C);
  const float var = lanes_sum(xr, C, [m](auto v) {
    const auto d = v - m;
    return d * d;
  });
  rs = 1.f / std::sqrt(var / static_cast<float>(C) + eps);
  for (int64_t i = 0; i < C; ++i) yr[i] = (xr[i] - m) * rs * wf[i] + (bf ? bf[i] : 0.f);
}

// One row of RMSNorm: yr = wf * (xr * rs), rs = 1 / sqrt(mean(xr^2) + eps).
void rmsnorm_row(float* yr, float& rs, const float* xr, const float* wf, float eps, int64_t C) {
  const float ss = lanes_sum(xr, C, [](auto v) { return v * v; });  // fixed order (layernorm_row)
  rs = 1.f / std::sqrt(ss / static_cast<float>(C) + eps);
  for (int64_t i = 0; i < C; ++i) yr[i] = wf[i] * (xr[i] * rs);
}

// The fused residual's row r: sum = a + b, stored rounded to sum's dtype as
// add stores it, and returned as the norm reads it back (s.row(0..2) used).
const float* residual_row(Tensor sum, const Tensor& a, const Tensor& b, int64_t r, int64_t C,
                          const ScratchRows::Rows& s) {
  const float* ar = load_row(a, r, C, s.row(0));
  const float* br = load_row(b, r, C, s.row(1));
  float* sr = s.row(2);
  for (int64_t i = 0; i < C; ++i) sr[i] = ar[i] + br[i];
  store_span(sum, r * C, C, sr, Store::write);
  return load_row(sum, r, C, s.row(0));
}

// LayerNorm over rows [0, N), row r's input from x_of(r, rows) (rows: this
// thread's scratch, rows 0-2 free for it).
template <typename XOf>
void layernorm_rows(Tensor y, Tensor mean, Tensor rstd, const Tensor& w, const Tensor& b, float eps, int64_t N,
                    int64_t C, XOf x_of) {
  const ScratchRows scratch(6, C);  // x (or a, b, sum), w, b, y
#pragma omp parallel if (N * C >= kMinParallel)
  {
    const ScratchRows::Rows s = scratch.mine();
    const float* wf = load_row(w, 0, C, s.row(3));
    const float* bf = b.defined() ? load_row(b, 0, C, s.row(4)) : nullptr;
    float* yr = s.row(5);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < N; ++r) {
      float m = 0, rs = 0;
      layernorm_row(yr, m, rs, x_of(r, s), wf, bf, eps, C);
      store_span(y, r * C, C, yr, Store::write);
      if (mean.defined()) mean.data_as<float>()[r] = m;
      if (rstd.defined()) rstd.data_as<float>()[r] = rs;
    }
  }
}

// RMSNorm over rows [0, N), as layernorm_rows.
template <typename XOf>
void rmsnorm_rows(Tensor y, Tensor rstd, const Tensor& w, float eps, int64_t N, int64_t C, XOf x_of) {
  const ScratchRows scratch(5, C);  // x (or a, b, sum), w, y
#pragma omp parallel if (N * C >= kMinParallel)
  {
    const ScratchRows::Rows s = scratch.mine();
    const float* wf = load_row(w, 0, C, s.row(3));
    float* yr = s.row(4);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < N; ++r) {
      float rs = 0;
      rmsnorm_row(yr, rs, x_of(r, s), wf, eps, C);
      store_span(y, r * C, C, yr, Store::write);
      if (rstd.defined()) rstd.data_as<float>()[r] = rs;
    }
  }
}

}  // namespace

// ---- LayerNorm ------------------------------------------------------------------

// x, y: (..., C)  w: (C)  b: (C) or undefined (no bias)  mean, rstd: one f32
// per row of x ((N) or x's leading shape), or undefined (inference).
void layernorm_forward(Tensor y, Tensor mean, Tensor rstd, const Tensor& x, const Tensor& w, const Tensor& b,
                       float eps) {
  const int64_t C = x.size(-1);
  layernorm_rows(y, mean, rstd, w, b, eps, rows(x), C,
                 [&](int64_t r, const ScratchRows::Rows& s) { return load_row(x, r, C, s.row(0)); });
}

void add_layernorm_forward(Tensor sum, Tensor y, Tensor mean, Tensor rstd, const Tensor& a, const Tensor& b,
                           const Tensor& w, const Tensor& bias, float eps) {
  const int64_t C = sum.size(-1);
  layernorm_rows(y, mean, rstd, w, bias, eps, rows(sum), C,
                 [&](int64_t r, const ScratchRows::Rows& s) { return residual_row(sum, a, b, r, C, s); });
}

// xhat = (x - mean) * rstd, g = w * dy:
//   dx += rstd * (g - mean(g) - xhat * mean(g * xhat))   dw += dy * xhat   db += dy
void layernorm_backward(Tensor dx, Tensor dw, Tensor db, const Tensor& dy, const Tensor& x, const Tensor& w,
                        const Tensor& mean, const Tensor& rstd) {
  const int64_t C = x.size(-1), N = rows(x);
  const RowBlocks blocks(N);
  const bool want_params = dw.defined() || db.defined();
  // (n_blocks, 2, C): each block's dw and db sums, zeroed and written by the thread that owns
  // the block.
  const int64_t n_partial = want_params ? blocks.n_blocks * 2 * C : 0;
  float* partial = thread_scratch<float>(ScratchSlot::a, static_cast<size_t>(n_partial));
  const ScratchRows scratch(4, C);  // x, dy, w, dx
#pragma omp parallel if (N * C >= kMinParallel)
  {
    const ScratchRows::Rows s = scratch.mine();
    const float* wf = load_row(w, 0, C, s.row(2));
    float* g = s.row(3);
#pragma omp for schedule(static)
    for (int64_t k = 0; k < blocks.n_blocks; ++k) {
      float* pdw = want_params ? partial + k * 2 * C : nullptr;
      float* pdb = want_params ? pdw + C : nullptr;
      if (want_params) std::fill_n(pdw, 2 * C, 0.f);
      for (int64_t r = blocks.begin(k); r < blocks.begin(k + 1); ++r) {
        const float* xr = load_row(x, r, C, s.row(0));
        const float* dyr = load_row(dy, r, C, s.row(1));
        const float m = mean.data_as<float>()[r], rs = rstd.data_as<float>()[r];
        if (want_params) {
          for (int64_t i = 0; i < C; ++i) {
            pdw[i] += dyr[i] * ((xr[i] - m) * rs);
            pdb[i] += dyr[i];
          }
        }
        if (!dx.defined()) continue;
        float sum_g = 0.f, sum_gx = 0.f;
#pragma omp simd reduction(+ : sum_g, sum_gx)
        for (int64_t i = 0; i < C; ++i) {
          const float gi = wf[i] * dyr[i];
          sum_g += gi;
          sum_gx += gi * ((xr[i] - m) * rs);
        }
        const float mg = sum_g / static_cast<float>(C), mgx = sum_gx / static_cast<float>(C);
        for (int64_t i = 0; i < C; ++i) g[i] = rs * (wf[i] * dyr[i] - mg - (xr[i] - m) * rs * mgx);
        store_span(dx, r * C, C, g, Store::add);
      }
    }
  }
  if (want_params) add_partials({dw, db}, partial, blocks.n_blocks, C);
}

// ---- RMSNorm ---------------------------------------------------------------------

// Hugging Face LlamaRMSNorm in f32: y = w * (x * rstd), rstd = 1 / sqrt(mean(x^2) + eps).
void rmsnorm_forward(Tensor y, Tensor rstd, const Tensor& x, const Tensor& w, float eps) {
  const int64_t C = x.size(-1);
  rmsnorm_rows(y, rstd, w, eps, rows(x), C,
               [&](int64_t r, const ScratchRows::Rows& s) { return load_row(x, r, C, s.row(0)); });
}

void add_rmsnorm_forward(Tensor sum, Tensor y, Tensor rstd, const Tensor& a, const Tensor& b, const Tensor& w,
                         float eps) {
  const int64_t C = sum.size(-1);
  rmsnorm_rows(y, rstd, w, eps, rows(sum), C,
               [&](int64_t r, const ScratchRows::Rows& s) { return residual_row(sum, a, b, r, C, s); });
}

// dx += rstd * w * dy - x * rstd^3 * mean(w * dy * x)   dw += dy * x * rstd
void rmsnorm_backward(Tensor dx, Tensor dw, const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd) {
  const int64_t C = x.size(-1), N = rows(x);
  const RowBlocks blocks(N);
  // (n_blocks, C): each block's dw sum, zeroed and written by the thread that owns the block.
  const int64_t n_partial = dw.defined() ? blocks.n_blocks * C : 0;
  float* partial = thread_scratch<float>(ScratchSlot::a, static_cast<size_t>(n_partial));
  const ScratchRows scratch(4, C);  // x, dy, w, dx
#pragma omp parallel if (N * C >= kMinParallel)
  {
    const ScratchRows::Rows s = scratch.mine();
    const float* wf = load_row(w, 0, C, s.row(2));
    float* g = s.row(3);
#pragma omp for schedule(static)
    for (int64_t k = 0; k < blocks.n_blocks; ++k) {
      float* pdw = dw.defined() ? partial + k * C : nullptr;
      if (pdw) std::fill_n(pdw, C, 0.f);
      for (int64_t r = blocks.begin(k); r < blocks.begin(k + 1); ++r) {
        const float* xr = load_row(x, r, C, s.row(0));
        const float* dyr = load_row(dy, r, C, s.row(1));
        const float rs = rstd.data_as<float>()[r];
        if (pdw) {
          for (int64_t i = 0; i < C; ++i) pdw[i] += dyr[i] * (xr[i] * rs);
        }
        if (!dx.defined()) continue;
        float sum = 0.f;
#pragma omp simd reduction(+ : sum)
        for (int64_t i = 0; i < C; ++i) sum += wf[i] * dyr[i] * xr[i];
        const float k3 = rs * rs * rs * sum / static_cast<float>(C);
        for (int64_t i = 0; i < C; ++i) g[i] = rs * wf[i] * dyr[i] - xr[i] * k3;
        store_span(dx, r * C, C, g, Store::add);
      }
    }
  }
  if (dw.defined()) add_partials({dw}, partial, blocks.n_blocks, C);
}

}  // namespace loom::kernels::cpu::LOOM_ISA
