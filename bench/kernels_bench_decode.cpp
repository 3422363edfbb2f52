// `loom bench kernels`' decode-chain case (kernels_bench.h): the weight
// stream of a decode step through the batch-invariant linear.
#include <cstdio>
#include <string>
#include <vector>

#include "bench/kernels_bench.h"
#include "core/memory.h"
#include "kernels/cpu_isa.h"
#include "kernels/ops.h"

namespace loom::bench {
namespace {

struct Linear {
  const char* name;
  int64_t in, out;
};

// The weight stream of a decode step: one row through every linear of a
// ~1B llama's first kLayers layers (q, k, v, o 2048 x 2048 with 4 kv heads of
// 64; gate, up 5632 x 2048; down 2048 x 5632), each matrix its own memory
// (f32: 0.7 GB, far past any cache), one call after another as the engine
// makes them. GB/s counts every weight byte once: the rate a decode step
// streams weights at, against bench serve's read bound. A single matrix
// (gpt2_lm_head, M = 1) shows the steady stream; this shows what the starts
// and ends of 28 calls cost.
constexpr int64_t kChainLayers = 4;
constexpr Linear kChainLinears[] = {{"q", 2048, 2048},    {"k", 2048, 256},     {"v", 2048, 256},
                                           {"o", 2048, 2048},    {"gate", 2048, 5632}, {"up", 2048, 5632},
                                           {"down", 5632, 2048}};

void bench_decode_chain(Pools& pools, const KernelBenchOptions& opts, DType dtype) {
  Pool& pool = pools[MemTag::workspace];
  std::vector<OwnedTensor> ws, xs, ys;
  int64_t bytes = 0;
  for (int64_t layer = 0; layer < kChainLayers; ++layer)
    for (const Linear& l : kChainLinears) {
      ws.push_back(pool.empty(dtype, {l.out, l.in}));
      xs.push_back(pool.empty(dtype, {1, l.in}));
      ys.push_back(pool.empty(dtype, {1, l.out}));
      fill_random(ws.back(), 8 + ws.size());
      fill_random(xs.back(), 7);
      bytes += ws.back().nbytes();
    }
  const Timing t = measure(
      [&] {
        for (size_t i = 0; i < ws.size(); ++i) kernels::linear_forward_invariant(ys[i], xs[i], ws[i], Tensor());
      },
      opts.min_seconds);
  const double gbps = static_cast<double>(bytes) / t.best / 1e9;
  const std::string name = "llama1b_decode_chain";
  if (opts.json) {
    std::printf("{\"op\":\"linear_invariant\",\"dtype\":\"%s\",\"case\":\"%s\",\"m\":1,\"calls\":%zu,"
                "\"weight_bytes\":%lld,\"seconds\":%.6g,\"median_seconds\":%.6g,\"reps\":%d,"
                "\"weight_gb_per_s\":%.2f,\"threads\":%d,\"isa\":\"%s\"}\n",
                dtype_name(dtype).data(), name.c_str(), ws.size(), static_cast<long long>(bytes), t.best, t.median,
                t.reps, gbps, opts.threads, kernels::cpu_isa_name(kernels::cpu_isa()));
  } else {
    std::printf("%-16s %-5s %-20s %6d %6zu %6s %10.4f %10.4f %9s %9.2f\n", "linear_invariant",
                dtype_name(dtype).data(), name.c_str(), 1, ws.size(), "", t.best * 1e3, t.median * 1e3, "",
                gbps);
  }
  std::fflush(stdout);
}

}  // namespace

int64_t bench_decode_chain_cases(Pools& pools, const KernelBenchOptions& opts) {
  int64_t measured = 0;
  for (DType dtype : {DType::f32, DType::bf16}) {
    if (!selected(opts, "linear_invariant", std::string(dtype_name(dtype)), "llama1b_decode_chain")) continue;
    if (!opts.json && measured == 0)
      std::printf("\n%-16s %-5s %-20s %6s %6s %6s %10s %10s %9s %9s\n", "op", "dtype", "case", "m", "calls", "",
                  "best_ms", "median_ms", "", "w GB/s");
    ++measured;
    bench_decode_chain(pools, opts, dtype);
  }
  return measured;
}

}  // namespace loom::bench
