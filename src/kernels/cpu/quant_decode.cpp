// linear_forward_quantized for few rows (decode: fewer than
// kQuantPrefillRows) at levels with AVX512_VNNI, q8_0, q4_0, q5_0, q4_1 and
// q5_1 weights (quant_prefill.h): 16 weight rows at a time, read in place.
//
// Decode reads every weight byte once per step, so it is bound by memory:
// the work per byte must stay below what the bandwidth leaves. quant_linear's
// 8-output tiles spent it on the shuffle port (each block's 8 partial sums
// reduced across lanes per output, its 8 f16 scales assembled one by one).
// Here a block's bytes of 16 rows fill 512-bit vectors -- q8_0, q5_0, q4_1,
// q5_1: rows c and c + 8's 32 values in the two halves; q4_0: rows c, c + 4,
// c + 8, c + 12's nibbles in the four quarters -- against x's block
// broadcast the same way, vpdpbusd straight into int32 (q8_0's values + 128
// and the nibble types' stored values as the unsigned side; where those
// carry an offset, the block's sum of x times it taken back, exact). One
// reduction tree of blends, in-lane shuffles and adds then leaves the 16
// rows' integer sums in 16 lanes, the 16 f16 scales (and q4_1 / q5_1's
// minima beside them) come in one gather, and the float step is the
// reference's per lane in its order (isum * (dw * da), + mw * sa for the
// types with a min, added to the sum of the earlier blocks; no FMA). So
// every output has quant.h's vec_dot bits, as on every other path
// (tests/kernels/test_quant_linear.cpp at every level), and a row's bits do
// not depend on the other rows. With several rows (a decode batch), up to 4
// of x's rows take each unpacked weight vector and gathered scale, so a
// batch of 4 costs about twice one row, not four times.
#include <omp.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/dtype.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/quant_prefill.h"
#include "kernels/cpu/quant_prefill_run.h"
#include "kernels/cpu/rows.h"

#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define LOOM_QUANT_DECODE 1
#include <immintrin.h>
// GCC 12 takes the intrinsics' undefined pass-through operands for
// uninitialized variables here (a false positive: every lane is written).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace loom::kernels::cpu::LOOM_ISA {

#if defined(LOOM_QUANT_DECODE)
namespace {

using namespace quant_packed;

constexpr int kT = 16;             // weight rows a panel takes: one per f32 lane
constexpr int64_t kAhead = 1;      // how many panels ahead the bytes are asked for (2 measured slower)

// Lanes [a, b, a, b, ...] within each pair: even lanes from a, odd from b,
// each the sum of a lane pair of its source (integer adds: exact).
inline __m512i pair32(__m512i a, __m512i b) {
  const __m512i x = _mm512_mask_blend_epi32(0xaaaa, a, b);
  const __m512i y = _mm512_mask_blend_epi32(0xaaaa, b, a);
  return _mm512_add_epi32(x, _mm512_shuffle_epi32(y, _MM_PERM_CDAB));
}
// The same on lane pairs: lanes [a a b b ...] of 4.
inline __m512i pair64(__m512i a, __m512i b) {
  const __m512i x = _mm512_mask_blend_epi32(0xcccc, a, b);
  const __m512i y = _mm512_mask_blend_epi32(0xcccc, b, a);
  return _mm512_add_epi32(x, _mm512_shuffle_epi32(y, _MM_PERM_BADC));
}

// q8_0 and the other 32-value types: pair[j] = pair32(acc[2j], acc[2j + 1]),
// where acc[k] holds row k's 8 partial sums in lanes 0-7 and row k + 8's in
// 8-15. Lane c of the result: row c's sum.
inline __m512i reduce_halves(__m512i lo, __m512i hi) {
  // lo = pair64(pair[0], pair[1]): rows 0-3 | 8-11, twice each; hi, from
  // pair[2] and pair[3], rows 4-7 | 12-15. 128-bit lanes: lo = [L0 L1 | L2
  // L3], hi = [H0 H1 | H2 H3]; rows 0-3 are L0 + L1, 4-7 H0 + H1, 8-11
  // L2 + L3, 12-15 H2 + H3.
  const __m512i x = _mm512_mask_blend_epi32(0xf0f0, lo, hi);                            // L0 H1 L2 H3
  const __m512i y = _mm512_shuffle_i32x4(_mm512_mask_blend_epi32(0xf0f0, hi, lo),
                                         _mm512_mask_blend_epi32(0xf0f0, hi, lo), _MM_SHUFFLE(2, 3, 0, 1));  // L1 H0 L3 H2
  return _mm512_add_epi32(x, y);
}

// Where the next panel's bytes lie, to be asked for while this one is
// computed: the panel's 16 rows are one stretch of memory, read as 16
// interleaved streams, which the hardware prefetcher followed too late
// (measured: 1B-parameter q4_0 decode at 0.39 of the bandwidth bound
// without, 0.47 with). Into L2: prefetches into L1 stalled on its few miss
// buffers (0.46 for q4_0, and no gain for q8_0).
struct Ahead {
  const char* next = nullptr;  // null: nothing to ask for
  int64_t lines_per_block = 0;
};

// Where a weight type's values lie in its block (quant.h), and what its u8
// form adds to a value (q8_0: qs + 128; q4_0, q5_0: the stored nibbles are
// value + 8, value + 16; q4_1, q5_1 store values 0..15 / 0..31 and a min,
// kHasMin).
struct Layout {
  size_t qs;
  int qh;  // the fifth bits' offset, or -1
  int32_t offset;
};
template <QuantType T>
constexpr Layout layout() {
  using B = WeightBlock32<T>;
  if constexpr (T == QuantType::q5_0 || T == QuantType::q5_1)
    return {offsetof(B, qs), static_cast<int>(offsetof(B, qh)), T == QuantType::q5_0 ? 16 : 0};
  else
    return {offsetof(B, qs), -1, T == QuantType::q8_0 ? 128 : T == QuantType::q4_0 ? 8 : 0};
}
template <QuantType T>
constexpr Layout kLayout = layout<T>();

// q4_1, q5_0, q5_1: rows k and k + 8's 32 values (0..31) of one block in the
// two 256-bit halves, as q8_0's (x's 32 values broadcast to both): each
// row's 16 nibble bytes in two 128-bit lanes, the high lane shifted down by
// 4, both masked to the nibble; the fifth bits of value j of the two rows
// are bits j and 32 + j of one 64-bit mask, added as 16 where set.
inline __m512i values32(const std::byte* r0, const std::byte* r1, size_t qs, int qh) {
  const auto lane = [&](const std::byte* r) {
    return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r + qs)));
  };
  __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(lane(r0)), lane(r1), 1);
  v = _mm512_and_si512(_mm512_mask_srli_epi16(v, 0xff00ff00, v, 4), _mm512_set1_epi8(0xf));
  if (qh >= 0) {
    uint32_t h0, h1;
    std::memcpy(&h0, r0 + qh, 4), std::memcpy(&h1, r1 + qh, 4);
    v = _mm512_mask_add_epi8(v, _cvtu64_mask64(static_cast<uint64_t>(h1) << 32 | h0), v, _mm512_set1_epi8(16));
  }
  return v;
}

// R rows' vectors, returned by value (a template argument of __m512 type
// loses its attributes, so no std::array).
template <int R>
struct IntSums {
  __m512i v[R];
};
template <int R>
struct Sums {
  __m512 v[R];
};

// The sums of the 16 rows' block b for R rows of x, built as the block's
// weight vectors are: each weight vector is unpacked once and taken by the R
// rows' vpdpbusd, and each row's partial sums are paired as soon as two
// exist, so that R = 4 rows' stay in registers. Each row's integer sums are
// the one-row reduction's, as are its bits.
template <QuantType T, int R>
IntSums<R> block_sums(const std::byte* const (&rows)[kT], size_t at, const Activations32<T>* const (&a)[R],
                      int64_t b) {
  constexpr Layout L = kLayout<T>;
  IntSums<R> sums;
  __m512i(&isum)[R] = sums.v;
  if constexpr (T == QuantType::q4_0) {
    __m512i x_lo[R], x_hi[R], first[R], pair[R];
    for (int r = 0; r < R; ++r) {
      const __m128i* xv = reinterpret_cast<const __m128i*>(a[r][b].qs);
      x_lo[r] = _mm512_broadcast_i32x4(_mm_loadu_si128(xv));
      x_hi[r] = _mm512_broadcast_i32x4(_mm_loadu_si128(xv + 1));
    }
    const __m512i low = _mm512_set1_epi8(0xf);
    // Weight vector g: rows g, g + 4, g + 8, g + 12's nibbles in the four
    // 128-bit lanes; isum = pair64(pair32(acc[0], acc[1]), pair32(acc[2], acc[3])).
    for (int g = 0; g < 4; ++g) {
      const auto q = [&](int i) {
        return _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[g + 4 * i] + at + L.qs));
      };
      __m512i v = _mm512_castsi128_si512(q(0));
      v = _mm512_inserti32x4(v, q(1), 1), v = _mm512_inserti32x4(v, q(2), 2), v = _mm512_inserti32x4(v, q(3), 3);
      const __m512i lo = _mm512_and_si512(v, low), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
      for (int r = 0; r < R; ++r) {
        const __m512i acc = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, x_lo[r]), hi, x_hi[r]);
        if (g % 2 == 0) first[r] = acc;
        else if (g == 1) pair[r] = pair32(first[r], acc);
        else isum[r] = pair64(pair[r], pair32(first[r], acc));
      }
    }
  } else {
    __m512i xq[R], first[R], pair[R], lo[R];
    for (int r = 0; r < R; ++r)
      xq[r] = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[r][b].qs)));
    for (int k = 0; k < 8; ++k) {
      __m512i w;
      if constexpr (T == QuantType::q8_0) {
        const auto half = [&](const std::byte* row) {
          return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + at + L.qs));
        };
        w = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(half(rows[k])), half(rows[k + 8]), 1),
                             _mm512_set1_epi8(-128));
      } else {
        w = values32(rows[k] + at, rows[k + 8] + at, L.qs, L.qh);
      }
      for (int r = 0; r < R; ++r) {
        const __m512i acc = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, xq[r]);
        if (k % 2 == 0) {
          first[r] = acc;
        } else if (k % 4 == 1) {
          pair[r] = pair32(first[r], acc);
        } else {
          const __m512i quad = pair64(pair[r], pair32(first[r], acc));
          if (k == 3) lo[r] = quad;
          else isum[r] = reduce_halves(lo[r], quad);
        }
      }
    }
  }
  return sums;
}

// Lane c of [r]: y[m0 + r][n0 + c] for the 16 outputs of rows[] (the last
// row repeated past OC), without the bias: R rows of x against one panel.
template <QuantType T, int R>
Sums<R> panel_rows(const std::byte* const (&rows)[kT], __m512i offsets, const QuantOperands& o, RowBlocks x,
                   int64_t m0, Ahead ahead) {
  constexpr Layout L = kLayout<T>;
  const Activations32<T>* a[R];
  Sums<R> sums;
  __m512(&s)[R] = sums.v;
  for (int r = 0; r < R; ++r) a[r] = row_at<Activations32<T>>(o.a, o.a_row, m0 + r), s[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < o.nb; ++b) {
    if (ahead.next != nullptr)
      for (int64_t l = 0; l < ahead.lines_per_block; ++l)
        _mm_prefetch(ahead.next + (b * ahead.lines_per_block + l) * 64, _MM_HINT_T1);
    const size_t at = static_cast<size_t>(b) * sizeof(WeightBlock32<T>);  // the block's first byte
    IntSums<R> isum = block_sums<T, R>(rows, at, a, b);
    const __m512i raw = _mm512_i32gather_epi32(offsets, rows[0] + at, 1);  // each row's block start: d, then m
    const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(raw));
    __m512 mw;
    if constexpr (kHasMin<T>) mw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(raw, 16)));
    for (int r = 0; r < R; ++r) {
      const int64_t xb = (m0 + r) * o.nb + b;
      if constexpr (L.offset != 0) isum.v[r] = _mm512_sub_epi32(isum.v[r], _mm512_set1_epi32(L.offset * x.sum[xb]));
      __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(isum.v[r]), _mm512_mul_ps(dw, _mm512_set1_ps(x.d[xb])));
      if constexpr (kHasMin<T>) t = _mm512_add_ps(t, _mm512_mul_ps(mw, _mm512_set1_ps(x.s[xb])));
      s[r] = _mm512_add_ps(s[r], t);
    }
  }
  return sums;
}

constexpr int kRows = 4;  // rows of x a pass over a panel takes (R above)

// y[m0 .. m0 + R)[n0 .. n0 + 16): panel_rows, then the bias, stored below OC.
// One function per R: with the four inlined into panel, the one-row pass
// measured 20% slower (q4_1, 3072 x 768: 74 -> 57 GFLOP/s a core).
template <QuantType T, int R>
[[gnu::noinline]] void store_panel_rows(const std::byte* const (&rows)[kT], __m512i offsets, const QuantOperands& o,
                                        RowBlocks x, int64_t m0, Ahead ahead, int64_t n0, __mmask16 mask,
                                        __m512 bias) {
  Sums<R> s = panel_rows<T, R>(rows, offsets, o, x, m0, ahead);
  for (int r = 0; r < R; ++r) {
    if (o.bias != nullptr) s.v[r] = _mm512_add_ps(s.v[r], bias);
    _mm512_mask_storeu_ps(o.y + (m0 + r) * o.OC + n0, mask, s.v[r]);
  }
}

// y[.][n0 .. n0 + 16) for panel p, every row of x.
template <QuantType T>
void panel(const QuantOperands& o, RowBlocks x, int64_t p) {
  const int64_t n0 = p * kT;
  const std::byte* rows[kT];
  alignas(64) int32_t off[kT];
  for (int c = 0; c < kT; ++c) {
    const int64_t n = std::min(n0 + c, o.OC - 1);
    rows[c] = row_at<std::byte>(o.w, o.w_row, n);
    off[c] = static_cast<int32_t>((n - n0) * static_cast<int64_t>(o.w_row));
  }
  const __m512i offsets = _mm512_load_si512(off);
  const auto mask = static_cast<__mmask16>((1u << std::min<int64_t>(kT, o.OC - n0)) - 1);
  const __m512 bias = o.bias != nullptr ? _mm512_maskz_loadu_ps(mask, o.bias + n0) : _mm512_setzero_ps();
  Ahead ahead;
  if (n0 + (kAhead + 1) * kT <= o.OC) {  // a whole panel kAhead panels on
    ahead.next = reinterpret_cast<const char*>(rows[0]) + kAhead * kT * o.w_row;
    ahead.lines_per_block = (kT * static_cast<int64_t>(o.w_row) / 64 + o.nb - 1) / o.nb;
  }
  // The first pass reads the panel from memory, the rest from cache.
  int64_t m = 0;
  for (; m + kRows <= o.N; m += kRows, ahead = Ahead{})
    store_panel_rows<T, kRows>(rows, offsets, o, x, m, ahead, n0, mask, bias);
  switch (o.N - m) {
    case 3: return store_panel_rows<T, 3>(rows, offsets, o, x, m, ahead, n0, mask, bias);
    case 2: return store_panel_rows<T, 2>(rows, offsets, o, x, m, ahead, n0, mask, bias);
    case 1: return store_panel_rows<T, 1>(rows, offsets, o, x, m, ahead, n0, mask, bias);
    default: return;
  }
}

template <QuantType T>
void run(const QuantOperands& o) {
  const RowBlocks x = prepare_q8<T>(o);
  const int64_t panels = (o.OC + kT - 1) / kT;
  const bool parallel = o.N * o.OC * o.nb * kQK >= kMinParallel;
  // Each thread one contiguous run of panels (every panel costs the same):
  // one long stream of weight bytes, which prefetching keeps ahead of
  // (items of 4 panels handed out one at a time measured 10-20% slower).
  // Which thread computes a panel never changes an output's arithmetic.
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t p = 0; p < panels; ++p) panel<T>(o, x, p);
}

}  // namespace
#endif

bool quant_decode16(QuantType wtype, const QuantOperands& o) {
#if defined(LOOM_QUANT_DECODE)
  // The gather's offsets are int32: 15 rows of w must fit.
  if (o.N >= kQuantPrefillRows || static_cast<int64_t>(o.w_row) * (kT - 1) > INT32_MAX) return false;
  if (wtype == QuantType::q8_0) return run<QuantType::q8_0>(o), true;
  if (wtype == QuantType::q4_0) return run<QuantType::q4_0>(o), true;
  if (wtype == QuantType::q5_0) return run<QuantType::q5_0>(o), true;
  if (wtype == QuantType::q4_1) return run<QuantType::q4_1>(o), true;
  if (wtype == QuantType::q5_1) return run<QuantType::q5_1>(o), true;
#else
  (void)wtype, (void)o;
#endif
  return false;
}

}  // namespace loom::kernels::cpu::LOOM_ISA
