// The batch-invariant linear at the amx level (linear_amx.h): bf16 operands
// multiplied in AMX tiles, every row count, decode included.
//
// y^T = w x^T as tiles: A, 16 rows of w (outputs n) by 32 bf16 of K, loaded
// from w in place (its rows are A's rows: no copy of w but a zero-padded one
// of a block's last K chunk and of a last block of fewer than 16 rows); B,
// 16 pairs of K by 16 rows of x, copied in the pair-interleaved layout
// TDPBF16PS takes (a 16 x 16 transpose of 32-bit pairs); C, 16 x 16 f32
// sums, outputs by rows. One output's arithmetic is fixed by K alone: +0,
// then per chunk of 32 in increasing K one TDPBF16PS step on that output's
// 32 products (zeros past K), then the bias added in f32 and one rounding
// to y's dtype. The step's rounding is the hardware's own: Intel documents
// sixteen pair steps, but on a Sapphire Rapids-class Xeon about two thirds
// of random steps differed (by up to several ulps) from every IEEE form
// tried -- products added in order, one rounding per pair, one per chunk,
// toward zero -- so no vector form is known to give these bits. The tile a
// row or an output falls in never changes that, so a row's bits depend
// neither on the call's other rows nor on the thread count -- the level's
// batch invariance. They differ from the avx512_bf16 level's (16 lanes of
// pairs, then a tree): bf16 results are a function of the level, as they
// already were there (linear_invariant.cpp gives the measured difference);
// f32 and f16 operands take linear_invariant.cpp's path, whose bits every
// level shares.
//
// Blocking: a thread takes 32 rows of w at a time (two A tiles) against 32
// rows of x (two B tiles): four C tiles, four TDPBF16PS per chunk for four
// tile loads; K in blocks of 8 chunks (w's part in L1) and x's rows in
// groups that fit in L2 (kBlockChunks, kGroupKiB below). Measured against
// oneDNN's AMX GEMM in BENCHMARKS.md (issue 34).
#include "kernels/cpu/linear_amx.h"

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/amx_config.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/rows.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/transpose16.h"

namespace loom::kernels::cpu::LOOM_ISA {

#if defined(__AVX512BF16__)
namespace {

constexpr int64_t kT = 16;         // rows of a tile; its columns hold 64 bytes
constexpr int64_t kChunk = 32;     // bf16 of K a tile step takes
constexpr int64_t kTileElems = kT * kChunk;  // bf16 of an A or B tile
// Cache blocking (measured in BENCHMARKS.md, issue 34): a tile block runs
// kBlockChunks chunks of K (w's 32 rows of them, 16 KiB, stay in L1 while
// every block of x's rows passes), and x's rows are taken in groups whose
// packed copy is at most kGroupKiB (in L2 while the thread's rows of w pass;
// half of a Sapphire Rapids core's L2). C's partial sums wait in memory
// between K blocks: a tile stored and loaded again is exact, so the chunks
// still reach each output in increasing K.
constexpr int64_t kBlockChunks = 8;
constexpr int64_t kGroupKiB = 1024;

// The tile configuration (amx_config.h): tiles 0-3 C, 4-5 A, 6-7 B, each
// 16 rows of 64 bytes.
__attribute__((target("amx-tile,amx-bf16"))) void tiles_begin() {
  TileConfig c;
  for (int t = 0; t < 8; ++t) c.colsb[t] = 64, c.rows[t] = kT;
  load_tile_config(c);
}

__attribute__((target("amx-tile,amx-bf16"))) void tiles_end() { _tile_release(); }

// Where an A tile's rows come from: chunk c at base + c * 64 bytes, rows
// `stride` bytes apart, and the last chunk (when K is not a multiple of 32)
// from a zero-padded copy, 64 bytes a row.
struct ASource {
  const char* base;
  int64_t stride;
  const char* tail;  // nullptr: every chunk in place
};

// C (four 16 x 16 f32 tiles at c: [n block][m block]) += A (two blocks of w
// rows) x B (two blocks of x rows, packed: 1 KiB a chunk) over the chunks
// [ch0, ch1) of `chunks`: C starts from zero at ch0 = 0, else from the sums
// at c. Without the second A or B (TwoN, TwoM false) the tiles that need it
// stay unused.
template <bool TwoN, bool TwoM>
__attribute__((target("amx-tile,amx-bf16"), noinline)) void tile_block(ASource a0, ASource a1, const bf16* b0,
                                                                         const bf16* b1, int64_t ch0, int64_t ch1,
                                                                         int64_t chunks, float* c) {
  if (ch0 == 0) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  } else {
    _tile_loadd(0, c, 64);
    if constexpr (TwoM) _tile_loadd(1, c + kT * kT, 64);
    if constexpr (TwoN) _tile_loadd(2, c + 2 * kT * kT, 64);
    if constexpr (TwoN && TwoM) _tile_loadd(3, c + 3 * kT * kT, 64);
  }
  for (int64_t ch = ch0; ch < ch1; ++ch) {
    const bool last = ch + 1 == chunks;
    const bool t0 = last && a0.tail != nullptr;
    _tile_loadd(4, t0 ? a0.tail : a0.base + ch * 64, t0 ? 64 : a0.stride);
    if constexpr (TwoN) {
      const bool t1 = last && a1.tail != nullptr;
      _tile_loadd(5, t1 ? a1.tail : a1.base + ch * 64, t1 ? 64 : a1.stride);
    }
    _tile_loadd(6, b0 + ch * kTileElems, 64);
    if constexpr (TwoM) _tile_loadd(7, b1 + ch * kTileElems, 64);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (TwoM) _tile_dpbf16ps(1, 4, 7);
    if constexpr (TwoN) _tile_dpbf16ps(2, 5, 6);
    if constexpr (TwoN && TwoM) _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, 64);
  if constexpr (TwoM) _tile_stored(1, c + kT * kT, 64);
  if constexpr (TwoN) _tile_stored(2, c + 2 * kT * kT, 64);
  if constexpr (TwoN && TwoM) _tile_stored(3, c + 3 * kT * kT, 64);
}

inline __mmask32 first32(int64_t valid) {
  return valid >= 32 ? ~__mmask32{0} : valid <= 0 ? __mmask32{0} : static_cast<__mmask32>((uint64_t{1} << valid) - 1);
}

// x's rows [m0, m0 + 16) (those below M; zeros for the rest) as B tiles, one
// per chunk: dst[(ch * 16 + i) * 32 + 2 m + e] = x[m0 + m][32 ch + 2 i + e],
// zeros past K. A chunk of 16 rows is a 16 x 16 block of 32-bit pairs,
// transposed in registers.
void pack_x(bf16* dst, const bf16* x, int64_t M, int64_t K, int64_t m0, int64_t chunks) {
  for (int64_t ch = 0; ch < chunks; ++ch) {
    __m512 a[kT];
    for (int64_t m = 0; m < kT; ++m)
      a[m] = m0 + m < M ? _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(first32(K - ch * kChunk), x + (m0 + m) * K + ch * kChunk))
                        : _mm512_setzero_ps();
    transpose16(a);
    for (int64_t i = 0; i < kT; ++i) _mm512_storeu_ps(reinterpret_cast<float*>(dst + (ch * kT + i) * kChunk), a[i]);
  }
}

// rows (<= 16) rows of w from n0, columns [k0, K), into a 16-row block of
// width `width` bf16, zeros elsewhere.
void copy_rows(bf16* dst, const bf16* w, int64_t K, int64_t n0, int64_t rows, int64_t k0, int64_t width) {
  std::memset(dst, 0, static_cast<size_t>(kT * width) * sizeof(bf16));
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(dst + r * width, w + (n0 + r) * K + k0, static_cast<size_t>(K - k0) * sizeof(bf16));
}

// y[m][n] for the C tile c ([n][m], 16 x 16 f32) of the outputs [n0, n0 +
// 16) and rows [m0, m0 + 16): transposed in registers, + bias (+0 without
// one), rounded to Y; only n < N and m < M are written.
template <typename Y, typename B>
void store_tile(Y* y, const float* c, const B* bias, int64_t M, int64_t N, int64_t m0, int64_t n0) {
  __m512 a[kT];
  for (int64_t n = 0; n < kT; ++n) a[n] = _mm512_loadu_ps(c + n * kT);
  transpose16(a);
  float b[kT];
  for (int64_t n = 0; n < kT; ++n) b[n] = bias != nullptr && n0 + n < N ? to_f32(bias[n0 + n]) : 0.f;
  const __m512 bv = _mm512_loadu_ps(b);
  const int64_t cols = std::min(kT, N - n0);
  for (int64_t m = 0; m < std::min(kT, M - m0); ++m) {
    if constexpr (std::is_same_v<Y, float>) {
      _mm512_mask_storeu_ps(y + (m0 + m) * N + n0, static_cast<__mmask16>((1u << cols) - 1), _mm512_add_ps(a[m], bv));
    } else {
      float row[kT];
      _mm512_storeu_ps(row, _mm512_add_ps(a[m], bv));
      span_from_f32(y + (m0 + m) * N + n0, row, cols);
    }
  }
}

// The A sources of w's one or two 16-row blocks from n0 (their count):
// in place, with a block's last K chunk copied zero-padded into tail_buf
// when K is not a multiple of 32, or a last block of fewer than 16 rows
// copied whole, padded, into pad_buf.
int w_blocks(ASource (&a)[2], const bf16* w, int64_t N, int64_t K, int64_t n0, bf16* tail_buf, bf16* pad_buf) {
  const int64_t chunks = (K + kChunk - 1) / kChunk, kp = chunks * kChunk;
  int nblocks = 0;
  for (int h = 0; h < 2 && n0 + h * kT < N; ++h, ++nblocks) {
    const int64_t nb = n0 + h * kT, rows = std::min(kT, N - nb);
    if (rows < kT) {
      copy_rows(pad_buf, w, K, nb, rows, 0, kp);
      a[h] = {reinterpret_cast<const char*>(pad_buf), kp * int64_t{sizeof(bf16)}, nullptr};
    } else {
      const char* tail_ptr = nullptr;
      if (K % kChunk != 0) {
        copy_rows(tail_buf + h * kTileElems, w, K, nb, kT, (chunks - 1) * kChunk, kChunk);
        tail_ptr = reinterpret_cast<const char*>(tail_buf + h * kTileElems);
      }
      a[h] = {reinterpret_cast<const char*>(w + nb * K), K * int64_t{sizeof(bf16)}, tail_ptr};
    }
  }
  return nblocks;
}

// y's outputs [n0, n0 + 16 nblocks) for x's row blocks [mg0, mg1) (packed
// at xp): K in blocks of kc chunks, each passing every pair of the row
// blocks, whose C tiles wait at c between K blocks.
template <typename Y, typename B>
void pair_by_group(Y* y, const ASource (&a)[2], int nblocks, const bf16* xp, const B* bias, int64_t M, int64_t N,
                   int64_t chunks, int64_t kc, int64_t n0, int64_t mg0, int64_t mg1, float* c) {
  for (int64_t ch0 = 0; ch0 < chunks; ch0 += kc) {
    const int64_t ch1 = std::min(chunks, ch0 + kc);
    for (int64_t mb = mg0; mb < mg1; mb += 2) {
      const bf16* b0 = xp + mb * chunks * kTileElems;
      const bool two_m = mb + 1 < mg1;
      const bf16* b1 = two_m ? b0 + chunks * kTileElems : nullptr;
      float* cp = c + (mb - mg0) / 2 * 4 * kT * kT;
      if (nblocks == 2 && two_m) tile_block<true, true>(a[0], a[1], b0, b1, ch0, ch1, chunks, cp);
      else if (nblocks == 2) tile_block<true, false>(a[0], a[1], b0, b1, ch0, ch1, chunks, cp);
      else if (two_m) tile_block<false, true>(a[0], a[0], b0, b1, ch0, ch1, chunks, cp);
      else tile_block<false, false>(a[0], a[0], b0, b1, ch0, ch1, chunks, cp);
      if (ch1 == chunks)
        for (int h = 0; h < nblocks; ++h)
          for (int g = 0; g < (two_m ? 2 : 1); ++g)
            store_tile(y, cp + (2 * h + g) * kT * kT, bias, M, N, (mb + g) * kT, n0 + h * kT);
    }
  }
}

template <typename Y, typename B>
void linear_tiles(Y* y, const bf16* x, const bf16* w, const B* bias, int64_t M, int64_t N, int64_t K) {
  const int64_t chunks = (K + kChunk - 1) / kChunk, kp = chunks * kChunk;
  const int64_t m_blocks = (M + kT - 1) / kT, n_pairs = (N + 2 * kT - 1) / (2 * kT);
  bf16* xp = thread_scratch<bf16>(ScratchSlot::a, static_cast<size_t>(m_blocks * chunks * kTileElems));
  const bool parallel = M * N * K >= kMinParallel;
#pragma omp parallel for schedule(static) if (parallel && m_blocks > 1)
  for (int64_t mb = 0; mb < m_blocks; ++mb) pack_x(xp + mb * chunks * kTileElems, x, M, K, mb * kT, chunks);
  // Blocks of x's rows per group (a packed block is 1 KiB a chunk; even, so
  // that only a last group has an odd one), and chunks per tile block: with
  // a single pair of x's blocks there is nothing to keep in L1 across them.
  const int64_t group = std::min(m_blocks, std::max<int64_t>(2, kGroupKiB / chunks / 2 * 2));
  const int64_t kc = group > 2 ? kBlockChunks : chunks;
  // Per thread: C's four tiles for each pair of x's blocks in a group, two A
  // tails, and a padded copy of a last block of fewer than 16 rows of w.
  const size_t c_floats = static_cast<size_t>((group + 1) / 2) * 4 * kT * kT, tails = 2 * kTileElems;
  const size_t padded = static_cast<size_t>(kT * kp);
  const ThreadSlices<float> cs(ScratchSlot::b, c_floats);
  const ThreadSlices<bf16> ws(ScratchSlot::c, tails + padded);
#pragma omp parallel if (parallel)
  {
    tiles_begin();
    float* c = cs.mine();
    bf16* tail_buf = ws.mine();
    bf16* pad_buf = tail_buf + tails;
    for (int64_t mg0 = 0; mg0 < m_blocks; mg0 += group) {
      const int64_t mg1 = std::min(m_blocks, mg0 + group);
      // A pair of 16-row blocks of w (the outputs [n0, n0 + 32)) against the
      // group's blocks of x's rows. Each thread takes one contiguous run of
      // pairs, the same run every call and every group: w streams in order,
      // and a weight that fits in a core's cache stays in that core's (at two
      // threads 1.05-1.2x the one-pair-at-a-time handout from 64 rows,
      // lm_head 2x). No barrier between groups: they write disjoint outputs.
      // The thread computing a pair never changes its arithmetic.
#pragma omp for schedule(static) nowait
      for (int64_t np = 0; np < n_pairs; ++np) {
        const int64_t n0 = np * 2 * kT;
        ASource a[2];
        const int nblocks = w_blocks(a, w, N, K, n0, tail_buf, pad_buf);
        pair_by_group(y, a, nblocks, xp, bias, M, N, chunks, kc, n0, mg0, mg1, c);
      }
    }
    tiles_end();
  }
}

}  // namespace
#endif

void linear_forward_invariant_amx(Tensor y, const Tensor& x, const Tensor& w, const Tensor& bias) {
#if defined(__AVX512BF16__)
  const int64_t N = w.size(0), K = w.size(1);
  if (x.dtype() == DType::bf16 && K > 0 && N > 0) {
    const int64_t M = x.numel() / K;
    if (M == 0) return;
    dispatch_linear(y, x, bias, [&]<typename T, typename Y, typename B>(const B* b) {
      if constexpr (std::is_same_v<T, bf16>)
        linear_tiles<Y, B>(y.data_as<Y>(), x.data_as<const bf16>(), w.data_as<const bf16>(), b, M, N, K);
    });
    return;
  }
#endif
  linear_forward_invariant(y, x, w, bias);
}

}  // namespace loom::kernels::cpu::LOOM_ISA
