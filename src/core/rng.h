// Counter-based random numbers (Philox-4x32-10, Salmon et al., SC'11).
//
// A value is a pure function of (seed, key, index): element i of a parameter
// named `key` is the same whether a rank generates the whole tensor or only
// its shard. This is what makes initialisation sharding-invariant (DESIGN.md
// §1.3).
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace loom {

// The Philox-4x32 bijection with 10 rounds: counter and key to 4 words.
std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

// A stable 64-bit key for a name (FNV-1a), e.g. a parameter name.
uint64_t rng_key(std::string_view name);

// Uniform in [0, 1) with 24 random bits.
float rng_uniform(uint64_t seed, uint64_t key, uint64_t index);
// Standard normal (Box-Muller on two words of the same Philox block).
float rng_normal(uint64_t seed, uint64_t key, uint64_t index);

// Fills out[j] with the value at global index offset + j, for j < n.
void rng_fill_uniform(float* out, int64_t n, uint64_t seed, uint64_t key, uint64_t offset, float lo = 0.f,
                      float hi = 1.f);
void rng_fill_normal(float* out, int64_t n, uint64_t seed, uint64_t key, uint64_t offset, float mean = 0.f,
                     float std = 1.f);

}  // namespace loom
