#include "common/ref.h"

#include <cstdint>
#include <cstring>
#include <fstream>

#include "core/error.h"

namespace loom::test {

std::vector<float> RefTensor::floats() const {
  const int64_t n = shape.numel();
  std::vector<float> out(n);
  for (int64_t i = 0; i < n; ++i) {
    switch (dtype) {
      case DType::f32: std::memcpy(&out[i], bytes.data() + 4 * i, 4); break;
      case DType::bf16: out[i] = load_f32(reinterpret_cast<const bf16*>(bytes.data())[i]); break;
      case DType::f16: out[i] = load_f32(reinterpret_cast<const f16*>(bytes.data())[i]); break;
      case DType::i32: out[i] = static_cast<float>(reinterpret_cast<const int32_t*>(bytes.data())[i]); break;
      default: LOOM_CHECK(false, "floats() of dtype ", dtype_name(dtype));
    }
  }
  return out;
}

RefCase::RefCase(const std::string& file) : path_(std::string(LOOM_REF_DIR) + "/" + file) {
  std::ifstream in(path_, std::ios::binary);
  LOOM_REQUIRE(in, "reference file ", path_, " is missing: run its tests/ref script (ctest runs it as a fixture)");
  char magic[8];
  uint32_t count = 0;
  in.read(magic, 8);
  in.read(reinterpret_cast<char*>(&count), 4);
  LOOM_REQUIRE(in && std::memcmp(magic, "LOOMREF1", 8) == 0, path_, ": not a LOOMREF1 file");
  for (uint32_t i = 0; i < count; ++i) {
    uint32_t len = 0, dtype = 0, ndim = 0;
    in.read(reinterpret_cast<char*>(&len), 4);
    std::string name(len, '\0');
    in.read(name.data(), len);
    in.read(reinterpret_cast<char*>(&dtype), 4);
    in.read(reinterpret_cast<char*>(&ndim), 4);
    LOOM_REQUIRE(in && dtype <= 5 && ndim <= kMaxDims, path_, ": bad header for tensor ", i);
    int64_t dims[kMaxDims];
    in.read(reinterpret_cast<char*>(dims), 8 * ndim);
    RefTensor t;
    t.dtype = static_cast<DType>(dtype);
    t.shape = Shape::of(static_cast<int>(ndim), dims);
    t.bytes.resize(static_cast<size_t>(t.shape.numel()) * dtype_size(t.dtype));
    in.read(reinterpret_cast<char*>(t.bytes.data()), static_cast<std::streamsize>(t.bytes.size()));
    LOOM_REQUIRE(in, path_, ": truncated data for ", name);
    tensors_[name] = std::move(t);
  }
}

RefTensor& RefCase::operator[](const std::string& name) {
  auto it = tensors_.find(name);
  LOOM_REQUIRE(it != tensors_.end(), path_, ": no tensor named ", name);
  return it->second;
}

}  // namespace loom::test
