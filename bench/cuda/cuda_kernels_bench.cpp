// bench_cuda_kernels: the CUDA backend's ops at gpt2-124m training sizes
// (B = 8, T = 1024, C = 768, V = 50257) and a square GEMM, timed with CUDA
// events (mean of the timed repetitions after warm-ups), printed one JSON
// object per line with the bound each is measured against: TFLOP/s for the
// GEMMs and attention, GB/s of bytes read and written for the memory-bound
// ops. bench/cuda/torch_kernels_bench.py times the same ops in PyTorch on
// the same GPU (scripts/gpu-check.sh runs both).
//
//   build-gpu/bench/cuda/bench_cuda_kernels [--reps N]
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/memory.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/ops.h"

namespace {

using namespace loom;
using namespace loom::kernels;

int g_reps = 20;

// Mean milliseconds of fn over g_reps runs after 3 warm-ups.
double time_ms(const std::function<void()>& fn) {
  for (int i = 0; i < 3; ++i) fn();
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  const auto ops = static_cast<cudaStream_t>(cuda_stream().handle);  // where the ops are enqueued
  cudaEventRecord(start, ops);
  for (int i = 0; i < g_reps; ++i) fn();
  cudaEventRecord(stop, ops);
  cudaEventSynchronize(stop);
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cuda_synchronize();
  return ms / g_reps;
}

void report(const std::string& op, const std::string& shape, DType dt, double ms, double flops, double bytes) {
  std::printf("{\"bench\":\"cuda_kernels\",\"op\":\"%s\",\"shape\":\"%s\",\"dtype\":\"%s\",\"ms\":%.4f", op.c_str(),
              shape.c_str(), std::string(dtype_name(dt)).c_str(), ms);
  if (flops > 0) std::printf(",\"tflops\":%.1f", flops / ms / 1e9);
  if (bytes > 0) std::printf(",\"gbps\":%.0f", bytes / ms / 1e6);
  std::printf("}\n");
  std::fflush(stdout);
}

struct Bench {
  Pools pools{Device::cuda(0)};
  OwnedTensor make(DType dt, Shape s, float value) {
    OwnedTensor t = pools[MemTag::workspace].empty(dt, s);
    fill(t, value);
    return t;
  }
  // Values that keep softmax and norms finite: a small constant, perturbed by
  // nothing (the ops' speed does not depend on the values).
  OwnedTensor make(DType dt, Shape s) { return make(dt, s, 0.01f); }
};

void gemms(Bench& b) {
  for (DType dt : {DType::bf16, DType::f32}) {
    const int64_t n = dt == DType::f32 ? 4096 : 8192;
    auto a = b.make(dt, {n, n}), w = b.make(dt, {n, n}), c = b.make(dt, {n, n});
    const double ms = time_ms([&] { matmul(c, a, w); });
    report("matmul", std::to_string(n) + "^3", dt, ms, 2.0 * n * n * n, 0);
  }
  // gpt2-124m's linears at B*T = 8192 tokens, forward and backward.
  struct Lin {
    const char* name;
    int64_t in, out;
  };
  const int64_t n = 8192;
  for (Lin l : {Lin{"qkv", 768, 2304}, Lin{"attn_proj", 768, 768}, Lin{"fc", 768, 3072}, Lin{"mlp_proj", 3072, 768},
                Lin{"lm_head", 768, 50304}, Lin{"lm_head_v50257", 768, 50257}}) {  // 50257: GPT-2's, slow in cuBLASLt
    const DType dt = DType::bf16;
    auto x = b.make(dt, {n, l.in}), w = b.make(dt, {l.out, l.in}), y = b.make(dt, {n, l.out});
    auto bias = b.make(dt, {l.out});
    auto dx = b.make(dt, {n, l.in}), dw = b.make(DType::f32, {l.out, l.in}), dbias = b.make(DType::f32, {l.out});
    const double flops = 2.0 * n * l.in * l.out;
    report(std::string("linear_forward_") + l.name, std::to_string(n) + "x" + std::to_string(l.in) + "->" +
           std::to_string(l.out), dt, time_ms([&] { linear_forward(y, x, w, bias); }), flops, 0);
    report(std::string("linear_backward_") + l.name, std::to_string(n) + "x" + std::to_string(l.in) + "->" +
           std::to_string(l.out), dt, time_ms([&] { linear_backward(dx, dw, dbias, y, x, w); }), 2 * flops, 0);
  }
}

void attention(Bench& b) {
  const int64_t B = 8, T = 1024, NH = 12, HS = 64;
  for (DType dt : {DType::bf16, DType::f32}) {
    auto q = b.make(dt, {B, T, NH, HS}), k = b.make(dt, {B, T, NH, HS}), v = b.make(dt, {B, T, NH, HS});
    auto out = b.make(dt, {B, T, NH, HS}), lse = b.make(DType::f32, {B, NH, T});
    auto dq = b.make(dt, {B, T, NH, HS}), dk = b.make(dt, {B, T, NH, HS}), dv = b.make(dt, {B, T, NH, HS});
    // Causal: half of the T x T scores. Forward 2 GEMMs, backward 5 (FlashAttention-2's count).
    const double fwd = 2.0 * 2 * B * NH * T * T * HS / 2;
    const std::string shape = "B8 T1024 NH12 HS64 causal";
    report("attention_forward", shape, dt, time_ms([&] { attention_forward(out, lse, q, k, v); }), fwd, 0);
    report("attention_backward", shape, dt,
           time_ms([&] { attention_backward(dq, dk, dv, out, q, k, v, out, lse); }), 2.5 * fwd, 0);
    if (dt == DType::bf16) {  // a bf16 run's dout is f32: rounded once, then the same kernels
      auto dout = b.make(DType::f32, {B, T, NH, HS});
      report("attention_backward_f32_dout", shape, dt,
             time_ms([&] { attention_backward(dq, dk, dv, dout, q, k, v, out, lse); }), 2.5 * fwd, 0);
    }
  }
}

void memory_bound(Bench& b) {
  const int64_t N = 8192, C = 768, V = 50257;
  const DType dt = DType::bf16;
  {
    auto x = b.make(dt, {N, C}), w = b.make(dt, {C}), bias = b.make(dt, {C}), y = b.make(dt, {N, C});
    auto mean = b.make(DType::f32, {N}), rstd = b.make(DType::f32, {N});
    auto dx = b.make(dt, {N, C}), dw = b.make(DType::f32, {C}), db = b.make(DType::f32, {C});
    const double bytes = 2.0 * N * C * 2;
    report("layernorm_forward", "8192x768", dt, time_ms([&] { layernorm_forward(y, mean, rstd, x, w, bias, 1e-5f); }),
           0, bytes);
    report("layernorm_backward", "8192x768", dt,
           time_ms([&] { layernorm_backward(dx, dw, db, y, x, w, mean, rstd); }), 0, 2.0 * bytes);
    auto g = b.make(dt, {N, 4 * C}), gy = b.make(dt, {N, 4 * C});
    report("gelu_forward", "8192x3072", dt, time_ms([&] { gelu_forward(gy, g); }), 0, 2.0 * N * 4 * C * 2);
  }
  {
    auto logits = b.make(dt, {N, V}), dlogits = b.make(dt, {N, V}), losses = b.make(DType::f32, {N});
    auto targets = b.pools[MemTag::workspace].empty(DType::i32, {N});
    arange(targets, 0);
    report("cross_entropy_forward_backward", "8192x50257", dt,
           time_ms([&] { cross_entropy_forward_backward(dlogits, losses, logits, targets); }), 0, 2.0 * N * V * 2);
  }
  {
    const int64_t P = 124475904;  // gpt2-124m's parameters
    auto p = b.make(DType::f32, {P}), m = b.make(DType::f32, {P}), v = b.make(DType::f32, {P});
    auto g = b.make(DType::f32, {P}), copy = b.make(dt, {P});
    AdamWConfig cfg;
    cfg.weight_decay = 0.1f;
    // Reads p, m, v, g (f32), writes p, m, v (f32) and the bf16 copy.
    report("adamw_step", "124475904", DType::f32, time_ms([&] { adamw_step(p, m, v, g, copy, cfg); }), 0,
           P * (4.0 * 4 + 3.0 * 4 + 2));
  }
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) g_reps = std::atoi(argv[++i]);
  }
  const std::string why = cuda_unavailable_reason(0);
  if (!why.empty()) {
    std::fprintf(stderr, "bench_cuda_kernels: no GPU: %s\n", why.c_str());
    return 1;
  }
  register_cuda_backend(0);
  std::printf("# bench_cuda_kernels on %s; reproduce: bench_cuda_kernels --reps %d\n",
              cuda_device_description(0).c_str(), g_reps);
  Bench b;
  try {
    gemms(b);
    attention(b);
    memory_bound(b);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda_kernels: %s\n", e.what());
    return 1;
  }
  return 0;
}
