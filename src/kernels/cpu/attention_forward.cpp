// Causal flash attention forward on the CPU (ops.h): FlashAttention (Dao et
// al. 2022), Algorithm 1. Each task owns one (b, head, query block); it walks
// the key blocks its queries can see, keeping a running max m and sum l per
// row and rescaling the output accumulator when m grows, so only a
// (kBlockQ, kBlockK) score tile ever exists.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "kernels/cpu/attention_tiles.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/cpu_ops.h"

namespace loom::kernels::cpu::LOOM_ISA {
namespace {

using namespace attention;

// One thread's f32 scratch for its forward tasks, laid out in a slice of
// ThreadSlices. Scores are kept transposed, (keys, queries), so the softmax
// statistics of a query are one lane of a vector and the per-key loops below
// vectorise across queries. Every size is a multiple of kBlockQ floats, so
// every array starts 64-byte aligned.
struct ForwardTiles {
  float *qt, *k, *v, *st, *acc;  // (HS, BQ) (BK, HSp) (BK, HSp) (BK, BQ) (BQ, HSp)
  float *m, *l, *mx, *alpha, *sum;  // (BQ): running max and sum, and per-tile temporaries
  int64_t floats = 0;  // the total
  // Lays the arrays out from base, or only counts them (floats) when base is null.
  ForwardTiles(int64_t HSp, float* base) {
    const std::pair<float**, int64_t> parts[] = {
        {&qt, HSp * kBlockQ}, {&k, kBlockK * HSp}, {&v, kBlockK * HSp}, {&st, kBlockK * kBlockQ},
        {&acc, kBlockQ * HSp}, {&m, kBlockQ}, {&l, kBlockQ}, {&mx, kBlockQ}, {&alpha, kBlockQ}, {&sum, kBlockQ}};
    for (const auto& [ptr, n] : parts) {
      *ptr = base ? base + floats : nullptr;
      floats += n;
    }
  }
};

// Online softmax over the score tile st (cols keys x nq query lanes), in
// place: st becomes exp(st - m_new) (0 where the key is in the future), l and
// the accumulator rows are rescaled by exp(m_old - m_new). Key c is visible
// to lane r iff c - r <= first (first = off + q0 - j0).
void online_softmax(ForwardTiles& w, int64_t cols, int64_t nq, int64_t mr, int64_t first, int64_t HSp) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  float *m = w.m, *mx = w.mx, *alpha = w.alpha, *sum = w.sum;
  std::fill_n(mx, nq, kNegInf);
  for (int64_t c = 0; c < cols; ++c) {
    float* s = w.st + c * kBlockQ;
    std::fill(s, s + std::clamp<int64_t>(c - first, 0, nq), kNegInf);
    for (int64_t r = 0; r < nq; ++r) mx[r] = s[r] > mx[r] ? s[r] : mx[r];
  }
  // m is -inf before the first tile; that tile holds key 0, which every
  // query sees, so m_new is finite and alpha = exp(-inf) = 0.
  for (int64_t r = 0; r < nq; ++r) {
    const float m_new = mx[r] > m[r] ? mx[r] : m[r];
    alpha[r] = exp_f32(m[r] - m_new);
    m[r] = m_new;
    sum[r] = 0.f;
  }
  for (int64_t c = 0; c < cols; ++c) {
    float* s = w.st + c * kBlockQ;
    for (int64_t r = 0; r < nq; ++r) {
      s[r] = exp_f32(s[r] - m[r]);
      sum[r] += s[r];
    }
  }
  for (int64_t r = 0; r < nq; ++r) w.l[r] = w.l[r] * alpha[r] + sum[r];
  for (int64_t r = 0; r < mr; ++r) {
    float* acc = w.acc + r * HSp;
    for (int64_t d = 0; d < HSp; ++d) acc[d] *= alpha[r];
  }
}

struct ForwardArgs {
  Tensor out, lse;
  Rows q, k, v;
  Geometry g;
};

// out[b, q0 + r, h, :] = acc[r, :] / l[r] and lse = m + log(l), r < rows.
void store_block(const ForwardArgs& a, ForwardTiles& w, int64_t b, int64_t h, int64_t q0, int64_t rows) {
  const Geometry& g = a.g;
  dispatch_float(a.out.dtype(), [&]<typename T>() {
    for (int64_t r = 0; r < rows; ++r) {
      T* dst = a.out.data_as<T>() + ((b * g.Tq + q0 + r) * g.NH + h) * g.HS;
      const float* acc = w.acc + r * g.HSp;
      const float inv = 1.f / w.l[r];
      for (int64_t d = 0; d < g.HS; ++d) dst[d] = from_f32<T>(acc[d] * inv);
    }
  });
  if (a.lse.defined()) {
    float* lse = a.lse.data_as<float>() + (b * g.NH + h) * g.Tq + q0;
    for (int64_t r = 0; r < rows; ++r) lse[r] = w.m[r] + std::log(w.l[r]);
  }
}

// One (b, h, query block): out rows [q0, q0 + rows) and their lse.
void forward_block(const ForwardArgs& a, ForwardTiles& w, int64_t b, int64_t h, int64_t q0) {
  const Geometry& g = a.g;
  const int64_t HSp = g.HSp, kvh = h / g.group();
  const int64_t rows = std::min(kBlockQ, g.Tq - q0), mr = round_up(rows, kRowBlock), nq = round_up(rows, kTileLanes);
  load_tile_t(w.qt, kBlockQ, a.q, b, q0, rows, nq, h, g.scale);  // scores = k . (q * scale)
  std::fill_n(w.acc, mr * HSp, 0.f);
  std::fill_n(w.m, nq, -std::numeric_limits<float>::infinity());
  std::fill_n(w.l, nq, 0.f);
  const int64_t last = std::min(g.off + q0 + rows - 1, g.Tk - 1);  // the last key the block's queries see
  for (int64_t j0 = 0; j0 <= last; j0 += kBlockK) {
    const int64_t cols = std::min(kBlockK, last + 1 - j0), mc = round_up(cols, kRowBlock);
    const View k = rows_tile(w.k, a.k, b, j0, cols, mc, kvh, HSp);
    const View v = rows_tile(w.v, a.v, b, j0, cols, cols, kvh, HSp);
    gemm_tile(w.st, kBlockQ, k, {w.qt, kBlockQ}, mc, nq, g.HS, Store::write);  // S^T = K Q^T
    online_softmax(w, cols, nq, mr, g.off + q0 - j0, HSp);
    // acc += P V, P = (S^T)^T: (mr, HSp)
    gemm_tile(w.acc, HSp, {w.st, 1, kBlockQ}, v, mr, HSp, cols, Store::add);
  }
  store_block(a, w, b, h, q0, rows);
}

}  // namespace

// out: (B, Tq, NH, HS) like q, contiguous   lse: (B, NH, Tq) f32 or undefined
void attention_forward(Tensor out, Tensor lse, const Tensor& q, const Tensor& k, const Tensor& v, int64_t q_pos) {
  const Geometry g = geometry(q, k, v, q_pos);
  const ForwardArgs args{out, lse, Rows(q), Rows(k), Rows(v), g};
  const int64_t n_qb = (g.Tq + kBlockQ - 1) / kBlockQ, n_bh = g.B * g.NH, n_tasks = n_qb * n_bh;
  // One slice per thread, and no more threads than tasks.
  const ThreadSlices<float> slices(ScratchSlot::a, static_cast<size_t>(ForwardTiles(g.HSp, nullptr).floats),
                                   static_cast<int>(std::min<int64_t>(omp_get_max_threads(), n_tasks)));
#pragma omp parallel num_threads(slices.threads())
  {
    ForwardTiles w(g.HSp, slices.mine());
    // Blocks of one head are handed out together (its k and v stay in
    // cache), late ones first: they see the most keys.
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < n_tasks; ++i) {
      const int64_t bh = i / n_qb, qb = n_qb - 1 - i % n_qb;
      forward_block(args, w, bh / g.NH, bh % g.NH, qb * kBlockQ);
    }
  }
}

}  // namespace loom::kernels::cpu::LOOM_ISA
