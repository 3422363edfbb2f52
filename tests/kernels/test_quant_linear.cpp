// linear_forward_quantized (ops.h): y = x @ W^T (+ bias) on weights stored as
// llama.cpp blocks. Bit for bit against the scalar reference (each row of x
// quantized by quantize_row, then quant.h's vec_dot per output) for every
// weight type, 1 to 520 rows, at every instruction-set level this CPU has;
// within the activations' quantization error of x @ dequantize(W)^T; the
// refused operands.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/tensors.h"
#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu_isa.h"
#include "kernels/ops.h"
#include "kernels/quant.h"

namespace loom::kernels {
namespace {

using test::expect_error;

constexpr QuantType kWeightTypes[] = {QuantType::q8_0, QuantType::q4_0, QuantType::q4_K, QuantType::q6_K,
                                      QuantType::q4_1, QuantType::q5_0, QuantType::q5_1, QuantType::q2_K,
                                      QuantType::q3_K, QuantType::q5_K};

std::vector<float> gaussian(size_t n, std::mt19937& rng, float sigma) {
  std::normal_distribution<float> dist(0.f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<uint8_t> random_weight_bytes(QuantType t, int64_t OC, int64_t IC, std::mt19937& rng);

// OC rows of IC values quantized to type t: rows of different magnitudes
// (q3_K, which loom does not write: random blocks).
std::vector<uint8_t> quantized_weight(QuantType t, int64_t OC, int64_t IC, std::mt19937& rng) {
  if (!quant_can_write(t)) return random_weight_bytes(t, OC, IC, rng);
  const size_t row = quant_row_bytes(t, IC);
  std::vector<uint8_t> w(row * static_cast<size_t>(OC));
  for (int64_t n = 0; n < OC; ++n) {
    const std::vector<float> v = gaussian(static_cast<size_t>(IC), rng, 0.02f * static_cast<float>(1 + n % 5));
    quantize_row(t, v.data(), w.data() + row * static_cast<size_t>(n), IC);
  }
  return w;
}

// Random bytes in every field but the f16 scales (finite, small): every
// nibble, 6-bit scale and min, int8 value (-128 included) and signed q6_K
// scale the format can hold, not only those the quantizers write.
std::vector<uint8_t> random_weight_bytes(QuantType t, int64_t OC, int64_t IC, std::mt19937& rng) {
  std::vector<uint8_t> w(quant_row_bytes(t, IC) * static_cast<size_t>(OC));
  for (uint8_t& b : w) b = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> scale(-0.01f, 0.01f);
  const auto set = [&](uint8_t* p) {
    const f16 h = to_f16(scale(rng));
    std::memcpy(p, &h, sizeof h);
  };
  const size_t bytes = quant_block_bytes(t);
  for (size_t off = 0; off < w.size(); off += bytes) {
    uint8_t* b = w.data() + off;
    size_t at[2];
    for (int i = 0, n = quant_f16_offsets(t, at); i < n; ++i) set(b + at[i]);
  }
  return w;
}

struct Problem {
  QuantType type;
  int64_t N, OC, IC;
  std::vector<float> x, bias;
  std::vector<uint8_t> w;
  Tensor xt(int64_t n) { return Tensor(x.data(), DType::f32, {n, IC}); }
  Tensor wt() { return Tensor(w.data(), DType::u8, {OC, static_cast<int64_t>(w.size()) / OC}); }
  Tensor bt() { return Tensor(bias.data(), DType::f32, {OC}); }
};

Problem make_problem(QuantType t, int64_t N, int64_t OC, int64_t IC, bool random_bytes, uint32_t seed) {
  std::mt19937 rng(seed);
  Problem p{t, N, OC, IC, gaussian(static_cast<size_t>(N * IC), rng, 1.f), gaussian(static_cast<size_t>(OC), rng, 1.f),
            {}};
  // A few rows with one large value per block: activation values of +-127.
  for (int64_t m = 1; m < N; m += 5)
    for (int64_t k = m % 7; k < IC; k += 32) p.x[static_cast<size_t>(m * IC + k)] = (k % 2 ? 40.f : -40.f);
  p.w = random_bytes ? random_weight_bytes(t, OC, IC, rng) : quantized_weight(t, OC, IC, rng);
  return p;
}

// The scalar reference: rows of x quantized by quantize_row, vec_dot per
// output.
std::vector<float> reference(Problem& p) {
  const QuantType at = quant_dot_type(p.type);
  const size_t arow = quant_row_bytes(at, p.IC), wrow = quant_row_bytes(p.type, p.IC);
  std::vector<uint8_t> a(arow * static_cast<size_t>(p.N));
  for (int64_t m = 0; m < p.N; ++m) quantize_row(at, p.x.data() + m * p.IC, a.data() + arow * m, p.IC);
  std::vector<float> y(static_cast<size_t>(p.N * p.OC));
  for (int64_t m = 0; m < p.N; ++m)
    for (int64_t n = 0; n < p.OC; ++n) {
      y[static_cast<size_t>(m * p.OC + n)] = vec_dot(p.type, p.w.data() + wrow * n, a.data() + arow * m, p.IC);
    }
  return y;
}

// y + bias (one f32 add per element).
std::vector<float> plus_bias(std::vector<float> y, const Problem& p) {
  for (size_t i = 0; i < y.size(); ++i) y[i] += p.bias[i % static_cast<size_t>(p.OC)];
  return y;
}

std::vector<CpuIsa> supported_levels() {
  std::vector<CpuIsa> levels;
  for (int l = 0; l <= static_cast<int>(cpu_isa_supported()); ++l)
    levels.push_back(static_cast<CpuIsa>(l));
  return levels;
}

// y of the first n rows, through ops.h (level < 0) or one level's table.
std::vector<float> run(Problem& p, int64_t n, bool with_bias, int level) {
  std::vector<float> y(static_cast<size_t>(n * p.OC), std::numeric_limits<float>::quiet_NaN());
  const Tensor yt(y.data(), DType::f32, {n, p.OC});
  const Tensor bias = with_bias ? p.bt() : Tensor();
  if (level < 0) linear_forward_quantized(yt, p.xt(n), p.wt(), p.type, bias);
  else cpu_backend(static_cast<CpuIsa>(level)).linear_forward_quantized(yt, p.xt(n), p.wt(), p.type, bias);
  return y;
}

// The first n rows of got equal want's bit for bit; reports the first difference.
void expect_same_bits(const std::vector<float>& want, const std::vector<float>& got, const std::string& what) {
  ASSERT_LE(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", the reference " << want[i];
      return;
    }
}

// rows: ascending; the problem has rows.back() rows.
void expect_reference_bits(QuantType t, int64_t OC, int64_t IC, bool random_bytes, const std::vector<int64_t>& rows) {
  Problem p = make_problem(t, rows.back(), OC, IC, random_bytes,
                           static_cast<uint32_t>(OC * 7 + IC + static_cast<int>(t)));
  const std::vector<float> dots = reference(p);
  for (bool with_bias : {false, true}) {
    const std::vector<float> want = with_bias ? plus_bias(dots, p) : dots;
    for (int64_t n : rows) {
      const std::string what = std::string(quant_name(t)) + " " + std::to_string(n) + "x" + std::to_string(OC) +
                               "x" + std::to_string(IC) + (with_bias ? " bias" : "");
      expect_same_bits(want, run(p, n, with_bias, -1), what + " (ops.h)");
      for (CpuIsa level : supported_levels())
        expect_same_bits(want, run(p, n, with_bias, static_cast<int>(level)), what + " at " + cpu_isa_name(level));
    }
  }
}

TEST(QuantLinear, EqualsTheScalarReferenceBitForBitAtEveryLevelAndRowCount) {
  for (QuantType t : kWeightTypes) {
    // 17 and more rows: the repacked paths where the level has them (8 or 16
    // outputs a vector, quant_prefill8.cpp / quant_prefill.cpp; AMX tiles of
    // 16 rows at the amx level, quant_prefill_amx*.cpp); 520 crosses their
    // 512-row blocks, 17 and 130 end in tails. 5 and 9 rows: the 4 x 2
    // decode tiles with a 1 x 8 tail, or the 8-output repacked path where
    // it starts that low (from 4 rows at AVX2). 1 to 15 rows at the VNNI
    // levels: quant_decode.cpp's passes of 4 rows, then one of 1 (5, 9), 2
    // (2, 6) or 3 (3, 15).
    expect_reference_bits(t, 33, 256, false, {1, 2, 3, 5, 6, 9, 15, 17, 64, 130, 520});
    expect_reference_bits(t, 768, 4096, false, {1, 3, 5, 9, 17, 64, 130});
  }
}

TEST(QuantLinear, EqualsTheReferenceOnArbitraryBlockBytes) {
  for (QuantType t : kWeightTypes) expect_reference_bits(t, 33, 512, true, {1, 3, 17, 64, 130});
}

// Activations whose quantization sits on the rules' edges, at every level
// (the vector quantizers of quant_activations.cpp against quantize_row):
// values that scale to exact halves (round_to_int8_as_x86 and nearest_int
// round them differently), all-zero and -0 blocks, blocks scaled to 1e-35
// (left to the reference), a largest |x| that occurs twice with both signs.
TEST(QuantLinear, EdgeActivationsQuantizeAsTheReference) {
  for (QuantType t : kWeightTypes) {
    constexpr int64_t N = 40, OC = 24, IC = 512;
    Problem p = make_problem(t, N, OC, IC, false, 91 + static_cast<uint32_t>(t));
    for (int64_t m = 0; m < N; ++m)
      for (int64_t k = 0; k < IC; ++k) {
        float& v = p.x[static_cast<size_t>(m * IC + k)];
        switch (m % 5) {
          case 0: v = k % 32 == 0 ? 127.f : static_cast<float>(k % 253 - 126) + 0.5f; break;  // halves, d = 1
          case 1: v = k < 256 ? 0.f : v; break;                                                // a zero block
          case 2: v = k % 2 ? -0.f : 0.f; break;                                               // -0 and +0
          case 3: v *= 1e-35f; break;                                                          // tiny scales
          default: v = k % 64 == 0 ? 3.f : (k % 64 == 1 ? -3.f : v * 0.5f);                    // tied max |x|
        }
      }
    const std::vector<float> want = reference(p);
    for (int64_t n : {int64_t{1}, int64_t{5}, N}) {
      const std::string what = std::string(quant_name(t)) + " " + std::to_string(n) + " edge rows";
      expect_same_bits(want, run(p, n, false, -1), what + " (ops.h)");
      for (CpuIsa level : supported_levels())
        expect_same_bits(want, run(p, n, false, static_cast<int>(level)), what + " at " + cpu_isa_name(level));
    }
  }
}

// |y - x @ dequantize(W)^T| within the activations' quantization (ops.h: at
// most 0.57 d per value, d = max|x| / 127 of its block) times |W|, plus f32
// rounding; and the error is really that of 8-bit activations (not exact).
TEST(QuantLinear, IsWithinTheActivationQuantizationErrorOfTheDequantizedProduct) {
  for (QuantType t : kWeightTypes) {
    Problem p = make_problem(t, 5, 40, 512, false, 11);
    const std::vector<float> y = run(p, p.N, true, -1);
    const size_t wrow = quant_row_bytes(t, p.IC);
    const int64_t block = quant_block_size(quant_dot_type(t));
    double worst = 0;
    for (int64_t n = 0; n < p.OC; ++n) {
      std::vector<float> w(static_cast<size_t>(p.IC));
      dequantize_row(t, p.w.data() + wrow * n, w.data(), p.IC);
      for (int64_t m = 0; m < p.N; ++m) {
        const float* x = p.x.data() + m * p.IC;
        double exact = p.bias[static_cast<size_t>(n)], bound = 0, magnitude = 0;
        for (int64_t b = 0; b < p.IC; b += block) {
          double amax = 0;
          for (int64_t k = b; k < b + block; ++k) amax = std::max(amax, std::fabs(double{x[k]}));
          for (int64_t k = b; k < b + block; ++k) {
            exact += double{x[k]} * w[static_cast<size_t>(k)];
            bound += 0.57 * amax / 127 * std::fabs(w[static_cast<size_t>(k)]);
            magnitude += std::fabs(double{x[k]} * w[static_cast<size_t>(k)]);
          }
        }
        const double err = std::fabs(y[static_cast<size_t>(m * p.OC + n)] - exact);
        EXPECT_LE(err, bound + 1e-5 * (magnitude + std::fabs(p.bias[static_cast<size_t>(n)])))
            << quant_name(t) << " y[" << m << "][" << n << "]";
        worst = std::max(worst, err / bound);
      }
    }
    EXPECT_GT(worst, 0.002) << quant_name(t) << ": activations quantized?";
  }
}

TEST(QuantLinear, LeadingDimsAreFlattened) {
  Problem p = make_problem(QuantType::q4_K, 6, 9, 256, false, 3);
  const std::vector<float> flat = run(p, 6, true, -1);
  std::vector<float> y(flat.size());
  linear_forward_quantized(Tensor(y.data(), DType::f32, {2, 3, 9}), Tensor(p.x.data(), DType::f32, {2, 3, 256}),
                           p.wt(), QuantType::q4_K, p.bt());
  expect_same_bits(flat, y, "(2, 3, 256)");
}

TEST(QuantLinear, BadOperandsAreErrorsNamingTheOpAndTheOperand) {
  Problem p = make_problem(QuantType::q4_0, 2, 4, 64, false, 5);
  std::vector<float> y(8), big(2 * 100);
  const Tensor yt(y.data(), DType::f32, {2, 4});
  const char* op = "linear_forward_quantized";
  expect_error([&] { linear_forward_quantized(yt, Tensor(big.data(), DType::f32, {2, 100}), p.wt(), QuantType::q4_0, {}); },
               {op, "x has 100 features, not a multiple of q4_0's block size 32"});
  expect_error([&] { linear_forward_quantized(yt, p.xt(2), p.wt(), QuantType::q4_K, {}); },
               {op, "x has 64 features, not a multiple of q4_K's block size 256"});
  expect_error([&] { linear_forward_quantized(yt, p.xt(2), p.wt(), QuantType::q8_0, {}); },
               {op, "w's rows hold 36 bytes, but 64 features of q8_0 take 68 (2 blocks of 34)"});
  expect_error([&] { linear_forward_quantized(yt, p.xt(2), p.wt(), QuantType::q8_K, {}); },
               {op, "q8_K is an activation type"});
  expect_error([&] { linear_forward_quantized(yt, p.xt(2), Tensor(big.data(), DType::f32, {4, 9}), QuantType::q4_0, {}); },
               {op, "w has dtype f32, expected u8"});
  expect_error([&] { linear_forward_quantized(yt, Tensor(p.x.data(), DType::bf16, {2, 64}), p.wt(), QuantType::q4_0, {}); },
               {op, "x has dtype bf16, expected f32"});
  expect_error([&] { linear_forward_quantized(Tensor(y.data(), DType::f32, {2, 3}), p.xt(2), p.wt(), QuantType::q4_0, {}); },
               {op, "y must have shape (2, 4)"});
  expect_error([&] { linear_forward_quantized(yt, p.xt(2), p.wt(), QuantType::q4_0, Tensor(big.data(), DType::f32, {5})); },
               {op, "bias must have shape (4,)"});
  expect_error([&] { linear_forward_quantized(yt, p.xt(2), p.wt(), QuantType::q4_0, Tensor(y.data(), DType::f32, {4})); },
               {op, "y must not overlap bias"});
  p.x[64 + 5] = std::numeric_limits<float>::quiet_NaN();
  expect_error([&] { linear_forward_quantized(yt, p.xt(2), p.wt(), QuantType::q4_0, {}); },
               {op, "row 1 of x", "value 5 is nan"});
}

}  // namespace
}  // namespace loom::kernels
