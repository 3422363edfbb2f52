// quant_prefill.cpp's repacked path at 8 outputs a vector, for levels with
// AVX2 but not AVX512_VNNI (the avx2 and avx512 levels): q8_0, q4_0, q5_0,
// q4_1, q5_1, q2_K, q3_K, q4_K, q5_K and q6_K.
//
// Lane c of a 32-byte vector holds four consecutive values of weight row c;
// vpmaddubsw multiplies them with four bytes of x broadcast (unsigned times
// signed, pairs summed in int16) and vpmaddwd against ones adds the pairs:
// four products into each of the 8 outputs' int32 lanes. The pairs must not
// saturate: q4_0's and q4_K's nibbles (0..15) go as they are (|pair| <= 2 *
// 15 * 128), q8_0's values as |w| against x with w's sign (|pair| <= 2 *
// 128 * 127), as quant_linear.cpp's dot_s8 does. Where the int16 sums have
// room (q4_0's, q4_1's and q4_K's 8 pair sums of a 32-value block, q5_0's,
// q5_1's and q5_K's 4, q6_K's two), they
// add up in int16 and are widened once (with q4_K's and q6_K's scale as the
// multiplier): half the multiplies. All integer steps are exact;
// the float steps are the reference's per lane in its order, so the bits are
// quant.h's vec_dot's (tests/kernels/test_quant_linear.cpp at each level).
#include "kernels/cpu/quant_prefill.h"
#include "kernels/cpu/quant_prefill_run.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "core/dtype.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/quant_tile.h"
#include "kernels/cpu/scratch.h"

#if defined(__AVX2__) && defined(__FMA__) && !(defined(__AVX512F__) && defined(__AVX512VNNI__))
#define LOOM_QUANT_PREFILL8 1
#include <immintrin.h>
#endif

namespace loom::kernels::cpu::LOOM_ISA {

#if defined(LOOM_QUANT_PREFILL8)
namespace {

using namespace quant_packed;

constexpr int kLanes = 8;
constexpr int64_t kRowBlock = 512, kGroupsPerItem = 8;
constexpr int kRowTile = 4;
// From how many rows of x repacking W pays for itself against
// quant_linear.cpp's decode tiles (`loom bench kernels --filter linear_quant
// --isa avx2`, one Zen 5 core, 4 rows: q8_0 74 -> 96 GFLOP/s, q4_0 75 ->
// 95, q4_K 96 -> 115, q6_K 78 -> 94; at 8 rows 1.6-2.7x).
constexpr int64_t kPackedMinRows = 4;

inline __m256i load(const void* p) { return _mm256_load_si256(static_cast<const __m256i*>(p)); }
inline __m256i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}
// An empty asm the value passes through: the compiler may not reassociate the
// chain of adds across it, which it otherwise turns into a tree of all the
// products at once (more live vectors than registers: spills).
inline void keep_order(__m256i& v) { asm("" : "+x"(v)); }
// Four u8 x s8 products per int32 lane.
inline __m256i dot4(__m256i u, __m256i s) { return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)); }

// v[c]: 8 rows' 8 words each. Stored transposed: word k of row c to
// q + 32 k + 4 c (an 8 x 8 transpose of int32: unpacks, then 128-bit swaps).
inline void store_lanes(uint8_t* q, const __m256i (&v)[kLanes]) {
  __m256i a[8], b[8];
  for (int i = 0; i < 4; ++i) {
    a[2 * i] = _mm256_unpacklo_epi32(v[2 * i], v[2 * i + 1]);      // words 0 1 | 4 5 of rows 2i, 2i+1
    a[2 * i + 1] = _mm256_unpackhi_epi32(v[2 * i], v[2 * i + 1]);  // words 2 3 | 6 7
  }
  for (int h = 0; h < 2; ++h) {  // rows 4h .. 4h + 3
    const __m256i *lo = a + 4 * h, *hi = a + 4 * h + 2;
    b[4 * h] = _mm256_unpacklo_epi64(lo[0], hi[0]);      // word 0 | 4
    b[4 * h + 1] = _mm256_unpackhi_epi64(lo[0], hi[0]);  // word 1 | 5
    b[4 * h + 2] = _mm256_unpacklo_epi64(lo[1], hi[1]);  // word 2 | 6
    b[4 * h + 3] = _mm256_unpackhi_epi64(lo[1], hi[1]);  // word 3 | 7
  }
  auto* out = reinterpret_cast<__m256i*>(q);
  for (int k = 0; k < 4; ++k) {
    _mm256_store_si256(out + k, _mm256_permute2x128_si256(b[k], b[4 + k], 0x20));
    _mm256_store_si256(out + k + 4, _mm256_permute2x128_si256(b[k], b[4 + k], 0x31));
  }
}

template <int R>
void store_rows(const __m256 (&s)[R], const QuantOperands& o, int64_t m, int64_t n0) {
  const int64_t cols = std::min<int64_t>(kLanes, o.OC - n0);
  for (int r = 0; r < R; ++r) {
    alignas(32) float v[kLanes];
    _mm256_store_ps(v, s[r]);
    for (int64_t c = 0; c < cols; ++c) o.y[(m + r) * o.OC + n0 + c] = o.bias != nullptr ? v[c] + o.bias[n0 + c] : v[c];
  }
}

// q8_0 / q4_0 / q5_0 against q8_0 activations; q4_1 / q5_1 against q8_1
// (quant.h's dot_with_min: (dw * da) * isum + mw * sa, the values 0..15 /
// 0..31 as they are, no offset).
struct alignas(32) Packed32 {
  float d[kLanes];
  float m[kLanes];   // q4_1, q5_1: the block's min
  uint8_t u[8][32];  // q8_0: |w|; q4_0: the nibble (value + 8); q5_0: value + 16; q4_1, q5_1: the value
  int8_t w[8][32];   // q8_0: w, for its sign
};

template <QuantType T>
struct Block32 {
  static constexpr bool kFive = T == QuantType::q5_0 || T == QuantType::q5_1;  // values to 31
  using Packed = Packed32;
  using Rows = RowBlocks;  // q4_0's and q5_0's offset: the block's sum of x; q4_1's and q5_1's min: x's s
  using A = Activations32<T>;
  static constexpr int kTile = kRowTile;

  static Rows prepare(const QuantOperands& o) { return prepare_q8<T>(o); }

  static void pack(Packed* p, const QuantOperands& o, int64_t n0) {
    const std::byte* rows[kLanes];
    for (int c = 0; c < kLanes; ++c) rows[c] = row_at<std::byte>(o.w, o.w_row, std::min(n0 + c, o.OC - 1));
    for (int64_t b = 0; b < o.nb; ++b) {
      __m256i u[kLanes], w[kLanes];
      for (int c = 0; c < kLanes; ++c) {
        if constexpr (T == QuantType::q8_0) {
          const block_q8_0& blk = reinterpret_cast<const block_q8_0*>(rows[c])[b];
          p[b].d[c] = half_to_float(blk.d);
          w[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qs));
          u[c] = _mm256_abs_epi8(w[c]);
        } else {
          u[c] = quant_tile::nibble_block32<T>(rows[c], b, &p[b].d[c], &p[b].m[c]);
        }
      }
      store_lanes(&p[b].u[0][0], u);
      if constexpr (T == QuantType::q8_0) store_lanes(reinterpret_cast<uint8_t*>(&p[b].w[0][0]), w);
    }
  }

  template <int R>
  static void tile(const Packed* p, const QuantOperands& o, Rows x, int64_t m, int64_t n0) {
    __m256 s[R];
    const A* a[R];
    for (int r = 0; r < R; ++r) s[r] = _mm256_setzero_ps(), a[r] = row_at<A>(o.a, o.a_row, m + r);
    for (int64_t b = 0; b < o.nb; ++b) {
      __m256i acc[R];
      for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_si256();
      if constexpr (T == QuantType::q8_0) {
        for (int k = 0; k < 8; ++k) {
          const __m256i u = load(p[b].u[k]), w = load(p[b].w[k]);
          for (int r = 0; r < R; ++r) {
            acc[r] = _mm256_add_epi32(acc[r], dot4(u, _mm256_sign_epi8(bcast4(a[r][b].qs + 4 * k), w)));
            keep_order(acc[r]);
          }
        }
      } else {  // the block's 8 pair sums in int16 (8 * 2 * 15 * 128 < 2^15), widened once;
                // q5_0's and q5_1's (values to 31) 4 at a time (4 * 2 * 31 * 128 < 2^15)
        __m256i first[R] = {};
        for (int k = 0; k < 8; ++k) {
          const __m256i u = load(p[b].u[k]);
          for (int r = 0; r < R; ++r) {
            acc[r] = _mm256_add_epi16(acc[r], _mm256_maddubs_epi16(u, bcast4(a[r][b].qs + 4 * k)));
            keep_order(acc[r]);
          }
          if (kFive && k == 3)
            for (int r = 0; r < R; ++r) first[r] = _mm256_madd_epi16(acc[r], _mm256_set1_epi16(1)), acc[r] = _mm256_setzero_si256();
        }
        for (int r = 0; r < R; ++r) {
          acc[r] = _mm256_madd_epi16(acc[r], _mm256_set1_epi16(1));
          if constexpr (kFive) acc[r] = _mm256_add_epi32(acc[r], first[r]);
        }
      }
      const __m256 dw = _mm256_load_ps(p[b].d);
      for (int r = 0; r < R; ++r) {
        const int64_t at = (m + r) * o.nb + b;
        if constexpr (T == QuantType::q4_0 || T == QuantType::q5_0)
          acc[r] = _mm256_sub_epi32(acc[r], _mm256_set1_epi32((kFive ? 16 : 8) * x.sum[at]));
        const __m256 d = _mm256_mul_ps(dw, _mm256_set1_ps(x.d[at]));
        __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(acc[r]), d);
        if constexpr (kHasMin<T>) t = _mm256_add_ps(t, _mm256_mul_ps(_mm256_load_ps(p[b].m), _mm256_set1_ps(x.s[at])));
        s[r] = _mm256_add_ps(s[r], t);
      }
    }
    store_rows<R>(s, o, m, n0);
  }
};

// q4_K and q5_K against q8_K: as quant_prefill.cpp's SuperK, 8 lanes. A
// sub-block's 8 vpmaddubsw pair sums add up in int16 (8 * 2 * 15 * 128 <
// 2^15; q5_K's values 0..31 four at a time, 4 * 2 * 31 * 128 < 2^15) and
// vpmaddwd multiplies them by the sub-block's scale (sc_j in both int16
// halves of lane c) into int32: one widening a sub-block instead of eight,
// and no 32-bit multiply. The mins likewise: vpmaddwd of two sub-blocks'
// mins against x's two sums of 32 values (|sum| <= 32 * 127: int16).
struct alignas(32) PackedK4 {
  float d[kLanes], dmin[kLanes];
  int16_t sc[8][2 * kLanes];  // [j]: sc_j of row c in int16 lanes 2 c and 2 c + 1
  int16_t m[4][2 * kLanes];   // [i]: m_2i and m_2i+1 of row c in lanes 2 c, 2 c + 1
  uint8_t q[8][8][32];        // [j][k]: lane c's values 4 k .. 4 k + 3 of sub-block j (nibbles unpacked)
};

template <bool kFive>
struct SuperK {
  using Packed = PackedK4;
  using Block = std::conditional_t<kFive, block_q5_K, block_q4_K>;
  using Rows = RowSupersOf<int16_t>;  // x's sums over sub-blocks of 32, for vpmaddwd
  static constexpr int kTile = kRowTile;

  static Rows prepare(const QuantOperands& o) { return prepare_q8_K<32, int16_t>(o); }

  static void pack(Packed* p, const QuantOperands& o, int64_t n0) {
    const Block* rows[kLanes];
    for (int c = 0; c < kLanes; ++c) rows[c] = row_at<Block>(o.w, o.w_row, std::min(n0 + c, o.OC - 1));
    const __m256i low = _mm256_set1_epi8(0xf);
    for (int64_t b = 0; b < o.nb; ++b) {
      for (int c = 0; c < kLanes; ++c) {
        const Block& x = rows[c][b];
        p[b].d[c] = half_to_float(x.d), p[b].dmin[c] = half_to_float(x.dmin);
        for (int j = 0; j < 8; ++j) {
          uint8_t sc = 0, mn = 0;
          q4_K_scale_min(j, x.scales, &sc, &mn);
          p[b].sc[j][2 * c] = p[b].sc[j][2 * c + 1] = sc;
          p[b].m[j / 2][2 * c + j % 2] = mn;
        }
      }
      for (int r = 0; r < 4; ++r) {
        __m256i lo[kLanes], hi[kLanes];
        for (int c = 0; c < kLanes; ++c) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[c][b].qs + 32 * r));
          lo[c] = _mm256_and_si256(v, low), hi[c] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
          if constexpr (kFive) {  // q5_K: bits 2 r and 2 r + 1 of qh as 16
            const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[c][b].qh));
            const __m256i bit4 = _mm256_set1_epi8(0x10);
            lo[c] = _mm256_or_si256(lo[c], _mm256_and_si256(_mm256_slli_epi16(_mm256_srli_epi16(h, 2 * r), 4), bit4));
            hi[c] = _mm256_or_si256(hi[c], _mm256_and_si256(_mm256_slli_epi16(_mm256_srli_epi16(h, 2 * r + 1), 4), bit4));
          }
        }
        store_lanes(&p[b].q[2 * r][0][0], lo);
        store_lanes(&p[b].q[2 * r + 1][0][0], hi);
      }
    }
  }

  template <int R>
  static void tile(const Packed* p, const QuantOperands& o, Rows x, int64_t m, int64_t n0) {
    __m256 s[R];
    const block_q8_K* a[R];
    for (int i = 0; i < R; ++i) s[i] = _mm256_setzero_ps(), a[i] = row_at<block_q8_K>(o.a, o.a_row, m + i);
    for (int64_t b = 0; b < o.nb; ++b) {
      __m256i isum[R];
      for (int i = 0; i < R; ++i) isum[i] = _mm256_setzero_si256();
#pragma GCC unroll 1
      for (int j = 0; j < 8; ++j) {  // one sub-block at a time: few live registers, no spills
        __m256i acc[R];
        for (int i = 0; i < R; ++i) acc[i] = _mm256_setzero_si256();
        const __m256i sc = load(p[b].sc[j]);
        for (int k = 0; k < 8; ++k) {
          const __m256i q = load(p[b].q[j][k]);
          for (int i = 0; i < R; ++i) {
            acc[i] = _mm256_add_epi16(acc[i], _mm256_maddubs_epi16(q, bcast4(a[i][b].qs + 32 * j + 4 * k)));
            keep_order(acc[i]);
          }
          if (kFive && k == 3)  // q5_K: four pair sums fill int16
            for (int i = 0; i < R; ++i)
              isum[i] = _mm256_add_epi32(isum[i], _mm256_madd_epi16(acc[i], sc)), acc[i] = _mm256_setzero_si256();
        }
        for (int i = 0; i < R; ++i) isum[i] = _mm256_add_epi32(isum[i], _mm256_madd_epi16(acc[i], sc));
      }
      for (int i = 0; i < R; ++i) {
        const int16_t* sums = x.sums + ((m + i) * o.nb + b) * 8;
        __m256i msum = _mm256_setzero_si256();
        for (int k = 0; k < 4; ++k)
          msum = _mm256_add_epi32(msum, _mm256_madd_epi16(load(p[b].m[k]), bcast4(reinterpret_cast<const int8_t*>(sums + 2 * k))));
        const __m256 dy = _mm256_set1_ps(x.d[(m + i) * o.nb + b]);
        const __m256 d = _mm256_mul_ps(_mm256_load_ps(p[b].d), dy), dmin = _mm256_mul_ps(_mm256_load_ps(p[b].dmin), dy);
        const __m256 t = _mm256_sub_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(isum[i])),
                                       _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(msum)));
        s[i] = _mm256_add_ps(s[i], t);
      }
    }
    store_rows<R>(s, o, m, n0);
  }
};

// q6_K, q3_K and q2_K against q8_K (quant.h's vec_dot_q6_K_q8_K, _q3_K_,
// _q2_K_): per super-block the integer isum = sum_j sc_j * dot_j - off *
// sum_j sc_j * bsum_j over its 16 sub-blocks of 16 (values q6_K 0..63, q3_K
// q + 4 in 0..7, q2_K 0..3; off 32, 4, 0; q3_K's scales signed, sc - 32),
// then (dw * dy) * isum; q2_K also msum = sum_j m_j * bsum_j and d * isum -
// dmin * msum. The scale enters with the pair sums: vpmaddwd multiplies
// vpmaddubsw's int16 pairs (2 * 63 * 128 < 32768) by sc_j instead of by
// ones, so sc_j * dot_j needs no 32-bit multiply; and the offset's (and
// q2_K's mins') sum_j sc_j * bsum_j is vpmaddwd of two sub-blocks' scales
// against x's bsums (int16 in q8_K). Every integer is exact in int32
// (|isum| < 16 * 128 * (16 * 63 * 128 + 32 * 2048) < 2^31).
struct alignas(32) PackedK16 {
  float d[kLanes], dmin[kLanes];  // dmin: q2_K
  int16_t sc[16][2 * kLanes];     // [j]: sc_j of row c in int16 lanes 2 c and 2 c + 1
  int16_t pairs[8][2 * kLanes];   // [i]: sc_2i and sc_2i+1 of row c in lanes 2 c, 2 c + 1
  int16_t mins[8][2 * kLanes];    // q2_K: m_2i and m_2i+1 likewise
  uint8_t q[64][32];              // [k]: lane c's values 4 k .. 4 k + 3 of row c
};

template <QuantType T>
struct Super16 {
  using Packed = PackedK16;
  using Rows = RowSupers;
  using Block = std::conditional_t<T == QuantType::q6_K, block_q6_K,
                                   std::conditional_t<T == QuantType::q3_K, block_q3_K, block_q2_K>>;
  static constexpr int kTile = kRowTile;
  static constexpr int kOffShift = T == QuantType::q6_K ? 5 : T == QuantType::q3_K ? 2 : -1;  // off = 1 << shift

  static Rows prepare(const QuantOperands& o) { return prepare_q8_K<16>(o); }

  static void pack(Packed* p, const QuantOperands& o, int64_t n0) {
    const Block* rows[kLanes];
    for (int c = 0; c < kLanes; ++c) rows[c] = row_at<Block>(o.w, o.w_row, std::min(n0 + c, o.OC - 1));
    for (int64_t b = 0; b < o.nb; ++b) {
      __m256i v[kLanes][8];  // row c's values 32 g .. 32 g + 31
      for (int c = 0; c < kLanes; ++c) {
        const Block& x = rows[c][b];
        p[b].d[c] = half_to_float(x.d);
        int sc[16], mn[16] = {};
        if constexpr (T == QuantType::q6_K) {
          for (int j = 0; j < 16; ++j) sc[j] = x.scales[j];
          unpack_q6_K_avx2(x, v[c]);
        } else if constexpr (T == QuantType::q3_K) {
          uint8_t s3[16];
          q3_K_scales(x.scales, s3);
          for (int j = 0; j < 16; ++j) sc[j] = s3[j] - 32;
          const auto u = quant_tile::Q3_KSimd::unpack(x);
          for (int g = 0; g < 8; ++g) v[c][g] = u.q[g];
        } else {
          p[b].dmin[c] = half_to_float(x.dmin);
          for (int j = 0; j < 16; ++j) sc[j] = x.scales[j] & 0xf, mn[j] = x.scales[j] >> 4;
          const auto u = quant_tile::Q2_KSimd::unpack(x);
          for (int g = 0; g < 8; ++g) v[c][g] = u.q[g];
        }
        for (int j = 0; j < 16; ++j) {
          p[b].sc[j][2 * c] = p[b].sc[j][2 * c + 1] = static_cast<int16_t>(sc[j]);
          p[b].pairs[j / 2][2 * c + j % 2] = static_cast<int16_t>(sc[j]);
          p[b].mins[j / 2][2 * c + j % 2] = static_cast<int16_t>(mn[j]);
        }
      }
      for (int g = 0; g < 8; ++g) {
        __m256i t[kLanes];
        for (int c = 0; c < kLanes; ++c) t[c] = v[c][g];
        store_lanes(p[b].q[8 * g], t);
      }
    }
  }

  // sum_j w_j * bsum_j of rows [m, m + R): w's two sub-blocks' int16 pairs against x's bsums.
  template <int R>
  static void against_bsums(const int16_t (&w)[8][2 * kLanes], const block_q8_K* const* a, int64_t b,
                            __m256i (&out)[R]) {
    for (int i = 0; i < R; ++i) out[i] = _mm256_setzero_si256();
    for (int k = 0; k < 8; ++k) {
      const __m256i wk = load(w[k]);
      for (int i = 0; i < R; ++i)
        out[i] = _mm256_add_epi32(out[i],
                                  _mm256_madd_epi16(wk, bcast4(reinterpret_cast<const int8_t*>(a[i][b].bsums + 2 * k))));
    }
  }

  template <int R>
  static void tile(const Packed* p, const QuantOperands& o, Rows x, int64_t m, int64_t n0) {
    __m256 s[R];
    const block_q8_K* a[R];
    for (int i = 0; i < R; ++i) s[i] = _mm256_setzero_ps(), a[i] = row_at<block_q8_K>(o.a, o.a_row, m + i);
    for (int64_t b = 0; b < o.nb; ++b) {
      __m256i isum[R];
      for (int i = 0; i < R; ++i) isum[i] = _mm256_setzero_si256();
      for (int j = 0; j < 16; ++j) {
        const __m256i sc = load(p[b].sc[j]);
        for (int t = 0; t < 4; t += 2) {  // two pair sums in int16 (2 * 2 * 63 * 128 < 2^15), then the scale
          const __m256i v0 = load(p[b].q[4 * j + t]), v1 = load(p[b].q[4 * j + t + 1]);
          for (int i = 0; i < R; ++i) {
            const int8_t* y = a[i][b].qs + 16 * j + 4 * t;
            const __m256i pair = _mm256_add_epi16(_mm256_maddubs_epi16(v0, bcast4(y)), _mm256_maddubs_epi16(v1, bcast4(y + 4)));
            isum[i] = _mm256_add_epi32(isum[i], _mm256_madd_epi16(pair, sc));
            keep_order(isum[i]);
          }
        }
      }
      if constexpr (kOffShift >= 0) {
        __m256i off[R];
        against_bsums<R>(p[b].pairs, a, b, off);
        for (int i = 0; i < R; ++i) isum[i] = _mm256_sub_epi32(isum[i], _mm256_slli_epi32(off[i], kOffShift));
      }
      __m256i msum[R];
      if constexpr (T == QuantType::q2_K) against_bsums<R>(p[b].mins, a, b, msum);
      const __m256 dw = _mm256_load_ps(p[b].d);
      for (int i = 0; i < R; ++i) {
        const __m256 dy = _mm256_set1_ps(x.d[(m + i) * o.nb + b]);
        __m256 t = _mm256_mul_ps(_mm256_mul_ps(dw, dy), _mm256_cvtepi32_ps(isum[i]));
        if constexpr (T == QuantType::q2_K)
          t = _mm256_sub_ps(t, _mm256_mul_ps(_mm256_mul_ps(_mm256_load_ps(p[b].dmin), dy), _mm256_cvtepi32_ps(msum[i])));
        s[i] = _mm256_add_ps(s[i], t);
      }
    }
    store_rows<R>(s, o, m, n0);
  }
};

template <class P>
void run(const QuantOperands& o) {
  run_packed<P, kLanes, kRowBlock, kGroupsPerItem>(o);
}

}  // namespace
#endif

bool quant_prefill8(QuantType wtype, const QuantOperands& o) {
#if defined(LOOM_QUANT_PREFILL8)
  if (o.N < kPackedMinRows) return false;
  if (wtype == QuantType::q8_0) return run<Block32<QuantType::q8_0>>(o), true;
  if (wtype == QuantType::q4_0) return run<Block32<QuantType::q4_0>>(o), true;
  if (wtype == QuantType::q5_0) return run<Block32<QuantType::q5_0>>(o), true;
  if (wtype == QuantType::q4_1) return run<Block32<QuantType::q4_1>>(o), true;
  if (wtype == QuantType::q5_1) return run<Block32<QuantType::q5_1>>(o), true;
  if (wtype == QuantType::q4_K) return run<SuperK<false>>(o), true;
  if (wtype == QuantType::q5_K) return run<SuperK<true>>(o), true;
  if (wtype == QuantType::q6_K) return run<Super16<QuantType::q6_K>>(o), true;
  if (wtype == QuantType::q3_K) return run<Super16<QuantType::q3_K>>(o), true;
  if (wtype == QuantType::q2_K) return run<Super16<QuantType::q2_K>>(o), true;
#else
  (void)wtype, (void)o;
#endif
  return false;
}

}  // namespace loom::kernels::cpu::LOOM_ISA
