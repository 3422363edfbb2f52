// linear_forward_invariant (ops.h), the serving engine's GEMM: its values
// against a double-precision reference on shapes whose K, N and M are not
// multiples of the kernel's steps and tiles (K past a 16- or 32-element
// step, N and M past the 4 x 4 register tile), f32 / bf16 / f16 operands,
// f32 or 16-bit outputs, biases of either dtype; the bits of each row against
// the same row computed alone and at another thread count. (Batch
// invariance over the model's real shapes and many row counts:
// test_batch_invariance.cpp; the paged runner's use of it:
// tests/model/test_paged_runner.cpp.)
#include <omp.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/tensors.h"
#include "core/dtype.h"
#include "core/error.h"
#include "kernels/ops.h"

namespace loom::kernels {
namespace {

using loom::test::Buffer;

Buffer random_buffer(DType dt, Shape s, std::mt19937& rng) {
  Buffer b(dt, s);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (int64_t i = 0; i < s.numel(); ++i) b.set(i, normal(rng));
  return b;
}

// Half of the 16-bit types' spacing at 1 (their rounding of the result).
double rounding(DType t) { return t == DType::bf16 ? 0x1p-8 : t == DType::f16 ? 0x1p-11 : 0x1p-24; }

struct Case {
  int64_t M, N, K;
  DType in, out, bias;  // bias: DType::u8 for none
};

std::string name(const Case& c) {
  return std::to_string(c.M) + "x" + std::to_string(c.N) + "x" + std::to_string(c.K) + " " +
         std::string(dtype_name(c.in)) + " -> " + std::string(dtype_name(c.out)) +
         (c.bias == DType::u8 ? "" : " bias " + std::string(dtype_name(c.bias)));
}

// y against sum_k x w in double (of the operands' rounded values) + bias:
// within the output's rounding of |y| plus f32 accumulation of sum_k |x w|.
void expect_close(const Case& c) {
  std::mt19937 rng(static_cast<uint32_t>(c.M * 1000003 + c.N * 1009 + c.K));
  Buffer x = random_buffer(c.in, {c.M, c.K}, rng), w = random_buffer(c.in, {c.N, c.K}, rng);
  Buffer bias = random_buffer(c.bias == DType::u8 ? DType::f32 : c.bias, {c.N}, rng);
  Buffer y(c.out, {c.M, c.N});
  linear_forward_invariant(y.view(), x.view(), w.view(), c.bias == DType::u8 ? Tensor() : bias.view());
  const auto xf = x.floats(), wf = w.floats(), bf = bias.floats(), yf = y.floats();
  int bad = 0;
  for (int64_t m = 0; m < c.M; ++m)
    for (int64_t n = 0; n < c.N; ++n) {
      double ref = c.bias == DType::u8 ? 0 : bf[static_cast<size_t>(n)], mag = std::fabs(ref);
      for (int64_t k = 0; k < c.K; ++k) {
        const double p = double(xf[static_cast<size_t>(m * c.K + k)]) * wf[static_cast<size_t>(n * c.K + k)];
        ref += p, mag += std::fabs(p);
      }
      const double got = yf[static_cast<size_t>(m * c.N + n)];
      // (f16's subnormals, below 2^-14, are 2^-24 apart: rounding to one
      // errs by up to 2^-25 whatever |ref| is.)
      const double tol = rounding(c.out) * std::fabs(ref) + (c.out == DType::f16 ? 0x1p-25 : 0) +
                         4 * 0x1p-24 * std::sqrt(double(c.K) + 1) * mag + 1e-30;
      if (std::fabs(got - ref) > tol && bad++ < 3)
        ADD_FAILURE() << name(c) << ": y[" << m << "][" << n << "] = " << got << ", reference " << ref << " (tol "
                      << tol << ")";
    }
}

TEST(LinearInvariant, MatchesADoubleReferenceOnEveryTileAndStepEdge) {
  for (int64_t K : {1, 15, 16, 17, 31, 32, 33, 100, 768, 1650})
    for (int64_t N : {1, 3, 4, 5, 37})
      for (int64_t M : {1, 3, 4, 5, 17, 140}) {
        expect_close({M, N, K, DType::f32, DType::f32, DType::f32});
        expect_close({M, N, K, DType::bf16, DType::bf16, DType::bf16});
        expect_close({M, N, K, DType::f16, DType::f16, DType::u8});
      }
}

TEST(LinearInvariant, HalfOperandsGiveF32OutputsWithEitherBias) {
  for (DType in : {DType::bf16, DType::f16})
    for (DType bias : {DType::f32, in, DType::u8}) expect_close({9, 70, 130, in, DType::f32, bias});
}

TEST(LinearInvariant, NoFeaturesGiveTheBiasAndNoRowsNothing) {
  Buffer x(DType::f32, {3, 0}), w(DType::f32, {2, 0}), bias(DType::f32, {2}, {1.5f, -2.f}), y(DType::f32, {3, 2});
  linear_forward_invariant(y.view(), x.view(), w.view(), bias.view());
  EXPECT_EQ(y.floats(), (test::Floats{1.5f, -2.f, 1.5f, -2.f, 1.5f, -2.f}));
  Buffer x0(DType::f32, {0, 4}), w0(DType::f32, {2, 4}), y0(DType::f32, {0, 2});
  linear_forward_invariant(y0.view(), x0.view(), w0.view(), Tensor());
}

// Every row of a many-row call equals the same row computed alone, bit for
// bit, and so does the whole call at 1 thread and at 3. (With AVX2 or
// AVX-512, whole tiles of the rows take the outer-product path -- from 64
// rows with AVX2 and bf16 pairs (AVX512_BF16), from 64 (K >= 1536) or 128
// rows with AVX-512 -- at K = 4200 cut into K blocks, at K = 201 ending in
// half a bf16 pair; the rest and a row alone take the dot-product tiles;
// N = 131 spans panels of w and ends in a part of a column tile. At
// the amx level bf16 rows take AMX tiles: at K = 4200 in K blocks, with x's
// 140 rows in two groups, the second of an odd number of 16-row blocks.)
TEST(LinearInvariant, RowsDoNotDependOnTheirNeighboursOrTheThreads) {
  for (int64_t K : {201, 4200}) {
    for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
      std::mt19937 rng(5);
      const int64_t M = K < 1536 ? 270 : 140, N = 131;
      Buffer x = random_buffer(dt, {M, K}, rng), w = random_buffer(dt, {N, K}, rng), b = random_buffer(dt, {N}, rng);
      Buffer all(dt, {M, N});
      linear_forward_invariant(all.view(), x.view(), w.view(), b.view());
      const size_t row = static_cast<size_t>(N) * dtype_size(dt);
      for (int64_t m = 0; m < M; ++m) {
        Buffer one(dt, {1, N});
        linear_forward_invariant(one.view(), x.view().slice(0, m, 1), w.view(), b.view());
        EXPECT_EQ(std::memcmp(one.bytes.data(), all.bytes.data() + static_cast<size_t>(m) * row, row), 0)
            << dtype_name(dt) << " K " << K << " row " << m;
      }
      const int threads = omp_get_max_threads();
      for (int t : {1, 3}) {
        omp_set_num_threads(t);
        Buffer again(dt, {M, N});
        linear_forward_invariant(again.view(), x.view(), w.view(), b.view());
        EXPECT_EQ(again.bytes, all.bytes) << dtype_name(dt) << " at " << t << " threads";
      }
      omp_set_num_threads(threads);
    }
  }
}

// More rows than a thread's packed copy of x holds (16 MiB: 31 tiles of 32
// rows at K = 4200 f32, 62 in bf16 pairs) go in chunks: rows of every chunk
// equal the rows computed alone.
TEST(LinearInvariant, RowsPastAChunkOfPackedRowsKeepTheirBits) {
  for (DType dt : {DType::f32, DType::bf16}) {
    std::mt19937 rng(11);
    const int64_t M = dt == DType::f32 ? 1060 : 2030, N = 20, K = 4200;
    Buffer x = random_buffer(dt, {M, K}, rng), w = random_buffer(dt, {N, K}, rng);
    Buffer all(DType::f32, {M, N});
    linear_forward_invariant(all.view(), x.view(), w.view(), Tensor());
    for (int64_t m = 0; m < M; m += m < M - 40 ? 37 : 1) {
      Buffer one(DType::f32, {1, N});
      linear_forward_invariant(one.view(), x.view().slice(0, m, 1), w.view(), Tensor());
      EXPECT_EQ(std::memcmp(one.bytes.data(), all.bytes.data() + static_cast<size_t>(m * N) * 4, size_t(N) * 4), 0)
          << dtype_name(dt) << " row " << m;
    }
  }
}

// y[m][n] by the arithmetic linear_invariant.cpp documents, in scalars: 16
// lanes from +0, lane k mod 16 fusing x[k] w[k] (0 x 0 past K, to the end
// of the last step), the halves-quarters-pairs tree, then + bias.
float lane_arithmetic(const float* x, const float* w, int64_t K, float bias) {
  float lane[16] = {};
  for (int64_t k0 = 0; k0 < K; k0 += 16)
    for (int64_t l = 0; l < 16; ++l)
      lane[l] = k0 + l < K ? std::fma(x[k0 + l], w[k0 + l], lane[l]) : std::fma(0.f, 0.f, lane[l]);
  for (int h = 8; h > 0; h /= 2)
    for (int i = 0; i < h; ++i) lane[i] += lane[i + h];
  return lane[0] + bias;
}

// Every ISA path (AVX-512, AVX2 + FMA, generic) computes exactly that, so
// f32 and f16 operands give the same bits at every level. (bf16 with
// AVX512_BF16 pairs its products: linear_invariant.cpp says by how much.)
// Tiny operands of opposite signs check the signed zeros: their products
// round to -0, and a step's zeros past K turn a -0 lane into +0.
TEST(LinearInvariant, EqualsTheDocumentedLaneArithmeticBitForBit) {
  for (DType in : {DType::f32, DType::f16})
    for (int64_t K : {1, 7, 15, 16, 17, 33, 100, 768, 1650})
      for (int64_t M : {1, 3, 5, 8, 140, 264})
        for (bool tiny : {false, true}) {
          if (tiny && in == DType::f16) continue;  // 1e-30 is 0 in f16
          std::mt19937 rng(static_cast<uint32_t>(K * 31 + M));
          const int64_t N = 7;
          Buffer x = random_buffer(in, {M, K}, rng), w = random_buffer(in, {N, K}, rng);
          Buffer bias = random_buffer(DType::f32, {N}, rng), y(DType::f32, {M, N});
          if (tiny) {
            for (int64_t i = 0; i < M * K; ++i) x.set(i, -1e-30f);
            for (int64_t i = 0; i < N * K; ++i) w.set(i, 1e-30f);
          }
          linear_forward_invariant(y.view(), x.view(), w.view(), tiny ? Tensor() : bias.view());
          const auto xf = x.floats(), wf = w.floats(), bf = bias.floats(), yf = y.floats();
          for (int64_t m = 0; m < M; ++m)
            for (int64_t n = 0; n < N; ++n) {
              const float want = lane_arithmetic(xf.data() + m * K, wf.data() + n * K, K, tiny ? 0.f : bf[size_t(n)]);
              const float got = yf[static_cast<size_t>(m * N + n)];
              EXPECT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want))
                  << dtype_name(in) << " M=" << M << " K=" << K << (tiny ? " tiny" : "") << " y[" << m << "][" << n
                  << "] = " << got << ", the lane arithmetic gives " << want;
            }
        }
}

TEST(LinearInvariant, BadOperandsAreClearErrors) {
  Buffer x(DType::f32, {2, 5}), w(DType::f32, {3, 4}), y(DType::f32, {2, 3});
  try {
    linear_forward_invariant(y.view(), x.view(), w.view(), Tensor());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("linear_forward_invariant: x has 5 features but w expects 4"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace loom::kernels
