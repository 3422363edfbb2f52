// GGUF type tables and metadata values: a value is the bytes that encode it
// in a file, so the accessors decode bytes the reader (or a factory here)
// has already checked.
#include <array>
#include <bit>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "core/error.h"
#include "io/gguf.h"

namespace loom::io {
namespace {

static_assert(std::endian::native == std::endian::little, "GGUF values are stored as the host's bytes");

// ggml's type numbers 0..39, for messages; "" where no type has the number.
constexpr std::array<std::string_view, 40> kGgmlNames{
    "f32",     "f16",      "q4_0",     "q4_1",     "q4_2",       "q4_3",       "q5_0",      "q5_1",
    "q8_0",    "q8_1",     "q2_K",     "q3_K",     "q4_K",       "q5_K",       "q6_K",      "q8_K",
    "iq2_xxs", "iq2_xs",   "iq3_xxs",  "iq1_s",    "iq4_nl",     "iq3_s",      "iq2_s",     "iq4_xs",
    "i8",      "i16",      "i32",      "i64",      "f64",        "iq1_m",      "bf16",      "q4_0_4_4",
    "q4_0_4_8", "q4_0_8_8", "tq1_0",   "tq2_0",    "iq4_nl_4_4", "iq4_nl_4_8", "iq4_nl_8_8", "mxfp4"};

struct SupportedType {
  GgmlType type;
  GgmlTypeTraits traits;
};
// Block sizes and bytes: ggml-common.h (QK4_0 = QK8_0 = 32, QK_K = 256).
constexpr std::array<SupportedType, 14> kSupported{{
    {GgmlType::f32, {"f32", 1, 4}},
    {GgmlType::f16, {"f16", 1, 2}},
    {GgmlType::bf16, {"bf16", 1, 2}},
    {GgmlType::q4_0, {"q4_0", 32, 2 + 16}},
    {GgmlType::q4_1, {"q4_1", 32, 2 + 2 + 16}},
    {GgmlType::q5_0, {"q5_0", 32, 2 + 4 + 16}},
    {GgmlType::q5_1, {"q5_1", 32, 2 + 2 + 4 + 16}},
    {GgmlType::q8_0, {"q8_0", 32, 2 + 32}},
    {GgmlType::q2_K, {"q2_K", 256, 16 + 64 + 2 + 2}},
    {GgmlType::q3_K, {"q3_K", 256, 32 + 64 + 12 + 2}},
    {GgmlType::q4_K, {"q4_K", 256, 2 + 2 + 12 + 128}},
    {GgmlType::q5_K, {"q5_K", 256, 2 + 2 + 12 + 32 + 128}},
    {GgmlType::q6_K, {"q6_K", 256, 128 + 64 + 16 + 2}},
    {GgmlType::q8_K, {"q8_K", 256, 4 + 256 + 2 * 16}},
}};

const SupportedType* find_supported(uint32_t type) {
  for (const SupportedType& s : kSupported)
    if (static_cast<uint32_t>(s.type) == type) return &s;
  return nullptr;
}

constexpr std::array<std::string_view, 13> kValueTypeNames{"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                                           "bool", "string", "array", "u64", "i64", "f64"};

template <typename T>
constexpr GgufValueType value_type_of() {
  if constexpr (std::is_same_v<T, uint8_t>) return GgufValueType::u8;
  if constexpr (std::is_same_v<T, int8_t>) return GgufValueType::i8;
  if constexpr (std::is_same_v<T, uint16_t>) return GgufValueType::u16;
  if constexpr (std::is_same_v<T, int16_t>) return GgufValueType::i16;
  if constexpr (std::is_same_v<T, uint32_t>) return GgufValueType::u32;
  if constexpr (std::is_same_v<T, int32_t>) return GgufValueType::i32;
  if constexpr (std::is_same_v<T, uint64_t>) return GgufValueType::u64;
  if constexpr (std::is_same_v<T, int64_t>) return GgufValueType::i64;
  if constexpr (std::is_same_v<T, float>) return GgufValueType::f32;
  if constexpr (std::is_same_v<T, double>) return GgufValueType::f64;
}

template <typename T>
void append(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}
template <typename T>
T load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <typename T>
GgufValue scalar(T v) {
  std::string bytes;
  append(bytes, v);
  return GgufValue::from_encoding(value_type_of<T>(), std::move(bytes));
}

std::string array_head(GgufValueType element, uint64_t count) {
  std::string bytes;
  append(bytes, static_cast<uint32_t>(element));
  append(bytes, count);
  return bytes;
}

bool is_integer(GgufValueType t) {
  switch (t) {
    case GgufValueType::u8: case GgufValueType::i8: case GgufValueType::u16: case GgufValueType::i16:
    case GgufValueType::u32: case GgufValueType::i32: case GgufValueType::u64: case GgufValueType::i64:
      return true;
    default:
      return false;
  }
}

// An integer of any GGUF width: signed ones as `s`, unsigned ones as `u`.
struct Integer {
  bool is_signed;
  int64_t s;
  uint64_t u;
};
Integer load_integer(GgufValueType t, const char* p) {
  switch (t) {
    case GgufValueType::u8: return {false, 0, load<uint8_t>(p)};
    case GgufValueType::i8: return {true, load<int8_t>(p), 0};
    case GgufValueType::u16: return {false, 0, load<uint16_t>(p)};
    case GgufValueType::i16: return {true, load<int16_t>(p), 0};
    case GgufValueType::u32: return {false, 0, load<uint32_t>(p)};
    case GgufValueType::i32: return {true, load<int32_t>(p), 0};
    case GgufValueType::u64: return {false, 0, load<uint64_t>(p)};
    case GgufValueType::i64: return {true, load<int64_t>(p), 0};
    default: LOOM_CHECK(false, "not an integer type ", static_cast<uint32_t>(t));
  }
}

size_t scalar_bytes(GgufValueType t) {
  switch (t) {
    case GgufValueType::u8: case GgufValueType::i8: case GgufValueType::boolean: return 1;
    case GgufValueType::u16: case GgufValueType::i16: return 2;
    case GgufValueType::u32: case GgufValueType::i32: case GgufValueType::f32: return 4;
    case GgufValueType::u64: case GgufValueType::i64: case GgufValueType::f64: return 8;
    default: return 0;
  }
}

// The encoded size of a checked value of type t at p.
size_t encoded_bytes(GgufValueType t, const char* p) {
  if (t == GgufValueType::string) return 8 + load<uint64_t>(p);
  if (t != GgufValueType::array) return scalar_bytes(t);
  const auto element = static_cast<GgufValueType>(load<uint32_t>(p));
  const uint64_t count = load<uint64_t>(p + 4);
  if (element != GgufValueType::string && element != GgufValueType::array) return 12 + count * scalar_bytes(element);
  size_t at = 12;
  for (uint64_t i = 0; i < count; ++i) at += encoded_bytes(element, p + at);
  return at;
}

}  // namespace

bool ggml_type_supported(uint32_t type) { return find_supported(type) != nullptr; }

std::string ggml_supported_type_names() {
  std::string out;
  for (const SupportedType& s : kSupported) out += (out.empty() ? "" : ", ") + std::string(s.traits.name);
  return out;
}

std::string ggml_type_describe(uint32_t type) {
  if (const SupportedType* s = find_supported(type)) return std::string(s->traits.name);
  if (type < kGgmlNames.size()) return concat("type ", type, " (", kGgmlNames[type], ")");
  return concat("type ", type);
}

const GgmlTypeTraits& ggml_type_traits(GgmlType type) {
  const SupportedType* s = find_supported(static_cast<uint32_t>(type));
  if (s == nullptr)
    fail(ggml_type_describe(static_cast<uint32_t>(type)), " is not supported (loom reads ",
         ggml_supported_type_names(), ")");
  return s->traits;
}

bool ggml_type_is_quantized(GgmlType type) {
  return type != GgmlType::f32 && type != GgmlType::f16 && type != GgmlType::bf16;
}

std::string_view gguf_file_type_name(uint32_t file_type) {
  static constexpr std::pair<uint32_t, std::string_view> kNames[] = {
      {0, "F32"},     {1, "F16"},     {2, "Q4_0"},    {3, "Q4_1"},    {7, "Q8_0"},    {8, "Q5_0"},
      {9, "Q5_1"},    {10, "Q2_K"},   {11, "Q3_K_S"}, {12, "Q3_K_M"}, {13, "Q3_K_L"}, {14, "Q4_K_S"},
      {15, "Q4_K_M"}, {16, "Q5_K_S"}, {17, "Q5_K_M"}, {18, "Q6_K"},   {32, "BF16"}};
  for (const auto& [id, name] : kNames)
    if (id == file_type) return name;
  return "unknown";
}

std::string gguf_value_type_name(uint32_t type) {
  if (type < kValueTypeNames.size()) return std::string(kValueTypeNames[type]);
  return concat("type ", type);
}

GgufValue GgufValue::u8(uint8_t v) { return scalar(v); }
GgufValue GgufValue::i8(int8_t v) { return scalar(v); }
GgufValue GgufValue::u16(uint16_t v) { return scalar(v); }
GgufValue GgufValue::i16(int16_t v) { return scalar(v); }
GgufValue GgufValue::u32(uint32_t v) { return scalar(v); }
GgufValue GgufValue::i32(int32_t v) { return scalar(v); }
GgufValue GgufValue::u64(uint64_t v) { return scalar(v); }
GgufValue GgufValue::i64(int64_t v) { return scalar(v); }
GgufValue GgufValue::f32(float v) { return scalar(v); }
GgufValue GgufValue::f64(double v) { return scalar(v); }
GgufValue GgufValue::boolean(bool v) { return from_encoding(GgufValueType::boolean, std::string(1, v ? 1 : 0)); }

GgufValue GgufValue::string(std::string_view v) {
  std::string bytes;
  append(bytes, static_cast<uint64_t>(v.size()));
  bytes.append(v);
  return from_encoding(GgufValueType::string, std::move(bytes));
}

template <typename T>
GgufValue GgufValue::array(std::span<const T> values) {
  std::string bytes = array_head(value_type_of<T>(), values.size());
  bytes.append(reinterpret_cast<const char*>(values.data()), values.size_bytes());
  return from_encoding(GgufValueType::array, std::move(bytes));
}
template GgufValue GgufValue::array(std::span<const uint8_t>);
template GgufValue GgufValue::array(std::span<const int8_t>);
template GgufValue GgufValue::array(std::span<const uint16_t>);
template GgufValue GgufValue::array(std::span<const int16_t>);
template GgufValue GgufValue::array(std::span<const uint32_t>);
template GgufValue GgufValue::array(std::span<const int32_t>);
template GgufValue GgufValue::array(std::span<const uint64_t>);
template GgufValue GgufValue::array(std::span<const int64_t>);
template GgufValue GgufValue::array(std::span<const float>);
template GgufValue GgufValue::array(std::span<const double>);

GgufValue GgufValue::bool_array(const std::vector<bool>& values) {
  std::string bytes = array_head(GgufValueType::boolean, values.size());
  for (bool b : values) bytes.push_back(b ? 1 : 0);
  return from_encoding(GgufValueType::array, std::move(bytes));
}

GgufValue GgufValue::string_array(std::span<const std::string> values) {
  std::string bytes = array_head(GgufValueType::string, values.size());
  for (const std::string& s : values) {
    append(bytes, static_cast<uint64_t>(s.size()));
    bytes.append(s);
  }
  return from_encoding(GgufValueType::array, std::move(bytes));
}

GgufValue GgufValue::array_of_arrays(std::span<const GgufValue> items) {
  std::string bytes = array_head(GgufValueType::array, items.size());
  for (const GgufValue& item : items) {
    LOOM_REQUIRE(item.is_array(), "an array of arrays holds arrays only, not a ", item.type_description());
    bytes.append(item.encoding());
  }
  return from_encoding(GgufValueType::array, std::move(bytes));
}

GgufValue GgufValue::from_encoding(GgufValueType type, std::string bytes) { return GgufValue(type, std::move(bytes)); }

GgufValueType GgufValue::element_type() const {
  LOOM_CHECK(is_array(), "element_type of a ", type_description());
  return static_cast<GgufValueType>(load<uint32_t>(bytes_.data()));
}

uint64_t GgufValue::array_size() const {
  LOOM_CHECK(is_array(), "array_size of a ", type_description());
  return load<uint64_t>(bytes_.data() + 4);
}

std::string GgufValue::type_description() const {
  if (!is_array()) return gguf_value_type_name(type_);
  return "array of " + gguf_value_type_name(element_type());
}

void GgufValue::type_error(std::string_view context, std::string_view wanted) const {
  fail(context, " is ", type_description(), ", not ", wanted);
}

template <typename T>
T GgufValue::as_int(std::string_view context) const {
  if (!is_integer(type_)) type_error(context, "an integer");
  const Integer v = load_integer(type_, bytes_.data());
  const bool fits = v.is_signed ? std::in_range<T>(v.s) : std::in_range<T>(v.u);
  if (!fits) {
    fail(context, " = ", v.is_signed ? std::to_string(v.s) : std::to_string(v.u), " (", type_description(),
         ") is outside the range allowed here, [", +std::numeric_limits<T>::min(), ", ",
         +std::numeric_limits<T>::max(), "]");
  }
  return v.is_signed ? static_cast<T>(v.s) : static_cast<T>(v.u);
}
template uint8_t GgufValue::as_int(std::string_view) const;
template int8_t GgufValue::as_int(std::string_view) const;
template uint16_t GgufValue::as_int(std::string_view) const;
template int16_t GgufValue::as_int(std::string_view) const;
template uint32_t GgufValue::as_int(std::string_view) const;
template int32_t GgufValue::as_int(std::string_view) const;
template uint64_t GgufValue::as_int(std::string_view) const;
template int64_t GgufValue::as_int(std::string_view) const;

double GgufValue::as_float(std::string_view context) const {
  if (type_ == GgufValueType::f32) return load<float>(bytes_.data());
  if (type_ == GgufValueType::f64) return load<double>(bytes_.data());
  type_error(context, "a float (f32 or f64)");
}

bool GgufValue::as_bool(std::string_view context) const {
  if (type_ != GgufValueType::boolean) type_error(context, "a bool");
  return bytes_[0] != 0;
}

std::string_view GgufValue::as_string(std::string_view context) const {
  if (type_ != GgufValueType::string) type_error(context, "a string");
  return std::string_view(bytes_).substr(8);
}

std::vector<std::string_view> GgufValue::as_string_array(std::string_view context) const {
  if (!is_array() || element_type() != GgufValueType::string) type_error(context, "an array of string");
  std::vector<std::string_view> out;
  out.reserve(array_size());
  const char* p = array_data();
  for (uint64_t i = 0; i < array_size(); ++i) {
    const uint64_t n = load<uint64_t>(p);
    out.emplace_back(p + 8, n);
    p += 8 + n;
  }
  return out;
}

std::vector<int64_t> GgufValue::as_int_array(std::string_view context) const {
  if (!is_array() || !is_integer(element_type())) type_error(context, "an array of integers");
  const GgufValueType t = element_type();
  const size_t step = scalar_bytes(t);
  std::vector<int64_t> out(array_size());
  for (uint64_t i = 0; i < out.size(); ++i) {
    const Integer v = load_integer(t, array_data() + i * step);
    if (!v.is_signed && !std::in_range<int64_t>(v.u))
      fail(context, "[", i, "] = ", v.u, " (u64) is larger than 2^63-1");
    out[i] = v.is_signed ? v.s : static_cast<int64_t>(v.u);
  }
  return out;
}

std::vector<double> GgufValue::as_float_array(std::string_view context) const {
  const bool ok = is_array() && (element_type() == GgufValueType::f32 || element_type() == GgufValueType::f64);
  if (!ok) type_error(context, "an array of f32 or f64");
  std::vector<double> out(array_size());
  const bool f32 = element_type() == GgufValueType::f32;
  for (uint64_t i = 0; i < out.size(); ++i)
    out[i] = f32 ? load<float>(array_data() + 4 * i) : load<double>(array_data() + 8 * i);
  return out;
}

std::vector<GgufValue> GgufValue::as_array_of_arrays(std::string_view context) const {
  if (!is_array() || element_type() != GgufValueType::array) type_error(context, "an array of arrays");
  std::vector<GgufValue> out;
  const char* p = array_data();
  for (uint64_t i = 0; i < array_size(); ++i) {
    const size_t n = encoded_bytes(GgufValueType::array, p);
    out.push_back(from_encoding(GgufValueType::array, std::string(p, n)));
    p += n;
  }
  return out;
}

void gguf_check_known_key(std::string_view key, const GgufValue& value, std::string_view context) {
  struct Known {
    std::string_view key;
    GgufValueType type, element;
  };
  constexpr GgufValueType kScalar = GgufValueType::u8;  // element: unused
  static constexpr std::array<Known, 8> kKnown{{
      {"general.alignment", GgufValueType::u32, kScalar},
      {"general.architecture", GgufValueType::string, kScalar},
      {"tokenizer.ggml.model", GgufValueType::string, kScalar},
      {"tokenizer.chat_template", GgufValueType::string, kScalar},
      {"tokenizer.ggml.tokens", GgufValueType::array, GgufValueType::string},
      {"tokenizer.ggml.merges", GgufValueType::array, GgufValueType::string},
      {"tokenizer.ggml.scores", GgufValueType::array, GgufValueType::f32},
      {"tokenizer.ggml.token_type", GgufValueType::array, GgufValueType::i32},
  }};
  for (const Known& k : kKnown) {
    if (k.key != key) continue;
    const bool ok = value.type() == k.type && (!value.is_array() || value.element_type() == k.element);
    if (!ok) {
      const std::string wanted = k.type == GgufValueType::array ? "array of " + gguf_value_type_name(k.element)
                                                                : gguf_value_type_name(k.type);
      fail(context, " is ", value.type_description(), ", but this key must be ", wanted);
    }
  }
}

}  // namespace loom::io
