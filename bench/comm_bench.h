// `loom bench comm`: time and bandwidth of one collective over the ranks of
// an mpirun job, from --min to --max bytes (doubling), in the nccl-tests
// convention: algbw = size / time; busbw = algbw · 2(n-1)/n for all_reduce,
// · (n-1)/n for reduce_scatter, all_gather and all_to_all, where size is
// the full buffer (all_reduce's buffer, reduce_scatter's input, all_gather's
// output, all_to_all's send buffer).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace loom::bench {

struct CommBenchOptions {
  std::string op = "all_reduce";  // all_reduce | reduce_scatter | all_gather | all_to_all
  std::string algo = "mpi";       // mpi | ring (comm::Algo)
  int64_t min_bytes = 1 << 10;
  int64_t max_bytes = int64_t{256} << 20;
  int iters = 20;                 // at most this many timed iterations per size (at least 3, ~1 s per size)
  int warmup = 2;
  bool check_collectives = false; // measure the cost of --check-collectives
  bool json = false;
  std::string command;            // the command line that reproduces the run
};

// The largest --min / --max: 2^31-1 f32 elements (MPI counts are int), so
// sizes and their doubling never overflow int64.
inline constexpr int64_t kMaxBenchBytes = ((int64_t{1} << 31) - 1) * 4;
// "1K", "256M", "1G", "4096" -> bytes (binary units); loom::Error otherwise,
// also above kMaxBenchBytes.
int64_t parse_bytes(std::string_view text);
// Runs on every rank of the job; rank 0 prints. Returns the exit code.
int run_comm_bench(const CommBenchOptions& opts);

}  // namespace loom::bench
