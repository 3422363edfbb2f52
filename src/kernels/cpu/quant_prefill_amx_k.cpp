// linear_forward_quantized for many rows at the amx level, q4_K and q6_K
// weights against q8_K activations (quant_prefill.h): the integer dot
// products of every sub-block in AMX tiles (quant_amx.h), one sub-block a
// tile step -- 32 values for q4_K, 16 for q6_K -- since each has its own
// scale.
//
// quant.h's vec_dot per super-block b of 256 values:
//   q4_K: isum = sum_j sc_j dot_j (8 sub-blocks, values 0..15),
//         msum = sum_j m_j (x's sum over sub-block j),
//         s += (dw dy) isum - (dmin dy) msum;
//   q6_K: isum = sum_j sc_j (dot_j - 32 bsum_j) (16 sub-blocks, values 0..63),
//         s += (dw dy) isum.
// The tiles take q6_K's values less 32 (signed bytes), so C is the bracket
// itself. C's rows times sc_j (32-bit multiplies) add into isum exactly in
// int32; q4_K's msum is vpmaddwd of each m_j (twice in a lane) against x's
// int16 bsums of its two halves. Then the float step as the reference, per
// lane, in its order (no FMA): the bits of every other path
// (tests/kernels/test_quant_linear.cpp at every level).
#include <algorithm>
#include <cstring>

#include "core/dtype.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/quant_amx.h"
#include "kernels/cpu/quant_prefill.h"
#include "kernels/cpu/quant_prefill_run.h"
#include "kernels/cpu/scratch.h"

#if defined(LOOM_QUANT_AMX)
// GCC 12 takes the intrinsics' undefined pass-through operands for
// uninitialized variables here (a false positive: every lane is written).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace loom::kernels::cpu::LOOM_ISA {

#if defined(LOOM_QUANT_AMX)
namespace {

using namespace quant_packed;
using namespace quant_amx;

// One super-block of a group of 16 weight rows. Sub-block j's B tile at
// q + j * kStep * 16 (kStep / 4 rows of 64 bytes).
struct alignas(64) TileSuper4 {
  int8_t q[8][8][64];
  int32_t sc[8][kT];
  int16_t m[8][2 * kT];  // m_j of row c in int16 lanes 2c and 2c + 1
  float d[kT], dmin[kT];
};
struct alignas(64) TileSuper6 {
  int8_t q[16][4][64];  // values less 32
  int32_t sc[16][kT];
  float d[kT];
};

// x's q8_K rows in tile order: tile t's super-block b's sub-block j holds the
// 16 rows' kStep values one after another (zeros past N); the scales, and
// (q4_K) each row's bsums as 8 int32 words of two int16 halves.
struct XSupers {
  const int8_t* q;       // [((t * nb + b) * (256 / step) + j) * 16 + r][step]
  const float* d;        // [(t * nb + b) * 16 + r]
  const int32_t* bsums;  // [((t * nb + b) * 16 + r) * 8 + k]
  XSupers tile(const QuantOperands& o, int64_t t) const {
    return {q + t * o.nb * kT * kQKK, d + t * o.nb * kT, bsums + t * o.nb * kT * 8};
  }
};

template <int Step>
XSupers pack_q8_K(const QuantOperands& o) {
  constexpr int kSteps = kQKK / Step;
  const int64_t tiles = (o.N + kT - 1) / kT, supers = tiles * o.nb;
  auto* q = thread_scratch<int8_t>(ScratchSlot::c, static_cast<size_t>(supers * kT * kQKK));
  auto* d = thread_scratch<float>(ScratchSlot::b, static_cast<size_t>(supers * kT * 9));
  auto* bsums = reinterpret_cast<int32_t*>(d + supers * kT);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < tiles; ++t)
    for (int64_t b = 0; b < o.nb; ++b)
      for (int r = 0; r < kT; ++r) {
        const int64_t m = t * kT + r, at = (t * o.nb + b) * kT + r;
        int8_t* dst = q + (t * o.nb + b) * kT * kQKK + r * Step;
        if (m < o.N) {
          const block_q8_K& blk = row_at<block_q8_K>(o.a, o.a_row, m)[b];
          for (int j = 0; j < kSteps; ++j) std::memcpy(dst + j * kT * Step, blk.qs + j * Step, Step);
          d[at] = blk.d;
          std::memcpy(bsums + at * 8, blk.bsums, sizeof blk.bsums);
        } else {
          for (int j = 0; j < kSteps; ++j) std::memset(dst + j * kT * Step, 0, Step);
          d[at] = 0.f;
          std::memset(bsums + at * 8, 0, 8 * sizeof(int32_t));
        }
      }
  return {q, d, bsums};
}

// Rows [n0, n0 + 16) of W (the last row repeated past OC) into p, nb
// super-blocks of q4_K.
void pack_q4_K(TileSuper4* p, const QuantOperands& o, int64_t n0) {
  const block_q4_K* rows[kT];
  for (int c = 0; c < kT; ++c) rows[c] = row_at<block_q4_K>(o.w, o.w_row, std::min(n0 + c, o.OC - 1));
  const __m256i low = _mm256_set1_epi8(0xf);
  for (int64_t b = 0; b < o.nb; ++b) {
    alignas(32) uint16_t d[kT], dmin[kT];
    for (int c = 0; c < kT; ++c) {
      const block_q4_K& blk = rows[c][b];
      std::memcpy(&d[c], &blk.d, 2), std::memcpy(&dmin[c], &blk.dmin, 2);
      for (int j = 0; j < 8; ++j) {
        uint8_t sc = 0, mn = 0;
        q4_K_scale_min(j, blk.scales, &sc, &mn);
        p[b].sc[j][c] = sc, p[b].m[j][2 * c] = p[b].m[j][2 * c + 1] = mn;
      }
    }
    for (int r = 0; r < 4; ++r) {  // run r: sub-block 2r in the low nibbles, 2r + 1 in the high ones
      __m256i lo[kT], hi[kT];
      for (int c = 0; c < kT; ++c) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[c][b].qs + 32 * r));
        lo[c] = _mm256_and_si256(v, low), hi[c] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
      }
      transpose_rows(lo, &p[b].q[2 * r][0][0]);
      transpose_rows(hi, &p[b].q[2 * r + 1][0][0]);
    }
    _mm512_store_ps(p[b].d, _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(d))));
    _mm512_store_ps(p[b].dmin, _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(dmin))));
  }
}

// The same for q6_K: values less 32, two sub-blocks of 16 a transpose.
void pack_q6_K(TileSuper6* p, const QuantOperands& o, int64_t n0) {
  const block_q6_K* rows[kT];
  for (int c = 0; c < kT; ++c) rows[c] = row_at<block_q6_K>(o.w, o.w_row, std::min(n0 + c, o.OC - 1));
  for (int64_t b = 0; b < o.nb; ++b) {
    alignas(32) uint8_t v[kT][kQKK];
    alignas(32) uint16_t d[kT];
    for (int c = 0; c < kT; ++c) {
      unpack_q6_K(rows[c][b], v[c]);
      std::memcpy(&d[c], &rows[c][b].d, 2);
      for (int j = 0; j < 16; ++j) p[b].sc[j][c] = rows[c][b].scales[j];
    }
    for (int jj = 0; jj < 8; ++jj) {
      __m256i w[kT];
      for (int c = 0; c < kT; ++c)
        w[c] = _mm256_sub_epi8(_mm256_load_si256(reinterpret_cast<const __m256i*>(v[c] + 32 * jj)),
                               _mm256_set1_epi8(32));
      transpose_rows(w, &p[b].q[2 * jj][0][0]);
    }
    _mm512_store_ps(p[b].d, _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(d))));
  }
}

// isum[r] += c[r] * sc (16 outputs' sub-block scales), row by row.
__attribute__((always_inline)) inline void add_scaled(__m512i (&isum)[kT], const int32_t (&c)[kT][kT],
                                                      const int32_t* sc) {
  const __m512i s = _mm512_load_si512(sc);
#pragma GCC unroll 16
  for (int r = 0; r < kT; ++r) isum[r] = _mm512_add_epi32(isum[r], _mm512_mullo_epi32(_mm512_load_si512(c[r]), s));
}

// The float step of super-block b for the tile's 16 rows: s[r] += ...
__attribute__((always_inline)) inline void finish(__m512 (&s)[kT], __m512i (&isum)[kT], const TileSuper4& w,
                                                  const XSupers& x, int64_t b) {
#pragma GCC unroll 16
  for (int r = 0; r < kT; ++r) {
    const int32_t* bs = x.bsums + (b * kT + r) * 8;
    __m512i msum = _mm512_setzero_si512();
    for (int j = 0; j < 8; ++j)
      msum = _mm512_add_epi32(msum, _mm512_madd_epi16(_mm512_load_si512(w.m[j]), _mm512_set1_epi32(bs[j])));
    const __m512 dy = _mm512_set1_ps(x.d[b * kT + r]);
    const __m512 d = _mm512_mul_ps(_mm512_load_ps(w.d), dy), dmin = _mm512_mul_ps(_mm512_load_ps(w.dmin), dy);
    const __m512 t = _mm512_sub_ps(_mm512_mul_ps(d, _mm512_cvtepi32_ps(isum[r])),
                                   _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(msum)));
    s[r] = _mm512_add_ps(s[r], t);
    isum[r] = _mm512_setzero_si512();
  }
}
__attribute__((always_inline)) inline void finish(__m512 (&s)[kT], __m512i (&isum)[kT], const TileSuper6& w,
                                                  const XSupers& x, int64_t b) {
  const __m512 dw = _mm512_load_ps(w.d);
#pragma GCC unroll 16
  for (int r = 0; r < kT; ++r) {
    const __m512 d = _mm512_mul_ps(dw, _mm512_set1_ps(x.d[b * kT + r]));
    s[r] = _mm512_add_ps(s[r], _mm512_mul_ps(d, _mm512_cvtepi32_ps(isum[r])));
    isum[r] = _mm512_setzero_si512();
  }
}

// Tile step k (super-block k / S, sub-block k % S) into C tile C, with A and
// B in tiles A and B, when k is one of the tile's steps. (GCC's tile
// intrinsics spell the tile number into the instruction: a literal.)
#define LOOM_TILE_STEP(k, C, A, B)                                                   \
  do {                                                                               \
    if ((k) < total) {                                                               \
      _tile_zero(C);                                                                 \
      _tile_loadd(A, x.q + (k) * kT * Step, Step);                                   \
      _tile_loadd(B, &p[(k) / kSteps].q[(k) % kSteps][0][0], 64);                    \
      _tile_dpbssd(C, A, B);                                                         \
    }                                                                                \
  } while (0)

// out[r] = the 16 outputs of the group for row r of x's tile, over all nb
// super-blocks: the tile steps run three ahead of the integer scaling (four
// C tiles in turn), as quant_prefill_amx.cpp's; s waits in memory between
// super-blocks, isum in registers.
template <class W, int Step>
__attribute__((target("amx-tile,amx-int8"), noinline)) void rows16_k(const W* p, XSupers x, int64_t nb,
                                                                      __m512 (&out)[kT]) {
  constexpr int kSteps = kQKK / Step;  // a multiple of 4: a round of four steps stays in one super-block
  const int64_t total = nb * kSteps;
  alignas(64) int32_t c[kT][kT];
  __m512 s[kT];
  __m512i isum[kT];
  for (int r = 0; r < kT; ++r) s[r] = _mm512_setzero_ps(), isum[r] = _mm512_setzero_si512();
  LOOM_TILE_STEP(0, 0, 4, 6);
  LOOM_TILE_STEP(1, 1, 5, 7);
  LOOM_TILE_STEP(2, 2, 4, 6);
  for (int64_t k = 0; k < total; k += 4) {
    const W& w = p[k / kSteps];
    const int j = static_cast<int>(k % kSteps);
    LOOM_TILE_STEP(k + 3, 3, 5, 7);
    _tile_stored(0, c, 64);
    add_scaled(isum, c, w.sc[j]);
    LOOM_TILE_STEP(k + 4, 0, 4, 6);
    _tile_stored(1, c, 64);
    add_scaled(isum, c, w.sc[j + 1]);
    LOOM_TILE_STEP(k + 5, 1, 5, 7);
    _tile_stored(2, c, 64);
    add_scaled(isum, c, w.sc[j + 2]);
    LOOM_TILE_STEP(k + 6, 2, 4, 6);
    _tile_stored(3, c, 64);
    add_scaled(isum, c, w.sc[j + 3]);
    if (j + 4 == kSteps) finish(s, isum, w, x, k / kSteps);
  }
  for (int r = 0; r < kT; ++r) out[r] = s[r];
}
#undef LOOM_TILE_STEP

// What run_tiles needs of a weight type.
struct Super4 {
  using Packed = TileSuper4;
  using X = XSupers;
  static constexpr int kStep = 32;
  static X pack_x(const QuantOperands& o) { return pack_q8_K<kStep>(o); }
  static void pack(Packed* p, const QuantOperands& o, int64_t n0) { pack_q4_K(p, o, n0); }
  static void rows16(const Packed* p, const X& x, int64_t nb, __m512 (&out)[kT]) {
    rows16_k<Packed, kStep>(p, x, nb, out);
  }
};
struct Super6 {
  using Packed = TileSuper6;
  using X = XSupers;
  static constexpr int kStep = 16;
  static X pack_x(const QuantOperands& o) { return pack_q8_K<kStep>(o); }
  static void pack(Packed* p, const QuantOperands& o, int64_t n0) { pack_q6_K(p, o, n0); }
  static void rows16(const Packed* p, const X& x, int64_t nb, __m512 (&out)[kT]) {
    rows16_k<Packed, kStep>(p, x, nb, out);
  }
};

}  // namespace
#endif

bool quant_prefill_amx_k(QuantType wtype, const QuantOperands& o) {
#if defined(LOOM_QUANT_AMX)
  if (o.N < kQuantPrefillRows) return false;
  if (wtype == QuantType::q4_K) return quant_amx::run_tiles<Super4>(o), true;
  if (wtype == QuantType::q6_K) return quant_amx::run_tiles<Super6>(o), true;
#else
  (void)wtype, (void)o;
#endif
  return false;
}

}  // namespace loom::kernels::cpu::LOOM_ISA
