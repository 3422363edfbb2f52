// The CUDA backend at model sizes (gpt2-124m and Llama-like shapes): the
// tiny shapes of test_backend_ops fit one tile of every kernel, these cross
// tile, block and warp boundaries (T not a multiple of any tile, HS 64 and
// 128, GQA, a 50257-way vocabulary). Each case runs on the CPU (through
// ops.h) and twice on the GPU: the GPU within docs/numerics.md's tolerances
// of the CPU (widened where a sum runs over thousands of terms), and its two
// runs bit for bit equal (ops.h: results are reproducible).
#include <cmath>
#include <iostream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/trace.h"
#include "gpu/large_case.h"
#include "kernels/backend.h"
#include "kernels/op_trace.h"
#include "kernels/ops.h"

namespace loom::kernels {
namespace {

// LargeCase, check, the dtypes' short names, the GEMM and attention
// tolerances: large_case.h, shared with cuda_ops_edges.cpp.
using namespace gpu_test;

TEST(CudaLarge, LinearForwardWithBiasGpt2Qkv) {
  for (DType dt : {f32, bf16})
    check({"linear_forward", dt, dt == f32 ? kGemmF32 : kGemmBf16, [](Io& io, DType t) {
             linear_forward(io.normal("y", t, {3, 129, 2304}), io.normal("x", t, {3, 129, 768}),
                            io.normal("w", t, {2304, 768}), io.normal("bias", t, {2304}));
           }});
}

// GPT-2's c_fc with its GELU in cuBLASLt's epilogue (bf16; f32 with the
// GEMM's tolerance, the GELU on the f32 sum being the same formula).
TEST(CudaLarge, LinearGeluForwardGpt2Fc) {
  for (DType dt : {f32, bf16})
    check({"linear_gelu_forward", dt, dt == f32 ? kGemmF32 : kGemmBf16, [](Io& io, DType t) {
             linear_gelu_forward(io.normal("y", t, {3, 129, 3072}), io.normal("pre", t, {3, 129, 3072}),
                                 io.normal("x", t, {3, 129, 768}), io.normal("w", t, {3072, 768}, 0.05),
                                 io.normal("bias", t, {3072}));
           }});
}

TEST(CudaLarge, LinearBackwardGpt2Mlp) {
  for (DType dt : {f32, bf16})
    check({"linear_backward", dt, dt == f32 ? kGemmF32 : kGemmBf16, [](Io& io, DType t) {
             linear_backward(io.normal("dx", t, {387, 3072}), io.normal("dw", f32, {768, 3072}),
                             io.normal("dbias", f32, {768}), io.normal("dy", t, {387, 768}),
                             io.normal("x", t, {387, 3072}), io.normal("w", t, {768, 3072}));
           }});
}

// GPT-2's LM head at its 50257 columns (rows not a multiple of 16 bytes, a
// shape cuBLASLt is slow at: BENCHMARKS.md), 66 rows; an f32 gradient of
// bf16 weights is rounded first.
TEST(CudaLarge, LinearGpt2LmHeadOfUnalignedRows) {
  for (DType dt : {f32, bf16})
    check({"lm head 50257", dt, dt == f32 ? kGemmF32 : kGemmBf16, [](Io& io, DType t) {
             const Tensor x = io.normal("x", t, {2, 33, 96}), w = io.normal("w", t, {50257, 96}, 0.1);
             linear_forward(io.normal("y", t, {2, 33, 50257}), x, w, Tensor());
             linear_backward(io.normal("dx", t, {2, 33, 96}), io.normal("dw", f32, {50257, 96}), Tensor(),
                             io.normal("dy", t, {2, 33, 50257}, 0.1), x, w);
             if (t == bf16)
               linear_backward(io.normal("dx_of_f32", t, {2, 33, 96}), io.normal("dw_of_f32", t, {50257, 96}),
                               Tensor(), io.normal("dy_f32", f32, {2, 33, 50257}, 0.1), x, w);
           }});
}

TEST(CudaLarge, LinearInvariantDecodeRows) {
  for (DType dt : {f32, bf16})
    check({"linear_forward_invariant", dt, dt == f32 ? kGemmF32 : kGemmBf16, [](Io& io, DType t) {
             linear_forward_invariant(io.normal("y", t, {5, 3072}), io.normal("x", t, {5, 768}),
                                      io.normal("w", t, {3072, 768}), io.normal("bias", f32, {3072}));
           }});
}

TEST(CudaLarge, BatchedMatmulWithSharedOperand) {
  check({"matmul", f32, kGemmF32, [](Io& io, DType t) {
           const Tensor a = io.normal("a", t, {4, 100, 300}), b = io.normal("b", t, {300, 70});
           matmul(io.normal("c", t, {4, 100, 70}), a, b, {false, false, 0.5f, 1.f});
           matmul_backward(io.normal("da", t, {4, 100, 300}), io.normal("db", t, {300, 70}),
                           io.normal("dc", t, {4, 100, 70}), a, b, {false, false, 0.5f, 0.f});
         }});
}

// Attention over T = 257 keys (no tile divides it), GQA 12 heads over 4.
// F32Dout: dout in f32 whatever t (a bf16 run's activation gradients; CUDA
// rounds it to bf16 for the tensor cores, and keeps f16's in f32 on the f32
// kernels).
template <int64_t T, int64_t NH, int64_t NKV, int64_t HS, bool F32Dout = false>
void attention_case(Io& io, DType t) {
  const Tensor q = io.normal("q", t, {2, T, NH, HS}), k = io.normal("k", t, {2, T, NKV, HS});
  const Tensor v = io.normal("v", t, {2, T, NKV, HS});
  const Tensor out = io.normal("out", t, {2, T, NH, HS}), lse = io.normal("lse", f32, {2, NH, T});
  attention_forward(out, lse, q, k, v);
  attention_backward(io.normal("dq", t, {2, T, NH, HS}), io.normal("dk", t, {2, T, NKV, HS}),
                     io.normal("dv", t, {2, T, NKV, HS}), io.normal("dout", F32Dout ? f32 : t, {2, T, NH, HS}), q, k,
                     v, out, lse);
}

// 70 queries at positions 230 .. 299 of 300 keys, GQA 8 over 2 heads.
template <int64_t HS>
void prefix_case(Io& io, DType t) {
  const Tensor q = io.normal("q", t, {2, 70, 8, HS}), k = io.normal("k", t, {2, 300, 2, HS});
  const Tensor v = io.normal("v", t, {2, 300, 2, HS});
  const Tensor out = io.normal("out", t, {2, 70, 8, HS}), lse = io.normal("lse", f32, {2, 8, 70});
  attention_forward(out, lse, q, k, v);
  attention_backward(io.normal("dq", t, {2, 70, 8, HS}), io.normal("dk", f32, {2, 300, 2, HS}),
                     io.normal("dv", t, {2, 300, 2, HS}), io.normal("dout", t, {2, 70, 8, HS}), q, k, v, out, lse);
}

TEST(CudaLarge, AttentionForwardBackwardHs64Gqa) {
  for (DType dt : {f32, bf16, f16})  // bf16 / f16: the tensor-core kernels (attention_mma*.cu)
    check({"attention hs64", dt, attention_tolerance(dt), attention_case<257, 12, 4, 64>});
}

TEST(CudaLarge, AttentionBackwardOfAnF32GradientOf16BitInputs) {
  for (DType dt : {bf16, f16})
    check({"attention hs64 f32 dout", dt, attention_tolerance(dt), attention_case<257, 12, 4, 64, true>});
}

TEST(CudaLarge, AttentionForwardBackwardHs128) {
  for (DType dt : {f32, bf16, f16})  // bf16 / f16: the tensor-core kernels (attention_mma*.cu)
    check({"attention hs128", dt, attention_tolerance(dt), attention_case<130, 4, 4, 128>});
}

// 70 queries after 230 keys of prefix (a chunk of a longer sequence: the
// key tiles before the first query's position, the query tiles that see
// none of the later keys), gradients of mixed types: f32 dk, 16-bit dq, dv.
TEST(CudaLarge, AttentionBackwardAfterAPrefixWithF32KeyGradients) {
  for (DType dt : {bf16, f16}) {
    check({"attention prefix hs64", dt, attention_tolerance(dt), prefix_case<64>});
    check({"attention prefix hs128", dt, attention_tolerance(dt), prefix_case<128>});
  }
}

TEST(CudaLarge, DecodeAgainstACacheAndARingBlock) {
  check({"attention decode + ring", f32, {1e-3, 1e-4}, [](Io& io, DType t) {
           const Tensor k = io.normal("k", t, {2, 300, 2, 64}), v = io.normal("v", t, {2, 300, 2, 64});
           const Tensor q1 = io.normal("q1", t, {2, 1, 8, 64});
           attention_forward(io.normal("out1", t, {2, 1, 8, 64}), io.normal("lse1", f32, {2, 8, 1}), q1, k, v);
           const Tensor q = io.normal("q", t, {2, 70, 8, 64});  // a block wholly after the keys
           attention_forward(io.normal("out2", t, {2, 70, 8, 64}), io.normal("lse2", f32, {2, 8, 70}), q, k, v, 300);
         }});
}

TEST(CudaLarge, PagedAttentionHs128) {
  check({"paged_attention", bf16, {2e-2, 2e-2}, [](Io& io, DType t) {
           // 3 sequences of 200, 17 and 64 tokens in 16-token blocks, 1, 17 and 5 query rows
           std::vector<double> table(3 * 13, -1);
           for (int s = 0, next = 0; s < 3; ++s) {
             const int blocks = (std::vector<int>{200, 17, 64}[s] + 15) / 16;
             for (int b = 0; b < blocks; ++b) table[s * 13 + b] = (next++ * 7) % 40;
           }
           paged_attention_forward(io.normal("out", t, {23, 8, 128}), io.normal("q", t, {23, 8, 128}),
                                   io.normal("k_cache", t, {40, 16, 2, 128}), io.normal("v_cache", t, {40, 16, 2, 128}),
                                   io.tensor("tables", i32, {3, 13}, table), io.tensor("lens", i32, {3}, {200, 17, 64}),
                                   io.tensor("starts", i32, {4}, {0, 1, 18, 23}));
         }});
}

TEST(CudaLarge, NormsAtGpt2AndLlamaWidths) {
  for (DType dt : {f32, bf16})
    check({"layernorm", dt, dt == f32 ? Tolerance{1e-4, 1e-4} : Tolerance{2e-2, 2e-2}, [](Io& io, DType t) {
             const Tensor x = io.normal("x", t, {515, 768}, 2, 1), w = io.normal("w", t, {768});
             const Tensor b = io.normal("b", t, {768});
             const Tensor mean = io.normal("mean", f32, {515}), rstd = io.normal("rstd", f32, {515});
             layernorm_forward(io.normal("y", t, {515, 768}), mean, rstd, x, w, b, 1e-5f);
             layernorm_backward(io.normal("dx", t, {515, 768}), io.normal("dw", f32, {768}),
                                io.normal("db", f32, {768}), io.normal("dy", t, {515, 768}), x, w, mean, rstd);
             const Tensor x2 = io.normal("x2", t, {33, 4096}), w2 = io.normal("w2", t, {4096});
             const Tensor rstd2 = io.normal("rstd2", f32, {33});
             rmsnorm_forward(io.normal("y2", t, {33, 4096}), rstd2, x2, w2, 1e-6f);
             rmsnorm_backward(io.normal("dx2", f32, {33, 4096}), io.normal("dw2", f32, {4096}),
                              io.normal("dy2", t, {33, 4096}), x2, w2, rstd2);
           }});
}

TEST(CudaLarge, CrossEntropyOverGpt2Vocabulary) {
  for (DType dt : {f32, bf16})
    check({"cross_entropy", dt, dt == f32 ? Tolerance{1e-5, 1e-8} : Tolerance{4e-3, 1e-6}, [](Io& io, DType t) {
             std::vector<double> targets(37);
             for (size_t i = 0; i < targets.size(); ++i)
               targets[i] = i % 5 == 3 ? -100.0 : static_cast<double>((i * 7919) % 50257);
             const Tensor logits = io.normal("logits", t, {37, 50257}, 2);
             io.result(cross_entropy_forward_backward(io.normal("dlogits", t, {37, 50257}), io.normal("losses", f32, {37}),
                                                      logits, io.tensor("targets", i32, {37}, targets)));
           }});
}

TEST(CudaLarge, SoftmaxEmbeddingAndActivations) {
  for (DType dt : {f32, bf16})
    check({"pointwise", dt, dt == f32 ? Tolerance{1e-5, 1e-6} : Tolerance{1e-2, 1e-3}, [](Io& io, DType t) {
             const Tensor x = io.normal("x", t, {19, 5000}, 3), y = io.normal("y", t, {19, 5000});
             softmax_forward(y, x);
             softmax_backward(io.normal("dx", f32, {19, 5000}), io.normal("dy", t, {19, 5000}), y);
             const Tensor g = io.normal("g", t, {64, 3072}, 2);
             gelu_forward(io.normal("gy", t, {64, 3072}), g);
             gelu_backward(io.normal("gdx", t, {64, 3072}), io.normal("gdy", t, {64, 3072}), g);
             const Tensor r = io.normal("r", t, {2, 65, 8, 128});
             rope_forward(io.normal("ry", t, {2, 65, 8, 128}), r, io.ints("pos", i32, {65}, 0, 8192), 500000.f);
           }});
  for (DType dt : {f32, bf16})
    check({"embedding", dt, dt == f32 ? Tolerance{1e-5, 1e-5} : Tolerance{1e-2, 1e-2}, [](Io& io, DType t) {
             const Tensor tokens = io.ints("tokens", i32, {4, 128}, 0, 300);  // many repeats
             const Tensor wte = io.normal("wte", t, {50257, 768}), wpe = io.normal("wpe", t, {1024, 768});
             embedding_forward(io.normal("y", t, {4, 128, 768}), tokens, wte, wpe, 3);
             embedding_backward(io.normal("dwte", f32, {50257, 768}), io.normal("dwpe", f32, {1024, 768}),
                                io.normal("dy", t, {4, 128, 768}), tokens, 3);
           }});
}

TEST(CudaLarge, AdamWAndNormsOverAMillionParameters) {
  check({"adamw", f32, {1e-6, 1e-7}, [](Io& io, DType) {
           const int64_t n = 1 << 20;
           std::vector<double> v(n, 0.01);
           const Tensor grad = io.normal("grad", bf16, {n});
           io.result(sum_squares(grad));
           AdamWConfig cfg;
           cfg.lr = 3e-4f;
           cfg.weight_decay = 0.1f;
           cfg.step = 7;
           adamw_step(io.normal("param", f32, {n}), io.normal("m", f32, {n}, 0.1), io.tensor("v", f32, {n}, v), grad,
                      io.normal("copy", bf16, {n}), cfg);
         }});
}

// The gradient norm's blocks (parallel/dp_state.h: 4096 elements each) over
// a model's pieces in one call, and more slices than a grid's y extent
// (65535) in 16-element blocks, the last block of each tensor cut short.
TEST(CudaLarge, SumSquaresBlocksOfTheGradientNorm) {
  check({"sum_squares_blocks 4096", bf16, {1e-12, 0}, [](Io& io, DType t) {
           const std::vector<Tensor> pieces = {io.normal("wte", t, {(1 << 20) + 1000}), io.normal("b", t, {768}),
                                               io.normal("w", t, {768 * 2304})};
           std::vector<double> sums(((1 << 20) + 1000 + 4095) / 4096 + 1 + 768 * 2304 / 4096);
           sum_squares_blocks(sums, pieces, 4096);
           for (const double v : sums) io.result(v);
         }});
  check({"sum_squares_blocks 16", f32, {1e-12, 0}, [](Io& io, DType t) {
           const std::vector<Tensor> pieces = {io.normal("g", t, {70000 * 16 + 5})};
           std::vector<double> sums(70001);
           sum_squares_blocks(sums, pieces, 16);
           for (const double v : sums) io.result(v);
         }});
}

// The op tracer on a GPU (op_trace.h, log.trace_ops): each op's device span
// comes from CUDA events on the compute stream. On one stream the spans
// follow each other without overlapping, each begins no earlier than the
// host queued it (give or take the clocks' meeting point, measured once), and
// their sum is within the wall time of the calls and the flush.
TEST(CudaLarge, OpTracerTimesEachOpOnTheDevice) {
  Io io(Device::cuda(0), 11);
  const Tensor x = io.normal("x", bf16, {8, 1024, 768}), w = io.normal("w", bf16, {3072, 768});
  const Tensor q = io.normal("q", bf16, {8, 1024, 12, 64}), k = io.normal("k", bf16, {8, 1024, 12, 64});
  const Tensor v = io.normal("v", bf16, {8, 1024, 12, 64});
  Tensor y = io.normal("y", bf16, {8, 1024, 3072}), out = io.normal("out", bf16, {8, 1024, 12, 64});
  Tensor lse = io.normal("lse", f32, {8, 12, 1024});
  TraceRecorder rec(0, "gpu");
  const double wall_start = rec.now_us();
  {
    OpTracer tracer(rec);
    for (int i = 0; i < 3; ++i) {
      linear_forward(y, x, w, Tensor());
      attention_forward(out, lse, q, k, v);
    }
    tracer.flush();
    const double wall = rec.now_us() - wall_start;
    double device_sum = 0;
    for (const char* op : {"linear_forward", "attention_forward"}) {
      size_t i = 0;
      while (std::string(backend_op_names()[i]) != op) ++i;
      const OpTracer::Totals t = tracer.totals(i, Device::Kind::cuda);
      EXPECT_EQ(t.calls, 3) << op;
      EXPECT_GT(t.device_us, 0.0) << op;
      device_sum += t.device_us;
    }
    EXPECT_LE(device_sum, wall);
    std::cout << tracer.table();
  }
  std::vector<TraceEvent> host, device;
  for (const TraceEvent& e : rec.events()) (e.tid == 0 ? host : device).push_back(e);
  ASSERT_EQ(host.size(), 6u);
  ASSERT_EQ(device.size(), 6u);
  for (size_t i = 0; i < device.size(); ++i) {
    EXPECT_EQ(device[i].name, host[i].name);
    EXPECT_GE(device[i].start_us, host[i].start_us - 50) << i;  // 50 us: where the two clocks were set together
    if (i > 0) EXPECT_GE(device[i].start_us, device[i - 1].start_us + device[i - 1].dur_us - 1) << i;
  }
}

}  // namespace
}  // namespace loom::kernels
