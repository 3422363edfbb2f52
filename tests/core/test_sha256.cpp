// SHA-256 (core/sha256.h) against the FIPS 180-4 example vectors, however the
// message is fed.
#include "core/sha256.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

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

}  // namespace
}  // namespace loom
