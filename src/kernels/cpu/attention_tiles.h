// Shared pieces of the CPU flash attention (attention_forward.cpp,
// attention_backward.cpp): the problem geometry and its validation, f32 tile
// loads from strided f32/bf16/f16 operands, a small register-blocked GEMM on
// tiles. Internal to src/kernels/cpu.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) || defined(__FMA__)
#include <immintrin.h>
#endif

#include "core/tensor.h"
#include "kernels/cpu/rows.h"
#include "kernels/cpu/vec_math.h"

namespace loom::kernels::cpu::LOOM_ISA::attention {

inline constexpr int64_t kBlockQ = 64;  // query rows per tile (multiple of kRowBlock)
inline constexpr int64_t kBlockK = 64;  // keys per tile (multiple of kTileLanes)
inline constexpr int64_t kMaxBlock = kBlockQ > kBlockK ? kBlockQ : kBlockK;

inline int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// 16 f32 lanes whatever the level: the vector of the batch-invariant paged
// attention (paged_attention.cpp), whose sums take one fixed tree everywhere.
inline constexpr int64_t kLanes = 16;
typedef float Vec __attribute__((vector_size(kLanes * sizeof(float))));

// The training tiles' vector width and GEMM micro-tile height, sized for the
// ISA level this file is compiled for (it is compiled once per level): tile
// widths are padded to kTileLanes, tile heights to kRowBlock. A micro-tile
// keeps kRowBlock x 2 accumulator vectors in registers, plus 2 B vectors and
// a broadcast: 8 x 2 + 3 of AVX-512's 32 zmm, 4 x 2 + 3 of the 16 ymm of AVX2
// (or xmm of SSE2). 4 x 2 is 8 independent FMA chains, two FMA ports times a
// 4-cycle latency. 16-lane tiles at AVX2 spill (measured 50x slower), and
// 4 x 3 or 8 x 1 measured slower than 4 x 2.
#if defined(__AVX512F__)
inline constexpr int64_t kTileLanes = 16, kRowBlock = 8;
#elif defined(__AVX__)
inline constexpr int64_t kTileLanes = 8, kRowBlock = 4;
#else
inline constexpr int64_t kTileLanes = 4, kRowBlock = 4;
#endif
typedef float TileVec __attribute__((vector_size(kTileLanes * sizeof(float))));

// GCC/Clang vector extensions, loaded and stored unaligned: the same
// instructions whatever the address.
template <typename V = Vec>
V load_vec(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <typename V>
void store_vec(float* p, V v) {
  std::memcpy(p, &v, sizeof v);
}

// A vector of x in every lane: x - 0 is exactly x, so GCC emits a lone
// broadcast (GCC 12 keeps the add of 0 + x, and builds a lane loop lane by lane).
inline TileVec splat(float x) { return x - TileVec{}; }

// a * b + c, fused where the level has FMA: explicitly, since loom compiles
// with -ffp-contract=off (CMakeLists.txt) and so never fuses by itself.
inline TileVec fma_vec(TileVec a, TileVec b, TileVec c) {
#if defined(__AVX512F__)
  return _mm512_fmadd_ps(a, b, c);
#elif defined(__FMA__)
  return _mm256_fmadd_ps(a, b, c);
#else
  return a * b + c;
#endif
}

// q: (B, Tq, NH, HS)  k, v: (B, Tk, NKV, HS). Query t sits at position off + t
// and sees keys 0 ..= min(off + t, Tk - 1).
struct Geometry {
  int64_t B = 0, Tq = 0, Tk = 0, NH = 0, NKV = 0, HS = 0;
  int64_t HSp = 0;   // HS padded to kTileLanes: the row length of every f32 tile
  int64_t off = 0;   // q_pos (ops.h): Tk - Tq for kQueriesLast
  float scale = 0;   // 1 / sqrt(HS)
  int64_t group() const { return NH / NKV; }  // query heads per kv head
};

// An f32 tile operand: element (r, c) at p[r * rs + c * cs], so a transposed
// tile is the same memory with the strides swapped.
struct View {
  const float* p;
  int64_t rs;
  int64_t cs = 1;
};

// The geometry of q, k, v (checked by ops.h's attention ops).
Geometry geometry(const Tensor& q, const Tensor& k, const Tensor& v, int64_t q_pos);

// A (B, T, heads, HS) operand whose (b, t) rows of heads are contiguous, with
// any strides along B and T (a view into a cache).
struct Rows {
  const void* data;
  DType dtype;
  int64_t sb, st, T, HS;
  explicit Rows(const Tensor& t)
      : data(t.data()), dtype(t.dtype()), sb(t.stride(0)), st(t.stride(1)), T(t.size(1)), HS(t.size(3)) {}
  int64_t at(int64_t b, int64_t t, int64_t h) const { return b * sb + t * st + h * HS; }
};

// dst[r, :] = x[b, t0 + r, h, :] * mul for r < n, zero-padded to HSp columns
// and to n_pad rows.   dst: (n_pad, HSp), rows ld apart.
void load_tile(float* dst, int64_t ld, const Rows& x, int64_t b, int64_t t0, int64_t n, int64_t n_pad, int64_t h,
               int64_t HSp, float mul = 1.f);
// Rows [t0, t0 + n) of head h as an f32 tile of n_pad rows and HSp columns:
// the operand's own memory when it is f32, HS == HSp and the n_pad rows exist
// (padding rows then hold the next positions: callers ignore them), else a
// load_tile into dst.
View rows_tile(float* dst, const Rows& x, int64_t b, int64_t t0, int64_t n, int64_t n_pad, int64_t h, int64_t HSp);
// Transposed: dst[d, c] = x[b, t0 + c, h, d] * mul for d < HS, c < n; zero
// for n <= c < n_pad.   dst: (HS, n_pad), rows ld apart.
void load_tile_t(float* dst, int64_t ld, const Rows& x, int64_t b, int64_t t0, int64_t n, int64_t n_pad, int64_t h,
                 float mul = 1.f);
// y[b, t0 + r, h, :] += src[r, :] * mul for r < n; y contiguous (B, T, heads, HS).
void add_tile(const Tensor& y, const float* src, int64_t ld, int64_t b, int64_t t0, int64_t n, int64_t h, float mul);

// C (M, N) = or += A (M, K) @ B (K, N), all f32; C rows ldc apart, b.cs == 1.
// M % kRowBlock == 0 and N % kTileLanes == 0: callers pad their tiles.
void gemm_tile(float* c, int64_t ldc, View a, View b, int64_t M, int64_t N, int64_t K, Store store);

}  // namespace loom::kernels::cpu::LOOM_ISA::attention
