// The offload file (io/offload_file.h) and its checksum (core/crc32c.h):
// CRC-32C's published check values, the SSE4.2 path equal to the table on
// every length and alignment, records that round-trip through the I/O
// threads (with and without O_DIRECT), exact transfers at any address
// mixed with padded ones, a flipped byte detected naming the
// file and the record, and a file the disk has no room for refused at start.
#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/error_of.h"
#include "core/crc32c.h"
#include "core/error.h"
#include "io/offload_file.h"

namespace loom::io {
namespace {

using test::error_of;

TEST(Crc32c, PublishedCheckValuesAndTheInstructionEqualsTheTable) {
  const char* check = "123456789";
  EXPECT_EQ(crc32c(check, 9), 0xE3069283u);  // the CRC catalogue's check value
  EXPECT_EQ(crc32c_portable(check, 9), 0xE3069283u);
  const std::vector<uint8_t> zeros(32, 0), ones(32, 0xFF);
  EXPECT_EQ(crc32c(zeros.data(), 32), 0x8A9136AAu);  // RFC 3720 B.4
  EXPECT_EQ(crc32c(ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(crc32c(check, 0), 0u);
  EXPECT_EQ(crc32c(check + 4, 5, crc32c(check, 4)), 0xE3069283u);  // continued
  std::vector<uint8_t> bytes(300);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 131 + 7);
  for (size_t at = 0; at < 9; ++at)
    for (size_t n = 0; at + n <= bytes.size(); n += 13)
      ASSERT_EQ(crc32c(bytes.data() + at, n), crc32c_portable(bytes.data() + at, n)) << at << " " << n;
}

struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<uint8_t[], AlignedFree>;
Buffer aligned(int64_t bytes) {
  return Buffer(static_cast<uint8_t*>(std::aligned_alloc(kOffloadAlign, static_cast<size_t>(bytes))));
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::path(::testing::TempDir()) / ("loom_offload_" + name)).string();
}

TEST(OffloadFile, RecordsRoundTripAndOnesNeverWrittenReadAsZeros) {
  for (bool direct : {false, true}) {
    const std::vector<int64_t> sizes = {5000, 4096, 12, 70000};
    OffloadFile f({temp_path("roundtrip"), direct, 2}, sizes);
    EXPECT_EQ(f.file_bytes(), 8192 + 4096 + 4096 + 73728);
    std::vector<Buffer> out, in;
    std::vector<OffloadFile::Io> ios;
    for (int64_t r = 0; r < f.num_records(); ++r) {
      out.push_back(aligned(f.buffer_bytes(r))), in.push_back(aligned(f.buffer_bytes(r)));
      for (int64_t i = 0; i < f.record_bytes(r); ++i) out.back()[i] = static_cast<uint8_t>(r * 37 + i * 11);
      std::memset(in.back().get(), 0xAB, static_cast<size_t>(f.buffer_bytes(r)));
    }
    OffloadFile::wait(f.read(2, in[2].get()));  // never written: zeros
    EXPECT_EQ(std::vector<uint8_t>(in[2].get(), in[2].get() + 12), std::vector<uint8_t>(12, 0));
    for (int64_t r : {0, 1, 3}) ios.push_back(f.write(r, out[static_cast<size_t>(r)].get()));
    for (const auto& io : ios) OffloadFile::wait(io);
    ios.clear();
    for (int64_t r : {3, 0, 1}) ios.push_back(f.read(r, in[static_cast<size_t>(r)].get()));
    for (const auto& io : ios) OffloadFile::wait(io);
    for (int64_t r : {0, 1, 3})
      EXPECT_EQ(std::memcmp(in[r].get(), out[r].get(), static_cast<size_t>(f.record_bytes(r))), 0)
          << "record " << r << (direct ? " (O_DIRECT asked)" : "");
    EXPECT_EQ(f.bytes_written(), 5000 + 4096 + 70000);
    EXPECT_EQ(f.bytes_read(), 5000 + 4096 + 70000);
  }
  EXPECT_FALSE(std::filesystem::exists(temp_path("roundtrip"))) << "the file outlived its object";
}

// Exact transfers: buffers of a record's own size at any address (a slice
// of a tensor), mixed with padded ones on the same records, with and
// without O_DIRECT: what one way wrote the other reads.
TEST(OffloadFile, ExactTransfersAtAnyAddressMixWithPaddedOnes) {
  for (bool direct : {false, true}) {
    const std::vector<int64_t> sizes = {5000, 8192, 12, 70001};
    OffloadFile f({temp_path("exact"), direct, 2}, sizes);
    for (int64_t shift : {0, 4096, 8, 1}) {  // the exact buffer's address past a 4 KiB boundary
      for (int64_t r = 0; r < f.num_records(); ++r) {
        const auto n = static_cast<size_t>(f.record_bytes(r));
        Buffer padded = aligned(f.buffer_bytes(r)), space = aligned(f.buffer_bytes(r) + 2 * kOffloadAlign);
        uint8_t* exact = space.get() + shift;
        for (size_t i = 0; i < n; ++i) exact[i] = static_cast<uint8_t>(r * 13 + i * 7 + shift);
        std::memset(exact + n, 0x5A, 64);  // past the record: must stay
        OffloadFile::wait(f.write_exact(r, exact));
        OffloadFile::wait(f.read(r, padded.get()));
        ASSERT_EQ(std::memcmp(padded.get(), exact, n), 0) << "record " << r << " shift " << shift << " direct "
                                                          << direct;
        for (size_t i = 0; i < n; ++i) padded[i] = static_cast<uint8_t>(~padded[i]);
        OffloadFile::wait(f.write(r, padded.get()));
        OffloadFile::wait(f.read_exact(r, exact));
        ASSERT_EQ(std::memcmp(padded.get(), exact, n), 0) << "record " << r << " shift " << shift;
        for (size_t i = n; i < n + 64; ++i) ASSERT_EQ(exact[i], 0x5A) << "byte " << i - n << " past record " << r;
      }
    }
  }
}

TEST(OffloadFile, AFlippedByteIsAnErrorNamingTheFileAndTheRecord) {
  const std::string path = temp_path("flip");
  OffloadFile f({path, false, 1}, {4096, 4096});
  Buffer b = aligned(4096);
  for (int i = 0; i < 4096; ++i) b[i] = static_cast<uint8_t>(i);
  OffloadFile::wait(f.write(0, b.get()));
  OffloadFile::wait(f.write(1, b.get()));
  const int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  uint8_t byte = 0;
  ASSERT_EQ(::pread(fd, &byte, 1, 4096 + 1000), 1);
  byte ^= 0x10;
  ASSERT_EQ(::pwrite(fd, &byte, 1, 4096 + 1000), 1);
  ::close(fd);
  OffloadFile::wait(f.read(0, b.get()));  // the other record still reads
  const std::string e = error_of([&] { OffloadFile::wait(f.read(1, b.get())); });
  EXPECT_NE(e.find("offload file '" + path + "': record 1 (4096 bytes at byte 4096) is corrupted"), std::string::npos)
      << e;
}

TEST(OffloadFile, ADiskWithoutRoomIsRefusedAtStartWithTheNumbers) {
  const std::string path = temp_path("huge");
  const std::string e = error_of([&] { OffloadFile f({path, false, 1}, {int64_t{1} << 52}); });
  EXPECT_NE(e.find("the offload file '" + path + "' needs 4503599627370496 bytes (4294967296 MiB) on disk"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("point parallel.offload_dir at a disk with room"), std::string::npos) << e;
  EXPECT_FALSE(std::filesystem::exists(path));
}

}  // namespace
}  // namespace loom::io
