// linear_forward_quantized for many rows (quant_prefill.h): q8_0 and q4_0
// weights against q8_0 activations with AVX512_VNNI, 16 outputs to a vector.
//
// quant_linear.cpp's tiles put one output's 32 products of a block in one
// vector and then reduce eight such vectors across lanes for every block;
// with many rows that reduction, not the products, bounds the speed. Here a
// group of 16 weight rows is first repacked (per call, per thread, while a
// block of x's rows passes it) so that lane c of a 64-byte vector holds four
// consecutive values of row c: one vpdpbusd against four bytes of x
// broadcast adds four products to each of the 16 outputs, and eight of them
// leave a block's 16 integer sums in 16 lanes, no reduction. vpdpbusd takes
// unsigned weights, so the repacked values are q8_0's qs + 128 and q4_0's
// nibbles (0..15), and the block's sum of x times that offset is subtracted:
// exact in int32 (|sum| <= 32 * 255 * 128). The float step is the
// reference's per lane, in its order (isum * (dw * da), added to the sum of
// the earlier blocks; no FMA), then + bias: quant.h's vec_dot bit for bit,
// as the other paths (tests/kernels/test_quant_linear.cpp).
#include "kernels/cpu/quant_prefill.h"

#include <omp.h>

#include <algorithm>
#include <cstring>

#include "core/dtype.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/scratch.h"

#if defined(__AVX512F__) && defined(__AVX512VNNI__)
#define LOOM_QUANT_PREFILL 1
#include <immintrin.h>
#endif

namespace loom::kernels::cpu::LOOM_ISA {

#if defined(LOOM_QUANT_PREFILL)
namespace {

constexpr int kLanes = 16;              // outputs of a group, one per f32 lane
constexpr int64_t kRowBlock = 128;      // x's rows an item takes past its groups
constexpr int64_t kGroupsPerItem = 4;   // groups of 16 outputs an item takes
constexpr int kRowTile = 8;             // rows sharing one block's weight vectors

// One block of a group: the 16 rows' scales widened, and their values as
// vpdpbusd takes them: value j of row c at q[(j / 4) * 64 + 4 c + j % 4].
struct alignas(64) PackedBlock {
  float d[kLanes];
  uint8_t q[kQK * kLanes];
};

// What the u8 form adds to a weight value (q8_0: qs + 128; q4_0: the nibble
// is already value + 8).
template <QuantType T>
constexpr int32_t kOffset = T == QuantType::q8_0 ? 128 : 8;

// Rows [n0, n0 + 16) of W (the last row repeated past OC) into p, nb blocks.
template <QuantType T>
void pack_group(PackedBlock* p, const QuantOperands& o, int64_t n0) {
  for (int c = 0; c < kLanes; ++c) {
    const std::byte* row = o.w + static_cast<size_t>(std::min(n0 + c, o.OC - 1)) * o.w_row;
    for (int64_t b = 0; b < o.nb; ++b) {
      __m256i v;
      if constexpr (T == QuantType::q8_0) {
        const auto& blk = reinterpret_cast<const block_q8_0*>(row)[b];
        p[b].d[c] = from_f16(blk.d);
        v = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qs)), _mm256_set1_epi8(-128));
      } else {
        const auto& blk = reinterpret_cast<const block_q4_0*>(row)[b];
        p[b].d[c] = from_f16(blk.d);
        const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.qs));
        v = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(0xf));
      }
      alignas(32) uint32_t four[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(four), v);
      for (int k = 0; k < 8; ++k) std::memcpy(p[b].q + 64 * k + 4 * c, &four[k], 4);
    }
  }
}

// Per row m and block b of x: its scale widened and the sum of its values.
struct RowBlocks {
  const float* d;
  const int32_t* sum;
};

// y's rows [m, m + R), outputs [n0, n0 + 16) (those below OC).
template <QuantType T, int R>
void rows_tile(const PackedBlock* p, const QuantOperands& o, RowBlocks x, int64_t m, int64_t n0) {
  __m512 s[R];
  const block_q8_0* a[R];
  for (int r = 0; r < R; ++r)
    s[r] = _mm512_setzero_ps(), a[r] = reinterpret_cast<const block_q8_0*>(o.a + static_cast<size_t>(m + r) * o.a_row);
  for (int64_t b = 0; b < o.nb; ++b) {
    const __m512 dw = _mm512_load_ps(p[b].d);
    __m512i wq[8];
    for (int k = 0; k < 8; ++k) wq[k] = _mm512_load_si512(p[b].q + 64 * k);
    for (int r = 0; r < R; ++r) {
      int32_t xq[8];
      std::memcpy(xq, a[r][b].qs, sizeof xq);
      __m512i acc = _mm512_setzero_si512();
      for (int k = 0; k < 8; ++k) acc = _mm512_dpbusd_epi32(acc, wq[k], _mm512_set1_epi32(xq[k]));
      const int64_t at = (m + r) * o.nb + b;
      acc = _mm512_sub_epi32(acc, _mm512_set1_epi32(kOffset<T> * x.sum[at]));
      const __m512 d = _mm512_mul_ps(dw, _mm512_set1_ps(x.d[at]));
      // (maskz: GCC 12 warns that plain cvtepi32_ps's undefined source may be uninitialized.)
      s[r] = _mm512_add_ps(s[r], _mm512_mul_ps(_mm512_maskz_cvtepi32_ps(0xffff, acc), d));
    }
  }
  const auto mask = static_cast<__mmask16>((1u << std::min<int64_t>(kLanes, o.OC - n0)) - 1);
  const __m512 bias = o.bias != nullptr ? _mm512_maskz_loadu_ps(mask, o.bias + n0) : _mm512_setzero_ps();
  for (int r = 0; r < R; ++r) {
    const __m512 v = o.bias != nullptr ? _mm512_add_ps(s[r], bias) : s[r];
    _mm512_mask_storeu_ps(o.y + (m + r) * o.OC + n0, mask, v);
  }
}

template <QuantType T>
void rows_of_group(const PackedBlock* p, const QuantOperands& o, RowBlocks x, int64_t m0, int64_t m1,
                   int64_t n0) {
  int64_t m = m0;
  for (; m + kRowTile <= m1; m += kRowTile) rows_tile<T, kRowTile>(p, o, x, m, n0);
  for (; m < m1; ++m) rows_tile<T, 1>(p, o, x, m, n0);
}

template <QuantType T>
void run_packed(const QuantOperands& o) {
  // x's scales and sums, once per call (a block's sum: vpdpbusd against ones).
  auto* d = thread_scratch<float>(ScratchSlot::b, static_cast<size_t>(o.N * o.nb));
  auto* sum = thread_scratch<int32_t>(ScratchSlot::c, static_cast<size_t>(o.N * o.nb));
#pragma omp parallel for schedule(static)
  for (int64_t m = 0; m < o.N; ++m)
    for (int64_t b = 0; b < o.nb; ++b) {
      const auto& blk = reinterpret_cast<const block_q8_0*>(o.a + static_cast<size_t>(m) * o.a_row)[b];
      const __m256i qs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qs));
      const __m256i s8 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(1), qs);
      const __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
      const __m128i s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
      d[m * o.nb + b] = from_f16(blk.d);
      sum[m * o.nb + b] = _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32(s2, 1)));
    }
  const RowBlocks x{d, sum};
  const int64_t groups = (o.OC + kLanes - 1) / kLanes, chunks = (groups + kGroupsPerItem - 1) / kGroupsPerItem;
  const int64_t row_blocks = (o.N + kRowBlock - 1) / kRowBlock;
  const ThreadSlices<PackedBlock> packed(ScratchSlot::d, static_cast<size_t>(o.nb));
  // Which thread computes an item never changes an output's arithmetic.
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t item = 0; item < chunks * row_blocks; ++item) {
    PackedBlock* p = packed.slice(omp_get_thread_num());
    const int64_t g0 = item % chunks * kGroupsPerItem, g1 = std::min(groups, g0 + kGroupsPerItem);
    const int64_t m0 = item / chunks * kRowBlock, m1 = std::min(o.N, m0 + kRowBlock);
    for (int64_t g = g0; g < g1; ++g) {
      pack_group<T>(p, o, g * kLanes);
      rows_of_group<T>(p, o, x, m0, m1, g * kLanes);
    }
  }
}

}  // namespace
#endif

bool quant_prefill(QuantType wtype, const QuantOperands& o) {
#if defined(LOOM_QUANT_PREFILL)
  if (o.N < kQuantPrefillRows) return false;
  if (wtype == QuantType::q8_0) return run_packed<QuantType::q8_0>(o), true;
  if (wtype == QuantType::q4_0) return run_packed<QuantType::q4_0>(o), true;
#else
  (void)wtype, (void)o;
#endif
  return false;
}

}  // namespace loom::kernels::cpu::LOOM_ISA
