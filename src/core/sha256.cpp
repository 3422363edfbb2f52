#include "core/sha256.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <vector>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "core/error.h"

namespace loom {

// ---- SHA-256, FIPS 180-4 §6.2 ----

namespace {

constexpr std::array<uint32_t, 64> kSha256K = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

constexpr uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

void compress_portable(std::array<uint32_t, 8>& hs, const uint8_t* p) {
  std::array<uint32_t, 64> w;
  for (int i = 0; i < 16; ++i)
    w[i] = uint32_t{p[4 * i]} << 24 | uint32_t{p[4 * i + 1]} << 16 | uint32_t{p[4 * i + 2]} << 8 | p[4 * i + 3];
  for (int i = 16; i < 64; ++i) {
    const uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
    const uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = hs[0], b = hs[1], c = hs[2], d = hs[3], e = hs[4], f = hs[5], g = hs[6], h = hs[7];
  for (int i = 0; i < 64; ++i) {
    const uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + kSha256K[i] + w[i];
    const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    h = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
  }
  hs[0] += a, hs[1] += b, hs[2] += c, hs[3] += d, hs[4] += e, hs[5] += f, hs[6] += g, hs[7] += h;
}

#if defined(__x86_64__)
// CPUID: leaf 7's EBX bit 29 (SHA), leaf 1's ECX bit 19 (SSE4.1; SSSE3 is
// older still).
bool cpu_has_sha() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(1, &a, &b, &c, &d) == 0 || (c & (1u << 19)) == 0) return false;
  return __get_cpuid_count(7, 0, &a, &b, &c, &d) != 0 && (b & (1u << 29)) != 0;
}

// The same rounds with SHA-NI: the state as the instructions hold it (ABEF
// and CDGH), four rounds a step -- two sha256rnds2, each two rounds of W + K
// -- and W[16..63] from sha256msg1 / sha256msg2 (the sigma0 and sigma1 sums)
// plus W[t - 7] by an alignr of the two latest groups.
__attribute__((target("sha,sse4.1,ssse3"))) void compress_sha_ni(std::array<uint32_t, 8>& hs, const uint8_t* p,
                                                                  size_t count) {
  const __m128i swap = _mm_set_epi64x(0x0c0d0e0f08090a0bLL, 0x0405060700010203LL);  // big-endian words
  __m128i t = _mm_shuffle_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(hs.data())), 0xB1);  // b a d c
  __m128i cdgh = _mm_shuffle_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(hs.data() + 4)), 0x1B);
  __m128i abef = _mm_alignr_epi8(t, cdgh, 8);
  cdgh = _mm_blend_epi16(cdgh, t, 0xF0);
  for (; count > 0; --count, p += 64) {
    const __m128i abef0 = abef, cdgh0 = cdgh;
    __m128i w[4];
    for (int g = 0; g < 16; ++g) {
      __m128i& cur = w[g % 4];
      if (g < 4) {
        cur = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * g)), swap);
      } else {  // W[4g ..]: w[g % 4] holds W[4g - 16 ..] until replaced
        const __m128i& prev = w[(g + 3) % 4];  // W[4g - 4 ..]
        __m128i x = _mm_sha256msg1_epu32(cur, w[(g + 1) % 4]);
        x = _mm_add_epi32(x, _mm_alignr_epi8(prev, w[(g + 2) % 4], 4));
        cur = _mm_sha256msg2_epu32(x, prev);
      }
      const __m128i wk = _mm_add_epi32(cur, _mm_loadu_si128(reinterpret_cast<const __m128i*>(kSha256K.data() + 4 * g)));
      // Two rounds each; a round's old ABEF is the next one's CDGH, so the
      // two variables swap roles and, after the pair, are back in place.
      cdgh = _mm_sha256rnds2_epu32(cdgh, abef, wk);  // rounds 4g, 4g + 1
      abef = _mm_sha256rnds2_epu32(abef, cdgh, _mm_shuffle_epi32(wk, 0x0E));  // 4g + 2, 4g + 3
    }
    abef = _mm_add_epi32(abef, abef0);
    cdgh = _mm_add_epi32(cdgh, cdgh0);
  }
  t = _mm_shuffle_epi32(abef, 0x1B);     // f e b a
  cdgh = _mm_shuffle_epi32(cdgh, 0xB1);  // d c h g
  _mm_storeu_si128(reinterpret_cast<__m128i*>(hs.data()), _mm_blend_epi16(t, cdgh, 0xF0));     // a b c d
  _mm_storeu_si128(reinterpret_cast<__m128i*>(hs.data() + 4), _mm_alignr_epi8(cdgh, t, 8));  // e f g h
}
#endif

std::atomic<bool>& hardware_flag() {
#if defined(__x86_64__)
  static std::atomic<bool> on{cpu_has_sha()};
#else
  static std::atomic<bool> on{false};
#endif
  return on;
}

}  // namespace

bool Sha256::hardware() { return hardware_flag().load(std::memory_order_relaxed); }

void Sha256::set_hardware(bool on) {
#if defined(__x86_64__)
  hardware_flag().store(on && cpu_has_sha(), std::memory_order_relaxed);
#else
  (void)on;
#endif
}

Sha256::Sha256()
    : h_{0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19} {}

void Sha256::compress(const uint8_t* blocks, size_t count) {
#if defined(__x86_64__)
  if (hardware()) return compress_sha_ni(h_, blocks, count);
#endif
  for (size_t i = 0; i < count; ++i) compress_portable(h_, blocks + 64 * i);
}

void Sha256::update(const void* data, size_t bytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  total_bytes_ += bytes;
  while (bytes > 0) {
    if (buffered_ == 0 && bytes >= buffer_.size()) {  // whole blocks straight from the input
      const size_t blocks = bytes / buffer_.size();
      compress(p, blocks);
      p += blocks * buffer_.size(), bytes -= blocks * buffer_.size();
      continue;
    }
    const size_t n = std::min(bytes, buffer_.size() - buffered_);
    std::memcpy(buffer_.data() + buffered_, p, n);
    buffered_ += n, p += n, bytes -= n;
    if (buffered_ == buffer_.size()) {
      compress(buffer_.data(), 1);
      buffered_ = 0;
    }
  }
}

std::array<uint8_t, 32> Sha256::finish() {
  const uint64_t bits = total_bytes_ * 8;
  const uint8_t one = 0x80, zero = 0;
  update(&one, 1);
  while (buffered_ != 56) update(&zero, 1);
  uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(bits >> (56 - 8 * i));
  update(length, 8);
  std::array<uint8_t, 32> out;
  for (int i = 0; i < 32; ++i) out[i] = static_cast<uint8_t>(h_[i / 4] >> (24 - 8 * (i % 4)));
  return out;
}

namespace {

std::string hex(const std::array<uint8_t, 32>& digest) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (const uint8_t b : digest) s += {digits[b >> 4], digits[b & 15]};
  return s;
}

}  // namespace

std::string sha256_hex(std::string_view data) {
  Sha256 h;
  h.update(data.data(), data.size());
  return hex(h.finish());
}

std::string sha256_file_hex(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  LOOM_REQUIRE(in.good(), "cannot read '", path, "'");
  Sha256 h;
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    h.update(buf.data(), static_cast<size_t>(in.gcount()));
  }
  LOOM_REQUIRE(in.eof(), "reading '", path, "' failed");
  return hex(h.finish());
}

}  // namespace loom
