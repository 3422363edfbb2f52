// Context-parallel attention (parallel/cp.h) against the single-rank kernel:
// every rank of the world is one cp rank (cp = 1, 2, 3, 4, 8 at np 1-8),
// holds its tokens of random sequences (zig-zag or contiguous), and runs
// ring or all-gather attention forward and backward; its out, lse, dQ, dK
// and dV must be the full attention's at the tokens' global positions
// (fp32: rel 1e-5). Sizes: T = 2·cp (chunks of one token: every diagonal
// block is tiny), odd chunks, chunks wider than the kernel's 64-wide tiles;
// GQA and plain multi-head; bf16 within bf16's rounding.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "common/mpi_env.h"
#include "common/tensors.h"
#include "core/error.h"
#include "kernels/ops.h"
#include "parallel/cp.h"

namespace loom::test {
namespace {

using parallel::ContextParallelAttention;
using parallel::CpAlgo;
using parallel::CpSplit;

struct Dims {
  int64_t B, T, NH, NKV, HS;
};

// The whole sequences, as every rank draws them (same seed).
struct Full {
  Dims d;
  Floats q, k, v, dout;
  Floats out, lse, dq, dk, dv;  // the single-rank kernel's
  explicit Full(Dims dims, uint32_t seed) : d(dims) {
    std::mt19937 rng(seed);
    q = random_floats(static_cast<size_t>(d.B * d.T * d.NH * d.HS), rng);
    k = random_floats(static_cast<size_t>(d.B * d.T * d.NKV * d.HS), rng);
    v = random_floats(k.size(), rng);
    dout = random_floats(q.size(), rng);
    out.resize(q.size()), lse.resize(static_cast<size_t>(d.B * d.NH * d.T));
    dq.assign(q.size(), 0.f), dk.assign(k.size(), 0.f), dv.assign(k.size(), 0.f);
    const Shape qs{d.B, d.T, d.NH, d.HS}, ks{d.B, d.T, d.NKV, d.HS};
    kernels::attention_forward(f32_view(out, qs), f32_view(lse, {d.B, d.NH, d.T}), f32_view(q, qs),
                               f32_view(k, ks), f32_view(v, ks));
    kernels::attention_backward(f32_view(dq, qs), f32_view(dk, ks), f32_view(dv, ks), f32_view(dout, qs),
                                f32_view(q, qs), f32_view(k, ks), f32_view(v, ks), f32_view(out, qs),
                                f32_view(lse, {d.B, d.NH, d.T}));
  }
};

// Rows (b, t, heads, HS) of x at the rank's tokens, in its order.
Floats local_rows(const Floats& x, const Full& f, const CpSplit& s, int rank, int64_t heads) {
  const int64_t n = s.local_tokens(), row = heads * f.d.HS;
  Floats y(static_cast<size_t>(f.d.B * n * row));
  for (int64_t b = 0; b < f.d.B; ++b)
    for (int64_t t = 0; t < n; ++t)
      std::copy_n(x.begin() + (b * f.d.T + s.position(rank, t)) * row, row, y.begin() + (b * n + t) * row);
  return y;
}

// lse (B, NH, T) at the rank's tokens.
Floats local_lse(const Full& f, const CpSplit& s, int rank) {
  const int64_t n = s.local_tokens();
  Floats y(static_cast<size_t>(f.d.B * f.d.NH * n));
  for (int64_t bh = 0; bh < f.d.B * f.d.NH; ++bh)
    for (int64_t t = 0; t < n; ++t) y[bh * n + t] = f.lse[bh * f.d.T + s.position(rank, t)];
  return y;
}

// |got - want| <= rtol * |want| + atol, reporting the worst element.
void expect_close(const Floats& got, const Floats& want, double rtol, double atol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double excess = std::abs(double(got[i]) - want[i]) - (rtol * std::abs(double(want[i])) + atol);
    if (excess > worst) worst = excess, at = i;
  }
  EXPECT_EQ(worst, 0) << what << ": element " << at << " is " << got[at] << ", want " << want[at];
}

struct Result {
  Floats out, lse, dq, dk, dv;
};

// The rank's share of f through ContextParallelAttention; T local tokens.
Result run_cp(const Full& f, CpAlgo algo, bool zigzag, Pools& pools) {
  comm::Communicator& w = world();
  const CpSplit s = parallel::cp_split(f.d.T, w.size(), zigzag);
  const int64_t n = s.local_tokens();
  Floats q = local_rows(f.q, f, s, w.rank(), f.d.NH), k = local_rows(f.k, f, s, w.rank(), f.d.NKV);
  Floats v = local_rows(f.v, f, s, w.rank(), f.d.NKV), dout = local_rows(f.dout, f, s, w.rank(), f.d.NH);
  const Shape qs{f.d.B, n, f.d.NH, f.d.HS}, ks{f.d.B, n, f.d.NKV, f.d.HS}, ls{f.d.B, f.d.NH, n};
  Result r;
  r.out.resize(q.size()), r.lse.resize(static_cast<size_t>(ls.numel()));
  r.dq.assign(q.size(), 0.f), r.dk.assign(k.size(), 0.f), r.dv.assign(k.size(), 0.f);
  ContextParallelAttention attn(w, algo, zigzag, pools);
  model::AttentionArgs a{.layer = 0, .q = f32_view(q, qs), .k = f32_view(k, ks), .v = f32_view(v, ks), .pos = {},
                         .out = f32_view(r.out, qs), .lse = f32_view(r.lse, ls)};
  attn.forward(a);
  attn.backward(a, {.dout = f32_view(dout, qs), .dq = f32_view(r.dq, qs), .dk = f32_view(r.dk, ks),
                    .dv = f32_view(r.dv, ks)});
  return r;
}

void expect_matches_one_rank(const Dims& d, CpAlgo algo, bool zigzag) {
  comm::Communicator& w = world();
  const Full f(d, 1234 + static_cast<uint32_t>(d.T));
  Pools pools;
  const Result r = run_cp(f, algo, zigzag, pools);
  const CpSplit s = parallel::cp_split(d.T, w.size(), zigzag);
  const std::string what = concat(parallel::cp_algo_name(algo), zigzag ? " zig-zag" : " contiguous", " cp=",
                                  w.size(), " rank ", w.rank(), " T=", d.T, " NH=", d.NH, " NKV=", d.NKV);
  constexpr double kRtol = 1e-5, kAtol = 1e-6;
  expect_close(r.out, local_rows(f.out, f, s, w.rank(), d.NH), kRtol, kAtol, what + " out");
  expect_close(r.lse, local_lse(f, s, w.rank()), kRtol, kAtol, what + " lse");
  expect_close(r.dq, local_rows(f.dq, f, s, w.rank(), d.NH), kRtol, kAtol, what + " dq");
  expect_close(r.dk, local_rows(f.dk, f, s, w.rank(), d.NKV), kRtol, kAtol, what + " dk");
  expect_close(r.dv, local_rows(f.dv, f, s, w.rank(), d.NKV), kRtol, kAtol, what + " dv");
}

// Sizes in chunks of the split, so that every world size runs them.
std::vector<Dims> sizes(int cp, bool zigzag) {
  const int64_t parts = zigzag ? 2 * cp : cp;
  return {{2, parts, 4, 2, 16},        // one token a chunk: the diagonal blocks are 1 x 1
          {2, parts * 37, 3, 3, 8},    // odd chunks, plain multi-head
          {1, parts * 80, 6, 2, 32}};  // chunks wider than the kernel's 64-wide tiles, GQA 3:1
}

TEST(ContextParallel, RingZigZagMatchesOneRank) {
  for (const Dims& d : sizes(world().size(), true)) expect_matches_one_rank(d, CpAlgo::ring, true);
}

TEST(ContextParallel, RingContiguousMatchesOneRank) {
  for (const Dims& d : sizes(world().size(), false)) expect_matches_one_rank(d, CpAlgo::ring, false);
}

TEST(ContextParallel, AllGatherZigZagMatchesOneRank) {
  for (const Dims& d : sizes(world().size(), true)) expect_matches_one_rank(d, CpAlgo::allgather, true);
}

TEST(ContextParallel, AllGatherContiguousMatchesOneRank) {
  for (const Dims& d : sizes(world().size(), false)) expect_matches_one_rank(d, CpAlgo::allgather, false);
}

// Both algorithms merge the blocks in the same order (rank r, r-1, ...):
// their forward is bitwise the same.
TEST(ContextParallel, RingAndAllGatherForwardAreBitwiseEqual) {
  const Full f({2, 2 * world().size() * 24, 4, 2, 16}, 99);
  Pools pools;
  const Result ring = run_cp(f, CpAlgo::ring, true, pools), gather = run_cp(f, CpAlgo::allgather, true, pools);
  EXPECT_EQ(ring.out, gather.out);
  EXPECT_EQ(ring.lse, gather.lse);
}

// The buffers a forward and backward take at their peak are what
// peak_bytes predicts (the bench and --memory-report print it).
TEST(ContextParallel, BuffersPeakAtWhatPeakBytesPredicts) {
  const int cp = world().size();
  const Dims d{2, 2 * cp * 10, 4, 2, 16};
  const Full f(d, 7);
  for (const CpAlgo algo : {CpAlgo::ring, CpAlgo::allgather})
    for (const bool zigzag : {true, false}) {
      Pools pools;
      run_cp(f, algo, zigzag, pools);
      EXPECT_EQ(static_cast<int64_t>(pools.report().peak_total),
                ContextParallelAttention::peak_bytes(d.B, d.T / cp, d.NH, d.NKV, d.HS, DType::f32, cp, algo, zigzag))
          << parallel::cp_algo_name(algo) << (zigzag ? " zig-zag" : " contiguous");
      EXPECT_EQ(pools.report().current_total, 0u) << "every buffer is returned after the call";
    }
}

// With zig-zag every rank makes the same number of kernel calls and sees the
// same number of (query, key) pairs; contiguous, rank r sees r·n² more than
// rank 0 (n tokens a rank).
TEST(ContextParallel, ZigZagGivesEveryRankTheSameCausalWork) {
  const int cp = world().size();
  for (const bool zigzag : {true, false}) {
    const CpSplit s = parallel::cp_split(2 * cp * 8, cp, zigzag);
    std::vector<int64_t> pairs(static_cast<size_t>(cp), 0);
    for (int r = 0; r < cp; ++r)
      for (int64_t t = 0; t < s.local_tokens(); ++t) pairs[static_cast<size_t>(r)] += s.position(r, t) + 1;
    for (int r = 0; r < cp; ++r) {
      if (zigzag) EXPECT_EQ(pairs[static_cast<size_t>(r)], pairs[0]) << "rank " << r;
      else EXPECT_EQ(pairs[static_cast<size_t>(r)], pairs[0] + int64_t{r} * s.local_tokens() * s.local_tokens())
               << "rank " << r;
    }
  }
}

TEST(ContextParallel, SplitRejectsSequencesThatDoNotDivide) {
  expect_error([] { parallel::cp_split(12, 4, true); },
               {"seq_len = 12", "cp = 4", "zig-zag", "multiple of 8", "2 * cp chunks"});
  expect_error([] { parallel::cp_split(10, 4, false); }, {"seq_len = 10", "multiple of 4"});
  expect_error([] { parallel::cp_algo_from_name("ulysses"); }, {"cp_algo = 'ulysses'", "ring and allgather"});
}

}  // namespace
}  // namespace loom::test
