// Paged attention on the CPU (ops.h): kv_cache_write and
// paged_attention_forward, the serving path's attention over K/V kept in
// fixed blocks (vLLM's PagedAttention, Kwon et al. 2023).
//
// Batch invariance (ops.h): each task is a tile of up to four consecutive
// query rows of one sequence and a range of their kv heads (how many rows
// and heads a task takes depends on the batch; what a row and head computes
// does not). Each head walks its sequence's cache blocks in logical order
// with an online softmax (FlashAttention's running max and sum) updated once
// per cache block. Every loop bound is a function of the row's position and
// the block size; every reduction (the dot products over HS, the sums over a
// block's keys, the horizontal sums, each accumulator's sum over keys) runs
// in a fixed order written out with explicit vectors on buffers of fixed
// alignment; rows in a tile share loads, never sums; no row's key range is
// ever split between threads. So the bits of a row cannot depend on which
// other rows share the call, on how many sequences there are, on how its own
// sequence was chunked, or on threads.
//
// Speed: decode attention reads every K/V byte of every running sequence
// once per step, so it is bound by memory (loom bench kernels --filter
// paged prints its GB/s). A task reads a block's rows for all its kv heads
// (side by side in memory), and asks for the next block head by head.
// Prefill attention is bound by arithmetic: a tile's rows share each block's
// loads, and their accumulators give the value update independent chains.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "kernels/cpu/attention_tiles.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/paged_vec.h"
#include "kernels/cpu/scratch.h"

// Every multiply and add below is its own IEEE operation (paged_vec.h).
namespace loom::kernels::cpu::LOOM_ISA {
namespace {

using namespace paged;

struct PagedGeometry {
  int64_t N = 0, NH = 0, NKV = 0, HS = 0, HSp = 0, BS = 0, NB = 0, S = 0, max_blocks = 0;
  int64_t group = 0;  // query heads per kv head
  float scale = 0;    // 1 / sqrt(HS)
};

PagedGeometry paged_geometry(const Tensor& q, const Tensor& k_cache, const Tensor& block_tables) {
  PagedGeometry g;
  g.N = q.size(0), g.NH = q.size(1), g.HS = q.size(2);
  g.NB = k_cache.size(0), g.BS = k_cache.size(1), g.NKV = k_cache.size(2);
  g.S = block_tables.size(0), g.max_blocks = block_tables.size(1);
  g.HSp = round_up(g.HS, kLanes);
  g.group = g.NH / g.NKV;
  g.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(g.HS)));
  return g;
}

// Query rows of one sequence a task takes at once (consecutive positions):
// each cache block is then read once for all of them, and their
// accumulators give the value update independent chains of adds. What a
// row computes is the same in a tile as alone (below).
inline constexpr int64_t kTileRows = 4;

// One thread's f32 scratch, each array a multiple of kLanes floats from a
// 64-byte aligned slice (so every array has the same alignment in every call).
// q, acc, m and l hold every query head a task may take, for each of its
// kTileRows rows; k and v one kv head's block at a time; p one block's scores
// for a kv head's query heads, for each row.
struct PagedTiles {
  float *q, *acc, *k, *v, *p;  // (R, NH, HSp) (R, NH, HSp) (BS, HSp) (BS, HSp) (R, G, BSp)
  float *m, *l;                // (R, Hp): running max and sum per row and head
  int64_t BSp = 0, Hp = 0, floats = 0;
  // Lays the arrays out from base, or only counts them (floats) when base is null.
  PagedTiles(const PagedGeometry& g, float* base) : BSp(round_up(g.BS, kLanes)), Hp(round_up(g.NH, kLanes)) {
    const int64_t H = g.NH, R = kTileRows;
    const std::pair<float**, int64_t> parts[] = {{&q, R * H * g.HSp}, {&acc, R * H * g.HSp}, {&k, g.BS * g.HSp},
                                                 {&v, g.BS * g.HSp},  {&p, R * g.group * BSp}, {&m, R * Hp},
                                                 {&l, R * Hp}};
    for (const auto& [ptr, n] : parts) {
      *ptr = base ? base + floats : nullptr;
      floats += n;
    }
  }
};

// Row r's state in a task's scratch: its query heads' q, acc, m, l, and the
// scores of the kv head at hand.
struct RowState {
  float *q, *acc, *m, *l, *p;
};

RowState row_state(const PagedGeometry& g, const PagedTiles& w, int64_t r) {
  return {w.q + r * g.NH * g.HSp, w.acc + r * g.NH * g.HSp, w.m + r * w.Hp, w.l + r * w.Hp,
          w.p + r * g.group * w.BSp};
}

struct PagedArgs {
  Tensor out, q, k_cache, v_cache;
  const int32_t *block_tables, *seq_lens, *query_start;
  PagedGeometry g;
};

// Element offset of kv head h's first row in physical block blk of a
// (NB, BS, NKV, HS) cache; its rows follow NKV * HS elements apart.
int64_t head_rows_offset(const PagedGeometry& g, int64_t blk, int64_t h) { return (blk * g.BS * g.NKV + h) * g.HS; }

// Rows [0, cnt) of kv head h of physical block blk of a cache of T: first
// row and row stride. As they are (16-bit rows converted as the kernel
// loads them, in registers) when HS == HSp; else copied into dst as f32
// rows of HSp columns, zero-padded.
template <typename T>
using BlockRows = std::pair<const T*, int64_t>;

template <typename T>
BlockRows<T> cache_rows(const Tensor& cache, const PagedGeometry& g, int64_t blk, int64_t h) {
  return {cache.data_as<T>() + head_rows_offset(g, blk, h), g.NKV * g.HS};
}

template <typename T>
BlockRows<float> padded_rows(float* dst, const Tensor& cache, const PagedGeometry& g, int64_t blk, int64_t h,
                             int64_t cnt) {
  const BlockRows<T> src = cache_rows<T>(cache, g, blk, h);
  for (int64_t j = 0; j < cnt; ++j) {
    float* d = dst + j * g.HSp;
    span_to_f32(d, src.first + j * src.second, g.HS);
    std::fill(d + g.HS, d + g.HSp, 0.f);
  }
  return {dst, g.HSp};
}

// p[j0 .. j0 + 16) for 16 keys there are, with HSp = D kLanes known: q's
// vectors and the 16 keys' lane partials stay in registers (the loop of
// dot_lanes to a run-time HSp kept them in memory, zeroed each time). The
// same multiplies and adds in the same order as dot_lanes.
template <int D, typename T>
inline void scores16(const float* q, BlockRows<T> k, int64_t j0, float* p) {
  V16 qv[D];
  for (int d = 0; d < D; ++d) qv[d] = load16(q + d * kLanes);
  V16 part[16];
  for (int64_t j = 0; j < 16; ++j) {
    const T* kr = k.first + (j0 + j) * k.second;
    V16 acc = qv[0] * load16(kr);
    for (int d = 1; d < D; ++d) acc += qv[d] * load16(kr + d * kLanes);
    part[j] = acc;
  }
  store16(p + j0, hsum16(part));
}

// p[0 .. cnt) = the block's scores, with zeros up to a multiple of 16.
template <typename T>
void block_scores(const float* q, BlockRows<T> k, int64_t cnt, int64_t HSp, float* p) {
  int64_t j0 = 0;
  for (; j0 + kLanes <= cnt; j0 += kLanes) {
    switch (HSp / kLanes) {
      case 1: scores16<1>(q, k, j0, p); continue;
      case 2: scores16<2>(q, k, j0, p); continue;
      case 4: scores16<4>(q, k, j0, p); continue;
      case 6: scores16<6>(q, k, j0, p); continue;
      case 8: scores16<8>(q, k, j0, p); continue;
      default: break;
    }
    V16 part[16];
    for (int64_t j = 0; j < kLanes; ++j) part[j] = dot_lanes(q, k.first + (j0 + j) * k.second, HSp);
    store16(p + j0, hsum16(part));
  }
  if (j0 < cnt) {  // the block's last keys, fewer than 16: zero partials for the rest
    V16 part[16] = {};
    for (int64_t j = j0; j < cnt; ++j) part[j - j0] = dot_lanes(q, k.first + j * k.second, HSp);
    store16(p + j0, hsum16(part));
  }
}

// Scores of one query head over a block's cnt keys, p[j] = k_j . q (q
// carries the scale); then the online-softmax update of the head's m and l:
// p becomes exp(p - m_new), zero-padded to a multiple of kLanes, and the
// factor alpha = exp(m_old - m_new) the head's acc is to be scaled by is
// returned.
template <typename T>
float scores_and_softmax(const float* q, BlockRows<T> k, int64_t cnt, int64_t HSp, float* p, float& m, float& l) {
  block_scores(q, k, cnt, HSp, p);
  // The running max over the block's scores, lane by lane from m, then across
  // the lanes; padding lanes hold -inf, so they never win and exp makes them 0.
  const int64_t cntp = round_up(cnt, kLanes);
  std::fill(p + cnt, p + cntp, -std::numeric_limits<float>::infinity());
  V16 mv = splat16(m);
  for (int64_t j0 = 0; j0 < cntp; j0 += kLanes) mv = max16(mv, load16(p + j0));
  const float mx = hmax(mv);
  // m is -inf before the first block, which holds key 0 that every row
  // sees: mx is finite and alpha = exp(-inf) = 0.
  const float alpha = exp_f32(m - mx);
  for (int64_t j0 = 0; j0 < cntp; j0 += kLanes) exp_minus16(p + j0, mx);
  // The block's sum by a fixed order: 16-lane groups in turn, then hsum.
  V16 ps = load16(p);
  for (int64_t j0 = kLanes; j0 < cnt; j0 += kLanes) ps += load16(p + j0);
  m = mx;
  l = l * alpha + hsum(ps);
  return alpha;
}

// acc_r[d] = acc_r[d] * alpha_r + sum_j p_r[j] v_j[d] for R rows' accumulators
// over one block's cnt values, columns [d0, d0 + C kLanes): each element's
// sum runs over j in order, one rounding per multiply and add, whatever R and
// C are (so a row's bits are its own); the R C running sums are independent
// chains of adds, which is what keeps the adder busy (one chain of cnt adds
// per column group left it waiting on each add's latency).
template <int R, int C, typename T>
inline void value_update(float* const (&acc)[R], const float* const (&p)[R], const float (&alpha)[R], BlockRows<T> v,
                         int64_t cnt, int64_t d0) {
  V16 a[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) a[r][c] = load16(acc[r] + d0 + c * kLanes) * alpha[r];
  for (int64_t j = 0; j < cnt; ++j) {
    const T* vj = v.first + j * v.second + d0;
    for (int c = 0; c < C; ++c) {
      const V16 x = load16(vj + c * kLanes);
      for (int r = 0; r < R; ++r) a[r][c] += p[r][j] * x;
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) store16(acc[r] + d0 + c * kLanes, a[r][c]);
}

// Accumulator vectors value_update may keep in registers: 16 of AVX-512's 32
// zmm; with AVX2 each V16 is two of the 16 ymm, so 4.
#if defined(__AVX512F__)
inline constexpr int kAccVectors = 16;
#else
inline constexpr int kAccVectors = 4;
#endif

// One cache block of cnt keys, seen whole by each of R rows, for the G
// query heads of one kv head (the task's heads h0 .. h0 + G - 1): scores and
// softmax row by row, then the value update for all R rows at once.
template <int R, typename T>
void block_step(const PagedGeometry& g, const RowState (&rows)[R], int64_t h0, BlockRows<T> k, BlockRows<T> v,
                int64_t cnt) {
  const int64_t HSp = g.HSp;
  constexpr int C = kAccVectors / R > 4 ? 4 : kAccVectors / R;  // column groups per pass
  for (int64_t i = h0; i < h0 + g.group; ++i) {
    float* acc[R];
    const float* p[R];
    float alpha[R];
    for (int r = 0; r < R; ++r) {
      float* pr = rows[r].p + (i - h0) * round_up(g.BS, kLanes);
      alpha[r] = scores_and_softmax(rows[r].q + i * HSp, k, cnt, HSp, pr, rows[r].m[i], rows[r].l[i]);
      acc[r] = rows[r].acc + i * HSp;
      p[r] = pr;
    }
    int64_t d0 = 0;
    for (; d0 + C * kLanes <= HSp; d0 += C * kLanes) value_update<R, C>(acc, p, alpha, v, cnt, d0);
    for (; d0 < HSp; d0 += kLanes) value_update<R, 1>(acc, p, alpha, v, cnt, d0);
  }
}

// Asks for the rows of kv head h in physical block blk (the next block of a
// row's walk) while the current one is computed: the blocks lie anywhere, a
// pattern the hardware prefetcher cannot guess (it made decoding wait on
// memory). Into L2 (locality 1): L1 fetches stalled on its few miss buffers
// (measured: 19-24 GB/s in L2, 13-14 into L1).
void prefetch_block(const PagedArgs& a, int64_t blk, int64_t h, int64_t cnt) {
  const PagedGeometry& g = a.g;
  const size_t elem = dtype_size(a.k_cache.dtype());
  const size_t row_bytes = static_cast<size_t>(g.HS) * elem, stride = static_cast<size_t>(g.NKV * g.HS) * elem;
  const size_t first = static_cast<size_t>(head_rows_offset(g, blk, h)) * elem;
  for (const Tensor* cache : {&a.k_cache, &a.v_cache}) {
    const auto* base = static_cast<const char*>(cache->data()) + first;
    for (int64_t j = 0; j < cnt; ++j)
      for (size_t off = 0; off < row_bytes; off += 64) __builtin_prefetch(base + j * stride + off, 0, 1);
  }
}

// The sequence of row n: the last s with query_start[s] <= n.
int64_t sequence_of(const PagedArgs& a, int64_t n) {
  const int32_t* end = a.query_start + a.g.S + 1;
  return (std::upper_bound(a.query_start, end, n) - a.query_start) - 1;
}

// Row n's state for query heads [hb, hb + nh): its q scaled (scores =
// k . (q * scale)) and zero-padded, acc and l zero, m -inf.
RowState start_row(const PagedArgs& a, RowState st, int64_t n, int64_t hb, int64_t nh) {
  const PagedGeometry& g = a.g;
  dispatch_float(a.q.dtype(), [&]<typename T>() {
    for (int64_t i = 0; i < nh; ++i) {
      const T* src = a.q.data_as<T>() + (n * g.NH + hb + i) * g.HS;
      float* d = st.q + i * g.HSp;
      for (int64_t c = 0; c < g.HS; ++c) d[c] = to_f32(src[c]) * g.scale;
      std::fill(d + g.HS, d + g.HSp, 0.f);
    }
  });
  std::fill_n(st.acc, nh * g.HSp, 0.f);
  std::fill_n(st.m, nh, -std::numeric_limits<float>::infinity());
  std::fill_n(st.l, nh, 0.f);
  return st;
}

// out[n, h, :] = acc / l for the query heads [hb, hb + nh).
void finish_row(const PagedArgs& a, const RowState& st, int64_t n, int64_t hb, int64_t nh) {
  const PagedGeometry& g = a.g;
  dispatch_float(a.out.dtype(), [&]<typename T>() {
    for (int64_t i = 0; i < nh; ++i) {
      T* dst = a.out.data_as<T>() + (n * g.NH + hb + i) * g.HS;
      const float* acc = st.acc + i * g.HSp;
      const float inv = 1.f / st.l[i];
      for (int64_t c = 0; c < g.HS; ++c) dst[c] = from_f32<T>(acc[c] * inv);
    }
  });
}

// A block seen whole by the first R of a tile's rows, as block_step<R>.
template <int R, typename T>
void block_step_first(const PagedGeometry& g, const RowState* st, int64_t h0, BlockRows<T> k, BlockRows<T> v,
                      int64_t cnt) {
  RowState rows[R];
  std::copy_n(st, R, rows);
  block_step<R>(g, rows, h0, k, v, cnt);
}

// out[n, h, :] for rows n0 .. n0 + R - 1 of sequence s (R <= kTileRows) and
// the query heads h of kv heads [kv0, kv1), walking the rows' blocks once for
// all of them: a block's rows hold the kv heads side by side, so the task
// reads one contiguous stretch per block row. Blocks every row of the tile
// sees whole go through block_step<R>; the one or two blocks holding the
// rows' own positions, which they see in part, row by row.
void tile_task(const PagedArgs& a, PagedTiles& w, int64_t s, int64_t n0, int64_t R, int64_t kv0, int64_t kv1) {
  const PagedGeometry& g = a.g;
  const int64_t q0 = a.query_start[s], q_len = a.query_start[s + 1] - q0;
  const int64_t first = a.seq_lens[s] - q_len + (n0 - q0);  // row n0 + r sees keys 0 ..= first + r
  const int64_t last = first + R - 1;
  const int64_t hb = kv0 * g.group, nh = (kv1 - kv0) * g.group;  // the task's query heads
  RowState st[kTileRows];
  for (int64_t r = 0; r < R; ++r) st[r] = start_row(a, row_state(g, w, r), n0 + r, hb, nh);
  const int32_t* table = a.block_tables + s * g.max_blocks;
  dispatch_float(a.k_cache.dtype(), [&]<typename T>() {
    for (int64_t b = 0; b * g.BS <= last; ++b) {
      const bool whole = (b + 1) * g.BS <= first + 1;  // every row sees all of block b
      const int64_t cnt = std::min(g.BS, last + 1 - b * g.BS);  // keys the last row sees
      // The next block's rows of each kv head are asked for as this block's
      // are used: the requests spread over the walk (all of a block's at once
      // filled the miss buffers and stalled: 15 GB/s against 22 measured with
      // loom bench kernels --filter paged).
      const int64_t next_cnt = std::clamp<int64_t>(last + 1 - (b + 1) * g.BS, 0, g.BS);
      for (int64_t kvh = kv0; kvh < kv1; ++kvh) {
        if (next_cnt > 0) prefetch_block(a, table[b + 1], kvh, next_cnt);
        const int64_t h0 = (kvh - kv0) * g.group;
        const auto step = [&]<typename U>(BlockRows<U> k, BlockRows<U> v) {
          if (whole) {
            switch (R) {
              case 1: return block_step_first<1>(g, st, h0, k, v, cnt);
              case 2: return block_step_first<2>(g, st, h0, k, v, cnt);
              case 3: return block_step_first<3>(g, st, h0, k, v, cnt);
              default: return block_step_first<4>(g, st, h0, k, v, cnt);
            }
          }
          for (int64_t r = 0; r < R; ++r)
            if (b * g.BS <= first + r) block_step_first<1>(g, st + r, h0, k, v, std::min(g.BS, first + r + 1 - b * g.BS));
        };
        if (g.HS == g.HSp)
          step(cache_rows<T>(a.k_cache, g, table[b], kvh), cache_rows<T>(a.v_cache, g, table[b], kvh));
        else
          step(padded_rows<T>(w.k, a.k_cache, g, table[b], kvh, cnt), padded_rows<T>(w.v, a.v_cache, g, table[b], kvh, cnt));
      }
    }
  });
  for (int64_t r = 0; r < R; ++r) finish_row(a, st[r], n0 + r, hb, nh);
}

// The values ops.h leaves to the backend: query_start from 0 to N, never
// decreasing; q_len <= seq_len <= max_blocks * BS; every block read in
// [0, NB).
void check_batch_values(const PagedArgs& a, const Tensor& block_tables, const Tensor& seq_lens,
                        const Tensor& query_start) {
  constexpr const char* op = "paged_attention_forward";
  const std::initializer_list<Operand> all = {
      {"block_tables", block_tables}, {"seq_lens", seq_lens}, {"query_start", query_start}};
  const PagedGeometry& g = a.g;
  const int32_t* qs = a.query_start;
  if (qs[0] != 0) op_fail(op, all, "query_start[0] must be 0, got ", qs[0]);
  if (qs[g.S] != g.N) op_fail(op, all, "query_start[", g.S, "] must be N = ", g.N, " (q's rows), got ", qs[g.S]);
  for (int64_t s = 0; s < g.S; ++s) {
    const int64_t q_len = int64_t{qs[s + 1]} - qs[s], len = a.seq_lens[s];
    if (q_len < 0) op_fail(op, all, "query_start decreases at ", s, ": ", qs[s], " then ", qs[s + 1]);
    if (len < q_len)
      op_fail(op, all, "sequence ", s, " has seq_lens ", len, ", fewer than its ", q_len, " query rows");
    if (len > g.max_blocks * g.BS)
      op_fail(op, all, "sequence ", s, " has seq_lens ", len, ", beyond its block table's ", g.max_blocks,
              " blocks of ", g.BS, " tokens");
    const int32_t* table = a.block_tables + s * g.max_blocks;
    for (int64_t b = 0; b * g.BS < len; ++b)
      if (table[b] < 0 || table[b] >= g.NB)
        op_fail(op, all, "block_tables[", s, ", ", b, "] = ", table[b], " is not a block of the caches [0, ",
                g.NB, ")");
  }
}

// The first slot outside [0, slots_total) that is not -1: a loom::Error.
void check_slots(const Tensor& slots, int64_t slots_total) {
  const int64_t* sl = slots.data_as<int64_t>();
  for (int64_t n = 0; n < slots.size(0); ++n)
    if (sl[n] != -1 && (sl[n] < 0 || sl[n] >= slots_total))
      op_fail("kv_cache_write", {{"slots", slots}}, "slots[", n, "] = ", sl[n], " is outside the caches' [0, ",
              slots_total, ") slots (and not -1, padding)");
}

// dst[i] = src[i] converted (RNE), i < n, any float dtypes.
void copy_row(void* dst, DType dst_type, const void* src, DType src_type, int64_t n) {
  if (dst_type == src_type) {
    std::memcpy(dst, src, static_cast<size_t>(n) * dtype_size(dst_type));
    return;
  }
  dispatch_float(src_type, [&]<typename S>() {
    dispatch_float(dst_type, [&]<typename D>() {
      for (int64_t i = 0; i < n; ++i) static_cast<D*>(dst)[i] = from_f32<D>(to_f32(static_cast<const S*>(src)[i]));
    });
  });
}

}  // namespace

// k, v: (N, NKV, HS)  slots: (N) i64  caches: (NB, BS, NKV, HS)
void kv_cache_write(Tensor k_cache, Tensor v_cache, const Tensor& k, const Tensor& v, const Tensor& slots) {
  const int64_t row = k.size(1) * k.size(2), slots_total = k_cache.size(0) * k_cache.size(1);
  check_slots(slots, slots_total);
  const size_t cache_bytes = dtype_size(k_cache.dtype()), in_bytes = dtype_size(k.dtype());
  const int64_t* sl = slots.data_as<int64_t>();
  // In row order, one thread: a repeated slot keeps the last row, and the
  // copy is a few rows of memory traffic next to the step's GEMMs.
  for (int64_t n = 0; n < k.size(0); ++n) {
    if (sl[n] == -1) continue;
    const size_t to = static_cast<size_t>(sl[n] * row) * cache_bytes, from = static_cast<size_t>(n * row) * in_bytes;
    copy_row(static_cast<std::byte*>(k_cache.data()) + to, k_cache.dtype(),
             static_cast<const std::byte*>(k.data()) + from, k.dtype(), row);
    copy_row(static_cast<std::byte*>(v_cache.data()) + to, v_cache.dtype(),
             static_cast<const std::byte*>(v.data()) + from, v.dtype(), row);
  }
}

// out, q: (N, NH, HS)  caches: (NB, BS, NKV, HS)  block_tables: (S, max_blocks)
// seq_lens: (S)  query_start: (S + 1), all i32
void paged_attention_forward(Tensor out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                             const Tensor& block_tables, const Tensor& seq_lens, const Tensor& query_start) {
  const PagedGeometry g = paged_geometry(q, k_cache, block_tables);
  const PagedArgs args{out, q, k_cache, v_cache, block_tables.data_as<int32_t>(), seq_lens.data_as<int32_t>(),
                       query_start.data_as<int32_t>(), g};
  check_batch_values(args, block_tables, seq_lens, query_start);
  if (g.N == 0) return;
  // A task is a tile of up to kTileRows consecutive rows of one sequence and
  // a range of their kv heads: all of them when there are tiles enough to
  // share out (each block is then read front to back), split so that every
  // thread has work when there are few (a lone decode row). The tiling and
  // the split choose which rows and heads share a walk, never the arithmetic
  // of any row and head.
  std::vector<int64_t> tiles;  // each tile's first row
  for (int64_t s = 0; s < g.S; ++s)
    for (int64_t n = args.query_start[s]; n < args.query_start[s + 1]; n += kTileRows) tiles.push_back(n);
  const int64_t n_tiles = static_cast<int64_t>(tiles.size());
  const int64_t threads = omp_get_max_threads();
  const int64_t splits = std::clamp<int64_t>((4 * threads + n_tiles - 1) / n_tiles, 1, g.NKV);
  const int64_t n_tasks = n_tiles * splits;
  const ThreadSlices<float> slices(ScratchSlot::a, static_cast<size_t>(PagedTiles(g, nullptr).floats),
                                   static_cast<int>(std::min<int64_t>(threads, n_tasks)));
#pragma omp parallel num_threads(slices.threads())
  {
    PagedTiles w(g, slices.mine());
    // Rows see different numbers of keys: tasks are handed out one at a
    // time. Which thread runs a task never changes its arithmetic.
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < n_tasks; ++t) {
      const int64_t n0 = tiles[static_cast<size_t>(t / splits)], i = t % splits;
      const int64_t s = sequence_of(args, n0);
      const int64_t rows = std::min(kTileRows, int64_t{args.query_start[s + 1]} - n0);
      tile_task(args, w, s, n0, rows, g.NKV * i / splits, g.NKV * (i + 1) / splits);
    }
  }
}

}  // namespace loom::kernels::cpu::LOOM_ISA
