// What the repacked quantized paths share (quant_prefill.cpp at 16 outputs a
// vector, quant_prefill8.cpp at 8): the work loop and x's per-block figures.
// Internal to src/kernels/cpu; compiled per instruction-set level like
// cpu_ops.h (a level's two sources share its flags).
#pragma once

#include <omp.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "core/dtype.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/quant_prefill.h"
#include "kernels/cpu/scratch.h"

#ifndef LOOM_ISA
#error "kernels/cpu/quant_prefill_run.h is included only by the per-level CPU kernel sources"
#endif

namespace loom::kernels::cpu::LOOM_ISA::quant_packed {

// Row i of rows `bytes` apart from base, as blocks of B.
template <typename B>
const B* row_at(const std::byte* base, size_t bytes, int64_t i) {
  return reinterpret_cast<const B*>(base + static_cast<size_t>(i) * bytes);
}

// Per row m and block b of q8_0 activations: the scale widened and the sum
// of the block's values.
struct RowBlocks {
  const float* d;
  const int32_t* sum;        // [m * nb + b]
  const float* s = nullptr;  // q8_1 rows: d * sum(qs) as stored (f16), widened
};
inline RowBlocks prepare_q8_0(const QuantOperands& o) {
  auto* d = thread_scratch<float>(ScratchSlot::b, static_cast<size_t>(o.N * o.nb));
  auto* sum = thread_scratch<int32_t>(ScratchSlot::c, static_cast<size_t>(o.N * o.nb));
#pragma omp parallel for schedule(static)
  for (int64_t m = 0; m < o.N; ++m)
    for (int64_t b = 0; b < o.nb; ++b) {
      const block_q8_0& blk = row_at<block_q8_0>(o.a, o.a_row, m)[b];
      int32_t t = 0;
      for (int j = 0; j < kQK; ++j) t += blk.qs[j];
      d[m * o.nb + b] = half_to_float(blk.d), sum[m * o.nb + b] = t;
    }
  return {d, sum};
}

// q8_1 rows: each block's d and s widened (RowBlocks' s; no sum).
inline RowBlocks prepare_q8_1(const QuantOperands& o) {
  auto* d = thread_scratch<float>(ScratchSlot::b, static_cast<size_t>(o.N * o.nb));
  auto* s = thread_scratch<float>(ScratchSlot::c, static_cast<size_t>(o.N * o.nb));
#pragma omp parallel for schedule(static)
  for (int64_t m = 0; m < o.N; ++m)
    for (int64_t b = 0; b < o.nb; ++b) {
      const block_q8_1& blk = row_at<block_q8_1>(o.a, o.a_row, m)[b];
      d[m * o.nb + b] = half_to_float(blk.d), s[m * o.nb + b] = half_to_float(blk.s);
    }
  return {d, nullptr, s};
}

// The 32-value weight types (quant.h): q4_1 and q5_1 carry a min per block
// and take q8_1 activations (quant.h's dot_with_min: (dw * da) * isum + mw *
// sa); q8_0, q4_0 and q5_0 take q8_0.
template <QuantType T>
inline constexpr bool kHasMin = T == QuantType::q4_1 || T == QuantType::q5_1;
template <QuantType T>
using WeightBlock32 = std::conditional_t<
    T == QuantType::q8_0, block_q8_0,
    std::conditional_t<T == QuantType::q4_0, block_q4_0,
                       std::conditional_t<T == QuantType::q5_0, block_q5_0,
                                          std::conditional_t<T == QuantType::q4_1, block_q4_1, block_q5_1>>>>;
template <QuantType T>
using Activations32 = std::conditional_t<kHasMin<T>, block_q8_1, block_q8_0>;
// x's per-block figures for weight type T's activations.
template <QuantType T>
RowBlocks prepare_q8(const QuantOperands& o) {
  return kHasMin<T> ? prepare_q8_1(o) : prepare_q8_0(o);
}

// Per row m and super-block b of q8_K activations: the scale, and the sums of
// x over its sub-blocks of Span values (q8_K's bsums cover 16 each).
template <typename Sum>
struct RowSupersOf {
  const float* d;
  const Sum* sums;  // [(m * nb + b) * (256 / Span) + j]
};
using RowSupers = RowSupersOf<int32_t>;
// Sum: int32_t, or int16_t where the consumer multiplies them by vpmaddwd
// (|a sum of 32 values| <= 32 * 127).
template <int Span, typename Sum = int32_t>
RowSupersOf<Sum> prepare_q8_K(const QuantOperands& o) {
  static_assert(Span <= 32 || sizeof(Sum) == 4, "int16 sums hold at most 32 values");
  constexpr int kSums = kQKK / Span, kPer = Span / 16;
  auto* d = thread_scratch<float>(ScratchSlot::b, static_cast<size_t>(o.N * o.nb));
  auto* sums = thread_scratch<Sum>(ScratchSlot::c, static_cast<size_t>(o.N * o.nb * kSums));
#pragma omp parallel for schedule(static)
  for (int64_t m = 0; m < o.N; ++m)
    for (int64_t b = 0; b < o.nb; ++b) {
      const block_q8_K& blk = row_at<block_q8_K>(o.a, o.a_row, m)[b];
      d[m * o.nb + b] = blk.d;
      for (int j = 0; j < kSums; ++j) {
        int32_t t = 0;
        for (int i = 0; i < kPer; ++i) t += blk.bsums[kPer * j + i];
        sums[(m * o.nb + b) * kSums + j] = static_cast<Sum>(t);
      }
    }
  return {d, sums};
}

// A q6_K super-block's 256 values as bytes 0..63 in order (quant.h's layout:
// value 128 h + 32 k + l from ql and qh).
inline void unpack_q6_K(const block_q6_K& x, uint8_t (&v)[kQKK]) {
  for (int h = 0; h < 2; ++h) {
    const uint8_t *ql = x.ql + 64 * h, *qh = x.qh + 32 * h;
    uint8_t* q = v + 128 * h;
    for (int l = 0; l < kQK; ++l) {
      q[l] = static_cast<uint8_t>((ql[l] & 0xf) | ((qh[l] & 3) << 4));
      q[l + 32] = static_cast<uint8_t>((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4));
      q[l + 64] = static_cast<uint8_t>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
      q[l + 96] = static_cast<uint8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
    }
  }
}

#if defined(__AVX2__)
// unpack_q6_K's order in vectors: q[g] holds values 32 g .. 32 g + 31 (0..63).
inline void unpack_q6_K_avx2(const block_q6_K& x, __m256i (&q)[8]) {
  const auto load = [](const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); };
  const __m256i m4 = _mm256_set1_epi8(0xf), m30 = _mm256_set1_epi8(0x30);
  for (int h = 0; h < 2; ++h) {
    const __m256i ql0 = load(x.ql + 64 * h), ql1 = load(x.ql + 64 * h + 32), qh = load(x.qh + 32 * h);
    __m256i* v = q + 4 * h;
    v[0] = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
    v[1] = _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
    v[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), _mm256_and_si256(qh, m30));
    v[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4), _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
  }
}
#endif

// y for a weight type P (Packed, Rows, kTile, prepare, pack, tile<R>): items of
// GroupsPerItem groups of Lanes outputs by RowBlock rows of x, handed out one
// at a time; each group repacked by the thread that takes it. Which thread
// computes an item never changes an output's arithmetic.
template <class P, int Lanes, int64_t RowBlock, int64_t GroupsPerItem>
void run_packed(const QuantOperands& o) {
  const typename P::Rows x = P::prepare(o);
  const int64_t groups = (o.OC + Lanes - 1) / Lanes, chunks = (groups + GroupsPerItem - 1) / GroupsPerItem;
  const int64_t row_blocks = (o.N + RowBlock - 1) / RowBlock;
  const ThreadSlices<typename P::Packed> packed(ScratchSlot::d, static_cast<size_t>(o.nb));
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t item = 0; item < chunks * row_blocks; ++item) {
    typename P::Packed* p = packed.slice(omp_get_thread_num());
    const int64_t g0 = item % chunks * GroupsPerItem, g1 = std::min(groups, g0 + GroupsPerItem);
    const int64_t m0 = item / chunks * RowBlock, m1 = std::min(o.N, m0 + RowBlock);
    for (int64_t g = g0; g < g1; ++g) {
      P::pack(p, o, g * Lanes);
      int64_t m = m0;
      for (; m + P::kTile <= m1; m += P::kTile) P::template tile<P::kTile>(p, o, x, m, g * Lanes);
      for (; m < m1; ++m) P::template tile<1>(p, o, x, m, g * Lanes);
    }
  }
}

}  // namespace loom::kernels::cpu::LOOM_ISA::quant_packed
