// ZeRO-Infinity's disk tier (DeepSpeed's offload to NVMe; parallel/
// offload.h uses it): one rank's working file of fixed records, each read
// and written whole, asynchronously, by a pool of I/O threads (pread /
// pwrite), optionally past the page cache (O_DIRECT). Every record written
// carries a CRC-32C kept in memory, checked when it is read back: a torn or
// corrupted record is a loom::Error naming the file, the record and its
// bytes, never data. A record never written reads as zeros; one whose
// last write failed is an error to read.
//
// The file is working state, not a checkpoint: it is created at start
// (preallocated, so a disk without room for it is refused at once with the
// numbers), and removed when the object goes.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/memory.h"

namespace loom::io {

// O_DIRECT's unit: records start on it, transfers are multiples of it, and
// buffers must be aligned to it.
inline constexpr int64_t kOffloadAlign = 4096;

class OffloadFile {
 public:
  struct Options {
    std::string path;
    bool direct = false;  // ask for O_DIRECT (a filesystem without it, tmpfs, falls back: direct() says)
    int threads = 2;      // I/O threads
    // Exact transfers past the page cache: each I/O thread's aligned buffer
    // of bounce_bytes from bounce_pool, through which a record of at most
    // that many (padded) bytes goes. None: exact transfers use the page
    // cache but for a buffer's aligned whole pages.
    Pool* bounce_pool = nullptr;
    int64_t bounce_bytes = 0;
  };
  // The bytes Options' bounce buffers take for `threads` threads.
  static int64_t bounce_buffer_bytes(int threads, int64_t bounce_bytes);
  // Creates (or truncates) o.path and preallocates a record of each size in
  // record_bytes. A disk without room is a loom::Error naming the path, the
  // bytes it needs and the bytes free.
  OffloadFile(Options o, std::vector<int64_t> record_bytes);
  ~OffloadFile();  // waits for the I/O in flight, closes and removes the file
  OffloadFile(const OffloadFile&) = delete;
  OffloadFile& operator=(const OffloadFile&) = delete;

  int64_t num_records() const { return static_cast<int64_t>(bytes_.size()); }
  int64_t record_bytes(int64_t r) const { return bytes_.at(static_cast<size_t>(r)); }
  // The bytes a buffer for record r must hold: record_bytes rounded up to
  // kOffloadAlign (the transfer's size under O_DIRECT).
  int64_t buffer_bytes(int64_t r) const;
  int64_t file_bytes() const { return file_bytes_; }
  const std::string& path() const { return path_; }
  bool direct() const { return direct_; }

  // Starts reading record r into dst / writing src to it (buffer_bytes(r)
  // bytes, aligned to kOffloadAlign under direct(); they must stay valid and
  // untouched until the I/O is waited for). wait(io) returns when it is
  // done and throws its error: a failed read or write (a full disk:
  // ENOSPC), or a record read back whose CRC-32C is not the one written.
  // Reads and writes of one record must not overlap.
  using Io = std::shared_future<void>;
  Io read(int64_t r, void* dst) { return read(r, dst, false); }
  Io write(int64_t r, const void* src) { return write(r, src, false); }
  // The same with a buffer of exactly record_bytes(r) bytes at any address
  // (a slice of a larger tensor): under direct(), through the I/O thread's
  // bounce buffer (Options::bounce_pool) past the page cache, or without
  // one its whole aligned pages past the page cache when it starts on
  // kOffloadAlign and the rest through it (the kernel keeps the two views
  // of the file coherent).
  Io read_exact(int64_t r, void* dst) { return read(r, dst, true); }
  Io write_exact(int64_t r, const void* src) { return write(r, src, true); }
  static void wait(const Io& io) { io.get(); }
  // Waits for every one, then throws the first error.
  static void wait_all(const std::vector<Io>& ios);
  // Bytes read and written so far.
  int64_t bytes_read() const;
  int64_t bytes_written() const;

 private:
  Io read(int64_t r, void* dst, bool exact);
  Io write(int64_t r, const void* src, bool exact);
  Io submit(std::function<void()> job);
  void worker(int index);
  void transfer(bool reading, int64_t r, void* buf, bool exact) const;
  void transfer(int fd, bool reading, int64_t r, char* buf, int64_t from, int64_t n) const;

  std::string path_;
  int fd_ = -1;
  int buffered_fd_ = -1;  // under direct_: the same file through the page cache (exact transfers' tails)
  bool direct_ = false;
  std::vector<int64_t> bytes_, offsets_;
  int64_t file_bytes_ = 0;
  mutable std::mutex mu_;  // guards what follows
  std::condition_variable cv_;
  std::deque<std::packaged_task<void()>> queue_;
  bool stopping_ = false;
  enum class State : uint8_t { never, written, lost };  // lost: its last write failed
  std::vector<uint32_t> crc_;
  std::vector<State> state_;
  int64_t read_ = 0, wrote_ = 0;
  std::vector<std::thread> threads_;
  std::vector<OwnedTensor> bounce_;  // per thread (Options::bounce_pool)
  int64_t bounce_bytes_ = 0;
};

}  // namespace loom::io
