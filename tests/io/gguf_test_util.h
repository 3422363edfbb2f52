// Helpers of the GGUF tests: a byte builder that writes GGUF by hand from
// the spec (independently of GgufWriter), temporary files, and a check that
// opening some bytes fails with a given message.
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "io/gguf.h"

namespace loom::io::gguf_test {

using Bytes = std::vector<uint8_t>;

// GGUF value type numbers, spelled out from the spec (not from gguf.h).
enum : uint32_t { kU8 = 0, kI8, kU16, kI16, kU32, kI32, kF32, kBool, kString, kArray, kU64, kI64, kF64 };
// ggml tensor type numbers.
enum : uint32_t { kTF32 = 0, kTF16 = 1, kTQ4_0 = 2, kTQ8_0 = 8, kTQ4_K = 12, kTQ6_K = 14, kTBF16 = 30 };

class Builder {
 public:
  Builder& raw(std::string_view s) {
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  template <typename T>
  Builder& put(T v) {
    uint8_t tmp[sizeof(T)];
    std::memcpy(tmp, &v, sizeof(T));
    b.insert(b.end(), tmp, tmp + sizeof(T));
    return *this;
  }
  Builder& u8(uint8_t v) { return put(v); }
  Builder& u32(uint32_t v) { return put(v); }
  Builder& u64(uint64_t v) { return put(v); }
  Builder& str(std::string_view s) { return u64(s.size()).raw(s); }
  Builder& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    return raw("GGUF").u32(version).u64(n_tensors).u64(n_kv);
  }
  Builder& kv_u32(std::string_view key, uint32_t v) { return str(key).u32(kU32).u32(v); }
  Builder& kv_str(std::string_view key, std::string_view v) { return str(key).u32(kString).str(v); }
  // The key, type array, element type and count; the elements follow.
  Builder& kv_array(std::string_view key, uint32_t element, uint64_t count) {
    return str(key).u32(kArray).u32(element).u64(count);
  }
  Builder& tensor(std::string_view name, std::initializer_list<uint64_t> dims, uint32_t type, uint64_t offset) {
    str(name).u32(static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) u64(d);
    return u32(type).u64(offset);
  }
  Builder& pad(size_t alignment) {
    while (b.size() % alignment != 0) b.push_back(0);
    return *this;
  }
  Builder& data(size_t n, uint8_t first = 1) {
    for (size_t i = 0; i < n; ++i) b.push_back(static_cast<uint8_t>(first + i));
    return *this;
  }
  Bytes b;
};

inline std::string temp_path(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / concat("loom_test_gguf_", ::getpid());
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

inline void write_bytes(const std::string& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

inline Bytes read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), {});
}

inline GgufFile open_bytes(const Bytes& bytes, const std::string& name = "t.gguf") {
  const std::string path = temp_path(name);
  write_bytes(path, bytes);
  return GgufFile::open(path);
}

// Opening `bytes` must throw a loom::Error naming the file and containing
// every one of `parts`.
inline void expect_rejected(const Bytes& bytes, std::initializer_list<std::string_view> parts) {
  const std::string path = temp_path("bad.gguf");
  write_bytes(path, bytes);
  try {
    GgufFile::open(path);
    ADD_FAILURE() << "accepted a file that should fail with: " << *parts.begin();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << "message does not name the file: " << msg;
    for (std::string_view p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

// One f32 tensor "w" of `dims` with `data_bytes` bytes of data, after one
// KV general.architecture = "llama".
inline Bytes one_tensor_file(std::initializer_list<uint64_t> dims, uint32_t type, uint64_t offset,
                             size_t data_bytes) {
  Builder f;
  f.header(1, 1).kv_str("general.architecture", "llama").tensor("w", dims, type, offset).pad(32).data(data_bytes);
  return f.b;
}

}  // namespace loom::io::gguf_test
