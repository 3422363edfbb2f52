// linear_forward_quantized on the CPU (ops.h): y = x @ W^T (+ bias) with W's
// rows stored as llama.cpp blocks (kernels/quant.h), read block by block and
// never dequantized.
//
// Each row of x is quantized once per call into scratch by quantize_row
// (q8_0, q8_1 or q8_K, the weight type's dot type: the reference's bytes). Then
// every output is vec_dot(W row n, x row m) of kernels/quant.h exactly: per
// block an integer sum, exact in any order, then the block's float steps in
// f32, accumulated in block order. The vector paths compute 8 outputs at a
// time (a tile: 1 row of x by 8 rows of W for decode, 4 by 2 for prefill),
// one output per f32 lane (many rows with AVX512_VNNI:
// quant_prefill.cpp, 16 outputs a vector): per block, the 8 outputs' integer sums are
// reduced into one vector (integer adds) and the float steps run lane by
// lane with the reference's operations in its order (separate multiply and
// add: no FMA). So every level gives the scalar reference's bits, whatever
// the tile, the rows around a row or the thread count (tests/kernels/
// test_quant_linear.cpp checks all levels against the reference).
//
// Integer sums (activation values are in [-127, 127]: quantize_row's range):
//   q8_0 . q8_0: |w| (u8) times y with w's sign (s8), pairs summed in int16
//     (at most 2 * 128 * 127: no saturation) then int32 — or vpdpbusd
//     (AVX512_VNNI), four products straight into int32;
//   q4_0 . q8_0: the nibble q (0..15) times y, minus 8 times y, in int16
//     pairs (|pair| <= 2 * 15 * 127), for (q - 8) y (levels with VNNI
//     decode q4_0 in quant_decode.cpp).
//   q4_K . q8_K: nibbles (0..15) times y, pairs in int16 (<= 3810), times
//     the sub-block's 6-bit scale into int32; the mins against q8_K's bsums.
//   q6_K . q8_K: 6-bit q (0..63) times y (pairs <= 16002), times the signed
//     scale; minus 32 * sum_j scale_j * bsums_j (q - 32 without a signed
//     unpack).
//   q5_K . q8_K: q4_K's with the fifth bit ORed into each nibble (0..31,
//     pairs <= 7874); q5_0 . q8_0: q4_0's with 16 for 8.
//   q4_1, q5_1 . q8_1: q (0..31) times y in int16 pairs, then int32; the
//     min times q8_1's s is the float step's second term.
//   q2_K . q8_K: q (0..3) times y, times the 4-bit scale (pairs <= 768);
//     the 4-bit mins against bsums as q4_K's.
//   q3_K . q8_K: q + 4 (0..7) times y, times the signed scale (sc - 32);
//     minus 4 * sum_j scale_j * bsums_j, as q6_K's offset.
// The generic level calls the reference dot products themselves.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/linear_amx.h"
#include "kernels/cpu/quant_prefill.h"
#include "kernels/cpu/quant_prefill_run.h"
#include "kernels/cpu/quant_tile.h"
#include "kernels/cpu/rows.h"
#include "kernels/cpu/scratch.h"
#include "kernels/quant.h"

namespace loom::kernels::cpu::LOOM_ISA {
namespace {

using namespace quant_tile;

#if defined(LOOM_QUANT_AVX2)

// out[i * C + j] = dot(W row w[j], activation row a[i]) over nb blocks (S:
// the type's vector version); the bytes at `ahead` (the next tile's weight
// rows, when decoding) asked for into L2 meanwhile, lines_ahead lines a block.
template <class Q, class S, int R, int C>
void tile_simd(const typename Q::W* const* w, const typename Q::A* const* a, int64_t nb, float* out,
               const char* ahead, int64_t lines_ahead) {
  static_assert(R * C == kPairs);
  __m256 s = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    if (ahead != nullptr)
      for (int64_t l = 0; l < lines_ahead; ++l) _mm_prefetch(ahead + (b * lines_ahead + l) * 64, _MM_HINT_T1);
    __m256i isum[kPairs], msum[kPairs];
    for (int j = 0; j < C; ++j) {
      const typename S::Unpacked u = S::unpack(w[j][b]);
      for (int i = 0; i < R; ++i) isum[i * C + j] = S::dot(u, a[i][b], &msum[i * C + j]);
    }
    __m256i msums = _mm256_setzero_si256();
    if constexpr (S::kMins) msums = hsum8(msum);
    s = S::template step<R, C>(s, hsum8(isum), msums, w, a, b);
  }
  _mm256_storeu_ps(out, s);
}

template <class Q, int R, int C>
void tile(const typename Q::W* const* w, const typename Q::A* const* a, int64_t nb, float* out, const char* ahead,
          int64_t lines_ahead) {
  using S = typename Simd<Q>::T;
  if constexpr (std::is_void_v<S>) {
    for (int i = 0; i < R; ++i)
      for (int j = 0; j < C; ++j) out[i * C + j] = Q::reference(w[j], a[i], nb * Q::kBlock);
  } else {
    tile_simd<Q, S, R, C>(w, a, nb, out, ahead, lines_ahead);
  }
}

#else  // generic: the reference dot products, one output at a time

template <class Q, int R, int C>
void tile(const typename Q::W* const* w, const typename Q::A* const* a, int64_t nb, float* out, const char*,
          int64_t) {
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < C; ++j) out[i * C + j] = Q::reference(w[j], a[i], nb * Q::kBlock);
}

#endif

using Operands = QuantOperands;  // quant_prefill.h

// Rows m .. m + R of y, columns n0 .. n1, in tiles of R x C: past the last
// row or column a tile repeats the last one (computed, not stored). Below
// fetch_end (decoding), row 0 asks for the next tile's weights meanwhile.
template <class Q, int R, int C>
void tiles(const Operands& o, int64_t m, int64_t n0, int64_t n1, int64_t fetch_end = 0) {
  using W = typename Q::W;
  using A = typename Q::A;
  const A* a[R];
  for (int i = 0; i < R; ++i)
    a[i] = reinterpret_cast<const A*>(o.a + static_cast<size_t>(std::min(m + i, o.N - 1)) * o.a_row);
  for (int64_t n = n0; n < n1; n += C) {
    const W* w[C];
    for (int j = 0; j < C; ++j)
      w[j] = reinterpret_cast<const W*>(o.w + static_cast<size_t>(std::min(n + j, n1 - 1)) * o.w_row);
    // Decoding (the first rows of x), the rows kPairs on -- C rows, one
    // stretch of memory -- are asked for while this tile's are used: C
    // interleaved streams, which the hardware prefetcher followed too late.
    const bool ask = m == 0 && n + C + kPairs <= fetch_end;
    const char* ahead = ask ? reinterpret_cast<const char*>(o.w + static_cast<size_t>(n + kPairs) * o.w_row) : nullptr;
    const int64_t lines = (C * static_cast<int64_t>(o.w_row) / 64 + o.nb - 1) / o.nb;
    float out[kPairs];
    tile<Q, R, C>(w, a, o.nb, out, ahead, lines);
    for (int i = 0; i < R && m + i < o.N; ++i)
      for (int j = 0; j < C && n + j < n1; ++j) {
        float v = out[i * C + j];
        if (o.bias != nullptr) v += o.bias[n + j];
        o.y[(m + i) * o.OC + n + j] = v;
      }
  }
}

// Decoding (fewer than kQuantPrefillRows rows): W's rows split into one
// contiguous run a thread -- one stream of bytes, which the prefetches keep
// ahead of -- 8 rows at a time against every row of x while they are in
// cache: rows of x four at a time in 4 x 2 tiles (a weight block unpacked
// once for 4 rows, not once a row), the last 1-3 in 1 x 8. Which thread
// computes a tile never changes its arithmetic.
template <class Q>
void run_decode(const Operands& o) {
  const int threads = omp_get_max_threads();
  const int64_t per_thread = (o.OC + threads - 1) / threads;
  const int64_t run = std::max<int64_t>(kPairs, (per_thread + kPairs - 1) / kPairs * kPairs);
  const bool parallel = o.N * o.OC * o.nb * Q::kBlock >= kMinParallel;
#pragma omp parallel for schedule(static, 1) if (parallel)
  for (int64_t n0 = 0; n0 < o.OC; n0 += run) {
    const int64_t n1 = std::min(o.OC, n0 + run);
    for (int64_t n = n0; n < n1; n += kPairs) {
      const int64_t n_end = std::min(n1, n + kPairs);
      int64_t m = 0;
      for (; m + 4 <= o.N; m += 4) tiles<Q, 4, 2>(o, m, n, n_end, n1);
      for (; m < o.N; ++m) tiles<Q, 1, kPairs>(o, m, n, n_end, n1);
    }
  }
}

// Every output, in work items of (blocks of x rows) x (panels of W rows),
// handed out one at a time: a thread's items never change any output's
// arithmetic. A panel of W stays in L2 while a block of rows passes it:
// rows in tiles of 4 (4 x 2 outputs), the last 1-3 one at a time (1 x 8).
template <class Q>
void run(const Operands& o) {
  if (o.N < kQuantPrefillRows) return run_decode<Q>(o);
  constexpr int64_t kRowBlock = 64, kPanelBytes = 128 << 10;
  const int threads = omp_get_max_threads();
  int64_t panel = std::max<int64_t>(kPairs, kPanelBytes / static_cast<int64_t>(std::max<size_t>(o.w_row, 1)));
  // At least 4 panels per thread when the rows of x are few.
  if (o.N <= kRowBlock) panel = std::min(panel, (o.OC + 4 * threads - 1) / (4 * threads));
  panel = std::max<int64_t>(kPairs, (panel + kPairs - 1) / kPairs * kPairs);
  const int64_t panels = (o.OC + panel - 1) / panel, row_blocks = (o.N + kRowBlock - 1) / kRowBlock;
  const bool parallel = o.N * o.OC * o.nb * Q::kBlock >= kMinParallel;
#pragma omp parallel for schedule(dynamic, 1) if (parallel)
  for (int64_t item = 0; item < panels * row_blocks; ++item) {
    const int64_t n0 = item % panels * panel, n1 = std::min(o.OC, n0 + panel);
    const int64_t m0 = item / panels * kRowBlock, m1 = std::min(o.N, m0 + kRowBlock);
    int64_t m = m0;
    for (; m + 4 <= m1; m += 4) tiles<Q, 4, 2>(o, m, n0, n1);
    for (; m < m1; ++m) tiles<Q, 1, 8>(o, m, n0, n1);
  }
}

// x's N rows quantized to `type` into scratch, row_bytes apart. A row
// quantize_row refuses (NaN, Inf) is a loom::Error naming it, thrown after
// the parallel region (none may leave one).
const std::byte* quantize_rows(const float* x, int64_t N, int64_t IC, QuantType type, size_t row_bytes) {
  std::byte* a = thread_scratch<std::byte>(ScratchSlot::a, static_cast<size_t>(N) * row_bytes);
  std::atomic<int64_t> bad{N};
#pragma omp parallel for schedule(static) if (N > 1 && N * IC >= kMinParallel)
  for (int64_t m = 0; m < N; ++m) {
    try {
      std::byte* row = a + static_cast<size_t>(m) * row_bytes;
      if (!quantize_row_fast(type, x + m * IC, row, IC)) quantize_row(type, x + m * IC, row, IC);
    } catch (...) {
      int64_t first = bad.load();
      while (m < first && !bad.compare_exchange_weak(first, m)) {
      }
    }
  }
  if (const int64_t m = bad.load(); m < N) {
    try {
      quantize_row(type, x + m * IC, a + static_cast<size_t>(m) * row_bytes, IC);
    } catch (const Error& e) {
      fail("linear_forward_quantized: row ", m, " of x: ", e.what());
    }
  }
  return a;
}

}  // namespace

namespace {

// linear_forward_quantized with `prefill` as the path for many rows.
void quantized_linear(Tensor y, const Tensor& x, const Tensor& w, QuantType wtype, const Tensor& bias,
                      bool (*prefill)(QuantType, const QuantOperands&)) {
  const int64_t OC = w.size(0), IC = x.size(-1), N = rows(x);
  if (N == 0 || OC == 0) return;
  const QuantType at = quant_dot_type(wtype);
  const size_t a_row = quant_row_bytes(at, IC);
  const QuantOperands o{y.data_as<float>(),
                   quantize_rows(x.data_as<const float>(), N, IC, at, a_row),
                   static_cast<const std::byte*>(w.data()),
                   bias.defined() ? bias.data_as<const float>() : nullptr,
                   a_row,
                   quant_row_bytes(wtype, IC),
                   N,
                   OC,
                   IC / quant_block_size(wtype)};
  if (prefill(wtype, o)) return;  // many rows, where this level has that path
  if (quant_decode16(wtype, o)) return;  // few, likewise
  switch (wtype) {
    case QuantType::q8_0: return run<Q8_0>(o);
    case QuantType::q4_0: return run<Q4_0>(o);
    case QuantType::q4_K: return run<Q4_K>(o);
    case QuantType::q6_K: return run<Q6_K>(o);
    case QuantType::q5_0: return run<Q5_0>(o);
    case QuantType::q4_1: return run<Q4_1>(o);
    case QuantType::q5_1: return run<Q5_1>(o);
    case QuantType::q2_K: return run<Q2_K>(o);
    case QuantType::q3_K: return run<Q3_K>(o);
    case QuantType::q5_K: return run<Q5_K>(o);
    case QuantType::q8_K:
    case QuantType::q8_1: break;
  }
  LOOM_CHECK(false, "linear_forward_quantized: weight type ", quant_name(wtype), " reached the CPU kernel");
}

}  // namespace

void linear_forward_quantized(Tensor y, const Tensor& x, const Tensor& w, QuantType wtype, const Tensor& bias) {
  quantized_linear(y, x, w, wtype, bias, &quant_prefill);
}

void linear_forward_quantized_amx(Tensor y, const Tensor& x, const Tensor& w, QuantType wtype, const Tensor& bias) {
  quantized_linear(y, x, w, wtype, bias, &quant_prefill_amx);
}

}  // namespace loom::kernels::cpu::LOOM_ISA

namespace loom::kernels::cpu::LOOM_ISA {

// dequantize_rows (ops.h): each row as dequantize_row, rows in parallel.
void dequantize_rows(Tensor out, const Tensor& w, QuantType wtype, int64_t first_row) {
  const int64_t R = out.size(0), IC = out.size(1), row_bytes = w.size(1);
  const uint8_t* src = w.data_as<const uint8_t>() + first_row * row_bytes;
  float* dst = out.data_as<float>();
#pragma omp parallel for schedule(static) if (R * IC >= (1 << 15))
  for (int64_t r = 0; r < R; ++r) dequantize_row(wtype, src + r * row_bytes, dst + r * IC, IC);
}

}  // namespace loom::kernels::cpu::LOOM_ISA
