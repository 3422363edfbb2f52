#include "text/shards.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
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
  s.fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (s.fd_ < 0) {
    // The descriptor stays open while the shard is read, so thousands of
    // shards can run into the process's limit on open files.
    const bool too_many = errno == EMFILE;
    fail("cannot open shard '", path, "': ", errno_text(),
         too_many ? " (every shard stays open while it is read: raise the limit with ulimit -n)" : "");
  }
  struct stat st {};
  if (::fstat(s.fd_, &st) != 0) fail("cannot stat shard '", path, "': ", errno_text());
  LOOM_REQUIRE(!S_ISDIR(st.st_mode), "shard '", path, "' is a directory: a .bin token shard or a glob of them is ",
               "expected (e.g. '", (std::filesystem::path(path) / "train_*.bin").string(), "')");
  LOOM_REQUIRE(S_ISREG(st.st_mode), "shard '", path, "' is not a regular file: a .bin token shard is expected");
  const int64_t file_bytes = st.st_size;
  if (file_bytes < kShardHeaderBytes) {
    fail("shard '", path, "' is truncated: ", file_bytes, " bytes, shorter than the ", kShardHeaderBytes,
         "-byte header");
  }
  s.file_bytes_ = file_bytes;
  int32_t header[3];
  s.read_bytes(0, sizeof(header), header);
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
  return s;
}

Shard::Shard(Shard&& other) noexcept { *this = std::move(other); }

Shard& Shard::operator=(Shard&& other) noexcept {
  if (this != &other) {
    close();
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    file_bytes_ = std::exchange(other.file_bytes_, 0);
    version_ = std::exchange(other.version_, 0);
    count_ = std::exchange(other.count_, 0);
  }
  return *this;
}

Shard::~Shard() { close(); }

void Shard::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void Shard::read_bytes(int64_t offset, int64_t n, void* out) const {
  auto* p = static_cast<unsigned char*>(out);
  int64_t done = 0;
  while (done < n) {
    const ssize_t got = ::pread(fd_, p + done, static_cast<size_t>(n - done), static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) fail("cannot read shard '", path_, "' at byte ", offset + done, ": ", errno_text());
    if (got == 0) {
      // End of file before the bytes the header promised: the file shrank
      // after it was opened (another process truncated or rewrote it in place).
      struct stat st {};
      const int64_t now = ::fstat(fd_, &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
      fail("shard '", path_, "' was truncated while being read: it is ", now, " bytes now, ", file_bytes_,
           " bytes when it was opened (", count_, " tokens); bytes [", offset, ", ", offset + n,
           ") are gone: restore the shard (or prepare the data again) and restart the run");
    }
    done += got;
  }
}

int32_t Shard::operator[](int64_t i) const {
  int32_t v;
  copy(i, 1, &v);
  return v;
}

void Shard::copy(int64_t begin, int64_t n, int32_t* out) const {
  LOOM_CHECK(begin >= 0 && n >= 0 && begin + n <= count_, "tokens [", begin, ", ", begin + n, ") of ", count_,
             " in ", path_);
  const int tb = shard_token_bytes(version_);
  read_bytes(kShardHeaderBytes + begin * tb, n * tb, out);
  if (version_ == 2) return;
  // uint16 tokens were read into the first 2n bytes of out; widen in place
  // from the back: out[j] (bytes 4j..4j+3) overwrites only uint16 tokens >= j,
  // which have been widened already.
  const auto* bytes = reinterpret_cast<const unsigned char*>(out);
  for (int64_t j = n - 1; j >= 0; --j) {
    uint16_t v;
    std::memcpy(&v, bytes + 2 * j, 2);
    out[j] = v;
  }
}

void Shard::check_vocab(int64_t vocab_size) const {
  // In chunks: the whole shard is read once, in order.
  constexpr int64_t kChunk = 1 << 16;
  std::vector<int32_t> chunk(static_cast<size_t>(std::min(kChunk, count_)));
  for (int64_t begin = 0; begin < count_; begin += kChunk) {
    const int64_t n = std::min(kChunk, count_ - begin);
    copy(begin, n, chunk.data());
    for (int64_t j = 0; j < n; ++j) {
      const int32_t t = chunk[j];
      LOOM_REQUIRE(t >= 0 && t < vocab_size, "shard '", path_, "': token ", begin + j, " is ", t,
                   ", outside the vocabulary [0, ", vocab_size, ")");
    }
  }
}

}  // namespace loom::text
