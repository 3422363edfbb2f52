// `loom bench kernels`: GFLOP/s of the CPU matmul (f32, bf16) at square and
// GPT-2 124M shapes, attention forward+backward tokens/s, the serving
// linears and paged attention, and GB/s of the memory-bound ops (norms,
// activations, rope, softmax, cross-entropy, AdamW, embedding, add, cast).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace loom {
class Tensor;
class Pools;
}  // namespace loom

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

// ---- shared by bench/kernels_bench*.cpp ----

struct Timing {
  double best = 0, median = 0;  // seconds
  int reps = 0;
};
// One warm-up call, then repeats until min_seconds have elapsed (at least 3).
Timing measure(const std::function<void()>& run, double min_seconds);
// Whether --filter selects a case: a substring of its op, its kind (a dtype
// or weight type) or its name; every case when the filter is empty.
bool selected(const KernelBenchOptions& opts, const std::string& op, const std::string& kind,
              const std::string& name);
// Uniform values in [-1, 1) from a fixed xorshift stream; t is f32 or bf16.
void fill_random(Tensor t, uint64_t seed);
// The memory-bound ops' cases --filter selects (kernels_bench_ops.cpp); returns how many ran.
int64_t bench_op_cases(Pools& pools, const KernelBenchOptions& opts);
// The decode-chain case (kernels_bench_decode.cpp) when --filter selects it; returns how many ran.
int64_t bench_decode_chain_cases(Pools& pools, const KernelBenchOptions& opts);

}  // namespace loom::bench
