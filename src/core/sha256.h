// SHA-256 (FIPS 180-4): the file digests a checkpoint's manifest lists
// (train/checkpoint_manifest.h) and the block hashes of the prefix cache
// (infer/block_hash.h).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace loom {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t bytes);
  std::array<uint8_t, 32> finish();  // once; the object is spent after

  // Whether whole blocks go through the CPU's SHA extensions (x86 SHA-NI,
  // where CPUID has them) rather than the portable rounds; the same digest
  // either way. Off: the portable rounds everywhere (tests compare the two).
  static bool hardware();
  static void set_hardware(bool on);

 private:
  void compress(const uint8_t* blocks, size_t count);

  std::array<uint32_t, 8> h_;
  std::array<uint8_t, 64> buffer_{};
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;
};

std::string sha256_hex(std::string_view data);
// Digest of a file's bytes; an unreadable file is a loom::Error naming it.
std::string sha256_file_hex(const std::string& path);

}  // namespace loom
