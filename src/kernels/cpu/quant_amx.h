// What the amx level's quantized paths share (quant_prefill_amx.cpp: q8_0,
// q4_0; quant_prefill_amx_k.cpp: q4_K, q6_K): the tile configuration, the
// transpose that turns 16 weight rows into a B tile, the work loop, the
// store. Internal to src/kernels/cpu; its code exists where AVX512_BF16 and
// AVX512_VNNI are (the avx512_bf16 objects, whose table is also the amx
// level's), and runs only at the amx level.
//
// A tile step is C (16 x 16 int32) += A (16 rows of x, `step` signed bytes
// each) . B (the same bytes of 16 weight rows, `step` / 4 rows of 64 bytes:
// row k holds values 4k .. 4k + 3 of each output), TDPBSSD. A weight type's
// blocks are cut into steps at its scales' boundaries (a q8_0 block, a q4_K
// sub-block of 32, a q6_K one of 16), so C holds exact integer dot products
// each step, which the type's code then scales as quant.h's vec_dot does.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/quant_prefill.h"
#include "kernels/cpu/scratch.h"

#ifndef LOOM_ISA
#error "kernels/cpu/quant_amx.h is included only by the per-level CPU kernel sources"
#endif

#if defined(__AVX512BF16__) && defined(__AVX512VNNI__)
#define LOOM_QUANT_AMX 1
#include <immintrin.h>

#include "kernels/cpu/amx_config.h"

namespace loom::kernels::cpu::LOOM_ISA::quant_amx {

inline constexpr int kT = 16;                 // x rows of a tile, and outputs of a group
inline constexpr int64_t kRowBlock = 512;     // x's rows an item takes past its groups
inline constexpr int64_t kGroupsPerItem = 4;  // groups of 16 outputs an item takes

// The tile configuration (amx_config.h): tiles 0-3 C (16 rows of 16 int32),
// 4 and 5 A (16 rows of `step` bytes), 6 and 7 B (step / 4 rows of 64 bytes).
__attribute__((target("amx-tile,amx-int8"))) inline void tiles_begin(int step) {
  TileConfig c;
  for (int t = 0; t < 4; ++t) c.colsb[t] = 64, c.rows[t] = kT;
  for (int t = 4; t < 6; ++t) c.colsb[t] = static_cast<uint16_t>(step), c.rows[t] = kT;
  for (int t = 6; t < 8; ++t) c.colsb[t] = 64, c.rows[t] = static_cast<uint8_t>(step / 4);
  load_tile_config(c);
}

__attribute__((target("amx-tile,amx-int8"))) inline void tiles_end() { _tile_release(); }

// 16 rows' 32 bytes each (v[c]: row c) as 8 rows of 64 bytes at dst (64-byte
// aligned): dst row k holds dword k of rows 0 .. 15 -- one 32-value step's B
// tile, or two 16-value steps' B tiles one after the other. Rows c and c + 8
// share a vector, and an 8 x 8 dword transpose runs in each 256-bit half.
inline void transpose_rows(const __m256i (&v)[kT], int8_t* dst) {
  __m512i z[8], t[8], u[8];
  for (int c = 0; c < 8; ++c) z[c] = _mm512_inserti64x4(_mm512_castsi256_si512(v[c]), v[c + 8], 1);
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(z[2 * i], z[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(z[2 * i], z[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {
    u[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  // The last step: 128-bit lanes 0 and 2 of u[k] then u[k + 4] (0x20 in each
  // half), or 1 and 3 (0x31), as qword indices of permutex2var.
  const __m512i lo_lanes = _mm512_set_epi64(13, 12, 5, 4, 9, 8, 1, 0);
  const __m512i hi_lanes = _mm512_set_epi64(15, 14, 7, 6, 11, 10, 3, 2);
  for (int k = 0; k < 4; ++k) {
    _mm512_store_si512(dst + 64 * k, _mm512_permutex2var_epi64(u[k], lo_lanes, u[k + 4]));
    _mm512_store_si512(dst + 64 * (k + 4), _mm512_permutex2var_epi64(u[k], hi_lanes, u[k + 4]));
  }
}

// y's rows [m, m + rows), outputs [n0, n0 + 16) below OC: the sums s, + bias.
inline void store_rows(const __m512 (&s)[kT], const QuantOperands& o, int64_t m, int64_t rows, int64_t n0) {
  const auto mask = static_cast<__mmask16>((1u << std::min<int64_t>(kT, o.OC - n0)) - 1);
  const __m512 bias = o.bias != nullptr ? _mm512_maskz_loadu_ps(mask, o.bias + n0) : _mm512_setzero_ps();
  for (int64_t r = 0; r < rows; ++r) {
    const __m512 v = o.bias != nullptr ? _mm512_add_ps(s[r], bias) : s[r];
    _mm512_mask_storeu_ps(o.y + (m + r) * o.OC + n0, mask, v);
  }
}

// y for a weight type P (Packed: one weight block of a group of 16 rows; X,
// x's rows in tile order, per_tile(o) of its elements a 16-row tile; kStep;
// pack_x, pack, rows16): items of kGroupsPerItem groups of 16 outputs by
// kRowBlock rows of x, handed out one at a time (run_packed's scheme,
// quant_prefill_run.h). The thread that takes one repacks its groups, then
// passes each 16-row tile of x by all of them while the tile is in cache.
// Which thread computes an item never changes an output's arithmetic.
template <class P>
void run_tiles(const QuantOperands& o) {
  const typename P::X x = P::pack_x(o);
  const int64_t groups = (o.OC + kT - 1) / kT, chunks = (groups + kGroupsPerItem - 1) / kGroupsPerItem;
  const int64_t row_blocks = (o.N + kRowBlock - 1) / kRowBlock;
  const ThreadSlices<typename P::Packed> packed(ScratchSlot::d, static_cast<size_t>(o.nb * kGroupsPerItem));
#pragma omp parallel
  {
    tiles_begin(P::kStep);
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < chunks * row_blocks; ++item) {
      typename P::Packed* p = packed.slice(omp_get_thread_num());
      const int64_t g0 = item % chunks * kGroupsPerItem, g1 = std::min(groups, g0 + kGroupsPerItem);
      const int64_t m0 = item / chunks * kRowBlock, m1 = std::min(o.N, m0 + kRowBlock);
      for (int64_t g = g0; g < g1; ++g) P::pack(p + (g - g0) * o.nb, o, g * kT);
      for (int64_t m = m0; m < m1; m += kT) {
        const typename P::X xt = x.tile(o, m / kT);
        for (int64_t g = g0; g < g1; ++g) {
          __m512 s[kT];
          P::rows16(p + (g - g0) * o.nb, xt, o.nb, s);
          store_rows(s, o, m, std::min<int64_t>(kT, m1 - m), g * kT);
        }
      }
    }
    tiles_end();
  }
}

}  // namespace loom::kernels::cpu::LOOM_ISA::quant_amx
#endif
