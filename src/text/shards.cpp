#include "text/shards.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>
#include <vector>

#include "core/atomic_file.h"
#include "core/error.h"

namespace loom::text {

static_assert(std::endian::native == std::endian::little, "shards are read and written as little-endian in place");

namespace {

std::string errno_text() { return std::strerror(errno); }

}  // namespace

int shard_version_for_vocab(int64_t vocab_size) { return vocab_size <= 65536 ? 1 : 2; }

int shard_token_bytes(int version) {
  LOOM_CHECK(version == 1 || version == 2, "shard version ", version);
  return version == 1 ? 2 : 4;
}

void write_shard(const std::string& path, std::span<const int32_t> tokens, int version) {
  LOOM_REQUIRE(version == 1 || version == 2, "shard '", path, "': version must be 1 (uint16) or 2 (uint32), not ",
               version);
  const int64_t limit = version == 1 ? 65535 : INT32_MAX;
  std::vector<unsigned char> body(tokens.size() * shard_token_bytes(version));
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t t = tokens[i];
    LOOM_REQUIRE(t >= 0 && t <= limit, "shard '", path, "': token ", i, " is ", t, ", outside [0, ", limit,
                 "] of version ", version);
    if (version == 1) {
      const uint16_t v = static_cast<uint16_t>(t);
      std::memcpy(&body[i * 2], &v, 2);
    } else {
      std::memcpy(&body[i * 4], &t, 4);
    }
  }
  int32_t header[kShardHeaderInts] = {};
  header[0] = kShardMagic;
  header[1] = version;
  LOOM_REQUIRE(tokens.size() <= static_cast<size_t>(INT32_MAX), "shard '", path, "': ", tokens.size(),
               " tokens exceed the format's int32 count");
  header[2] = static_cast<int32_t>(tokens.size());

  AtomicFile file(path);
  file.write(header, sizeof(header));
  file.write(body.data(), body.size());
  file.commit();
}

Shard Shard::open(const std::string& path) {
  Shard s;
  s.path_ = path;
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) fail("cannot open shard '", path, "': ", errno_text());
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    fail("cannot stat shard '", path, "': ", errno_text());
  }
  const int64_t file_bytes = st.st_size;
  if (file_bytes < kShardHeaderBytes) {
    ::close(fd);
    fail("shard '", path, "' is truncated: ", file_bytes, " bytes, shorter than the ", kShardHeaderBytes,
         "-byte header");
  }
  s.map_ = ::mmap(nullptr, static_cast<size_t>(file_bytes), PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);  // the map keeps the file open
  if (s.map_ == MAP_FAILED) {
    s.map_ = nullptr;
    fail("cannot memory-map shard '", path, "': ", errno_text());
  }
  s.map_bytes_ = static_cast<size_t>(file_bytes);
  int32_t header[3];
  std::memcpy(header, s.map_, sizeof(header));
  LOOM_REQUIRE(header[0] == kShardMagic, "shard '", path, "' has wrong magic ", header[0], " (expected ",
               kShardMagic, "): not an llm.c .bin token shard");
  LOOM_REQUIRE(header[1] == 1 || header[1] == 2, "shard '", path, "' has unsupported version ", header[1],
               " (expected 1: uint16 tokens or 2: uint32 tokens)");
  s.version_ = header[1];
  LOOM_REQUIRE(header[2] >= 0, "shard '", path, "' has a negative token count ", header[2]);
  s.count_ = header[2];
  const int64_t body_bytes = file_bytes - kShardHeaderBytes;
  const int64_t want_bytes = s.count_ * shard_token_bytes(s.version_);
  LOOM_REQUIRE(body_bytes >= want_bytes, "shard '", path, "' is truncated: the header counts ", s.count_,
               " tokens (", want_bytes, " bytes) but only ", body_bytes, " bytes follow it");
  LOOM_REQUIRE(body_bytes == want_bytes, "shard '", path, "' has a token count mismatch: the header counts ",
               s.count_, " tokens (", want_bytes, " bytes) but ", body_bytes, " bytes follow it");
  s.tokens_ = static_cast<const unsigned char*>(s.map_) + kShardHeaderBytes;
  return s;
}

Shard::Shard(Shard&& other) noexcept { *this = std::move(other); }

Shard& Shard::operator=(Shard&& other) noexcept {
  if (this != &other) {
    unmap();
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
    version_ = std::exchange(other.version_, 0);
    count_ = std::exchange(other.count_, 0);
    tokens_ = std::exchange(other.tokens_, nullptr);
  }
  return *this;
}

Shard::~Shard() { unmap(); }

void Shard::unmap() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
  map_ = nullptr;
}

int32_t Shard::operator[](int64_t i) const {
  LOOM_CHECK(i >= 0 && i < count_, "token ", i, " of ", count_, " in ", path_);
  if (version_ == 1) {
    uint16_t v;
    std::memcpy(&v, tokens_ + 2 * i, 2);
    return v;
  }
  int32_t v;
  std::memcpy(&v, tokens_ + 4 * i, 4);
  return v;
}

void Shard::copy(int64_t begin, int64_t n, int32_t* out) const {
  LOOM_CHECK(begin >= 0 && n >= 0 && begin + n <= count_, "tokens [", begin, ", ", begin + n, ") of ", count_,
             " in ", path_);
  if (version_ == 2) {
    std::memcpy(out, tokens_ + 4 * begin, static_cast<size_t>(n) * 4);
    return;
  }
  const unsigned char* p = tokens_ + 2 * begin;
  for (int64_t j = 0; j < n; ++j) {
    uint16_t v;
    std::memcpy(&v, p + 2 * j, 2);
    out[j] = v;
  }
}

void Shard::check_vocab(int64_t vocab_size) const {
  for (int64_t i = 0; i < count_; ++i) {
    const int32_t t = (*this)[i];
    LOOM_REQUIRE(t >= 0 && t < vocab_size, "shard '", path_, "': token ", i, " is ", t,
                 ", outside the vocabulary [0, ", vocab_size, ")");
  }
}

}  // namespace loom::text
