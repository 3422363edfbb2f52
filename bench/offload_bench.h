// `loom bench offload`: what the optimizer's disk tier (parallel/offload.h)
// gets from a disk. A file of --size bytes in records of --record bytes is
// written and read back three ways, each after the page cache has let go of
// it (fsync + POSIX_FADV_DONTNEED):
//   raw       one thread, pwrite / pread of one record at a time, O_DIRECT
//             (fio's rw=write / rw=read at bs = record, iodepth 1): the disk's own
//   offload   io::OffloadFile, its I/O threads with --depth records in flight,
//             O_DIRECT (where the filesystem has it)
//   buffered  the same through the page cache (parallel.offload_direct = false)
// Each line gives MB/s and the ratio to raw.
#pragma once

#include <cstdint>
#include <string>

namespace loom::bench {

struct OffloadBenchOptions {
  std::string dir = "/tmp";      // where the file goes (the disk measured)
  int64_t size = int64_t{1} << 30;
  int64_t record = int64_t{4} << 20;
  int threads = 2;               // OffloadFile's I/O threads
  int depth = 4;                 // records in flight (OffloadedState::kSlots)
  bool json = false;
  std::string command;
};

int run_offload_bench(const OffloadBenchOptions& opts);

}  // namespace loom::bench
