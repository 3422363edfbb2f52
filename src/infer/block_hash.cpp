#include "infer/block_hash.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace loom::infer {

namespace {

BlockHash first_128_bits(const std::array<uint8_t, 32>& digest) {
  BlockHash h;
  for (int i = 0; i < 8; ++i) {
    h.hi = (h.hi << 8) | digest[i];
    h.lo = (h.lo << 8) | digest[8 + i];
  }
  return h;
}

void update_le64(Sha256& sha, uint64_t v) {
  uint8_t bytes[8];
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<uint8_t>(v >> (8 * i));
  sha.update(bytes, 8);
}

}  // namespace

BlockHash sha256_128(std::span<const uint8_t> bytes) {
  Sha256 sha;
  sha.update(bytes.data(), bytes.size());
  return first_128_bits(sha.finish());
}

BlockHash block_hash(const BlockHash& parent, std::span<const int32_t> tokens,
                     std::span<const uint64_t> extra_keys) {
  Sha256 sha;
  update_le64(sha, parent.hi);
  update_le64(sha, parent.lo);
  update_le64(sha, tokens.size());
  // Tokens as little-endian int32, 64 at a time.
  uint8_t chunk[256];
  for (size_t begin = 0; begin < tokens.size(); begin += 64) {
    const size_t n = std::min<size_t>(64, tokens.size() - begin);
    for (size_t i = 0; i < n; ++i) {
      const auto t = static_cast<uint32_t>(tokens[begin + i]);
      for (int b = 0; b < 4; ++b) chunk[4 * i + b] = static_cast<uint8_t>(t >> (8 * b));
    }
    sha.update(chunk, 4 * n);
  }
  update_le64(sha, extra_keys.size());
  for (uint64_t key : extra_keys) update_le64(sha, key);
  return first_128_bits(sha.finish());
}

std::vector<BlockHash> block_hashes(const BlockHash& seed, std::span<const int32_t> tokens,
                                    int64_t block_size, std::span<const uint64_t> extra_keys) {
  LOOM_REQUIRE(block_size >= 1, "block_hashes: block_size ", block_size, " must be >= 1");
  const size_t full = tokens.size() / static_cast<size_t>(block_size);
  std::vector<BlockHash> hashes;
  hashes.reserve(full);
  BlockHash parent = seed;
  for (size_t i = 0; i < full; ++i) {
    parent = block_hash(parent, tokens.subspan(i * block_size, block_size), extra_keys);
    hashes.push_back(parent);
  }
  return hashes;
}

}  // namespace loom::infer
