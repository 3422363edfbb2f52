// Block hashes for prefix caching: a full KV block is named by a chain hash
//   h_0 = H(seed, tokens[0, B), extra)   h_i = H(h_{i-1}, tokens[iB, (i+1)B), extra)
// so two blocks match only when every token before and in them matches, under
// the same seed (a fingerprint of the model's weights: blocks computed by
// different weights never match) and the same extra keys (e.g. a LoRA id).
// H is SHA-256 truncated to 128 bits: a collision would serve another
// sequence's K/V, so a fast non-cryptographic hash is not enough.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "core/sha256.h"

namespace loom::infer {

// 128 bits: the first 16 bytes of a SHA-256 digest, big-endian into hi, lo.
struct BlockHash {
  uint64_t hi = 0;
  uint64_t lo = 0;
  friend bool operator==(const BlockHash&, const BlockHash&) = default;
};

// For unordered containers: the bits are already uniform.
struct BlockHashHasher {
  size_t operator()(const BlockHash& h) const { return static_cast<size_t>(h.lo ^ h.hi); }
};

// The first 128 bits of SHA-256(bytes): a seed from a weights fingerprint,
// a config string, or any bytes.
BlockHash sha256_128(std::span<const uint8_t> bytes);

// H(parent, tokens, extra): SHA-256 over parent (16 bytes), the token count
// and tokens (int32), the extra-key count and keys (uint64), all
// little-endian; the counts make the encoding unambiguous.
BlockHash block_hash(const BlockHash& parent, std::span<const int32_t> tokens,
                     std::span<const uint64_t> extra_keys);

// The chain hashes of every full block of tokens (a partial last block is
// never hashed): tokens.size() / block_size of them, the first with parent seed.
std::vector<BlockHash> block_hashes(const BlockHash& seed, std::span<const int32_t> tokens,
                                    int64_t block_size, std::span<const uint64_t> extra_keys);

}  // namespace loom::infer
