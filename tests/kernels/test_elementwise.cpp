// add, cast and fill over f32 / bf16 / f16 (reference conversions:
// tests/ref/ref_elementwise.py). Every check is exact: a conversion rounds
// once (RNE) and an add is the f32 sum rounded once to y's dtype, so results
// are compared bit for bit with core/dtype.h and with PyTorch (NaN payloads
// aside: torch writes its canonical NaN, loom keeps the payload).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/compare.h"
#include "common/ref.h"
#include "common/tensors.h"
#include "kernels/ops.h"

namespace loom {
namespace {

using namespace loom::test;

constexpr DType kFloatDtypes[] = {DType::f32, DType::bf16, DType::f16};

// Bitwise equality of two float vectors, except that any NaN equals any NaN.
::testing::AssertionResult same_values(const std::vector<float>& actual, const std::vector<float>& expected) {
  if (actual.size() != expected.size()) return ::testing::AssertionFailure() << "sizes differ";
  size_t misses = 0, first = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const bool both_nan = std::isnan(actual[i]) && std::isnan(expected[i]);
    if (!both_nan && std::memcmp(&actual[i], &expected[i], sizeof(float)) != 0 && misses++ == 0) first = i;
  }
  if (misses == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << misses << " of " << actual.size() << " differ; first at " << first
                                       << ": actual " << actual[first] << " expected " << expected[first];
}

// Values spanning every exponent and sign, plus NaN and Inf.
std::vector<float> varied(int64_t n) {
  std::vector<float> x(n);
  uint32_t s = 12345;
  for (auto& v : x) {
    s = s * 1664525u + 1013904223u;  // LCG: reproducible, covers all bit patterns
    std::memcpy(&v, &s, sizeof(float));
  }
  return x;
}

// ---- cast -------------------------------------------------------------------

TEST(Cast, MatchesTorchInEveryDirectionOnEdgeAndRandomValues) {
  RefCase rc("elementwise_cast.ref");
  struct Dir {
    const char* src;
    const char* want;
    DType dst;
  };
  const Dir dirs[] = {{"x", "x_to_bf16", DType::bf16}, {"x", "x_to_f16", DType::f16},
                      {"b", "b_to_f16", DType::f16},   {"b", "b_to_f32", DType::f32},
                      {"h", "h_to_bf16", DType::bf16}, {"h", "h_to_f32", DType::f32}};
  for (const Dir& d : dirs) {
    SCOPED_TRACE(std::string(d.src) + " -> " + d.want);
    Tensor src = rc[d.src].view();
    Buffer dst(d.dst, src.shape());
    kernels::cast(dst.view(), src);
    ASSERT_EQ(rc[d.want].dtype, d.dst);
    EXPECT_TRUE(same_values(dst.floats(), rc[d.want].floats()));  // bitwise: -0 stays -0
  }
}

TEST(Cast, RoundsToNearestEvenAndKeepsSpecials) {
  struct Case {
    float x, bf16_value, f16_value;
  };
  const float inf = INFINITY;
  const Case cases[] = {
      {1 + 0x1p-8f, 1.f, 1 + 0x1p-8f},                  // bf16 tie: to even (down)
      {1 + 3 * 0x1p-8f, 1 + 0x1p-6f, 1 + 3 * 0x1p-8f},  // bf16 tie: to even (up)
      {1 + 0x1p-11f, 1.f, 1.f},                         // f16 tie: to even (down)
      {1 + 3 * 0x1p-11f, 1.f, 1 + 0x1p-9f},             // f16 tie: to even (up)
      {0.1f, 0x1.9ap-4f, 0x1.998p-4f},
      {65504.f, 65536.f, 65504.f},                      // f16 max
      {65519.f, 65536.f, 65504.f},                      // just below the f16 overflow tie
      {65520.f, 65536.f, inf},                          // f16 overflow tie: Inf
      {0x1.fefffep+127f, 0x1.fep+127f, inf},            // just below bf16's tie with Inf
      {0x1.ffp+127f, inf, inf},                         // bf16 tie between its max and Inf: to even (Inf)
      {1e-8f, 0x1.58p-27f, 0.f},                        // f16 underflow
      {0x1p-25f, 0x1p-25f, 0.f},                        // tie with the smallest f16 subnormal: to even (0)
      {1.5f * 0x1p-25f, 1.5f * 0x1p-25f, 0x1p-24f},     // above that tie: the smallest subnormal
      {0x1p-14f - 0x1p-25f, 0x1p-14f, 0x1p-14f},        // f16 subnormal rounding up into the normals
      {1e-40f, 0x1p-133f, 0.f},                         // f32 subnormal: the smallest bf16 subnormal
      {-inf, -inf, -inf},
      {-0.f, -0.f, -0.f},
  };
  const int64_t n = std::size(cases);
  Buffer x(DType::f32, {n}), b(DType::bf16, {n}), h(DType::f16, {n});
  for (int64_t i = 0; i < n; ++i) x.set(i, cases[i].x);
  kernels::cast(b.view(), x.view());
  kernels::cast(h.view(), x.view());
  const std::vector<float> bv = b.floats(), hv = h.floats();
  for (int64_t i = 0; i < n; ++i) {
    SCOPED_TRACE(::testing::Message() << "x = " << std::hexfloat << cases[i].x);
    EXPECT_TRUE(same_values({bv[i]}, {cases[i].bf16_value}));
    EXPECT_TRUE(same_values({hv[i]}, {cases[i].f16_value}));
  }
  // NaN stays NaN through every direction, and Inf stays Inf.
  Buffer nan32(DType::f32, {2}, {NAN, -NAN});
  for (DType mid : {DType::bf16, DType::f16}) {
    Buffer m(mid, {2}), back(DType::f32, {2});
    kernels::cast(m.view(), nan32.view());
    kernels::cast(back.view(), m.view());
    for (float f : back.floats()) EXPECT_TRUE(std::isnan(f)) << dtype_name(mid);
  }
}

TEST(Cast, EqualsDtypeHelpersBitwiseForEveryPairOnALargeTensor) {
  const int64_t n = 100003;  // parallel path, ragged end
  const std::vector<float> x = varied(n);
  for (DType from : kFloatDtypes) {
    Buffer src(from, {n}, x);
    for (DType to : kFloatDtypes) {
      SCOPED_TRACE(std::string(dtype_name(from)) + " -> " + std::string(dtype_name(to)));
      Buffer dst(to, {n}), want(to, {n}, src.floats());  // want: core/dtype.h conversions of the same values
      kernels::cast(dst.view(), src.view());
      EXPECT_EQ(dst.bytes, want.bytes);
    }
  }
}

TEST(Cast, MisuseThrowsNamingTheOpAndShapes) {
  Buffer a(DType::f32, {2, 3}), b(DType::bf16, {3, 2}), i(DType::i32, {2, 3}), big(DType::f32, {8});
  expect_error([&] { kernels::cast(b.view(), a.view()); }, {"cast", "bf16(3, 2)"});
  expect_error([&] { kernels::cast(i.view(), a.view()); }, {"cast", "dst has dtype i32"});
  expect_error([&] { kernels::cast(a.view(), i.view()); }, {"cast", "src has dtype i32"});
  Tensor lo(big.bytes.data(), DType::f32, {6}), hi(big.bytes.data() + 8, DType::bf16, {6});
  expect_error([&] { kernels::cast(hi, lo); }, {"cast", "overlaps"});
}

// ---- add --------------------------------------------------------------------

TEST(Add, IsTheF32SumRoundedOnceForEveryDtypeCombination) {
  const int64_t n = 40001;
  std::vector<float> xa(n), xb(n);
  for (int64_t k = 0; k < n; ++k) {
    xa[k] = std::sin(0.11f * static_cast<float>(k)) * 300.f;
    xb[k] = std::cos(0.07f * static_cast<float>(k)) * 0.5f;
  }
  xa[3] = INFINITY, xb[4] = NAN, xa[5] = 60000.f, xb[5] = 6000.f;  // an f16 overflow, specials
  for (DType dy : kFloatDtypes)
    for (DType da : kFloatDtypes)
      for (DType db : kFloatDtypes) {
        SCOPED_TRACE(std::string(dtype_name(dy)) + " = " + std::string(dtype_name(da)) + " + " +
                     std::string(dtype_name(db)));
        Buffer a(da, {n}, xa), b(db, {n}, xb), y(dy, {n});
        const std::vector<float> fa = a.floats(), fb = b.floats();
        std::vector<float> sum(n);
        for (int64_t k = 0; k < n; ++k) sum[k] = fa[k] + fb[k];
        Buffer want(dy, {n}, sum);
        kernels::add(y.view(), a.view(), b.view());
        EXPECT_TRUE(same_values(y.floats(), want.floats()));
      }
}

// mul: the f32 product rounded once, for every dtype combination (what a
// dropout mask's multiply relies on: a kept element x (1 / (1 - p)), a
// dropped one 0), and in place.
TEST(Mul, IsTheF32ProductRoundedOnceForEveryDtypeCombination) {
  const int64_t n = 40001;
  std::vector<float> xa(n), xb(n);
  for (int64_t k = 0; k < n; ++k) {
    xa[k] = std::sin(0.11f * static_cast<float>(k)) * 300.f;
    xb[k] = k % 3 == 0 ? 0.f : std::cos(0.07f * static_cast<float>(k)) * 1.25f;
  }
  xa[3] = INFINITY, xb[4] = NAN, xa[5] = 60000.f, xb[5] = 6.f;  // an f16 overflow, specials
  for (DType dy : kFloatDtypes)
    for (DType da : kFloatDtypes)
      for (DType db : kFloatDtypes) {
        SCOPED_TRACE(std::string(dtype_name(dy)) + " = " + std::string(dtype_name(da)) + " * " +
                     std::string(dtype_name(db)));
        Buffer a(da, {n}, xa), b(db, {n}, xb), y(dy, {n});
        const std::vector<float> fa = a.floats(), fb = b.floats();
        std::vector<float> product(n);
        for (int64_t k = 0; k < n; ++k) product[k] = fa[k] * fb[k];
        Buffer want(dy, {n}, product);
        kernels::mul(y.view(), a.view(), b.view());
        EXPECT_TRUE(same_values(y.floats(), want.floats()));
        Buffer in_place = b;
        kernels::mul(in_place.view(), a.view(), in_place.view());
        if (db == dy) {
          EXPECT_EQ(in_place.bytes, y.bytes);
        }
      }
  Buffer a(DType::f32, {2, 3}), b(DType::f32, {3, 2});
  expect_error([&] { kernels::mul(a.view(), a.view(), b.view()); }, {"mul", "shape"});
}

TEST(Add, InPlaceOnEitherOperand) {
  for (DType d : kFloatDtypes) {
    SCOPED_TRACE(std::string(dtype_name(d)));
    const std::vector<float> xa = {1.f, -2.5f, 3.25f, 1e3f, 0.f}, xb = {0.5f, 0.5f, -3.25f, 24.f, -0.f};
    Buffer a(d, {5}, xa), b(d, {5}, xb), want(d, {5});
    kernels::add(want.view(), a.view(), b.view());
    Buffer a2 = a, b2 = b;
    kernels::add(a2.view(), a2.view(), b.view());
    kernels::add(b2.view(), a.view(), b2.view());
    EXPECT_EQ(a2.bytes, want.bytes);
    EXPECT_EQ(b2.bytes, want.bytes);
    Buffer twice(d, {5});
    kernels::add(a.view(), a.view(), a.view());  // y = a + a: every operand the same memory
    kernels::add(twice.view(), Buffer(d, {5}, xa).view(), Buffer(d, {5}, xa).view());
    EXPECT_EQ(a.bytes, twice.bytes);
  }
}

TEST(Add, MisuseThrowsNamingTheOpAndShapes) {
  Buffer a(DType::f32, {2, 3}), b(DType::f32, {3, 2}), i(DType::i32, {2, 3}), y(DType::f32, {6});
  Buffer big(DType::f32, {16});
  expect_error([&] { kernels::add(a.view(), a.view(), b.view()); }, {"add", "f32(3, 2)"});
  expect_error([&] { kernels::add(y.view(), a.view(), a.view()); }, {"add", "y=f32(6,)"});
  expect_error([&] { kernels::add(a.view(), a.view(), i.view()); }, {"add", "b has dtype i32"});
  expect_error([&] { kernels::add(i.view(), a.view(), a.view()); }, {"add", "y has dtype i32"});
  Tensor x0(big.bytes.data(), DType::f32, {8}), x1(big.bytes.data() + 4, DType::f32, {8});
  expect_error([&] { kernels::add(x1, x0, x0); }, {"add", "overlaps"});
  Tensor as_bf16(big.bytes.data(), DType::bf16, {8});
  expect_error([&] { kernels::add(as_bf16, x0, x0); }, {"add", "overlaps"});
}

// ---- fill -------------------------------------------------------------------

TEST(Fill, WritesTheRoundedValueEverywhere) {
  const int64_t n = 70001;
  for (DType d : kFloatDtypes) {
    for (float value : {1.f / 3.f, -0.f, 1e5f, NAN}) {
      SCOPED_TRACE(std::string(dtype_name(d)) + " " + std::to_string(value));
      Buffer t(d, {n}, varied(n)), want(d, {n}, std::vector<float>(n, value));
      kernels::fill(t.view(), value);
      EXPECT_TRUE(same_values(t.floats(), want.floats()));
    }
  }
}

// From 32 MiB the fill streams past the cache in vector-sized lines
// (kernels/cpu/elementwise.cpp): every element is still written, from a
// start that is not line-aligned to a length that is no whole number of
// lines, and not one byte beside the tensor.
TEST(Fill, ALargeFillWritesEveryElementAndNothingBeside) {
  for (DType d : kFloatDtypes) {
    SCOPED_TRACE(dtype_name(d));
    const int64_t es = static_cast<int64_t>(dtype_size(d));
    const int64_t n = (int64_t{33} << 20) / es + 7, total = n + 64 / es + 2;
    std::vector<std::byte> bytes(static_cast<size_t>(total * es), std::byte{0x5a});
    Tensor t(bytes.data() + 3 * es, d, Shape{n});  // 3 elements past the buffer's start
    kernels::fill(t, -1.5f);
    const Buffer want(d, {1}, {-1.5f});
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i)
      wrong += std::memcmp(bytes.data() + (3 + i) * es, want.bytes.data(), static_cast<size_t>(es)) != 0;
    EXPECT_EQ(wrong, 0);
    for (int64_t i = 0; i < 3 * es; ++i) EXPECT_EQ(bytes[static_cast<size_t>(i)], std::byte{0x5a}) << i;
    for (int64_t i = (3 + n) * es; i < total * es; ++i) EXPECT_EQ(bytes[static_cast<size_t>(i)], std::byte{0x5a}) << i;
  }
}

TEST(Fill, MisuseThrowsNamingTheOp) {
  Buffer i(DType::i32, {3});
  expect_error([&] { kernels::fill(i.view(), 1.f); }, {"fill", "t has dtype i32"});
  expect_error([&] { kernels::fill(Tensor(), 1.f); }, {"fill", "t is required"});
}

}  // namespace
}  // namespace loom
