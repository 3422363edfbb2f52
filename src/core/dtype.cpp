#include "core/dtype.h"

#include "core/error.h"

namespace loom {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::f16: return 2;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::u8: return 1;
  }
  LOOM_CHECK(false, "unknown dtype ", static_cast<int>(t));
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::u8: return "u8";
  }
  LOOM_CHECK(false, "unknown dtype ", static_cast<int>(t));
}

DType dtype_from_name(std::string_view name) {
  for (DType t : {DType::f32, DType::bf16, DType::f16, DType::i32, DType::i64, DType::u8})
    if (dtype_name(t) == name) return t;
  fail("unknown dtype '", name, "': allowed are f32, bf16, f16, i32, i64, u8");
}

DType precision_dtype(std::string_view name, std::string_view what) {
  constexpr std::array<DType, kPrecisionNames.size()> kCompute = {DType::f32, DType::bf16, DType::f16};
  for (size_t i = 0; i < kPrecisionNames.size(); ++i)
    if (kPrecisionNames[i] == name) return kCompute[i];
  std::string allowed;
  for (std::string_view n : kPrecisionNames) allowed += concat(allowed.empty() ? "" : ", ", n);
  fail(what, " = '", name, "' is invalid: allowed values are ", allowed);
}

bool dtype_is_float(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

f16 to_f16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return f16{static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu))};
  if (a >= 0x477ff000u) return f16{static_cast<uint16_t>(sign | 0x7c00u)};  // rounds to >= 65520: Inf
  if (a < 0x38800000u) {
    // Result is subnormal (or zero) in f16: |f| < 2^-14. Shift the full
    // significand into place and round to nearest even on the dropped bits.
    if (a < 0x33000000u) return f16{sign};  // < 2^-25 rounds to zero (2^-25 itself ties to even 0)
    const uint32_t exp = a >> 23;
    const uint32_t mant = (a & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exp;  // 14..24
    uint32_t half = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return f16{static_cast<uint16_t>(sign | half)};
  }
  // Normal: rebias exponent (127 -> 15), round 13 dropped bits to nearest even;
  // a carry out of the mantissa correctly bumps the exponent.
  uint32_t v = a - 0x38000000u;
  v += 0xfffu + ((v >> 13) & 1u);
  return f16{static_cast<uint16_t>(sign | (v >> 13))};
}

float from_f16(f16 h) {
  const uint32_t sign = static_cast<uint32_t>(h.bits & 0x8000u) << 16;
  const uint32_t exp = (h.bits >> 10) & 0x1fu;
  uint32_t mant = h.bits & 0x3ffu;
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    if (mant == 0) return std::bit_cast<float>(sign);
    int e = -1;  // normalise the subnormal
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    return std::bit_cast<float>(sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(sign | (exp + 112) << 23 | mant << 13);
}

}  // namespace loom
