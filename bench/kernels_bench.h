// `loom bench kernels`: GFLOP/s of the CPU matmul (f32, bf16) at square and
// GPT-2 124M shapes, and attention forward+backward tokens/s.
#pragma once

#include <string>

namespace loom::bench {

struct KernelBenchOptions {
  bool json = false;        // JSON Lines instead of a table
  std::string filter;       // only cases whose op, dtype or case name contains this text
  double min_seconds = 0.5; // measure each case at least this long
  int threads = 1;          // recorded in the output
  bool openblas = false;    // also time OpenBLAS sgemm at the f32 matmul cases (the backend comparison)
  std::string command;      // the command line that reproduces the run, printed with the table
};

// Runs the benchmark, prints results to stdout; returns the exit code.
int run_kernel_bench(const KernelBenchOptions& opts);

}  // namespace loom::bench
