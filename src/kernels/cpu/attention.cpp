// Tile machinery shared by attention_forward.cpp and attention_backward.cpp
// (declared in attention_tiles.h).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/attention_tiles.h"
#include "kernels/ops.h"

namespace loom::kernels::cpu::LOOM_ISA::attention {

Geometry geometry(const Tensor& q, const Tensor& k, const Tensor& v, int64_t q_pos) {
  Geometry g;
  g.B = q.size(0), g.Tq = q.size(1), g.NH = q.size(2), g.HS = q.size(3);
  g.Tk = k.size(1), g.NKV = k.size(2);
  g.HSp = round_up(g.HS, kTileLanes);
  g.off = q_pos == kQueriesLast ? g.Tk - g.Tq : q_pos;
  g.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(g.HS)));
  return g;
}

void load_tile(float* dst, int64_t ld, const Rows& x, int64_t b, int64_t t0, int64_t n, int64_t n_pad, int64_t h,
               int64_t HSp, float mul) {
  dispatch_float(x.dtype, [&]<typename T>() {
    const T* base = static_cast<const T*>(x.data);
    for (int64_t r = 0; r < n; ++r) {
      const T* src = base + x.at(b, t0 + r, h);
      float* d = dst + r * ld;
      if constexpr (std::is_same_v<T, f16>) {  // vectorised conversion, then the scale
        span_to_f32(d, src, x.HS);
        for (int64_t i = 0; i < x.HS; ++i) d[i] *= mul;
      } else {
        for (int64_t i = 0; i < x.HS; ++i) d[i] = to_f32(src[i]) * mul;
      }
      std::fill(d + x.HS, d + HSp, 0.f);
    }
  });
  for (int64_t r = n; r < n_pad; ++r) std::fill_n(dst + r * ld, HSp, 0.f);
}

View rows_tile(float* dst, const Rows& x, int64_t b, int64_t t0, int64_t n, int64_t n_pad, int64_t h, int64_t HSp) {
  if (x.dtype == DType::f32 && x.HS == HSp && t0 + n_pad <= x.T)
    return {static_cast<const float*>(x.data) + x.at(b, t0, h), x.st};
  load_tile(dst, HSp, x, b, t0, n, n_pad, h, HSp);
  return {dst, HSp};
}

// d outer, c inner: stores run along dst rows, and the n source rows (at most
// a block) stay in L1 while d sweeps them.
void load_tile_t(float* dst, int64_t ld, const Rows& x, int64_t b, int64_t t0, int64_t n, int64_t n_pad, int64_t h,
                 float mul) {
  LOOM_CHECK(n <= kMaxBlock, "load_tile_t: ", n, " rows");
  dispatch_float(x.dtype, [&]<typename T>() {
    const T* src[kMaxBlock];
    for (int64_t c = 0; c < n; ++c) src[c] = static_cast<const T*>(x.data) + x.at(b, t0 + c, h);
    for (int64_t d = 0; d < x.HS; ++d) {
      float* row = dst + d * ld;
      for (int64_t c = 0; c < n; ++c) row[c] = to_f32(src[c][d]) * mul;
      std::fill(row + n, row + n_pad, 0.f);
    }
  });
}

void add_tile(const Tensor& y, const float* src, int64_t ld, int64_t b, int64_t t0, int64_t n, int64_t h, float mul) {
  const int64_t T = y.size(1), heads = y.size(2), HS = y.size(3);
  dispatch_float(y.dtype(), [&]<typename T_>() {
    for (int64_t r = 0; r < n; ++r) {
      T_* dst = y.data_as<T_>() + ((b * T + t0 + r) * heads + h) * HS;
      const float* s = src + r * ld;
      for (int64_t i = 0; i < HS; ++i) dst[i] = from_f32<T_>(to_f32(dst[i]) + s[i] * mul);
    }
  });
}

namespace {

// A micro-tile of C: kRowBlock rows x W vectors kept in registers while K
// runs; each step loads W vectors of one B row and broadcasts one A element
// per row (attention_tiles.h sizes it per level). Written with vector types
// because GCC spills plain float arrays of this size to the stack (measured:
// 1.5x slower).
template <int W>
void micro_tile(float* __restrict cr, int64_t ldc, const float* __restrict a, int64_t ars, int64_t acs,
                const float* __restrict bp, int64_t ldb, int64_t K, Store store) {
  TileVec c[kRowBlock][W] = {};
  for (int64_t kk = 0; kk < K; ++kk) {
    TileVec bv[W];
    for (int w = 0; w < W; ++w) bv[w] = load_vec<TileVec>(bp + kk * ldb + w * kTileLanes);
    for (int r = 0; r < kRowBlock; ++r) {
      const TileVec x = splat(a[r * ars + kk * acs]);
      for (int w = 0; w < W; ++w) c[r][w] = fma_vec(x, bv[w], c[r][w]);
    }
  }
  for (int r = 0; r < kRowBlock; ++r) {
    for (int w = 0; w < W; ++w) {
      float* p = cr + r * ldc + w * kTileLanes;
      store_vec(p, store == Store::add ? c[r][w] + load_vec<TileVec>(p) : c[r][w]);
    }
  }
}

}  // namespace

void gemm_tile(float* c, int64_t ldc, View a, View b, int64_t M, int64_t N, int64_t K, Store store) {
  LOOM_CHECK(b.cs == 1 && M % kRowBlock == 0 && N % kTileLanes == 0, "gemm_tile: M=", M, " N=", N, " b.cs=", b.cs);
  for (int64_t i = 0; i < M; i += kRowBlock) {
    const float* ai = a.p + i * a.rs;
    float* ci = c + i * ldc;
    int64_t n = 0;
    for (; n + 2 * kTileLanes <= N; n += 2 * kTileLanes) micro_tile<2>(ci + n, ldc, ai, a.rs, a.cs, b.p + n, b.rs, K, store);
    if (n < N) micro_tile<1>(ci + n, ldc, ai, a.rs, a.cs, b.p + n, b.rs, K, store);
  }
}

}  // namespace loom::kernels::cpu::LOOM_ISA::attention
