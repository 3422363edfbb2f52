// A canonical JSON description of a GGUF file, the form
// tests/interop/gguf_hf_parse.mjs prints from @huggingface/gguf's parse, so the
// two readers can be compared field by field.
#include <cmath>
#include <cstring>

#include <nlohmann/json.hpp>

#include "io/gguf.h"

namespace loom::io {
namespace {

using nlohmann::ordered_json;

template <typename T>
T load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

ordered_json float_json(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

// Decodes one checked value of type t at p into j; returns the bytes read.
size_t decode(GgufValueType t, const char* p, ordered_json& j, bool with_element_type);

size_t decode_array(const char* p, ordered_json& j, bool with_element_type) {
  const auto element = static_cast<GgufValueType>(load<uint32_t>(p));
  const uint64_t count = load<uint64_t>(p + 4);
  ordered_json values = ordered_json::array();
  size_t at = 12;
  for (uint64_t i = 0; i < count; ++i) {
    ordered_json item;
    at += decode(element, p + at, item, false);
    values.push_back(std::move(item));
  }
  if (with_element_type) {
    j = ordered_json::object();
    j["element_type"] = gguf_value_type_name(element);
    j["values"] = std::move(values);
  } else {
    j = std::move(values);
  }
  return at;
}

size_t decode(GgufValueType t, const char* p, ordered_json& j, bool with_element_type) {
  switch (t) {
    case GgufValueType::u8: j = std::to_string(load<uint8_t>(p)); return 1;
    case GgufValueType::i8: j = std::to_string(load<int8_t>(p)); return 1;
    case GgufValueType::u16: j = std::to_string(load<uint16_t>(p)); return 2;
    case GgufValueType::i16: j = std::to_string(load<int16_t>(p)); return 2;
    case GgufValueType::u32: j = std::to_string(load<uint32_t>(p)); return 4;
    case GgufValueType::i32: j = std::to_string(load<int32_t>(p)); return 4;
    case GgufValueType::u64: j = std::to_string(load<uint64_t>(p)); return 8;
    case GgufValueType::i64: j = std::to_string(load<int64_t>(p)); return 8;
    case GgufValueType::f32: j = float_json(load<float>(p)); return 4;
    case GgufValueType::f64: j = float_json(load<double>(p)); return 8;
    case GgufValueType::boolean: j = p[0] != 0; return 1;
    case GgufValueType::string: {
      const uint64_t n = load<uint64_t>(p);
      j = std::string(p + 8, n);
      return 8 + n;
    }
    case GgufValueType::array: return decode_array(p, j, with_element_type);
  }
  return 0;
}

}  // namespace

std::string gguf_describe_json(const GgufFile& file) {
  ordered_json root;
  root["version"] = file.version();
  root["tensor_data_offset"] = std::to_string(file.data_offset());
  ordered_json& metadata = root["metadata"] = ordered_json::array();
  for (const GgufKv& kv : file.kvs()) {
    ordered_json entry;
    entry["key"] = kv.key;
    entry["type"] = gguf_value_type_name(kv.value.type());
    decode(kv.value.type(), kv.value.encoding().data(), entry["value"], true);
    metadata.push_back(std::move(entry));
  }
  ordered_json& tensors = root["tensors"] = ordered_json::array();
  for (const GgufTensorInfo& t : file.tensors()) {
    ordered_json entry;
    entry["name"] = t.name;
    entry["type"] = static_cast<uint32_t>(t.type);
    entry["dims"] = ordered_json::array();
    for (int64_t ne : t.dims()) entry["dims"].push_back(std::to_string(ne));
    entry["offset"] = std::to_string(t.offset);
    tensors.push_back(std::move(entry));
  }
  return root.dump(1, ' ', false, ordered_json::error_handler_t::replace) + "\n";
}

}  // namespace loom::io
