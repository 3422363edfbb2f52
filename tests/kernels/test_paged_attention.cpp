// kv_cache_write / paged_attention_forward (ops.h): against a naive
// reference in double and against the training kernel attention_forward on
// a contiguous copy of the same keys and values; bf16 storage; read-back of
// written slots; batch invariance, bitwise; misuse.
//
// Each sequence's blocks come from a seeded shuffle of the pool, so block
// tables are neither contiguous nor monotonic, and unused table entries are
// -1 (never read).
//
// Tolerances (docs/numerics.md, attention): paged vs the double reference,
// rtol 1e-4 / atol 1e-5 (reductions over up to T keys). Paged vs
// attention_forward, both f32 with the same inputs, only the summation
// orders differ: rtol 1e-5 / atol 1e-6.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "common/compare.h"
#include "common/tensors.h"
#include "core/threads.h"
#include "kernels/ops.h"

namespace loom::test {
namespace {

using kernels::attention_forward;
using kernels::kv_cache_write;
using kernels::paged_attention_forward;

constexpr double kRefRtol = 1e-4, kRefAtol = 1e-5;
constexpr double kFlashRtol = 1e-5, kFlashAtol = 1e-6;

struct Dims {
  int64_t NH, NKV, HS, BS;
};

// Every token's q (T, NH, HS) and k, v (T, NKV, HS).
struct Seq {
  int64_t T;
  Floats q, k, v;
  Seq(int64_t len, const Dims& d, std::mt19937& rng)
      : T(len),
        q(random_floats(len * d.NH * d.HS, rng)),
        k(random_floats(len * d.NKV * d.HS, rng)),
        v(random_floats(len * d.NKV * d.HS, rng)) {}
};

using Table = std::vector<int32_t>;

// Blocks for sequences of the given lengths: a seeded shuffle of [0, NB)
// handed out in order.
std::vector<Table> shuffled_tables(const std::vector<int64_t>& lens, int64_t BS, int64_t NB, uint32_t seed) {
  std::vector<int32_t> pool(static_cast<size_t>(NB));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), std::mt19937(seed));
  std::vector<Table> tables;
  size_t next = 0;
  for (int64_t len : lens) {
    Table t;
    for (int64_t b = 0; b * BS < len; ++b) t.push_back(pool.at(next++));
    tables.push_back(t);
  }
  return tables;
}

struct Cache {
  Dims d;
  Buffer k, v;
  Cache(const Dims& dims, DType dtype, int64_t NB)
      : d(dims), k(dtype, {NB, dims.BS, dims.NKV, dims.HS}), v(dtype, {NB, dims.BS, dims.NKV, dims.HS}) {}
};

// Tokens [t0, t1) of s into their slots, with k and v given in dtype.
void write_tokens(Cache& c, const Seq& s, const Table& table, int64_t t0, int64_t t1, DType dtype = DType::f32) {
  const int64_t row = c.d.NKV * c.d.HS, n = t1 - t0;
  const Floats k(s.k.begin() + t0 * row, s.k.begin() + t1 * row), v(s.v.begin() + t0 * row, s.v.begin() + t1 * row);
  Buffer kb(dtype, {n, c.d.NKV, c.d.HS}, k), vb(dtype, {n, c.d.NKV, c.d.HS}, v);
  std::vector<int64_t> slots;
  for (int64_t t = t0; t < t1; ++t) slots.push_back(table.at(t / c.d.BS) * c.d.BS + t % c.d.BS);
  kv_cache_write(c.k.view(), c.v.view(), kb.view(), vb.view(), Tensor(slots.data(), DType::i64, {n}));
}

// Query rows [t0, t1) of a sequence whose cache holds tokens [0, t1).
struct Item {
  const Seq* seq;
  const Table* table;
  int64_t t0, t1;
};

// One paged_attention_forward over the items, q in dtype: out (N, NH, HS) as floats.
Floats run_paged(Cache& c, const std::vector<Item>& items, DType dtype = DType::f32) {
  const Dims& d = c.d;
  const int64_t S = static_cast<int64_t>(items.size()), row = d.NH * d.HS;
  int64_t max_blocks = 1;
  for (const Item& it : items) max_blocks = std::max<int64_t>(max_blocks, static_cast<int64_t>(it.table->size()));
  std::vector<int32_t> tables(static_cast<size_t>(S * max_blocks), -1), seq_lens, query_start = {0};
  Floats q;
  for (int64_t s = 0; s < S; ++s) {
    const Item& it = items[static_cast<size_t>(s)];
    std::copy(it.table->begin(), it.table->end(), tables.begin() + s * max_blocks);
    seq_lens.push_back(static_cast<int32_t>(it.t1));
    query_start.push_back(query_start.back() + static_cast<int32_t>(it.t1 - it.t0));
    q.insert(q.end(), it.seq->q.begin() + it.t0 * row, it.seq->q.begin() + it.t1 * row);
  }
  const int64_t N = query_start.back();
  Buffer qb(dtype, {N, d.NH, d.HS}, q), out(dtype, {N, d.NH, d.HS});
  paged_attention_forward(out.view(), qb.view(), c.k.view(), c.v.view(), i32_view(tables, {S, max_blocks}),
                          i32_view(seq_lens, {S}), i32_view(query_start, {S + 1}));
  return out.floats();
}

// Rows [t0, t1) of s by plain loops in double over the given k, v (the values the cache holds).
Floats naive_attention(const Seq& s, const Dims& d, int64_t t0, int64_t t1, const Floats& k, const Floats& v) {
  Floats out;
  const int64_t G = d.NH / d.NKV;
  for (int64_t t = t0; t < t1; ++t) {
    for (int64_t h = 0; h < d.NH; ++h) {
      const float* q = &s.q[static_cast<size_t>((t * d.NH + h) * d.HS)];
      std::vector<double> p(static_cast<size_t>(t + 1));
      double mx = -INFINITY, sum = 0;
      for (int64_t j = 0; j <= t; ++j) {
        const float* kj = &k[static_cast<size_t>((j * d.NKV + h / G) * d.HS)];
        double dot = 0;
        for (int64_t i = 0; i < d.HS; ++i) dot += static_cast<double>(q[i]) * kj[i];
        p[j] = dot / std::sqrt(static_cast<double>(d.HS));
        mx = std::max(mx, p[j]);
      }
      for (double& x : p) sum += (x = std::exp(x - mx));
      for (int64_t i = 0; i < d.HS; ++i) {
        double acc = 0;
        for (int64_t j = 0; j <= t; ++j) acc += p[j] * v[static_cast<size_t>((j * d.NKV + h / G) * d.HS + i)];
        out.push_back(static_cast<float>(acc / sum));
      }
    }
  }
  return out;
}

// Rows [t0, t1) of s by attention_forward on contiguous f32 copies.
Floats flash_attention(const Seq& s, const Dims& d, int64_t t0, int64_t t1) {
  const int64_t n = t1 - t0;
  Floats q(s.q.begin() + t0 * d.NH * d.HS, s.q.begin() + t1 * d.NH * d.HS), out(q.size());
  Floats k(s.k.begin(), s.k.begin() + t1 * d.NKV * d.HS), v(s.v.begin(), s.v.begin() + t1 * d.NKV * d.HS);
  attention_forward(f32_view(out, {1, n, d.NH, d.HS}), Tensor(), f32_view(q, {1, n, d.NH, d.HS}),
                    f32_view(k, {1, t1, d.NKV, d.HS}), f32_view(v, {1, t1, d.NKV, d.HS}));
  return out;
}

double max_rel_error(const Floats& a, const Floats& b, double atol) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(double(a[i]) - b[i]) / (atol + std::abs(double(b[i]))));
  return worst;
}

// A batch exercising every shape of row: a 1-token sequence, a whole
// prefill, a chunk in the middle, a decode, and a sequence with no query
// rows this step; lengths cross block boundaries for BS 16 and 32.
struct Batch {
  std::vector<Seq> seqs;
  std::vector<Table> tables;
  std::vector<Item> items;
  Batch(const Dims& d, int64_t NB, uint32_t seed) {
    const std::vector<int64_t> lens = {1, 17, 33, 70, 40};
    const std::vector<std::pair<int64_t, int64_t>> rows = {{0, 1}, {0, 17}, {20, 33}, {69, 70}, {40, 40}};
    std::mt19937 rng(seed);
    for (int64_t len : lens) seqs.emplace_back(len, d, rng);
    tables = shuffled_tables(lens, d.BS, NB, seed);
    for (size_t s = 0; s < lens.size(); ++s) items.push_back({&seqs[s], &tables[s], rows[s].first, rows[s].second});
  }
};

int64_t blocks_for(const Dims& d) { return 200 / d.BS + 8; }  // the batch's 161 tokens and spare blocks

const Dims kGqa{8, 2, 32, 16}, kMha{4, 4, 24, 16};  // HS 32: f32 blocks read in place; HS 24: padded copies

// GQA and MHA, each with block sizes 1, 16, 32.
std::vector<Dims> all_dims() {
  std::vector<Dims> all;
  for (const Dims& base : {kGqa, kMha})
    for (int64_t BS : {1, 16, 32}) all.push_back({base.NH, base.NKV, base.HS, BS});
  return all;
}

TEST(PagedAttention, MatchesNaiveReferenceAndTrainingKernelF32) {
  double worst_ref = 0, worst_flash = 0;
  for (const Dims& d : all_dims()) {
    SCOPED_TRACE("NH " + std::to_string(d.NH) + " NKV " + std::to_string(d.NKV) + " BS " + std::to_string(d.BS));
    Batch b(d, blocks_for(d), static_cast<uint32_t>(d.BS));
    Cache c(d, DType::f32, blocks_for(d));
    for (size_t s = 0; s < b.seqs.size(); ++s) write_tokens(c, b.seqs[s], b.tables[s], 0, b.seqs[s].T);
    const Floats got = run_paged(c, b.items);
    size_t at = 0;
    for (const Item& it : b.items) {
      if (it.t0 == it.t1) continue;  // a sequence without query rows this step
      const size_t n = static_cast<size_t>((it.t1 - it.t0) * d.NH * d.HS);
      const Floats rows(got.begin() + static_cast<int64_t>(at), got.begin() + static_cast<int64_t>(at + n));
      at += n;
      const Floats ref = naive_attention(*it.seq, d, it.t0, it.t1, it.seq->k, it.seq->v);
      const Floats flash = flash_attention(*it.seq, d, it.t0, it.t1);
      EXPECT_ALL_CLOSE(rows, ref, kRefRtol, kRefAtol) << "naive, rows " << it.t0 << ".." << it.t1;
      EXPECT_ALL_CLOSE(rows, flash, kFlashRtol, kFlashAtol) << "attention_forward, rows " << it.t0 << ".." << it.t1;
      worst_ref = std::max(worst_ref, max_rel_error(rows, ref, kRefAtol / kRefRtol));
      worst_flash = std::max(worst_flash, max_rel_error(rows, flash, kFlashAtol / kFlashRtol));
    }
    EXPECT_EQ(at, got.size());
  }
  // For the report: the worst |got - want| / (|want| + atol / rtol).
  std::printf("worst error relative to the tolerance's scale: vs naive %.3g (rtol %g), "
              "vs attention_forward %.3g (rtol %g)\n",
              worst_ref, kRefRtol, worst_flash, kFlashRtol);
}

// bf16 storage only rounds: every value widens exactly to f32 and the
// arithmetic is the f32 path's, so the bf16 output is the f32 output on the
// rounded inputs, rounded once.
TEST(PagedAttention, Bf16OutputIsTheF32ResultOnRoundedInputsRoundedOnce) {
  for (const Dims& d : all_dims()) {
    Batch b(d, blocks_for(d), 7);
    for (Seq& s : b.seqs) s.q = rounded_to_bf16(s.q), s.k = rounded_to_bf16(s.k), s.v = rounded_to_bf16(s.v);
    Cache c32(d, DType::f32, blocks_for(d)), c16(d, DType::bf16, blocks_for(d));
    for (size_t s = 0; s < b.seqs.size(); ++s) {
      write_tokens(c32, b.seqs[s], b.tables[s], 0, b.seqs[s].T);
      write_tokens(c16, b.seqs[s], b.tables[s], 0, b.seqs[s].T, DType::bf16);
    }
    EXPECT_EQ(run_paged(c16, b.items, DType::bf16), rounded_to_bf16(run_paged(c32, b.items)));
  }
}

// An f32 model with a bf16 cache (kv_cache_write rounds on write).
TEST(PagedAttention, F32QueriesOverABf16CacheMatchNaiveReferenceOnRoundedKv) {
  for (const Dims& d : all_dims()) {
    Batch b(d, blocks_for(d), 11);
    Cache c(d, DType::bf16, blocks_for(d));
    for (size_t s = 0; s < b.seqs.size(); ++s) write_tokens(c, b.seqs[s], b.tables[s], 0, b.seqs[s].T);
    const Floats got = run_paged(c, b.items);
    Floats ref;
    for (const Item& it : b.items) {
      const Floats r =
          naive_attention(*it.seq, d, it.t0, it.t1, rounded_to_bf16(it.seq->k), rounded_to_bf16(it.seq->v));
      ref.insert(ref.end(), r.begin(), r.end());
    }
    EXPECT_ALL_CLOSE(got, ref, kRefRtol, kRefAtol);
  }
}

// Token t of a sequence through its table: (NKV, HS) values of cache row.
Floats read_token(const Buffer& cache, const Dims& d, const Table& table, int64_t t) {
  const Floats all = cache.floats();
  const int64_t row = d.NKV * d.HS, slot = table.at(t / d.BS) * d.BS + t % d.BS;
  return Floats(all.begin() + slot * row, all.begin() + (slot + 1) * row);
}

TEST(KvCacheWrite, ReadBackThroughTheBlockTableGivesTheWrittenValues) {
  const Dims d{4, 2, 24, 16};
  struct Case {
    DType in, cache;
  };
  for (const Case& cs : {Case{DType::f32, DType::f32}, Case{DType::f32, DType::bf16}, Case{DType::bf16, DType::f32}}) {
    std::mt19937 rng(3);
    const Seq s(45, d, rng);
    const Table table = shuffled_tables({45}, d.BS, 6, 5)[0];
    const Floats prefill = random_floats(6 * d.BS * d.NKV * d.HS, rng);
    Cache c(d, cs.cache, 6);
    c.k = Buffer(cs.cache, c.k.shape, prefill), c.v = Buffer(cs.cache, c.v.shape, prefill);
    write_tokens(c, s, table, 0, 30, cs.in);  // two calls: a prefill chunk, then the rest
    write_tokens(c, s, table, 30, 45, cs.in);
    const bool rounds = cs.in == DType::bf16 || cs.cache == DType::bf16;
    const int64_t row = d.NKV * d.HS;
    for (int64_t t = 0; t < 45; ++t) {
      Floats k(s.k.begin() + t * row, s.k.begin() + (t + 1) * row);
      Floats v(s.v.begin() + t * row, s.v.begin() + (t + 1) * row);
      if (rounds) k = rounded_to_bf16(k), v = rounded_to_bf16(v);
      ASSERT_EQ(read_token(c.k, d, table, t), k) << "token " << t;
      ASSERT_EQ(read_token(c.v, d, table, t), v) << "token " << t;
    }
  }
}

TEST(KvCacheWrite, PaddingSlotsAreSkippedAndNothingElseIsTouched) {
  const Floats prefill = random_floats(3 * 4 * 2 * 8, 9);
  Buffer kc(DType::f32, {3, 4, 2, 8}, prefill), vc(DType::f32, {3, 4, 2, 8}, prefill);
  Floats k = random_floats(3 * 2 * 8, 10), v = random_floats(3 * 2 * 8, 11);
  std::vector<int64_t> slots = {6, -1, 1};
  kv_cache_write(kc.view(), vc.view(), f32_view(k, {3, 2, 8}), f32_view(v, {3, 2, 8}),
                 Tensor(slots.data(), DType::i64, {3}));
  Floats want_k = prefill, want_v = prefill;
  for (int64_t n : {0, 2}) {
    std::copy_n(k.begin() + n * 16, 16, want_k.begin() + slots[n] * 16);
    std::copy_n(v.begin() + n * 16, 16, want_v.begin() + slots[n] * 16);
  }
  EXPECT_EQ(kc.floats(), want_k);
  EXPECT_EQ(vc.floats(), want_v);
}

// ---- batch invariance -------------------------------------------------------

// The target's rows [0, T) computed in chunks of `chunk` tokens, each call
// after writing that chunk's K/V: chunk == T is one prefill.
Floats chunked(Cache& c, const Seq& s, const Table& table, int64_t chunk, const std::vector<Item>& others) {
  Floats out;
  const int64_t row = c.d.NH * c.d.HS;
  for (int64_t t0 = 0; t0 < s.T; t0 += chunk) {
    const int64_t t1 = std::min(s.T, t0 + chunk);
    write_tokens(c, s, table, t0, t1);
    std::vector<Item> items = others;  // the target sits in the middle of the batch
    const size_t at = others.size() / 2;
    items.insert(items.begin() + static_cast<int64_t>(at), Item{&s, &table, t0, t1});
    const Floats all = run_paged(c, items);
    int64_t before = 0;  // rows ahead of the target's
    for (size_t i = 0; i < at; ++i) before += items[i].t1 - items[i].t0;
    out.insert(out.end(), all.begin() + before * row, all.begin() + (before + t1 - t0) * row);
  }
  return out;
}

// The kernel takes up to four rows of a sequence at a time and walks the
// blocks they all see whole together: chunks of 150, 1, 7 and 64 rows give
// every tile height and every position of a tile against the block edges.
// GQA with HS 32 (rows read in place) and blocks of 16; MHA with HS 24
// (padded copies) and blocks of 5; f32 and bf16 caches.
TEST(PagedAttention, RowsAreBitwiseTheSameAloneInABatchChunkedAndOnAnyThreadCount) {
  const int saved = num_threads();
  for (const Dims& d : {Dims{8, 2, 32, 16}, Dims{4, 4, 24, 5}}) {
    for (DType cache_type : {DType::f32, DType::bf16}) {
      SCOPED_TRACE("HS " + std::to_string(d.HS) + " BS " + std::to_string(d.BS) + " cache " +
                   std::string(dtype_name(cache_type)));
      const int64_t NB = 200 / d.BS * 2 + 8;
      std::mt19937 rng(21);
      const Seq target(150, d, rng);
      // Other sequences sharing the batch: a prefill chunk and two decodes.
      Batch others(d, NB, 22);
      const std::vector<Item> batch_others = {others.items[1], others.items[2], others.items[3]};
      // Alone, the target's blocks are the first of a shuffle; in the batch,
      // the others hold their own blocks and the target's are elsewhere.
      const Table alone_table = shuffled_tables({150}, d.BS, NB, 23)[0];
      std::vector<int64_t> used;
      for (const Table& t : others.tables) used.insert(used.end(), t.begin(), t.end());
      Table batch_table;
      for (int32_t b = static_cast<int32_t>(NB) - 1; static_cast<int64_t>(batch_table.size()) * d.BS < 150; --b)
        if (std::find(used.begin(), used.end(), b) == used.end()) batch_table.push_back(b);

      set_num_threads(1);
      Cache alone(d, cache_type, NB);
      const Floats want = chunked(alone, target, alone_table, 150, {});
      for (int threads : {1, 2}) {
        set_num_threads(threads);
        for (int64_t chunk : {int64_t{150}, int64_t{1}, int64_t{7}, int64_t{64}}) {
          SCOPED_TRACE("threads " + std::to_string(threads) + " chunk " + std::to_string(chunk));
          Cache a(d, cache_type, NB);
          EXPECT_EQ(chunked(a, target, alone_table, chunk, {}), want) << "alone";
          Cache b(d, cache_type, NB);
          for (size_t s = 0; s < others.seqs.size(); ++s)
            write_tokens(b, others.seqs[s], others.tables[s], 0, others.seqs[s].T);
          EXPECT_EQ(chunked(b, target, batch_table, chunk, batch_others), want) << "in a batch";
        }
      }
    }
  }
  set_num_threads(saved);
}

// ---- misuse -------------------------------------------------------------------

struct Misuse {
  Floats q = Floats(5 * 4 * 8), out = Floats(5 * 4 * 8), kc = Floats(4 * 4 * 2 * 8), vc = Floats(4 * 4 * 2 * 8);
  std::vector<int32_t> tables = {2, 0, 3, 1, -1, -1}, seq_lens = {7, 2}, query_start = {0, 3, 5};
  void run(int64_t NH = 4) {
    paged_attention_forward(f32_view(out, {5, NH, 32 / NH}), f32_view(q, {5, NH, 32 / NH}),
                            f32_view(kc, {4, 4, 2, 8}), f32_view(vc, {4, 4, 2, 8}), i32_view(tables, {2, 3}),
                            i32_view(seq_lens, {2}), i32_view(query_start, {3}));
  }
};

TEST(PagedAttention, ValidOperandsRunAndEachBadOneIsAClearError) {
  Misuse{}.run();
  Misuse m;
  m.query_start[2] = 4;
  expect_error([&] { m.run(); }, {"paged_attention_forward", "query_start[2] must be N = 5", "got 4"});
  m = Misuse{};
  m.seq_lens[0] = 13;
  expect_error([&] { m.run(); }, {"paged_attention_forward", "sequence 0 has seq_lens 13",
                                  "beyond its block table's 3 blocks of 4 tokens"});
  m = Misuse{};
  m.seq_lens[1] = 1;
  expect_error([&] { m.run(); }, {"sequence 1 has seq_lens 1, fewer than its 2 query rows"});
  m = Misuse{};
  m.tables[1] = 4;
  expect_error([&] { m.run(); }, {"block_tables[0, 1] = 4 is not a block of the caches [0, 4)"});
  m = Misuse{};
  m.query_start = {0, 6, 5};
  expect_error([&] { m.run(); }, {"query_start decreases at 1"});
  m = Misuse{};
  expect_error([&] { m.run(8); }, {"paged_attention_forward", "head size 4", "head size 8"});
  Floats q3(5 * 3 * 8), out3(5 * 3 * 8);
  expect_error(
      [&] {
        paged_attention_forward(f32_view(out3, {5, 3, 8}), f32_view(q3, {5, 3, 8}), f32_view(m.kc, {4, 4, 2, 8}),
                                f32_view(m.vc, {4, 4, 2, 8}), i32_view(m.tables, {2, 3}), i32_view(m.seq_lens, {2}),
                                i32_view(m.query_start, {3}));
      },
      {"paged_attention_forward", "q has 3 heads, not a multiple of the 2 kv heads", "q=f32(5, 3, 8)"});
  expect_error(
      [&] {
        paged_attention_forward(f32_view(m.out, {5, 4, 8}), f32_view(m.q, {5, 4, 8}), f32_view(m.kc, {4, 4, 2, 8}),
                                f32_view(m.vc, {4, 4, 2, 8}), i32_view(m.tables, {2, 3}), i32_view(m.seq_lens, {2}),
                                i32_view(m.query_start, {2}));
      },
      {"paged_attention_forward", "query_start must have S + 1 = 3 entries, got 2"});
}

TEST(KvCacheWrite, BadSlotsAndOperandsAreClearErrorsAndWriteNothing) {
  Floats kc(4 * 4 * 2 * 8), vc(4 * 4 * 2 * 8), k = random_floats(3 * 2 * 8, 1), v = random_floats(3 * 2 * 8, 2);
  auto write = [&](std::vector<int64_t> slots) {
    kv_cache_write(f32_view(kc, {4, 4, 2, 8}), f32_view(vc, {4, 4, 2, 8}), f32_view(k, {3, 2, 8}),
                   f32_view(v, {3, 2, 8}), Tensor(slots.data(), DType::i64, {3}));
  };
  expect_error([&] { write({0, 5, 16}); }, {"kv_cache_write", "slots[2] = 16 is outside the caches' [0, 16) slots"});
  expect_error([&] { write({-2, 5, 1}); }, {"kv_cache_write", "slots[0] = -2"});
  EXPECT_EQ(kc, Floats(kc.size())) << "a rejected call wrote k";
  EXPECT_EQ(vc, Floats(vc.size())) << "a rejected call wrote v";
  std::vector<int32_t> slots32 = {0, 1, 2};
  expect_error(
      [&] {
        kv_cache_write(f32_view(kc, {4, 4, 2, 8}), f32_view(vc, {4, 4, 2, 8}), f32_view(k, {3, 2, 8}),
                       f32_view(v, {3, 2, 8}), i32_view(slots32, {3}));
      },
      {"kv_cache_write", "slots has dtype i32, expected i64"});
  expect_error(
      [&] {
        std::vector<int64_t> slots = {0, 1, 2};
        kv_cache_write(f32_view(kc, {4, 4, 2, 8}), f32_view(vc, {4, 4, 2, 8}), f32_view(k, {3, 1, 16}),
                       f32_view(v, {3, 1, 16}), Tensor(slots.data(), DType::i64, {3}));
      },
      {"kv_cache_write", "k has (1 kv heads, head size 16) but the caches hold (2, 8)"});
}

}  // namespace
}  // namespace loom::test
