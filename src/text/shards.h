// Token shards in llm.c's .bin format (llm.c dev/data/data_common.py):
//   header: 256 x int32 little-endian
//     [0] magic 20240520
//     [1] version: 1 = uint16 tokens, 2 = uint32 tokens (vocabularies over 65536)
//     [2] token count
//   then `count` tokens, little-endian.
// Written atomically (temporary name, fsync, rename). Read with pread(2)
// through a descriptor held open, not a memory map: a file truncated while it
// is read then gives a short read, reported as a loom::Error naming the shard
// and its sizes, where a map would kill the process with SIGBUS (issue 15).
// A file replaced by rename (a new `data prepare`) is not seen: the
// descriptor keeps reading the file that was opened.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace loom::text {

inline constexpr int32_t kShardMagic = 20240520;
inline constexpr int64_t kShardHeaderInts = 256;
inline constexpr int64_t kShardHeaderBytes = kShardHeaderInts * 4;

// 1 when every id of the vocabulary fits 16 bits, else 2.
int shard_version_for_vocab(int64_t vocab_size);
// Bytes per token of a version (1 -> 2, 2 -> 4).
int shard_token_bytes(int version);

// Writes `tokens` to `path` as a shard of `version`; throws loom::Error for a
// token the version cannot hold or a file that cannot be written.
void write_shard(const std::string& path, std::span<const int32_t> tokens, int version);

// One shard open for reading. Movable, not copyable. Each open shard holds a
// file descriptor until it is destroyed.
class Shard {
 public:
  // Throws loom::Error naming the file and the problem: missing, a directory
  // or other non-regular file, shorter than the header, wrong magic, unknown
  // version, count that disagrees with the file size.
  static Shard open(const std::string& path);

  Shard() = default;
  Shard(Shard&& other) noexcept;
  Shard& operator=(Shard&& other) noexcept;
  Shard(const Shard&) = delete;
  Shard& operator=(const Shard&) = delete;
  ~Shard();

  const std::string& path() const { return path_; }
  int version() const { return version_; }
  int64_t size() const { return count_; }  // tokens
  int32_t operator[](int64_t i) const;
  // out[j] = token begin + j for j < n; [begin, begin + n) must lie in the
  // shard. One pread of n tokens; throws loom::Error (shard, its size now and
  // at open) when the file has shrunk below them or cannot be read.
  void copy(int64_t begin, int64_t n, int32_t* out) const;
  // Throws loom::Error naming the file, the position and the id of the first
  // token >= vocab_size.
  void check_vocab(int64_t vocab_size) const;

 private:
  void close();
  // bytes [offset, offset + n) of the file into out; loom::Error on a short read.
  void read_bytes(int64_t offset, int64_t n, void* out) const;

  std::string path_;
  int fd_ = -1;
  int64_t file_bytes_ = 0;  // at open: header + count * token bytes
  int version_ = 0;
  int64_t count_ = 0;
};

}  // namespace loom::text
