// linear_forward_quantized for many rows at the amx level (quant_prefill.h):
// q8_0 and q4_0 weights against q8_0 activations, the integer sums of each
// block in AMX tiles (TDPBSSD, signed bytes by signed bytes).
//
// Per block of 32 values, quant.h's vec_dot adds isum * (dw * da) to an f32
// sum in block order, isum being the block's exact integer dot product. A
// tile step (quant_amx.h) gives 16 rows of x by 16 outputs of isum at once:
// A, 16 rows of x's block b (x repacked in tile order); B, the 16 outputs'
// block b (signed values, so no offset to take back); C, 16 x 16 int32. K is
// one block (32 bytes) per step because every block has its own scales: C
// is stored after each step and its 16 rows enter the f32 sums in vector
// registers, the reference's multiplies and adds in its order (no FMA). So every output has the bits
// of the other paths (tests/kernels/test_quant_linear.cpp runs at every
// level), and a row's bits never depend on the rows around it.
//
// The tile step does 8192 multiply-adds where the AVX512_VNNI path
// (quant_prefill.cpp) needs 128 vpdpbusd and their broadcasts; what remains
// per block is the f32 step, four vector operations a row.
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

// One block of a group of 16 weight rows: their scales widened, and their
// values as a B tile: value j of row c at q[j / 4][4 c + j % 4].
struct alignas(64) TileBlock {
  float d[kT];
  int8_t q[kQK / 4][4 * kT];
};

// The 32 values of a q8_0 or q4_0 block as signed bytes, in order.
template <QuantType T>
__m256i block_values(const std::byte* row, int64_t b) {
  if constexpr (T == QuantType::q8_0) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(reinterpret_cast<const block_q8_0*>(row)[b].qs));
  } else {  // q4_0: low nibbles are values 0..15, high ones 16..31, each minus 8
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(reinterpret_cast<const block_q4_0*>(row)[b].qs));
    const __m256i v = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(0xf));
    return _mm256_sub_epi8(v, _mm256_set1_epi8(8));
  }
}

// Rows [n0, n0 + 16) of W (the last row repeated past OC) into p, nb blocks,
// a block at a time.
template <QuantType T>
void pack_group(TileBlock* p, const QuantOperands& o, int64_t n0) {
  const std::byte* rows[kT];
  for (int c = 0; c < kT; ++c) rows[c] = row_at<std::byte>(o.w, o.w_row, std::min(n0 + c, o.OC - 1));
  constexpr size_t kBlockBytes = T == QuantType::q8_0 ? sizeof(block_q8_0) : sizeof(block_q4_0);
  for (int64_t b = 0; b < o.nb; ++b) {
    __m256i v[kT];
    alignas(32) uint16_t d[kT];
    for (int c = 0; c < kT; ++c) {
      v[c] = block_values<T>(rows[c], b);
      std::memcpy(&d[c], rows[c] + static_cast<size_t>(b) * kBlockBytes, sizeof d[c]);  // d comes first in both
    }
    transpose_rows(v, &p[b].q[0][0]);
    _mm512_store_ps(p[b].d, _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(d))));
  }
}

// x's rows as A tiles: tile t's block b holds rows [16 t, 16 t + 16)'s 32
// values of block b, one after another (512 bytes; zeros past N), and the 16
// scales widened. A tile load then reads 8 consecutive lines (in place, 16
// rows a whole row apart, each load waited on a miss per row).
struct XTiles {
  const int8_t* q;  // [(t * nb + b) * 16 + r][32]
  const float* d;   // [(t * nb + b) * 16 + r]
  XTiles tile(const QuantOperands& o, int64_t t) const { return {q + t * o.nb * kT * kQK, d + t * o.nb * kT}; }
};

XTiles pack_q8_0(const QuantOperands& o) {
  const int64_t tiles = (o.N + kT - 1) / kT, per_tile = o.nb * kT;
  auto* q = thread_scratch<int8_t>(ScratchSlot::c, static_cast<size_t>(tiles * per_tile * kQK));
  auto* d = thread_scratch<float>(ScratchSlot::b, static_cast<size_t>(tiles * per_tile));
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < tiles; ++t)
    for (int64_t b = 0; b < o.nb; ++b)
      for (int r = 0; r < kT; ++r) {
        const int64_t m = t * kT + r, at = (t * o.nb + b) * kT + r;
        if (m < o.N) {
          const block_q8_0& blk = row_at<block_q8_0>(o.a, o.a_row, m)[b];
          std::memcpy(q + at * kQK, blk.qs, kQK);
          d[at] = half_to_float(blk.d);
        } else {
          std::memset(q + at * kQK, 0, kQK);
          d[at] = 0.f;
        }
      }
  return {q, d};
}

// Block b's 16 x 16 integer sums into C tile C, with A and B in tiles A and
// B, when b < nb. (GCC's tile intrinsics are macros that spell the tile
// number into the instruction: it must be a literal.)
#define LOOM_TILE_STEP(b, C, A, B)                  \
  do {                                              \
    if ((b) < nb) {                                 \
      _tile_zero(C);                                \
      _tile_loadd(A, x.q + (b) * kT * kQK, kQK);    \
      _tile_loadd(B, p[b].q, 64);                   \
      _tile_dpbssd(C, A, B);                        \
    }                                               \
  } while (0)

// s[r] += isum[r] * (dw * da[r]) for block b's sums c, row by row: the
// reference's multiplies and adds (no FMA).
__attribute__((always_inline)) inline void scale_rows(__m512 (&s)[kT], const int32_t (&c)[kT][kT],
                                                      const TileBlock& w, const float* da) {
  const __m512 dw = _mm512_load_ps(w.d);
#pragma GCC unroll 16
  for (int r = 0; r < kT; ++r) {
    const __m512 d = _mm512_mul_ps(dw, _mm512_set1_ps(da[r]));
    const __m512 isum = _mm512_cvtepi32_ps(_mm512_load_si512(c[r]));
    s[r] = _mm512_add_ps(s[r], _mm512_mul_ps(isum, d));
  }
}

// out[r] = the 16 outputs of the group for row r of x's tile (x: the tile's
// first block), over all nb blocks. The tile steps run three blocks ahead
// of the scaling (four C tiles in turn), so the tile unit's latency hides
// behind the vector unit's work.
__attribute__((target("amx-tile,amx-int8"), noinline)) void amx_rows16(const TileBlock* p, XTiles x, int64_t nb,
                                                                        __m512 (&out)[kT]) {
  alignas(64) int32_t c[kT][kT];
  __m512 s[kT];
#pragma GCC unroll 16
  for (int r = 0; r < kT; ++r) s[r] = _mm512_setzero_ps();
  LOOM_TILE_STEP(0, 0, 4, 6);
  LOOM_TILE_STEP(1, 1, 5, 7);
  LOOM_TILE_STEP(2, 2, 4, 6);
  for (int64_t b = 0; b < nb; b += 4) {
    LOOM_TILE_STEP(b + 3, 3, 5, 7);
    _tile_stored(0, c, 64);
    scale_rows(s, c, p[b], x.d + b * kT);
    if (b + 1 >= nb) break;
    LOOM_TILE_STEP(b + 4, 0, 4, 6);
    _tile_stored(1, c, 64);
    scale_rows(s, c, p[b + 1], x.d + (b + 1) * kT);
    if (b + 2 >= nb) break;
    LOOM_TILE_STEP(b + 5, 1, 5, 7);
    _tile_stored(2, c, 64);
    scale_rows(s, c, p[b + 2], x.d + (b + 2) * kT);
    if (b + 3 >= nb) break;
    LOOM_TILE_STEP(b + 6, 2, 4, 6);
    _tile_stored(3, c, 64);
    scale_rows(s, c, p[b + 3], x.d + (b + 3) * kT);
  }
#pragma GCC unroll 16
  for (int r = 0; r < kT; ++r) out[r] = s[r];
}
#undef LOOM_TILE_STEP

// q8_0 / q4_0 weights: what run_tiles needs of a weight type.
template <QuantType T>
struct Block32 {
  using Packed = TileBlock;
  using X = XTiles;
  static constexpr int kStep = kQK;
  static X pack_x(const QuantOperands& o) { return pack_q8_0(o); }
  static void pack(Packed* p, const QuantOperands& o, int64_t n0) { pack_group<T>(p, o, n0); }
  static void rows16(const Packed* p, const X& x, int64_t nb, __m512 (&out)[kT]) { amx_rows16(p, x, nb, out); }
};

}  // namespace
#endif

bool quant_prefill_amx(QuantType wtype, const QuantOperands& o) {
#if defined(LOOM_QUANT_AMX)
  if (o.N < kQuantPrefillRows) return false;
  if (wtype == QuantType::q8_0) return run_tiles<Block32<QuantType::q8_0>>(o), true;
  if (wtype == QuantType::q4_0) return run_tiles<Block32<QuantType::q4_0>>(o), true;
  if (quant_prefill_amx_k(wtype, o)) return true;
#endif
  return quant_prefill(wtype, o);
}

}  // namespace loom::kernels::cpu::LOOM_ISA
