// linear_forward_quantized for many rows (quant_prefill.h): q8_0, q4_0 and
// q5_0 weights against q8_0 activations, q4_1 and q5_1 against q8_1, q2_K,
// q3_K, q4_K, q5_K and q6_K against q8_K, with
// AVX512_VNNI, 16 outputs to a vector.
//
// quant_linear.cpp's tiles put one output's 32 products of a block in one
// vector and then reduce eight such vectors across lanes for every block;
// with many rows that reduction, not the products, bounds the speed. Here a
// group of 16 weight rows is first repacked (per call, per thread, while a
// block of x's rows passes it) so that lane c of a 64-byte vector holds four
// consecutive values of row c: one vpdpbusd against four bytes of x
// broadcast adds four products to each of the 16 outputs, and eight of them
// leave a block's 16 integer sums in 16 lanes, no reduction. vpdpbusd takes
// unsigned weights, so the repacked values are q8_0's qs + 128, q4_0's
// nibbles (0..15) and q5_0's 0..31 as stored, and the block's sum of x
// times that offset (128, 8, 16) is subtracted:
// exact in int32 (|sum| <= 32 * 255 * 128). The float step is the
// reference's per lane, in its order (isum * (dw * da), added to the sum of
// the earlier blocks; no FMA), then + bias: quant.h's vec_dot bit for bit,
// as the other paths (tests/kernels/test_quant_linear.cpp).
#include "kernels/cpu/quant_prefill.h"
#include "kernels/cpu/quant_prefill_run.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "core/dtype.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/quant_tile.h"
#include "kernels/cpu/scratch.h"

#if defined(__AVX512F__) && defined(__AVX512VNNI__)
#define LOOM_QUANT_PREFILL 1
#include <immintrin.h>
#endif

namespace loom::kernels::cpu::LOOM_ISA {

#if defined(LOOM_QUANT_PREFILL)
namespace {

using namespace quant_packed;

constexpr int kLanes = 16;              // outputs of a group, one per f32 lane
constexpr int64_t kRowBlock = 512;      // x's rows an item takes past its groups
constexpr int64_t kGroupsPerItem = 4;   // groups of 16 outputs an item takes
constexpr int kRowTile = 8;             // rows sharing one block's weight vectors

// One block of a group: the 16 rows' scales widened, and their values as
// vpdpbusd takes them: value j of row c at q[(j / 4) * 64 + 4 c + j % 4].
struct alignas(64) PackedBlock {
  float d[kLanes];
  float m[kLanes];  // q4_1, q5_1: the block's min
  uint8_t q[kQK * kLanes];
};

// What the u8 form adds to a weight value (q8_0: qs + 128; q4_0, q5_0: the
// stored value is already value + 8, value + 16).
template <QuantType T>
constexpr int32_t kOffset = T == QuantType::q8_0 ? 128 : T == QuantType::q5_0 ? 16 : 8;

// Rows [n0, n0 + 16) of W (the last row repeated past OC) into p, nb blocks.
template <QuantType T>
void pack_group(PackedBlock* p, const QuantOperands& o, int64_t n0) {
  for (int c = 0; c < kLanes; ++c) {
    const std::byte* row = row_at<std::byte>(o.w, o.w_row, std::min(n0 + c, o.OC - 1));
    for (int64_t b = 0; b < o.nb; ++b) {
      __m256i v;
      if constexpr (T == QuantType::q8_0) {
        const auto& blk = reinterpret_cast<const block_q8_0*>(row)[b];
        p[b].d[c] = half_to_float(blk.d);
        v = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qs)), _mm256_set1_epi8(-128));
      } else {  // q4_0, q5_0, q4_1 (values 0..15, or 0..31), q5_1, with the min beside d
        v = quant_tile::nibble_block32<T>(row, b, &p[b].d[c], &p[b].m[c]);
      }
      alignas(32) uint32_t four[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(four), v);
      for (int k = 0; k < 8; ++k) std::memcpy(p[b].q + 64 * k + 4 * c, &four[k], 4);
    }
  }
}

// y's rows [m, m + R), outputs [n0, n0 + 16) below OC: the sums s, + bias.
template <int R>
void store_rows(const __m512 (&s)[R], const QuantOperands& o, int64_t m, int64_t n0) {
  const auto mask = static_cast<__mmask16>((1u << std::min<int64_t>(kLanes, o.OC - n0)) - 1);
  const __m512 bias = o.bias != nullptr ? _mm512_maskz_loadu_ps(mask, o.bias + n0) : _mm512_setzero_ps();
  for (int r = 0; r < R; ++r) {
    const __m512 v = o.bias != nullptr ? _mm512_add_ps(s[r], bias) : s[r];
    _mm512_mask_storeu_ps(o.y + (m + r) * o.OC + n0, mask, v);
  }
}

// y's rows [m, m + R), outputs [n0, n0 + 16) (those below OC).
template <QuantType T, int R>
void rows_tile(const PackedBlock* p, const QuantOperands& o, RowBlocks x, int64_t m, int64_t n0) {
  using A = Activations32<T>;
  __m512 s[R];
  const A* a[R];
  for (int r = 0; r < R; ++r) s[r] = _mm512_setzero_ps(), a[r] = row_at<A>(o.a, o.a_row, m + r);
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
      if constexpr (!kHasMin<T>) acc = _mm512_sub_epi32(acc, _mm512_set1_epi32(kOffset<T> * x.sum[at]));
      const __m512 d = _mm512_mul_ps(dw, _mm512_set1_ps(x.d[at]));
      // (maskz: GCC 12 warns that plain cvtepi32_ps's undefined source may be uninitialized.)
      __m512 t = _mm512_mul_ps(_mm512_maskz_cvtepi32_ps(0xffff, acc), d);
      if constexpr (kHasMin<T>) t = _mm512_add_ps(t, _mm512_mul_ps(_mm512_load_ps(p[b].m), _mm512_set1_ps(x.s[at])));
      s[r] = _mm512_add_ps(s[r], t);
    }
  }
  store_rows<R>(s, o, m, n0);
}

// q8_0 / q4_0 / q5_0 / q4_1 / q5_1 weights: what run_packed needs of a weight type.
template <QuantType T>
struct Block32 {
  using Packed = PackedBlock;
  using Rows = RowBlocks;
  static constexpr int kTile = kRowTile;
  static Rows prepare(const QuantOperands& o) { return prepare_q8<T>(o); }
  static void pack(Packed* p, const QuantOperands& o, int64_t n0) { pack_group<T>(p, o, n0); }
  template <int R>
  static void tile(const Packed* p, const QuantOperands& o, Rows x, int64_t m, int64_t n0) {
    rows_tile<T, R>(p, o, x, m, n0);
  }
};

// q4_K and q5_K against q8_K (quant.h's vec_dot_q4_K_q8_K, _q5_K_q8_K): per
// super-block an integer isum = sum_j sc_j * dot_j over the 8 sub-blocks of
// 32 (dot_j of the values 0..15 or 0..31 with x: vpdpbusd as is) and msum =
// sum_j m_j * (x's sum over sub-block j, from its bsums), exact in int32;
// then the reference's d * isum - dmin * msum, added in super-block order.
struct NoHigh {};
struct High {
  uint8_t v[4][8][64];  // q5_K: [r][k]: lane c's values 4 k .. 4 k + 3 of sub-block 2 r + 1
};
template <bool kFive>
struct alignas(64) PackedSuperK {
  float d[kLanes], dmin[kLanes];
  int32_t sc[8][kLanes], m[8][kLanes];
  // [r][k]: lane c's 4 bytes qs[32 r + 4 k ..] of row c: low nibbles values of
  // sub-block 2 r, high nibbles of sub-block 2 r + 1. q5_K: the values of
  // sub-block 2 r (0..31, the fifth bit joined when packing), and those of
  // 2 r + 1 in hi: no unpacking per row tile.
  uint8_t q[4][8][64];
  [[no_unique_address]] std::conditional_t<kFive, High, NoHigh> hi;
};

template <bool kFive>
struct SuperK {
  using Packed = PackedSuperK<kFive>;
  using Block = std::conditional_t<kFive, block_q5_K, block_q4_K>;
  using Rows = RowSupers;
  static constexpr int kTile = 4;

  static Rows prepare(const QuantOperands& o) { return prepare_q8_K<32>(o); }

  static void pack(Packed* p, const QuantOperands& o, int64_t n0) {
    for (int c = 0; c < kLanes; ++c) {
      const auto* row = row_at<Block>(o.w, o.w_row, std::min(n0 + c, o.OC - 1));
      for (int64_t b = 0; b < o.nb; ++b) {
        const Block& blk = row[b];
        p[b].d[c] = half_to_float(blk.d), p[b].dmin[c] = half_to_float(blk.dmin);
        for (int j = 0; j < 8; ++j) {
          uint8_t sc = 0, mn = 0;
          q4_K_scale_min(j, blk.scales, &sc, &mn);
          p[b].sc[j][c] = sc, p[b].m[j][c] = mn;
        }
        if constexpr (kFive) {
          // quant_tile.h's unpacking: sub-block j's 32 values (0..31) in q[j].
          const quant_tile::KUnpacked u = quant_tile::Q5_KSimd::unpack(blk);
          for (int r = 0; r < 4; ++r) {
            alignas(32) uint32_t lo[8], hi[8];
            _mm256_store_si256(reinterpret_cast<__m256i*>(lo), u.q[2 * r]);
            _mm256_store_si256(reinterpret_cast<__m256i*>(hi), u.q[2 * r + 1]);
            for (int k = 0; k < 8; ++k) {
              std::memcpy(p[b].q[r][k] + 4 * c, &lo[k], 4);
              std::memcpy(p[b].hi.v[r][k] + 4 * c, &hi[k], 4);
            }
          }
        } else {
          for (int r = 0; r < 4; ++r)
            for (int k = 0; k < 8; ++k) std::memcpy(p[b].q[r][k] + 4 * c, blk.qs + 32 * r + 4 * k, 4);
        }
      }
    }
  }

  // isum[i] of rows [m, m + R) for super-block b of the group.
  template <int R>
  static void isums(const Packed& w, const block_q8_K* const* a, int64_t b, __m512i (&isum)[R]) {
    const __m512i low = _mm512_set1_epi8(0xf);
    for (int i = 0; i < R; ++i) isum[i] = _mm512_setzero_si512();
    for (int r = 0; r < 4; ++r) {
      __m512i lo[R], hi[R];
      for (int i = 0; i < R; ++i) lo[i] = hi[i] = _mm512_setzero_si512();
      for (int k = 0; k < 8; ++k) {
        const __m512i v = _mm512_load_si512(w.q[r][k]);
        __m512i vl, vh;
        if constexpr (kFive) {
          vl = v, vh = _mm512_load_si512(w.hi.v[r][k]);
        } else {
          vl = _mm512_and_si512(v, low), vh = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
        }
        for (int i = 0; i < R; ++i) {
          int32_t y[2];
          std::memcpy(&y[0], a[i][b].qs + 64 * r + 4 * k, 4);
          std::memcpy(&y[1], a[i][b].qs + 64 * r + 32 + 4 * k, 4);
          lo[i] = _mm512_dpbusd_epi32(lo[i], vl, _mm512_set1_epi32(y[0]));
          hi[i] = _mm512_dpbusd_epi32(hi[i], vh, _mm512_set1_epi32(y[1]));
        }
      }
      const __m512i sl = _mm512_load_si512(w.sc[2 * r]), sh = _mm512_load_si512(w.sc[2 * r + 1]);
      for (int i = 0; i < R; ++i)
        isum[i] = _mm512_add_epi32(isum[i],
                                   _mm512_add_epi32(_mm512_mullo_epi32(sl, lo[i]), _mm512_mullo_epi32(sh, hi[i])));
    }
  }

  template <int R>
  static void tile(const Packed* p, const QuantOperands& o, Rows x, int64_t m, int64_t n0) {
    __m512 s[R];
    const block_q8_K* a[R];
    for (int i = 0; i < R; ++i)
      s[i] = _mm512_setzero_ps(), a[i] = row_at<block_q8_K>(o.a, o.a_row, m + i);
    for (int64_t b = 0; b < o.nb; ++b) {
      __m512i isum[R];
      isums<R>(p[b], a, b, isum);
      for (int i = 0; i < R; ++i) {
        const int32_t* sums = x.sums + ((m + i) * o.nb + b) * 8;
        __m512i msum = _mm512_setzero_si512();
        for (int j = 0; j < 8; ++j)
          msum = _mm512_add_epi32(msum, _mm512_mullo_epi32(_mm512_load_si512(p[b].m[j]), _mm512_set1_epi32(sums[j])));
        const __m512 dy = _mm512_set1_ps(x.d[(m + i) * o.nb + b]);
        const __m512 d = _mm512_mul_ps(_mm512_load_ps(p[b].d), dy), dmin = _mm512_mul_ps(_mm512_load_ps(p[b].dmin), dy);
        const __m512 t = _mm512_sub_ps(_mm512_mul_ps(d, _mm512_maskz_cvtepi32_ps(0xffff, isum[i])),
                                       _mm512_mul_ps(dmin, _mm512_maskz_cvtepi32_ps(0xffff, msum)));
        s[i] = _mm512_add_ps(s[i], t);
      }
    }
    store_rows<R>(s, o, m, n0);
  }
};

// q6_K, q3_K and q2_K against q8_K (quant.h's vec_dot_q6_K_q8_K, _q3_K_,
// _q2_K_): 16 sub-blocks of 16 values, unpacked to bytes when W is repacked
// (q6_K 0..63, q3_K q + 4 in 0..7, q2_K 0..3) and dot_j of them with x
// (vpdpbusd as is); per super-block isum = sum_j sc_j * (dot_j - off *
// bsum_j) (off 32, 4, 0; bsum_j x's sum there, q8_K's bsums; q3_K's scales
// signed, sc - 32) exact in int32, then (dw * dy) * isum; q2_K also msum =
// sum_j m_j * bsum_j and d * isum - dmin * msum, as the reference.
struct NoMins {};
struct Mins {
  float dmin[kLanes];
  int32_t m[16][kLanes];
};
template <QuantType T>
struct alignas(64) PackedSuper16 {
  float d[kLanes];
  int32_t sc[16][kLanes];
  uint8_t q[64][64];  // [k]: lane c's values 4 k .. 4 k + 3 of row c
  [[no_unique_address]] std::conditional_t<T == QuantType::q2_K, Mins, NoMins> mins;
};

// Values 128 h + 32 k + l of a q2_K / q3_K super-block: bits 2k of qs[32 h + l]
// (q3_K: + 4 * bit 4 h + k of hmask[l]).
template <class Block>
void unpack_low_bits(const Block& x, uint8_t (&v)[kQKK]) {
  for (int h = 0; h < 2; ++h)
    for (int k = 0; k < 4; ++k)
      for (int l = 0; l < 32; ++l) {
        int q = (x.qs[32 * h + l] >> (2 * k)) & 3;
        if constexpr (std::is_same_v<Block, block_q3_K>) q += 4 * ((x.hmask[l] >> (4 * h + k)) & 1);
        v[128 * h + 32 * k + l] = static_cast<uint8_t>(q);
      }
}

template <QuantType T>
struct Super16 {
  using Packed = PackedSuper16<T>;
  using Rows = RowSupers;  // sums over sub-blocks of 16: q8_K's bsums
  using Block = std::conditional_t<T == QuantType::q6_K, block_q6_K,
                                   std::conditional_t<T == QuantType::q3_K, block_q3_K, block_q2_K>>;
  static constexpr int kTile = 4;
  static constexpr int32_t kOff = T == QuantType::q6_K ? 32 : T == QuantType::q3_K ? 4 : 0;

  static Rows prepare(const QuantOperands& o) { return prepare_q8_K<16>(o); }

  static void pack(Packed* p, const QuantOperands& o, int64_t n0) {
    for (int c = 0; c < kLanes; ++c) {
      const auto* row = row_at<Block>(o.w, o.w_row, std::min(n0 + c, o.OC - 1));
      for (int64_t b = 0; b < o.nb; ++b) {
        const Block& x = row[b];
        p[b].d[c] = half_to_float(x.d);
        uint8_t v[kQKK];
        if constexpr (T == QuantType::q6_K) {
          for (int j = 0; j < 16; ++j) p[b].sc[j][c] = x.scales[j];
          unpack_q6_K(x, v);
        } else if constexpr (T == QuantType::q3_K) {
          uint8_t sc[16];
          q3_K_scales(x.scales, sc);
          for (int j = 0; j < 16; ++j) p[b].sc[j][c] = sc[j] - 32;
          unpack_low_bits(x, v);
        } else {
          p[b].mins.dmin[c] = half_to_float(x.dmin);
          for (int j = 0; j < 16; ++j) p[b].sc[j][c] = x.scales[j] & 0xf, p[b].mins.m[j][c] = x.scales[j] >> 4;
          unpack_low_bits(x, v);
        }
        for (int k = 0; k < 64; ++k) std::memcpy(p[b].q[k] + 4 * c, v + 4 * k, 4);
      }
    }
  }

  template <int R>
  static void tile(const Packed* p, const QuantOperands& o, Rows x, int64_t m, int64_t n0) {
    __m512 s[R];
    const block_q8_K* a[R];
    for (int i = 0; i < R; ++i)
      s[i] = _mm512_setzero_ps(), a[i] = row_at<block_q8_K>(o.a, o.a_row, m + i);
    for (int64_t b = 0; b < o.nb; ++b) {
      __m512i isum[R], msum[R];
      for (int i = 0; i < R; ++i) isum[i] = msum[i] = _mm512_setzero_si512();
      for (int j = 0; j < 16; ++j) {
        __m512i acc[R];
        for (int i = 0; i < R; ++i) acc[i] = _mm512_setzero_si512();
        for (int t = 0; t < 4; ++t) {
          const __m512i v = _mm512_load_si512(p[b].q[4 * j + t]);
          for (int i = 0; i < R; ++i) {
            int32_t y;
            std::memcpy(&y, a[i][b].qs + 16 * j + 4 * t, 4);
            acc[i] = _mm512_dpbusd_epi32(acc[i], v, _mm512_set1_epi32(y));
          }
        }
        const __m512i sc = _mm512_load_si512(p[b].sc[j]);
        for (int i = 0; i < R; ++i) {
          const int32_t bsum = x.sums[((m + i) * o.nb + b) * 16 + j];
          if constexpr (kOff != 0) acc[i] = _mm512_sub_epi32(acc[i], _mm512_set1_epi32(kOff * bsum));
          isum[i] = _mm512_add_epi32(isum[i], _mm512_mullo_epi32(sc, acc[i]));
          if constexpr (T == QuantType::q2_K)
            msum[i] = _mm512_add_epi32(msum[i], _mm512_mullo_epi32(_mm512_load_si512(p[b].mins.m[j]),
                                                                     _mm512_set1_epi32(bsum)));
        }
      }
      const __m512 dw = _mm512_load_ps(p[b].d);
      for (int i = 0; i < R; ++i) {
        const __m512 dy = _mm512_set1_ps(x.d[(m + i) * o.nb + b]);
        __m512 t = _mm512_mul_ps(_mm512_mul_ps(dw, dy), _mm512_maskz_cvtepi32_ps(0xffff, isum[i]));
        if constexpr (T == QuantType::q2_K)
          t = _mm512_sub_ps(t, _mm512_mul_ps(_mm512_mul_ps(_mm512_load_ps(p[b].mins.dmin), dy),
                                             _mm512_maskz_cvtepi32_ps(0xffff, msum[i])));
        s[i] = _mm512_add_ps(s[i], t);
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

bool quant_prefill(QuantType wtype, const QuantOperands& o) {
#if defined(LOOM_QUANT_PREFILL)
  if (o.N < kQuantPrefillRows) return false;
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
  return false;
#else
  return quant_prefill8(wtype, o);
#endif
}

}  // namespace loom::kernels::cpu::LOOM_ISA
