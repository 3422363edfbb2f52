// kernels/quant.h against llama.cpp itself: quantize_row's bytes equal those
// of ggml's reference quantizers (quantize_row_*_ref) and of
// ggml_quantize_chunk without an importance matrix (llama-quantize's path),
// dequantize_row's floats equal ggml's dequantize_row_* bit for bit, and
// to_f16 equals GGML_FP32_TO_FP16 — on random blocks of many shapes and on
// edge blocks. ggml comes from libggml-base.so, named by LOOM_GGML_BASE_LIB
// (npm's @node-llama-cpp/linux-x64 ships it in bins/linux-x64/); without it
// these tests skip.
#include <dlfcn.h>
#include <unistd.h>
#include <gtest/gtest.h>

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "kernels/quant.h"

namespace loom::kernels {
namespace {

constexpr QuantType kTypes[] = {QuantType::q8_0, QuantType::q4_0, QuantType::q4_K, QuantType::q6_K,
                                QuantType::q8_K, QuantType::q4_1, QuantType::q5_0, QuantType::q5_1,
                                QuantType::q2_K, QuantType::q3_K, QuantType::q5_K, QuantType::q8_1};
constexpr const char* kGgmlNames[] = {"q8_0", "q4_0", "q4_K", "q6_K", "q8_K", "q4_1",
                                      "q5_0", "q5_1", "q2_K", "q3_K", "q5_K", "q8_1"};
constexpr int kGgmlTypeId[] = {8, 2, 12, 14, 15, 3, 6, 7, 10, 11, 13, 9};  // enum ggml_type
constexpr int kNumTypes = 12;

// ggml's C entry points, loaded once from LOOM_GGML_BASE_LIB.
struct Ggml {
  using Quantize = void (*)(const float*, void*, int64_t);
  using Dequantize = void (*)(const void*, float*, int64_t);
  using Chunk = size_t (*)(int type, const float* src, void* dst, int64_t start, int64_t nrows, int64_t n_per_row,
                           const float* imatrix);
  using ToF16 = uint16_t (*)(float);
  Quantize quantize[kNumTypes];
  Dequantize dequantize[kNumTypes];  // none for q8_1 (ggml has no dequantize_row_q8_1)
  Chunk chunk;
  ToF16 to_f16;
};

const Ggml* ggml() {
  static const Ggml* loaded = [] () -> const Ggml* {
    // LOOM_GGML_BASE_LIB, else the one scripts/fetch-data.sh installs
    // (node-llama-cpp's linux-x64 build, tests/interop/package-lock.json).
    const char* env = std::getenv("LOOM_GGML_BASE_LIB");
    const std::string fallback =
        std::string(LOOM_INTEROP_DIR) + "/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64/libggml-base.so";
    const char* path = env && *env ? env : fallback.c_str();
    if (!(env && *env) && access(path, R_OK) != 0) return nullptr;
    void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      ADD_FAILURE() << "LOOM_GGML_BASE_LIB=" << path << ": " << dlerror();
      return nullptr;
    }
    auto* g = new Ggml{};
    for (int t = 0; t < kNumTypes; ++t) {
      g->quantize[t] = reinterpret_cast<Ggml::Quantize>(dlsym(h, (std::string("quantize_row_") + kGgmlNames[t] + "_ref").c_str()));
      g->dequantize[t] = reinterpret_cast<Ggml::Dequantize>(dlsym(h, (std::string("dequantize_row_") + kGgmlNames[t]).c_str()));
    }
    g->chunk = reinterpret_cast<Ggml::Chunk>(dlsym(h, "ggml_quantize_chunk"));
    g->to_f16 = reinterpret_cast<Ggml::ToF16>(dlsym(h, "ggml_fp32_to_fp16"));
    return g;
  }();
  return loaded;
}

#define REQUIRE_GGML()                                                                     \
  if (!ggml()) GTEST_SKIP() << "no llama.cpp libggml-base.so: run bash scripts/fetch-data.sh (data/interop), or set LOOM_GGML_BASE_LIB"; \
  static_assert(true)

constexpr int kReps = 200;  // ~3,000 super-blocks: enough to catch a reordered float sum

// Super-blocks of 256 values, each family a shape the quantizers branch on.
std::vector<float> test_blocks() {
  std::mt19937 rng(1234);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  auto pow10 = [&](float lo, float hi) { return std::pow(10.f, std::uniform_real_distribution<float>(lo, hi)(rng)); };
  std::vector<float> x;
  auto add = [&](auto value_of) {
    for (int i = 0; i < 256; ++i) x.push_back(value_of(i));
  };
  for (int rep = 0; rep < kReps; ++rep) {
    const float s = pow10(-3, 2);
    add([&](int) { return normal(rng) * s; });                                       // Gaussian
    add([&](int) { return uni(rng) * s; });                                          // uniform
    add([&](int) { return normal(rng) / (0.05f + std::fabs(uni(rng))) * s; });       // heavy tails
    add([&](int) { return std::fabs(normal(rng)) * s + s * rep / 10; });              // all positive
    add([&](int) { return -std::fabs(normal(rng)) * s - s * rep / 20; });             // all negative
    add([&](int) { return uni(rng) > 0.8f ? normal(rng) * s : 0.f; });                // sparse
    add([&](int i) { return i == rep * 6 % 256 ? 100 * s : normal(rng) * s; });     // one outlier
    const float c = normal(rng) * s;
    add([&](int) { return c; });                                                     // constant
    add([&](int i) { return (i - 128 + rep) * s / 64; });                            // ramp
    float sub = 1;
    add([&](int i) { return (i % 16 == 0 ? sub = pow10(-4, 3) : sub) * normal(rng); });  // mixed ranges
    add([&](int) { return normal(rng) * pow10(-12, -4); });                          // f16-subnormal scales
    add([&](int) { return std::round(normal(rng) * 8) * s; });                        // on a grid
    add([&](int i) { return (i * 7 + rep) % 3 == 0 ? s : -s; });                     // two values
    add([&](int i) { return i % 32 == rep % 32 ? 127.f : std::round(uni(rng) * 100) + 0.5f; });  // ties at d = 1
    add([&](int i) { return i / 16 == rep % 16 ? normal(rng) * 1e-17f : normal(rng) * s; });  // a sub-block below 1e-15
  }
  add([](int) { return 0.f; });
  add([](int i) { return i == 5 ? 1e-16f : 0.f; });                     // below GROUP_MAX_EPS
  add([](int i) { return i == 9 ? -3e-15f : 0.f; });
  add([&](int) { return normal(rng) * 1e-39f; });                        // f32 subnormals
  add([&](int) { return normal(rng) * 1e-44f; });
  add([&](int) { return normal(rng) * 1e7f; });                          // scales past f16's range
  add([&](int i) { return i % 2 ? FLT_MAX : -FLT_MAX / 3; });
  add([&](int) { return uni(rng) * 3e38f; });
  add([&](int i) { return i < 128 ? 65504.f * 127 : -65504.f * 8; });
  return x;
}

std::string first_difference(const uint8_t* a, const uint8_t* b, size_t bytes, size_t block_bytes) {
  for (size_t i = 0; i < bytes; ++i)
    if (a[i] != b[i]) return "block " + std::to_string(i / block_bytes) + " byte " + std::to_string(i % block_bytes);
  return "";
}

TEST(QuantGgml, QuantizeRowWritesTheBytesOfGgmlsReferenceQuantizers) {
  REQUIRE_GGML();
  const std::vector<float> x = test_blocks();
  const auto n = static_cast<int64_t>(x.size());
  for (int t = 0; t < kNumTypes; ++t) {
    if (!quant_can_write(kTypes[t])) continue;  // q3_K: read only
    ASSERT_NE(ggml()->quantize[t], nullptr) << kGgmlNames[t];
    const size_t bytes = quant_row_bytes(kTypes[t], n);
    std::vector<uint8_t> ours(bytes, 0xab), theirs(bytes, 0);  // ggml leaves q8_K's zero blocks' bsums unwritten
    quantize_row(kTypes[t], x.data(), ours.data(), n);
    ggml()->quantize[t](x.data(), theirs.data(), n);
    EXPECT_EQ(first_difference(ours.data(), theirs.data(), bytes, quant_block_bytes(kTypes[t])), "") << kGgmlNames[t];
  }
}

// llama-quantize calls ggml_quantize_chunk; with no imatrix it must come to
// the same bytes (it calls the _ref functions for these types).
TEST(QuantGgml, LlamaQuantizesPathWithoutImatrixGivesTheSameBytes) {
  REQUIRE_GGML();
  const std::vector<float> x = test_blocks();
  const int64_t n_per_row = 1024, nrows = static_cast<int64_t>(x.size()) / n_per_row;
  for (int t = 0; t < kNumTypes; ++t) {
    if (quant_is_activation_type(kTypes[t]) || !quant_can_write(kTypes[t])) continue;
    const size_t bytes = quant_row_bytes(kTypes[t], n_per_row * nrows);
    std::vector<uint8_t> ours(bytes), theirs(bytes);
    quantize_row(kTypes[t], x.data(), ours.data(), n_per_row * nrows);
    EXPECT_EQ(ggml()->chunk(kGgmlTypeId[t], x.data(), theirs.data(), 0, nrows, n_per_row, nullptr), bytes);
    EXPECT_EQ(first_difference(ours.data(), theirs.data(), bytes, quant_block_bytes(kTypes[t])), "") << kGgmlNames[t];
  }
}

// Equal floats, or both NaN.
std::string first_float_difference(const std::vector<float>& a, const std::vector<float>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i]) && !(std::isnan(a[i]) && std::isnan(b[i])))
      return "value " + std::to_string(i) + ": " + std::to_string(a[i]) + " vs " + std::to_string(b[i]);
  return "";
}

// On quantized test blocks and on random bytes (any scale, any packing).
TEST(QuantGgml, DequantizeRowGivesTheFloatsOfGgmlsDequantizers) {
  REQUIRE_GGML();
  const std::vector<float> x = test_blocks();
  const auto n = static_cast<int64_t>(x.size());
  std::mt19937 rng(77);
  for (int t = 0; t < kNumTypes; ++t) {
    if (kTypes[t] == QuantType::q8_1) continue;
    ASSERT_NE(ggml()->dequantize[t], nullptr) << kGgmlNames[t];
    std::vector<uint8_t> q(quant_row_bytes(kTypes[t], n));
    for (int pass = 0; pass < 2; ++pass) {
      // q3_K's test blocks from ggml's quantizer (loom does not write it).
      if (pass == 0 && !quant_can_write(kTypes[t])) ggml()->quantize[t](x.data(), q.data(), n);
      else if (pass == 0) quantize_row(kTypes[t], x.data(), q.data(), n);
      else for (uint8_t& b : q) b = static_cast<uint8_t>(rng());
      std::vector<float> ours(x.size()), theirs(x.size());
      dequantize_row(kTypes[t], q.data(), ours.data(), n);
      ggml()->dequantize[t](q.data(), theirs.data(), n);
      EXPECT_EQ(first_float_difference(ours, theirs), "") << kGgmlNames[t] << (pass ? " random bytes" : "");
    }
  }
}

// core/dtype.h's to_f16 rounds as GGML_FP32_TO_FP16 does (nearest even,
// subnormals, overflow to Inf) around every f16 value; NaN aside (ggml
// writes 0x7e00, to_f16 keeps the payload).
TEST(QuantGgml, ToF16RoundsAsGgmlDoes) {
  REQUIRE_GGML();
  auto check = [](float f) {
    ASSERT_EQ(to_f16(f).bits, ggml()->to_f16(f)) << std::hexfloat << f;
  };
  for (uint32_t h = 0; h < 0x7c00u; ++h) {
    const float lo = from_f16(f16{static_cast<uint16_t>(h)});
    const float hi = h + 1 < 0x7c00u ? from_f16(f16{static_cast<uint16_t>(h + 1)}) : 65536.f;
    const float mid = lo + (hi - lo) / 2;
    for (float f : {lo, mid, std::nextafter(mid, 0.f), std::nextafter(mid, hi), std::nextafter(lo, 0.f)}) {
      check(f);
      check(-f);
    }
  }
  std::mt19937 rng(5);
  for (int i = 0; i < 1000000; ++i) {
    const float f = std::bit_cast<float>(static_cast<uint32_t>(rng()));
    if (!std::isnan(f)) check(f);
  }
}

}  // namespace
}  // namespace loom::kernels
