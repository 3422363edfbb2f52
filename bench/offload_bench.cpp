// loom bench offload (offload_bench.h).
#include "bench/offload_bench.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <memory>
#include <vector>

#include "core/error.h"
#include "io/offload_file.h"

namespace loom::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct FreeBuffer {
  void operator()(void* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<uint8_t[], FreeBuffer>;

Buffer aligned_buffer(int64_t bytes) {
  auto* p = static_cast<uint8_t*>(std::aligned_alloc(io::kOffloadAlign, static_cast<size_t>(bytes)));
  LOOM_REQUIRE(p != nullptr, "bench offload: cannot allocate ", bytes, " bytes");
  for (int64_t i = 0; i < bytes; ++i) p[i] = static_cast<uint8_t>(i * 2654435761u >> 24);
  return Buffer(p);
}

// Whatever of path the page cache holds, let go (written back first).
void drop_cache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

struct Rates {
  double write_mbs = 0, read_mbs = 0;
  bool direct = false;
};

double mbs(int64_t bytes, Clock::time_point t0) {
  return static_cast<double>(bytes) / 1e6 / std::chrono::duration<double>(Clock::now() - t0).count();
}

// One thread, one record at a time, O_DIRECT where the filesystem has it.
Rates raw_rates(const OffloadBenchOptions& o, const std::string& path) {
  Buffer buf = aligned_buffer(o.record);
  Rates r;
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0600);
  r.direct = fd >= 0;
  if (fd < 0) fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  LOOM_REQUIRE(fd >= 0, "bench offload: cannot create '", path, "': ", std::strerror(errno));
  LOOM_REQUIRE(::posix_fallocate(fd, 0, o.size) == 0, "bench offload: no room for ", o.size, " bytes in ", o.dir);
  const auto all = [&](bool reading) {
    for (int64_t at = 0; at < o.size; at += o.record) {
      const ssize_t n = reading ? ::pread(fd, buf.get(), static_cast<size_t>(o.record), at)
                                : ::pwrite(fd, buf.get(), static_cast<size_t>(o.record), at);
      LOOM_REQUIRE(n == o.record, "bench offload: ", reading ? "pread" : "pwrite", " of '", path, "' at ", at,
                   " returned ", n, ": ", std::strerror(errno));
    }
  };
  auto t0 = Clock::now();
  all(false);
  ::fsync(fd);
  r.write_mbs = mbs(o.size, t0);
  ::close(fd);
  drop_cache(path);
  fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | (r.direct ? O_DIRECT : 0));
  t0 = Clock::now();
  all(true);
  r.read_mbs = mbs(o.size, t0);
  ::close(fd);
  std::filesystem::remove(path);
  return r;
}

// io::OffloadFile: o.depth records in flight over its threads.
Rates offload_rates(const OffloadBenchOptions& o, const std::string& path, bool direct) {
  const int64_t n = o.size / o.record;
  io::OffloadFile f({path, direct, o.threads}, std::vector<int64_t>(static_cast<size_t>(n), o.record));
  std::vector<Buffer> bufs;
  for (int i = 0; i < o.depth; ++i) bufs.push_back(aligned_buffer(f.buffer_bytes(0)));
  const auto all = [&](bool reading) {
    std::deque<io::OffloadFile::Io> flight;
    for (int64_t r = 0; r < n; ++r) {
      if (static_cast<int>(flight.size()) == o.depth) io::OffloadFile::wait(flight.front()), flight.pop_front();
      uint8_t* b = bufs[static_cast<size_t>(r % o.depth)].get();
      flight.push_back(reading ? f.read(r, b) : f.write(r, b));
    }
    for (const auto& io : flight) io::OffloadFile::wait(io);
  };
  Rates rates;
  rates.direct = f.direct();
  auto t0 = Clock::now();
  all(false);
  drop_cache(path);  // the writes on disk (buffered: out of the cache too)
  rates.write_mbs = mbs(o.size, t0);
  t0 = Clock::now();
  all(true);
  rates.read_mbs = mbs(o.size, t0);
  return rates;
}

}  // namespace

int run_offload_bench(const OffloadBenchOptions& o) {
  LOOM_REQUIRE(o.record >= io::kOffloadAlign && o.record % io::kOffloadAlign == 0 && o.size >= o.record,
               "bench offload: --record must be a multiple of ", io::kOffloadAlign, " bytes and --size at least one");
  const std::string path = (std::filesystem::path(o.dir) / concat("loom-bench-offload-", ::getpid(), ".bin")).string();
  const int64_t size = o.size / o.record * o.record;
  OffloadBenchOptions s = o;
  s.size = size;
  const Rates raw = raw_rates(s, path), direct = offload_rates(s, path, true), cached = offload_rates(s, path, false);
  if (o.json) {
    for (const auto& [name, r] : {std::pair{"raw", raw}, {"offload", direct}, {"buffered", cached}})
      std::printf("{\"method\": \"%s\", \"size\": %lld, \"record\": %lld, \"threads\": %d, \"depth\": %d, \"direct\": %s, "
                  "\"write_MBps\": %.1f, \"read_MBps\": %.1f}\n",
                  name, static_cast<long long>(size), static_cast<long long>(o.record), o.threads, o.depth,
                  r.direct ? "true" : "false", r.write_mbs, r.read_mbs);
    return 0;
  }
  std::printf("# %s\n# %lld MiB in records of %lld KiB under %s\n", o.command.c_str(),
              static_cast<long long>(size >> 20), static_cast<long long>(o.record >> 10), o.dir.c_str());
  std::printf("%-10s %-8s %12s %12s %10s %10s\n", "path", "O_DIRECT", "write MB/s", "read MB/s", "w vs raw", "r vs raw");
  for (const auto& [name, r] : {std::pair{"raw", raw}, {"offload", direct}, {"buffered", cached}})
    std::printf("%-10s %-8s %12.1f %12.1f %10.2f %10.2f\n", name, r.direct ? "yes" : "no", r.write_mbs, r.read_mbs,
                r.write_mbs / raw.write_mbs, r.read_mbs / raw.read_mbs);
  std::printf("(raw: one thread, one record at a time; offload: %d I/O threads, %d records in flight)\n", o.threads,
              o.depth);
  return 0;
}

}  // namespace loom::bench
