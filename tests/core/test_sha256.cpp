// SHA-256 (core/sha256.h) against the FIPS 180-4 example vectors, however the
// message is fed.
#include "core/sha256.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

namespace loom {
namespace {

std::string hex(const std::array<uint8_t, 32>& digest) {
  char out[65];
  for (int i = 0; i < 32; ++i) std::snprintf(out + 2 * i, 3, "%02x", digest[i]);
  return out;
}

TEST(Sha256, MatchesTheFips180Vectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha256_hex("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmno"
                       "pqrsmnopqrstnopqrstu"),
            "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
}

TEST(Sha256, OneMillionAsFedInUnevenPiecesMatchesTheFips180Vector) {
  const std::string a(1'000'000, 'a');
  Sha256 h;
  size_t done = 0;
  for (size_t piece = 1; done < a.size(); piece = piece * 3 % 1000 + 1) {
    const size_t n = std::min(piece, a.size() - done);
    h.update(a.data() + done, n);
    done += n;
  }
  EXPECT_EQ(hex(h.finish()), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  EXPECT_EQ(sha256_hex(a), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

// Lengths around the padding edges (55, 56, 63, 64, 119, 120 bytes), and an
// update of no bytes from no memory.
TEST(Sha256, FedByteByByteEqualsOneUpdate) {
  for (size_t n = 0; n <= 130; ++n) {
    std::string message(n, ' ');
    for (size_t i = 0; i < n; ++i) message[i] = static_cast<char>('a' + (i * 7) % 26);
    Sha256 bytewise;
    bytewise.update(nullptr, 0);
    for (char c : message) bytewise.update(&c, 1);
    EXPECT_EQ(hex(bytewise.finish()), sha256_hex(message)) << "length " << n;
  }
}

// The SHA extensions' rounds (where this CPU has them) and the portable ones
// give the same digests: the FIPS vectors under both, and random messages of
// every length to 300 bytes and a few of many blocks, fed whole or in pieces.
TEST(Sha256, HardwareAndPortableRoundsGiveTheSameDigests) {
  const bool had = Sha256::hardware();
  std::printf("SHA extensions on this CPU: %s\n", had ? "yes, both paths compared" : "no, portable rounds only");
  uint64_t state = 0x9E3779B97F4A7C15ull;
  std::string message(70'000, ' ');
  for (char& c : message) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    c = static_cast<char>(state >> 56);
  }
  const auto digests = [&](bool hardware) {
    Sha256::set_hardware(hardware);
    std::vector<std::string> out{sha256_hex("abc"), sha256_hex(std::string(1'000'000, 'a'))};
    for (size_t n = 0; n <= 300; ++n) out.push_back(sha256_hex(std::string_view(message).substr(0, n)));
    for (size_t n : {size_t{4096}, size_t{65'536} + 17, message.size()}) {
      Sha256 pieces;
      for (size_t at = 0; at < n; at += 1000) pieces.update(message.data() + at, std::min<size_t>(1000, n - at));
      out.push_back(hex(pieces.finish()));
    }
    return out;
  };
  const std::vector<std::string> portable = digests(false);
  const std::vector<std::string> hardware = digests(true);
  Sha256::set_hardware(had);
  EXPECT_EQ(portable[0], "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(portable[1], "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  ASSERT_EQ(portable.size(), hardware.size());
  for (size_t i = 0; i < portable.size(); ++i) EXPECT_EQ(portable[i], hardware[i]) << "case " << i;
}

}  // namespace
}  // namespace loom
