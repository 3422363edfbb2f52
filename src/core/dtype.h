// Element types and exact conversions between them.
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace loom {

enum class DType : uint8_t { f32, bf16, f16, i32, i64, u8 };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);
// Parses "f32", "bf16", ...; throws loom::Error listing the allowed names.
DType dtype_from_name(std::string_view name);
// A run's precision names (train.dtype, loom bench train --dtype): fp32, or
// bf16 / fp16 mixed precision (16-bit compute, f32 master weights).
inline constexpr std::array<std::string_view, 3> kPrecisionNames = {"fp32", "bf16", "fp16"};
// The compute dtype of a precision name: f32, bf16 or f16. Another name is a
// loom::Error "<what> = '<name>' is invalid: allowed values are fp32, bf16,
// fp16".
DType precision_dtype(std::string_view name, std::string_view what = "dtype");
bool dtype_is_float(DType t);

// 16-bit float storage types: the bits only, arithmetic goes through float.
struct bf16 {
  uint16_t bits;
};
struct f16 {
  uint16_t bits;
};

// f32 -> bf16, round to nearest even; NaN stays NaN (quiet), Inf stays Inf.
inline bf16 to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<uint16_t>((u >> 16) | 0x0040u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<uint16_t>(u >> 16)};
}
inline float from_bf16(bf16 h) { return std::bit_cast<float>(static_cast<uint32_t>(h.bits) << 16); }

// f32 -> f16 (IEEE binary16), round to nearest even, with subnormals;
// overflow gives Inf, NaN stays NaN (quiet).
f16 to_f16(float f);
float from_f16(f16 h);

template <typename T>
struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::f32; };
template <> struct dtype_of<bf16> { static constexpr DType value = DType::bf16; };
template <> struct dtype_of<f16> { static constexpr DType value = DType::f16; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::i32; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::i64; };
template <> struct dtype_of<uint8_t> { static constexpr DType value = DType::u8; };

// Loads/stores of float-like storage through f32, for templated kernels.
inline float load_f32(float x) { return x; }
inline float load_f32(bf16 x) { return from_bf16(x); }
inline float load_f32(f16 x) { return from_f16(x); }
template <typename T> T store_as(float x);
template <> inline float store_as<float>(float x) { return x; }
template <> inline bf16 store_as<bf16>(float x) { return to_bf16(x); }
template <> inline f16 store_as<f16>(float x) { return to_f16(x); }

}  // namespace loom
