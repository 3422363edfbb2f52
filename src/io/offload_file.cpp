// OffloadFile (offload_file.h): records at kOffloadAlign-aligned offsets,
// pread / pwrite by a pool of threads, a CRC-32C per record in memory.
#include "io/offload_file.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/crc32c.h"
#include "core/error.h"

namespace loom::io {
namespace {

int64_t round_up(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

// The I/O thread's bounce buffer (aligned), and its bytes; null without one.
thread_local char* t_bounce = nullptr;

int64_t free_bytes(const std::string& path) {
  struct statvfs s {};
  const std::string dir = std::filesystem::path(path).parent_path().string();
  if (statvfs(dir.empty() ? "." : dir.c_str(), &s) != 0) return -1;
  return static_cast<int64_t>(s.f_bavail) * static_cast<int64_t>(s.f_frsize);
}

}  // namespace

OffloadFile::OffloadFile(Options o, std::vector<int64_t> record_bytes)
    : path_(std::move(o.path)), bytes_(std::move(record_bytes)) {
  LOOM_REQUIRE(o.threads >= 1, "offload file '", path_, "': ", o.threads, " I/O threads; allowed: 1 or more");
  for (int64_t b : bytes_) {
    LOOM_CHECK(b > 0, "OffloadFile: a record of ", b, " bytes");
    offsets_.push_back(file_bytes_);
    file_bytes_ += round_up(b, kOffloadAlign);
  }
  const int flags = O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC;
  if (o.direct) fd_ = ::open(path_.c_str(), flags | O_DIRECT, 0600);
  direct_ = fd_ >= 0;
  if (fd_ < 0) fd_ = ::open(path_.c_str(), flags, 0600);  // no O_DIRECT here (tmpfs): through the page cache
  LOOM_REQUIRE(fd_ >= 0, "cannot create the offload file '", path_, "': ", std::strerror(errno));
  if (direct_) buffered_fd_ = ::open(path_.c_str(), O_RDWR | O_CLOEXEC);
  LOOM_REQUIRE(!direct_ || buffered_fd_ >= 0, "cannot open the offload file '", path_, "': ", std::strerror(errno));
  const int err = file_bytes_ > 0 ? ::posix_fallocate(fd_, 0, file_bytes_) : 0;
  if (err != 0) {
    const int64_t free = free_bytes(path_);
    ::close(fd_);
    if (buffered_fd_ >= 0) ::close(buffered_fd_);
    ::unlink(path_.c_str());
    fail("the offload file '", path_, "' needs ", file_bytes_, " bytes (", file_bytes_ >> 20, " MiB) on disk; ",
         err == ENOSPC ? concat("the filesystem has ", free, " free (", free >> 20, " MiB)") : std::strerror(err),
         ": point parallel.offload_dir at a disk with room, or offload less (parallel.offload)");
  }
  crc_.assign(bytes_.size(), 0);
  state_.assign(bytes_.size(), State::never);
  if (o.bounce_pool && o.bounce_bytes > 0) {
    bounce_bytes_ = round_up(o.bounce_bytes, kOffloadAlign);
    for (int i = 0; i < o.threads; ++i)
      bounce_.push_back(o.bounce_pool->empty(DType::u8, {bounce_buffer_bytes(1, o.bounce_bytes)}));
  }
  for (int i = 0; i < o.threads; ++i) threads_.emplace_back([this, i] { worker(i); });
}

OffloadFile::~OffloadFile() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
  if (buffered_fd_ >= 0) ::close(buffered_fd_);
  ::close(fd_);
  ::unlink(path_.c_str());
}

void OffloadFile::wait_all(const std::vector<Io>& ios) {
  std::exception_ptr first;
  for (const Io& io : ios) try {
      io.get();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  if (first) std::rethrow_exception(first);
}

int64_t OffloadFile::bounce_buffer_bytes(int threads, int64_t bounce_bytes) {
  return bounce_bytes > 0 ? threads * (round_up(bounce_bytes, kOffloadAlign) + kOffloadAlign) : 0;
}

int64_t OffloadFile::buffer_bytes(int64_t r) const { return round_up(record_bytes(r), kOffloadAlign); }

int64_t OffloadFile::bytes_read() const {
  std::lock_guard lock(mu_);
  return read_;
}

int64_t OffloadFile::bytes_written() const {
  std::lock_guard lock(mu_);
  return wrote_;
}

void OffloadFile::worker(int index) {
  if (static_cast<size_t>(index) < bounce_.size()) {
    char* b = static_cast<char*>(bounce_[static_cast<size_t>(index)].data());
    const auto at = static_cast<int64_t>(reinterpret_cast<uintptr_t>(b));
    t_bounce = b + (round_up(at, kOffloadAlign) - at);
  }
  for (;;) {
    std::packaged_task<void()> job;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    job();
  }
}

OffloadFile::Io OffloadFile::submit(std::function<void()> job) {
  std::packaged_task<void()> task(std::move(job));
  Io done = task.get_future().share();
  {
    std::lock_guard lock(mu_);
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
  return done;
}

// The whole transfer of record r: padded (a buffer of buffer_bytes(r),
// aligned under direct_) in one piece, exact (record_bytes(r) at any
// address) in its aligned whole pages past the page cache and the rest
// through it.
void OffloadFile::transfer(bool reading, int64_t r, void* buf, bool exact) const {
  auto* p = static_cast<char*>(buf);
  if (!direct_) return transfer(fd_, reading, r, p, 0, record_bytes(r));
  if (!exact) return transfer(fd_, reading, r, p, 0, buffer_bytes(r));
  if (t_bounce && buffer_bytes(r) <= bounce_bytes_) {
    const auto n = static_cast<size_t>(record_bytes(r));
    if (!reading) {
      std::memcpy(t_bounce, p, n);
      std::memset(t_bounce + n, 0, static_cast<size_t>(buffer_bytes(r)) - n);
    }
    transfer(fd_, reading, r, t_bounce, 0, buffer_bytes(r));
    if (reading) std::memcpy(p, t_bounce, n);
    return;
  }
  const bool aligned = reinterpret_cast<uintptr_t>(p) % kOffloadAlign == 0;
  const int64_t pages = aligned ? record_bytes(r) / kOffloadAlign * kOffloadAlign : 0;
  if (pages > 0) transfer(fd_, reading, r, p, 0, pages);
  if (pages < record_bytes(r)) transfer(buffered_fd_, reading, r, p, pages, record_bytes(r) - pages);
}

// Bytes [from, from + n) of record r, short counts and EINTR retried.
void OffloadFile::transfer(int fd, bool reading, int64_t r, char* buf, int64_t from, int64_t n) const {
  const int64_t base = offsets_[static_cast<size_t>(r)] + from;
  for (int64_t done = 0; done < n;) {
    const auto want = static_cast<size_t>(n - done);
    char* p = buf + from + done;
    const ssize_t got = reading ? ::pread(fd, p, want, base + done) : ::pwrite(fd, p, want, base + done);
    if (got < 0 && errno == EINTR) continue;
    LOOM_REQUIRE(got > 0, "offload file '", path_, "': ", reading ? "reading" : "writing", " record ", r, " (",
                 record_bytes(r), " bytes at byte ", offsets_[static_cast<size_t>(r)], ") failed: ",
                 got == 0 ? "the file ends early" : std::strerror(errno),
                 errno == ENOSPC ? " (the disk is full: free space on parallel.offload_dir's disk)" : "");
    done += got;
  }
}

OffloadFile::Io OffloadFile::read(int64_t r, void* dst, bool exact) {
  LOOM_CHECK(r >= 0 && r < num_records(), "OffloadFile::read: record ", r, " of ", num_records());
  return submit([this, r, dst, exact] {
    uint32_t want = 0;
    {
      std::lock_guard lock(mu_);
      const State st = state_[static_cast<size_t>(r)];
      LOOM_REQUIRE(st != State::lost, "offload file '", path_, "': record ", r, " was lost: its last write failed");
      if (st == State::never) {
        std::memset(dst, 0, static_cast<size_t>(record_bytes(r)));
        return;
      }
      want = crc_[static_cast<size_t>(r)];
    }
    transfer(true, r, dst, exact);
    const uint32_t got = crc32c(dst, static_cast<size_t>(record_bytes(r)));
    LOOM_REQUIRE(got == want, "offload file '", path_, "': record ", r, " (", record_bytes(r), " bytes at byte ",
                 offsets_[static_cast<size_t>(r)], ") is corrupted: its CRC-32C is ", got, ", written as ", want,
                 "; the run stops (resume it from its last checkpoint)");
    std::lock_guard lock(mu_);
    read_ += record_bytes(r);
  });
}

OffloadFile::Io OffloadFile::write(int64_t r, const void* src, bool exact) {
  LOOM_CHECK(r >= 0 && r < num_records(), "OffloadFile::write: record ", r, " of ", num_records());
  return submit([this, r, src, exact] {
    const uint32_t crc = crc32c(src, static_cast<size_t>(record_bytes(r)));
    try {
      transfer(false, r, const_cast<void*>(src), exact);
    } catch (...) {
      std::lock_guard lock(mu_);
      state_[static_cast<size_t>(r)] = State::lost;  // part written, or none: either way not its values
      throw;
    }
    std::lock_guard lock(mu_);
    crc_[static_cast<size_t>(r)] = crc, state_[static_cast<size_t>(r)] = State::written;
    wrote_ += record_bytes(r);
  });
}

}  // namespace loom::io
