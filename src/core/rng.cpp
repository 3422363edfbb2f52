#include "core/rng.h"

#include <cmath>

namespace loom {

namespace {
constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;   // round multipliers
constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;  // key schedule increments

inline void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t p = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}

// Counter = (index lo, index hi, key lo, key hi); Philox key = seed.
inline std::array<uint32_t, 4> block(uint64_t seed, uint64_t key, uint64_t index) {
  return philox4x32_10({static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32), static_cast<uint32_t>(key),
                        static_cast<uint32_t>(key >> 32)},
                       {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
}

inline float to_unit(uint32_t w) { return static_cast<float>(w >> 8) * 0x1.0p-24f; }  // [0, 1)

inline float normal_from(const std::array<uint32_t, 4>& r) {
  const double u1 = (static_cast<double>(r[0]) + 1.0) * 0x1.0p-32;  // (0, 1]: log is finite
  const double u2 = static_cast<double>(r[1]) * 0x1.0p-32;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
}
}  // namespace

std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(kMul0, c[0], hi0, lo0);
    mulhilo(kMul1, c[2], hi1, lo1);
    c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
    k[0] += kWeyl0;
    k[1] += kWeyl1;
  }
  return c;
}

uint64_t rng_key(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : name) {
    h ^= ch;
    h *= 0x100000001b3ull;
  }
  return h;
}

float rng_uniform(uint64_t seed, uint64_t key, uint64_t index) { return to_unit(block(seed, key, index)[0]); }

float rng_normal(uint64_t seed, uint64_t key, uint64_t index) { return normal_from(block(seed, key, index)); }

void rng_fill_uniform(float* out, int64_t n, uint64_t seed, uint64_t key, uint64_t offset, float lo, float hi) {
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t j = 0; j < n; ++j) out[j] = lo + (hi - lo) * rng_uniform(seed, key, offset + j);
}

void rng_fill_normal(float* out, int64_t n, uint64_t seed, uint64_t key, uint64_t offset, float mean, float std) {
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t j = 0; j < n; ++j) out[j] = mean + std * rng_normal(seed, key, offset + j);
}

}  // namespace loom
