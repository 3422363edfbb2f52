// `loom bench kernels`: matmul GFLOP/s at square shapes and at every GEMM of a
// GPT-2 124M training step, attention forward+backward tokens/s, and the
// serving linears (oneDNN vs the batch-invariant kernel) at 1 to 512 rows,
// the quantized serving linear (every weight type of kernels/quant.h) at 1 and 64
// rows, the paged attention of a decode step (K/V GB/s), and the memory-bound
// ops of a training and a decode step (GB/s, kernels_bench_ops.cpp).
//
// Each case runs once to warm up (creating the oneDNN primitive, touching
// the pages), then repeats until --seconds have elapsed (at least 3 times).
// The reported time is the BEST repetition (the machine is shared: the
// minimum is the most reproducible statistic); the median is printed too.
// tests/ref/bench_torch_kernels.py measures the same cases in PyTorch.
#include "bench/kernels_bench.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/memory.h"
#include "kernels/cpu_isa.h"
#include "kernels/ops.h"
#include "kernels/quant.h"

namespace loom::bench {
namespace {

// GPT-2 124M, one training step of B*T = 512 rows (also in bench_torch_kernels.py).
constexpr int64_t kRows = 512, kC = 768, kV = 50257;

// c (M, N) = op(a) @ op(b) (+= with beta = 1, the backward convention).
struct MatmulCase {
  std::string name;
  int64_t m, n, k;
  bool trans_a, trans_b;
  float beta;
};

std::vector<MatmulCase> matmul_cases() {
  std::vector<MatmulCase> cases;
  for (int64_t s : {1024, 2048, 4096}) cases.push_back({"square_" + std::to_string(s), s, s, s, false, false, 0.f});
  struct Linear {
    const char* name;
    int64_t in, out;
  };
  const Linear linears[] = {{"qkv", kC, 3 * kC}, {"attn_proj", kC, kC}, {"fc", kC, 4 * kC},
                            {"mlp_proj", 4 * kC, kC}, {"lm_head", kC, kV}};
  // linear: y = x @ w^T, dx += dy @ w, dw += dy^T @ x   (x: (rows, in), w: (out, in))
  for (const Linear& l : linears) {
    const std::string name = std::string("gpt2_") + l.name;
    cases.push_back({name + "_fwd", kRows, l.out, l.in, false, true, 0.f});
    cases.push_back({name + "_dx", kRows, l.in, l.out, false, false, 1.f});
    cases.push_back({name + "_dw", l.out, l.in, kRows, true, false, 1.f});
  }
  return cases;
}

struct AttentionCase {
  int64_t b, t, nh, hs;
};
const AttentionCase kAttentionCases[] = {{1, 512, 12, 64}, {1, 1024, 12, 64}};

}  // namespace

bool selected(const KernelBenchOptions& opts, const std::string& op, const std::string& kind,
              const std::string& name) {
  if (opts.filter.empty()) return true;
  for (const std::string* s : {&op, &kind, &name})
    if (s->find(opts.filter) != std::string::npos) return true;
  return false;
}

Timing measure(const std::function<void()>& run, double min_seconds) {
  using clock = std::chrono::steady_clock;
  run();  // warm-up
  std::vector<double> times;
  const auto start = clock::now();
  while (times.size() < 3 || std::chrono::duration<double>(clock::now() - start).count() < min_seconds) {
    const auto t0 = clock::now();
    run();
    times.push_back(std::chrono::duration<double>(clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  return {times.front(), times[times.size() / 2], static_cast<int>(times.size())};
}

void fill_random(Tensor t, uint64_t seed) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < t.numel(); ++i) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    const float v = static_cast<float>(s >> 40) / static_cast<float>(1 << 23) - 1.f;
    if (t.dtype() == DType::f32) t.data_as<float>()[i] = v;
    else t.data_as<bf16>()[i] = to_bf16(v);
  }
}

namespace {

// Random bytes from a fixed xorshift stream.
void fill_random_bytes(Tensor t, uint64_t seed) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  auto* p = static_cast<uint8_t*>(t.data());
  for (size_t i = 0; i < t.nbytes(); ++i) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    p[i] = static_cast<uint8_t>(s >> 32);
  }
}

// The code that ran op: loom's kernels at the running level (cpu_isa.h),
// oneDNN's GEMM at its own, or OpenBLAS.
std::string isa_of(const std::string& op) {
  if (op == "matmul") return std::string("onednn:") + kernels::onednn_isa_name();
  if (op == "matmul_openblas") return "openblas";
  return kernels::cpu_isa_name(kernels::cpu_isa());
}

bool selected(const KernelBenchOptions& opts, const std::string& op, DType dtype, const std::string& name) {
  return bench::selected(opts, op, std::string(dtype_name(dtype)), name);
}

void print_matmul(const KernelBenchOptions& opts, const char* op, DType dtype, const MatmulCase& c, Timing t) {
  const double gflops = 2.0 * c.m * c.n * c.k / t.best / 1e9;
  if (opts.json) {
    std::printf(
        "{\"op\":\"%s\",\"dtype\":\"%s\",\"case\":\"%s\",\"m\":%lld,\"n\":%lld,\"k\":%lld,\"trans_a\":%s,"
        "\"trans_b\":%s,\"beta\":%g,\"seconds\":%.6g,\"median_seconds\":%.6g,\"reps\":%d,\"gflops\":%.2f,"
        "\"threads\":%d,\"isa\":\"%s\"}\n",
        op, dtype_name(dtype).data(), c.name.c_str(), static_cast<long long>(c.m), static_cast<long long>(c.n),
        static_cast<long long>(c.k), c.trans_a ? "true" : "false", c.trans_b ? "true" : "false", c.beta, t.best,
        t.median, t.reps, gflops, opts.threads, isa_of(op).c_str());
  } else {
    std::printf("%-16s %-5s %-20s %6lld %6lld %6lld %3s %3s %4g %10.3f %10.3f %9.1f\n", op, dtype_name(dtype).data(),
                c.name.c_str(), static_cast<long long>(c.m), static_cast<long long>(c.n),
                static_cast<long long>(c.k), c.trans_a ? "T" : "N", c.trans_b ? "T" : "N", c.beta, t.best * 1e3,
                t.median * 1e3, gflops);
  }
  std::fflush(stdout);
}

// Operands stored as the case reads them: a is (K, M) when trans_a, b is (N, K) when trans_b.
Timing time_matmul(Pools& pools, DType dtype, const MatmulCase& c, double min_seconds, bool openblas) {
  Pool& pool = pools[MemTag::workspace];
  OwnedTensor a = pool.empty(dtype, c.trans_a ? Shape{c.k, c.m} : Shape{c.m, c.k});
  OwnedTensor b = pool.empty(dtype, c.trans_b ? Shape{c.n, c.k} : Shape{c.k, c.n});
  OwnedTensor out = pool.zeros(dtype, {c.m, c.n});
  fill_random(a, 1);
  fill_random(b, 2);
  if (!openblas) {
    const kernels::MatmulOpts o{c.trans_a, c.trans_b, 1.f, c.beta};
    return measure([&] { kernels::matmul(out, a, b, o); }, min_seconds);
  }
  // The backend comparison behind src/kernels/cpu/matmul.cpp's choice (f32 only:
  // Debian's OpenBLAS exports no bf16 GEMM).
  return measure(
      [&] {
        cblas_sgemm(CblasRowMajor, c.trans_a ? CblasTrans : CblasNoTrans, c.trans_b ? CblasTrans : CblasNoTrans,
                    c.m, c.n, c.k, 1.f, a.data_as<float>(), c.trans_a ? c.m : c.k, b.data_as<float>(),
                    c.trans_b ? c.k : c.n, c.beta, out.data_as<float>(), c.n);
      },
      min_seconds);
}

void bench_attention(Pools& pools, const KernelBenchOptions& opts, DType dtype, const AttentionCase& c) {
  Pool& pool = pools[MemTag::workspace];
  const Shape shape{c.b, c.t, c.nh, c.hs};
  OwnedTensor q = pool.empty(dtype, shape), k = pool.empty(dtype, shape), v = pool.empty(dtype, shape);
  OwnedTensor out = pool.empty(dtype, shape), dout = pool.empty(dtype, shape);
  OwnedTensor dq = pool.zeros(dtype, shape), dk = pool.zeros(dtype, shape), dv = pool.zeros(dtype, shape);
  OwnedTensor lse = pool.empty(DType::f32, {c.b, c.nh, c.t});
  fill_random(q, 3);
  fill_random(k, 4);
  fill_random(v, 5);
  fill_random(dout, 6);
  const Timing t = measure(
      [&] {
        kernels::attention_forward(out, lse, q, k, v);
        kernels::attention_backward(dq, dk, dv, dout, q, k, v, out, lse);
      },
      opts.min_seconds);
  const double tokens_per_s = static_cast<double>(c.b * c.t) / t.best;
  if (opts.json) {
    std::printf(
        "{\"op\":\"attention_fwd_bwd\",\"dtype\":\"%s\",\"b\":%lld,\"t\":%lld,\"nh\":%lld,\"hs\":%lld,"
        "\"seconds\":%.6g,\"median_seconds\":%.6g,\"reps\":%d,\"tokens_per_s\":%.1f,\"threads\":%d,\"isa\":\"%s\"}\n",
        dtype_name(dtype).data(), static_cast<long long>(c.b), static_cast<long long>(c.t),
        static_cast<long long>(c.nh), static_cast<long long>(c.hs), t.best, t.median, t.reps, tokens_per_s,
        opts.threads, isa_of("attention_fwd_bwd").c_str());
  } else {
    std::printf("%-18s %-5s b=%lld t=%-5lld nh=%-3lld hs=%-3lld %10.3f %10.3f %12.0f\n", "attention_fwd_bwd",
                dtype_name(dtype).data(), static_cast<long long>(c.b), static_cast<long long>(c.t),
                static_cast<long long>(c.nh), static_cast<long long>(c.hs), t.best * 1e3, t.median * 1e3,
                tokens_per_s);
  }
  std::fflush(stdout);
}

// The serving path's linears (y = x @ w^T at gpt2-124m's shapes, M rows):
// oneDNN's linear_forward (training's) next to linear_forward_invariant
// (the engine's, batch invariant), so the price of invariance is measured
// where it is paid. GB/s counts w's bytes once: at M = 1 it is the bandwidth
// the decode step gets.
struct ServingLinear {
  const char* name;
  int64_t in, out;
};
constexpr ServingLinear kServingLinears[] = {
    {"qkv", kC, 3 * kC}, {"attn_proj", kC, kC}, {"fc", kC, 4 * kC}, {"mlp_proj", 4 * kC, kC}, {"lm_head", kC, kV}};
constexpr int64_t kServingRows[] = {1, 8, 64, 128, 256, 512};

void bench_serving_linear(Pools& pools, const KernelBenchOptions& opts, const char* op, DType dtype,
                          const ServingLinear& l, int64_t m) {
  Pool& pool = pools[MemTag::workspace];
  OwnedTensor x = pool.empty(dtype, {m, l.in}), w = pool.empty(dtype, {l.out, l.in});
  OwnedTensor y = pool.empty(dtype, {m, l.out});
  fill_random(x, 7);
  fill_random(w, 8);
  const bool invariant = std::string(op) == "linear_invariant";
  const Timing t = measure(
      [&] {
        if (invariant) kernels::linear_forward_invariant(y, x, w, Tensor());
        else kernels::linear_forward(y, x, w, Tensor());
      },
      opts.min_seconds);
  const double gflops = 2.0 * m * l.out * l.in / t.best / 1e9;
  const double gbps = static_cast<double>(w.nbytes()) / t.best / 1e9;
  const std::string name = std::string("gpt2_") + l.name;
  if (opts.json) {
    std::printf("{\"op\":\"%s\",\"dtype\":\"%s\",\"case\":\"%s\",\"m\":%lld,\"n\":%lld,\"k\":%lld,\"seconds\":%.6g,"
                "\"median_seconds\":%.6g,\"reps\":%d,\"gflops\":%.2f,\"weight_gb_per_s\":%.2f,\"threads\":%d,\"isa\":\"%s\"}\n",
                op, dtype_name(dtype).data(), name.c_str(), static_cast<long long>(m),
                static_cast<long long>(l.out), static_cast<long long>(l.in), t.best, t.median, t.reps, gflops, gbps,
                opts.threads, isa_of(op).c_str());
  } else {
    std::printf("%-16s %-5s %-16s %6lld %6lld %6lld %10.4f %10.4f %9.1f %9.2f\n", op, dtype_name(dtype).data(),
                name.c_str(), static_cast<long long>(m), static_cast<long long>(l.out), static_cast<long long>(l.in),
                t.best * 1e3, t.median * 1e3, gflops, gbps);
  }
  std::fflush(stdout);
}

// The quantized serving linears (linear_forward_quantized) at gpt2-124m's MLP
// shapes, decode (1 row; 8: eight sequences decoding) and prefill (64, 512): weights of random block bytes
// (finite f16 scales; the speed does not depend on the values). GFLOP/s
// counts 2 M N K; GB/s counts w's bytes once, as linear_invariant's does.
constexpr ServingLinear kQuantLinears[] = {{"fc", kC, 4 * kC}, {"mlp_proj", 4 * kC, kC}};
constexpr int64_t kQuantRows[] = {1, 4, 8, 64, 512};
constexpr kernels::QuantType kQuantTypes[] = {
    kernels::QuantType::q8_0, kernels::QuantType::q4_0, kernels::QuantType::q4_1, kernels::QuantType::q5_0,
    kernels::QuantType::q5_1, kernels::QuantType::q2_K, kernels::QuantType::q3_K, kernels::QuantType::q4_K,
    kernels::QuantType::q5_K, kernels::QuantType::q6_K};

// Random block bytes with every f16 scale (kernels::quant_f16_offsets) set
// to a small finite value.
void fill_quantized(Tensor w, kernels::QuantType t) {
  fill_random_bytes(w, 12);
  const size_t bytes = kernels::quant_block_bytes(t), n = static_cast<size_t>(w.numel());
  const f16 scale = to_f16(1e-3f);
  auto* p = w.data_as<uint8_t>();
  size_t at[2];
  const int fields = kernels::quant_f16_offsets(t, at);
  for (size_t off = 0; off < n; off += bytes)
    for (int i = 0; i < fields; ++i) std::memcpy(p + off + at[i], &scale, sizeof scale);
}

void bench_quant_linear(Pools& pools, const KernelBenchOptions& opts, kernels::QuantType type, const ServingLinear& l,
                        int64_t m) {
  Pool& pool = pools[MemTag::workspace];
  const auto row_bytes = static_cast<int64_t>(kernels::quant_row_bytes(type, l.in));
  OwnedTensor x = pool.empty(DType::f32, {m, l.in}), w = pool.empty(DType::u8, {l.out, row_bytes});
  OwnedTensor y = pool.empty(DType::f32, {m, l.out});
  fill_random(x, 7);
  fill_quantized(w, type);
  const Timing t = measure([&] { kernels::linear_forward_quantized(y, x, w, type, Tensor()); }, opts.min_seconds);
  const double gflops = 2.0 * m * l.out * l.in / t.best / 1e9;
  const double gbps = static_cast<double>(w.nbytes()) / t.best / 1e9;
  const std::string name = std::string("gpt2_") + l.name, wtype(kernels::quant_name(type));
  if (opts.json) {
    std::printf("{\"op\":\"linear_quant\",\"dtype\":\"%s\",\"case\":\"%s\",\"m\":%lld,\"n\":%lld,\"k\":%lld,"
                "\"seconds\":%.6g,\"median_seconds\":%.6g,\"reps\":%d,\"gflops\":%.2f,\"weight_gb_per_s\":%.2f,"
                "\"threads\":%d,\"isa\":\"%s\"}\n",
                wtype.c_str(), name.c_str(), static_cast<long long>(m), static_cast<long long>(l.out),
                static_cast<long long>(l.in), t.best, t.median, t.reps, gflops, gbps, opts.threads,
                isa_of("linear_quant").c_str());
  } else {
    std::printf("%-16s %-5s %-16s %6lld %6lld %6lld %10.4f %10.4f %9.1f %9.2f\n", "linear_quant", wtype.c_str(),
                name.c_str(), static_cast<long long>(m), static_cast<long long>(l.out), static_cast<long long>(l.in),
                t.best * 1e3, t.median * 1e3, gflops, gbps);
  }
  std::fflush(stdout);
}

// The quantized linear cases --filter selects (by op, weight type or case
// name); returns how many ran.
int64_t bench_quant_linear_cases(Pools& pools, const KernelBenchOptions& opts) {
  int64_t measured = 0;
  for (kernels::QuantType type : kQuantTypes) {
    for (const ServingLinear& l : kQuantLinears) {
      const std::string name = std::string("gpt2_") + l.name;
      if (!selected(opts, "linear_quant", std::string(kernels::quant_name(type)), name)) continue;
      for (int64_t m : kQuantRows) {
        if (!opts.json && measured == 0)
          std::printf("\n%-16s %-5s %-16s %6s %6s %6s %10s %10s %9s %9s\n", "op", "wtype", "case", "m", "n", "k",
                      "best_ms", "median_ms", "GFLOP/s", "w GB/s");
        ++measured;
        bench_quant_linear(pools, opts, type, l, m);
      }
    }
  }
  return measured;
}

// The serving path's attention over a paged cache (blocks of 16 in shuffled
// order, as a pool hands them out after churn) with gpt2-124m's heads, all
// 12 layers in turn as in a step, so the K/V come from memory as they do
// there. A decode case is S sequences of L tokens with one query row each:
// GB/s counts the K/V bytes the step must read (every layer's keys and
// values of every sequence once), decode attention's bound being memory
// bandwidth. A prefill case is one sequence's L rows at once, causal: it
// prints tokens/s and GFLOP/s (QK^T and PV over the keys each row sees).
struct PagedCase {
  int64_t s, len;
  bool prefill;
};
constexpr PagedCase kPagedCases[] = {{1, 256, false}, {32, 256, false}, {4, 1024, false}, {1, 512, true}};
constexpr int64_t kPagedLayers = 12, kPagedHeads = 12, kPagedHs = 64, kPagedBlock = 16;

void bench_paged_attention(Pools& pools, const KernelBenchOptions& opts, DType dtype, const PagedCase& c) {
  Pool& pool = pools[MemTag::workspace];
  const int64_t per_seq = (c.len + kPagedBlock - 1) / kPagedBlock, NB = c.s * per_seq;
  const int64_t q_len = c.prefill ? c.len : 1, rows = c.s * q_len;
  std::vector<OwnedTensor> k_caches, v_caches;
  for (int64_t l = 0; l < kPagedLayers; ++l) {
    k_caches.push_back(pool.empty(dtype, {NB, kPagedBlock, kPagedHeads, kPagedHs}));
    v_caches.push_back(pool.empty(dtype, {NB, kPagedBlock, kPagedHeads, kPagedHs}));
    fill_random(k_caches.back(), 10 + 2 * l);
    fill_random(v_caches.back(), 11 + 2 * l);
  }
  OwnedTensor q = pool.empty(dtype, {rows, kPagedHeads, kPagedHs});
  OwnedTensor out = pool.empty(dtype, {rows, kPagedHeads, kPagedHs});
  fill_random(q, 9);
  OwnedTensor tables = pool.empty(DType::i32, {c.s, per_seq}), lens = pool.empty(DType::i32, {c.s});
  OwnedTensor starts = pool.empty(DType::i32, {c.s + 1});
  std::vector<int32_t> order(static_cast<size_t>(NB));
  for (int64_t b = 0; b < NB; ++b) order[static_cast<size_t>(b)] = static_cast<int32_t>(b);
  uint64_t r = 0x2545F4914F6CDD1Dull;  // a fixed shuffle (Fisher-Yates, xorshift)
  for (int64_t b = NB - 1; b > 0; --b) {
    r ^= r << 13, r ^= r >> 7, r ^= r << 17;
    std::swap(order[static_cast<size_t>(b)], order[r % static_cast<uint64_t>(b + 1)]);
  }
  std::copy(order.begin(), order.end(), tables.data_as<int32_t>());
  for (int64_t i = 0; i < c.s; ++i) lens.data_as<int32_t>()[i] = static_cast<int32_t>(c.len);
  for (int64_t i = 0; i <= c.s; ++i) starts.data_as<int32_t>()[i] = static_cast<int32_t>(i * q_len);
  const Timing t = measure(
      [&] {
        for (int64_t l = 0; l < kPagedLayers; ++l)
          kernels::paged_attention_forward(out, q, k_caches[l], v_caches[l], tables, lens, starts);
      },
      opts.min_seconds);
  const char* op = c.prefill ? "paged_attention_prefill" : "paged_attention_decode";
  // Decode: GB/s of K/V. Prefill: tokens/s, and GFLOP/s over the (L + 1) L / 2
  // (row, key) pairs, 4 HS flops each per head and layer.
  const double kv_bytes = 2.0 * kPagedLayers * c.s * c.len * kPagedHeads * kPagedHs * dtype_size(dtype);
  const double flops = 4.0 * kPagedHs * kPagedHeads * kPagedLayers * c.s * (c.len + 1) * c.len / 2;
  const double figure = c.prefill ? flops / t.best / 1e9 : kv_bytes / t.best / 1e9;
  if (opts.json) {
    std::printf("{\"op\":\"%s\",\"dtype\":\"%s\",\"seqs\":%lld,\"context\":%lld,"
                "\"layers\":%lld,\"seconds\":%.6g,\"median_seconds\":%.6g,\"reps\":%d,\"%s\":%.2f,",
                op, dtype_name(dtype).data(), static_cast<long long>(c.s), static_cast<long long>(c.len),
                static_cast<long long>(kPagedLayers), t.best, t.median, t.reps,
                c.prefill ? "gflop_per_s" : "kv_gb_per_s", figure);
    if (c.prefill) std::printf("\"tokens_per_s\":%.1f,", static_cast<double>(rows) / t.best);
    std::printf("\"threads\":%d,\"isa\":\"%s\"}\n", opts.threads, isa_of(op).c_str());
  } else {
    std::printf("%-23s %-5s seqs=%-3lld context=%-5lld %10.3f %10.3f %9.2f %s", op, dtype_name(dtype).data(),
                static_cast<long long>(c.s), static_cast<long long>(c.len), t.best * 1e3, t.median * 1e3, figure,
                c.prefill ? "GFLOP/s" : "GB/s");
    if (c.prefill) std::printf(", %.0f tokens/s", static_cast<double>(rows) / t.best);
    std::printf("\n");
  }
  std::fflush(stdout);
}

// The paged attention cases --filter selects; returns how many ran.
int64_t bench_paged_attention_cases(Pools& pools, const KernelBenchOptions& opts) {
  int64_t measured = 0;
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (const PagedCase& c : kPagedCases) {
      if (!selected(opts, c.prefill ? "paged_attention_prefill" : "paged_attention_decode", dtype, "")) continue;
      if (!opts.json && measured == 0)
        std::printf("\n%-23s %-5s %-24s %10s %10s %9s\n", "op", "dtype", "shape (12 layers)", "best_ms", "median_ms",
                    "figure");
      ++measured;
      bench_paged_attention(pools, opts, dtype, c);
    }
  }
  return measured;
}

// What --filter is matched against, for the error when it matches nothing.
constexpr const char* kFilterHelp =
    "it is matched against an op (matmul, matmul_openblas, attention_fwd_bwd, linear, linear_invariant, "
    "linear_quant, paged_attention_decode, paged_attention_prefill, layernorm_fwd, layernorm_bwd, rmsnorm_fwd, "
    "rmsnorm_bwd, gelu_fwd, gelu_bwd, swiglu_fwd, swiglu_bwd, rope_fwd, rope_bwd, softmax_fwd, softmax_bwd, cross_entropy_fwd_bwd, "
    "adamw_step, embedding_fwd, embedding_bwd, add, cast), a dtype (f32, bf16, f32_to_bf16, bf16_to_f32), a "
    "weight type (q8_0, q4_0, q4_1, q5_0, q5_1, q2_K, q3_K, q4_K, q5_K, q6_K) or a case name (square_1024, gpt2_lm_head_dw, train_b4t128, decode_s32, "
    "...)";

}  // namespace

// The serving linear cases --filter selects (oneDNN's linear where it runs
// the dtype, loom's at every level); returns how many ran.
int64_t bench_serving_linear_cases(Pools& pools, const KernelBenchOptions& opts) {
  int64_t measured = 0;
  bool header = false;
  const bool onednn_bf16 = kernels::bf16_matmul_unsupported_reason().empty();
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (const char* linear_op : {"linear", "linear_invariant"}) {
      // oneDNN's linear where it runs the dtype; loom's at every level (bf16
      // weights widened in registers without AVX512_BF16).
      if (dtype == DType::bf16 && !onednn_bf16 && std::string(linear_op) == "linear") continue;
      for (const ServingLinear& l : kServingLinears) {
        if (!selected(opts, linear_op, dtype, std::string("gpt2_") + l.name)) continue;
        for (int64_t m : kServingRows) {
          ++measured;
          if (!opts.json && !std::exchange(header, true))
            std::printf("\n%-16s %-5s %-16s %6s %6s %6s %10s %10s %9s %9s\n", "op", "dtype", "case", "m", "n", "k",
                        "best_ms", "median_ms", "GFLOP/s", "w GB/s");
          bench_serving_linear(pools, opts, linear_op, dtype, l, m);
        }
      }
    }
  }
  return measured;
}

int run_kernel_bench(const KernelBenchOptions& opts) {
  Pools pools;
  if (!opts.json)
    std::printf("loom bench kernels: %d threads; best and median of repeats over >= %g s per case\n%s\nreproduce: %s\n",
                opts.threads, opts.min_seconds, kernels::cpu_isa_describe().c_str(), opts.command.c_str());
  std::vector<std::pair<const char*, DType>> variants = {{"matmul", DType::f32}};
  if (const std::string why = kernels::bf16_matmul_unsupported_reason(); why.empty())
    variants.push_back({"matmul", DType::bf16});
  else
    std::fprintf(stderr, "bench kernels: skipping the bf16 matmul cases: %s\n", why.c_str());
  if (opts.openblas) variants.push_back({"matmul_openblas", DType::f32});
  int64_t measured = 0;
  bool header = false;
  for (const auto& [op, dtype] : variants) {
    for (const MatmulCase& c : matmul_cases()) {
      if (!selected(opts, op, dtype, c.name)) continue;
      ++measured;
      if (!opts.json && !std::exchange(header, true))
        std::printf("\n%-16s %-5s %-20s %6s %6s %6s %3s %3s %4s %10s %10s %9s\n", "op", "dtype", "case", "m", "n",
                    "k", "ta", "tb", "beta", "best_ms", "median_ms", "GFLOP/s");
      const bool blas = std::string(op) == "matmul_openblas";
      print_matmul(opts, op, dtype, c, time_matmul(pools, dtype, c, opts.min_seconds, blas));
    }
  }
  header = false;
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (const AttentionCase& c : kAttentionCases) {
      if (!selected(opts, "attention_fwd_bwd", dtype, "")) continue;
      ++measured;
      if (!opts.json && !std::exchange(header, true))
        std::printf("\n%-18s %-5s %-26s %10s %10s %12s\n", "op", "dtype", "shape", "best_ms", "median_ms",
                    "tokens/s");
      bench_attention(pools, opts, dtype, c);
    }
  }
  measured += bench_serving_linear_cases(pools, opts);
  measured += bench_decode_chain_cases(pools, opts);
  measured += bench_quant_linear_cases(pools, opts);
  measured += bench_paged_attention_cases(pools, opts);
  measured += bench_op_cases(pools, opts);
  LOOM_REQUIRE(measured > 0, "bench kernels: --filter '", opts.filter, "' matches no case; ", kFilterHelp);
  return 0;
}

}  // namespace loom::bench
