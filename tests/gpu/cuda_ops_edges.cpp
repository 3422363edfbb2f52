// The CUDA paths that cuda_ops_large.cpp's model-sized cases never reach
// (found by review), each aimed at the kernel code that serves it:
// - linear_gelu_forward runs cuBLASLt's GELU epilogue (gemm.cu), not the
//   fallback that prints a warning and takes the GEMM, then the GELU kernel;
// - attention at an explicit q_pos as ring attention passes it
//   (parallel/cp.cpp): every key visible, a block starting 3 positions after
//   its keys, more queries than keys; over strided q, k, v (a fused QKV
//   buffer, a cache with rows to spare); with dq or dk, dv left out; at B = 1
//   and T = 1, 63, 65. 16-bit q, k, v at head sizes 64 and 128 must take the
//   tensor-core kernels (attention_mma*.cu): a silent fallback to the f32
//   CUDA-core kernels (attention.cu) would still match the CPU, so it is
//   asserted through attention_mma.h's predicates (and, at head size 96,
//   that 16-bit storage takes the f32 kernels);
// - layernorm_backward on both sides of its warp-per-row limit (C = 1024,
//   norms.cu) and rmsnorm_backward, with gradients left out;
// - the fused residual norms with sum written over a or b;
// - sum_squares_blocks against sum_squares of each slice, bit for bit (ops.h),
//   past a grid's 65535 slices;
// - the compute stream: an op is enqueued on the device's own stream (the
//   Context's), so that it can be captured into a CUDA graph.
// Cases as cuda_ops_large.cpp's (large_case.h): on the CPU through ops.h and
// twice on the GPU, within tolerance of the CPU and bit for bit equal.
#include <algorithm>
#include <bit>
#include <cstdint>
#include <string>
#include <vector>

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "core/memory.h"
#include "gpu/large_case.h"
#include "kernels/cuda/attention_mma.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/ops.h"

namespace loom::kernels {
namespace {

using namespace gpu_test;

// ---- linear + GELU ------------------------------------------------------------

// GPT-2's c_fc, bias optional (GELU_AUX_BIAS, or GELU_AUX without).
template <bool kBias>
void linear_gelu_case(Io& io, DType t) {
  const Tensor y = io.normal("y", t, {3, 129, 3072}), pre = io.normal("pre", t, {3, 129, 3072});
  const Tensor x = io.normal("x", t, {3, 129, 768}), w = io.normal("w", t, {3072, 768}, 0.05);
  linear_gelu_forward(y, pre, x, w, kBias ? io.normal("bias", t, {3072}) : Tensor());
}

// The whole case (CPU run included) with stderr captured: no "warning".
void check_without_warning(const LargeCase& c) {
  testing::internal::CaptureStderr();
  check(c);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(err.find("warning"), std::string::npos) << c.name << " printed: " << err;
}

// First in the file: gemm.cu falls back for good (per dtype, per process)
// after one refusal and warns only then, so no earlier bf16 call may come.
TEST(CudaEdges, LinearGeluTakesTheCublasLtEpilogueWithAndWithoutBias) {
  check_without_warning({"linear_gelu_forward with bias", bf16, kGemmBf16, linear_gelu_case<true>});
  check_without_warning({"linear_gelu_forward without bias", bf16, kGemmBf16, linear_gelu_case<false>});
}

// ---- attention ----------------------------------------------------------------

// q (B, Tq, NH, HS) at positions q_pos + t over k, v (B, Tk, NKV, HS);
// q_pos = kQueriesLast: the last Tq of the keys' positions.
struct AttnShape {
  int64_t B, Tq, Tk, NH, NKV, HS, q_pos;
};

// The gradients attention_backward is given; the others are Tensor().
enum : int { kDq = 1, kDk = 2, kDv = 4, kAllGrads = 7 };

struct Qkv {
  Tensor q, k, v;
};

// On the GPU: 16-bit q, k, v at head size 64 or 128 are meant for the
// tensor-core kernels, forward and backward; everything else for the f32 ones.
void expect_attention_kernels(const Tensor& out, const Tensor& dout, const Qkv& in) {
  if (in.q.device().is_cpu()) return;
  const int64_t HS = in.q.size(3);
  const bool tensor_cores = in.q.dtype() != DType::f32 && (HS == 64 || HS == 128);
  EXPECT_EQ(cuda::attention_mma_applies(out, in.q, in.k, in.v), tensor_cores) << "forward's kernels";
  EXPECT_EQ(cuda::attention_mma_backward_applies(dout, in.q, in.k, in.v), tensor_cores) << "backward's kernels";
}

// attention_forward at s.q_pos, then attention_backward into the gradients
// `grads` names (kDq | kDk | kDv), of dtype gt (f32 as ring attention's, or q's).
void forward_backward(Io& io, const AttnShape& s, const Qkv& in, int grads, DType gt) {
  const DType t = in.q.dtype();
  const Shape qs{s.B, s.Tq, s.NH, s.HS}, ks{s.B, s.Tk, s.NKV, s.HS};
  const Tensor out = io.normal("out", t, qs), lse = io.normal("lse", f32, {s.B, s.NH, s.Tq});
  attention_forward(out, lse, in.q, in.k, in.v, s.q_pos);
  const Tensor dout = io.normal("dout", t, qs);
  const Tensor dq = grads & kDq ? io.normal("dq", gt, qs) : Tensor();
  const Tensor dk = grads & kDk ? io.normal("dk", gt, ks) : Tensor();
  const Tensor dv = grads & kDv ? io.normal("dv", gt, ks) : Tensor();
  attention_backward(dq, dk, dv, dout, in.q, in.k, in.v, out, lse, s.q_pos);
  expect_attention_kernels(out, dout, in);
}

// Contiguous q, k, v; f32 gradients when kF32Grads (ring attention's), else q's dtype.
template <AttnShape S, int kGrads, bool kF32Grads>
void contiguous_case(Io& io, DType t) {
  const Qkv in{io.normal("q", t, {S.B, S.Tq, S.NH, S.HS}), io.normal("k", t, {S.B, S.Tk, S.NKV, S.HS}),
               io.normal("v", t, {S.B, S.Tk, S.NKV, S.HS})};
  forward_backward(io, S, in, kGrads, kF32Grads ? f32 : t);
}

// Ring attention's blocks (cp.cpp: q_pos is where the query chunk starts,
// counted from the key chunk's start), GQA 8 over 2 heads: keys wholly in
// the queries' past (q_pos = Tk + 5, and Tk - 1, the first that sees every
// key); a block starting 3 positions after its keys (early queries see a few
// keys, later ones all, the key tiles before a query tile skipped); and more
// queries than keys.
template <int64_t HS>
void ring_blocks(DType dt) {
  const std::string hs = " hs" + std::to_string(HS);
  const Tolerance tol = attention_tolerance(dt);
  check({"q_pos Tk + 5" + hs, dt, tol, contiguous_case<AttnShape{2, 70, 200, 8, 2, HS, 205}, kAllGrads, true>});
  check({"q_pos Tk - 1" + hs, dt, tol, contiguous_case<AttnShape{2, 70, 200, 8, 2, HS, 199}, kAllGrads, true>});
  check({"q_pos 3" + hs, dt, tol, contiguous_case<AttnShape{2, 100, 200, 8, 2, HS, 3}, kAllGrads, true>});
  check({"q_pos 3, Tq > Tk" + hs, dt, tol, contiguous_case<AttnShape{2, 130, 70, 8, 2, HS, 3}, kAllGrads, true>});
}

TEST(CudaEdges, AttentionAtRingAttentionsQueryPositions) {
  for (DType dt : {bf16, f16}) {
    ring_blocks<64>(dt);
    ring_blocks<128>(dt);
  }
  ring_blocks<64>(f32);
}

// q, k, v slices of one fused (B, T, NH + 2 NKV, HS) buffer (a QKV
// projection's output): each strided along B and T.
template <AttnShape S>
void fused_qkv_case(Io& io, DType t) {
  static_assert(S.Tq == S.Tk && S.q_pos == kQueriesLast);
  const Tensor qkv = io.normal("qkv", t, {S.B, S.Tq, S.NH + 2 * S.NKV, S.HS});
  const Qkv in{qkv.slice(2, 0, S.NH), qkv.slice(2, S.NH, S.NKV), qkv.slice(2, S.NH + S.NKV, S.NKV)};
  forward_backward(io, S, in, kAllGrads, t);
}

// k, v the first Tk rows of caches with 37 rows to spare (strided along B),
// q rows 4 .. 4 + Tq of a longer chunk (strided along B), f32 gradients; the
// spare rows must come back untouched (Io compares every tensor).
template <AttnShape S>
void cache_case(Io& io, DType t) {
  const Tensor k = io.normal("k_cache", t, {S.B, S.Tk + 37, S.NKV, S.HS}).slice(1, 0, S.Tk);
  const Tensor v = io.normal("v_cache", t, {S.B, S.Tk + 37, S.NKV, S.HS}).slice(1, 0, S.Tk);
  const Tensor q = io.normal("q_chunk", t, {S.B, S.Tq + 9, S.NH, S.HS}).slice(1, 4, S.Tq);
  forward_backward(io, S, {q, k, v}, kAllGrads, f32);
}

TEST(CudaEdges, AttentionOverStridedQueriesKeysAndValues) {
  for (DType dt : {f32, bf16, f16}) {
    const Tolerance tol = attention_tolerance(dt);
    check({"fused qkv hs64", dt, tol, fused_qkv_case<AttnShape{2, 130, 130, 8, 2, 64, kQueriesLast}>});
    check({"fused qkv hs128", dt, tol, fused_qkv_case<AttnShape{2, 97, 97, 4, 4, 128, kQueriesLast}>});
    check({"cache hs64", dt, tol, cache_case<AttnShape{2, 70, 150, 8, 2, 64, 80}>});
    check({"cache hs128", dt, tol, cache_case<AttnShape{2, 70, 150, 4, 2, 128, kQueriesLast}>});
  }
}

// ops.h: an undefined gradient is skipped. attention.cu and
// attention_mma_bwd.cu launch the dK, dV kernel only for dk or dv, and
// read each of them only when given.
TEST(CudaEdges, AttentionBackwardWithSomeGradientsUndefined) {
  constexpr AttnShape hs64{2, 130, 130, 8, 2, 64, kQueriesLast}, hs128{2, 130, 130, 4, 4, 128, kQueriesLast};
  for (DType dt : {f32, bf16, f16}) {
    const Tolerance tol = attention_tolerance(dt);
    check({"dq alone hs64", dt, tol, contiguous_case<hs64, kDq, false>});
    check({"dk, dv alone hs64", dt, tol, contiguous_case<hs64, kDk | kDv, false>});
    check({"dv alone hs64", dt, tol, contiguous_case<hs64, kDv, false>});
    check({"dq alone hs128", dt, tol, contiguous_case<hs128, kDq, true>});
    check({"dk alone hs128", dt, tol, contiguous_case<hs128, kDk, true>});
  }
}

// One sequence of T = 1, 63 and 65 (a tile minus one, plus one).
template <int64_t HS>
void odd_lengths(DType dt) {
  const std::string hs = " hs" + std::to_string(HS);
  const Tolerance tol = attention_tolerance(dt);
  check({"B 1 T 1" + hs, dt, tol, contiguous_case<AttnShape{1, 1, 1, 4, 2, HS, kQueriesLast}, kAllGrads, false>});
  check({"B 1 T 63" + hs, dt, tol, contiguous_case<AttnShape{1, 63, 63, 4, 2, HS, kQueriesLast}, kAllGrads, false>});
  check({"B 1 T 65" + hs, dt, tol, contiguous_case<AttnShape{1, 65, 65, 4, 2, HS, kQueriesLast}, kAllGrads, false>});
}

TEST(CudaEdges, AttentionAtBatchOneAndOddLengths) {
  for (DType dt : {f32, bf16, f16}) {
    odd_lengths<64>(dt);
    odd_lengths<128>(dt);
  }
}

// 16-bit storage at a head size with no tensor-core kernel (96: padded to
// 128 columns) goes through the f32 CUDA-core kernels: strided and at q_pos.
TEST(CudaEdges, SixteenBitAttentionAtHeadSize96TakesTheF32Kernels) {
  for (DType dt : {bf16, f16}) {
    const Tolerance tol = attention_tolerance(dt);
    check({"hs96 q_pos 3", dt, tol, contiguous_case<AttnShape{2, 100, 200, 6, 3, 96, 3}, kAllGrads, true>});
    check({"hs96 cache", dt, tol, cache_case<AttnShape{2, 70, 150, 6, 3, 96, kQueriesLast}>});
  }
}

// ---- norms --------------------------------------------------------------------

enum : int { kDx = 1, kDw = 2, kDb = 4 };

// The norms' sums run over C (or N rows, for dw and db) in another order
// on the GPU: f32's atol covers dw, db near 0 after 2085 rows.
Tolerance norm_tolerance(DType dt) { return dt == f32 ? Tolerance{1e-4, 1e-3} : Tolerance{2e-2, 2e-2}; }

// layernorm_forward of (N, C), then layernorm_backward into the gradients
// kGrads names (dx in x's dtype, dw f32, db in w's dtype).
template <int64_t N, int64_t C, int kGrads>
void layernorm_case(Io& io, DType t) {
  const Tensor x = io.normal("x", t, {N, C}, 2, 1), w = io.normal("w", t, {C}), b = io.normal("b", t, {C});
  const Tensor mean = io.normal("mean", f32, {N}), rstd = io.normal("rstd", f32, {N});
  layernorm_forward(io.normal("y", t, {N, C}), mean, rstd, x, w, b, 1e-5f);
  const Tensor dx = kGrads & kDx ? io.normal("dx", t, {N, C}) : Tensor();
  const Tensor dw = kGrads & kDw ? io.normal("dw", f32, {C}) : Tensor();
  const Tensor db = kGrads & kDb ? io.normal("db", t, {C}) : Tensor();
  layernorm_backward(dx, dw, db, io.normal("dy", t, {N, C}), x, w, mean, rstd);
}

// norms.cu: a warp per row up to C = 1024 (24 and 32 columns a lane here),
// a block per row from 1025; 2085 rows: 8 warps a block, several rows each.
TEST(CudaEdges, LayerNormBackwardAroundTheWarpPerRowLimit) {
  constexpr int all = kDx | kDw | kDb;
  for (DType dt : {f32, bf16}) {
    const Tolerance tol = norm_tolerance(dt);
    check({"layernorm C 515", dt, tol, layernorm_case<67, 515, all>});
    check({"layernorm C 1000", dt, tol, layernorm_case<67, 1000, all>});
    check({"layernorm C 1024", dt, tol, layernorm_case<2085, 1024, all>});
    check({"layernorm C 1025", dt, tol, layernorm_case<2085, 1025, all>});
  }
}

TEST(CudaEdges, LayerNormBackwardWithGradientsLeftOut) {
  for (DType dt : {f32, bf16}) {
    const Tolerance tol = norm_tolerance(dt);
    check({"layernorm C 1000 dx alone", dt, tol, layernorm_case<515, 1000, kDx>});
    check({"layernorm C 1000 dw, db alone", dt, tol, layernorm_case<515, 1000, kDw | kDb>});
    check({"layernorm C 1000 db alone", dt, tol, layernorm_case<515, 1000, kDb>});
    check({"layernorm C 515 dx alone", dt, tol, layernorm_case<515, 515, kDx>});
    check({"layernorm C 515 dw alone", dt, tol, layernorm_case<515, 515, kDw>});
    check({"layernorm C 1025 dx alone", dt, tol, layernorm_case<515, 1025, kDx>});
    check({"layernorm C 1025 dw, db alone", dt, tol, layernorm_case<515, 1025, kDw | kDb>});
  }
}

// rmsnorm_forward of (N, C), then rmsnorm_backward into dx (x's dtype)
// and dw (f32) as kGrads says.
template <int64_t N, int64_t C, int kGrads>
void rmsnorm_case(Io& io, DType t) {
  const Tensor x = io.normal("x", t, {N, C}), w = io.normal("w", t, {C}), rstd = io.normal("rstd", f32, {N});
  rmsnorm_forward(io.normal("y", t, {N, C}), rstd, x, w, 1e-6f);
  const Tensor dx = kGrads & kDx ? io.normal("dx", t, {N, C}) : Tensor();
  const Tensor dw = kGrads & kDw ? io.normal("dw", f32, {C}) : Tensor();
  rmsnorm_backward(dx, dw, io.normal("dy", t, {N, C}), x, w, rstd);
}

TEST(CudaEdges, RmsNormBackwardWithGradientsLeftOut) {
  for (DType dt : {f32, bf16}) {
    const Tolerance tol = norm_tolerance(dt);
    check({"rmsnorm C 1000", dt, tol, rmsnorm_case<2085, 1000, kDx | kDw>});
    check({"rmsnorm C 1000 dx alone", dt, tol, rmsnorm_case<515, 1000, kDx>});
    check({"rmsnorm C 1000 dw alone", dt, tol, rmsnorm_case<515, 1000, kDw>});
  }
}

// sum = a + b written over a (kSumIsA) or b, then the norm of sum:
// add_layernorm_forward and add_rmsnorm_forward, on inputs of their own.
template <int64_t N, int64_t C, bool kSumIsA>
void residual_case(Io& io, DType t) {
  const Tensor a = io.normal("a", t, {N, C}), b = io.normal("b", t, {N, C}, 2, 1);
  const Tensor w = io.normal("w", t, {C}), bias = io.normal("bias", t, {C});
  const Tensor y = io.normal("y", t, {N, C}), mean = io.normal("mean", f32, {N}), rstd = io.normal("rstd", f32, {N});
  add_layernorm_forward(kSumIsA ? a : b, y, mean, rstd, a, b, w, bias, 1e-5f);
  const Tensor a2 = io.normal("a2", t, {N, C}), b2 = io.normal("b2", t, {N, C}), w2 = io.normal("w2", t, {C});
  const Tensor y2 = io.normal("y2", t, {N, C}), rstd2 = io.normal("rstd2", f32, {N});
  add_rmsnorm_forward(kSumIsA ? a2 : b2, y2, rstd2, a2, b2, w2, 1e-6f);
}

TEST(CudaEdges, FusedResidualNormsWithTheSumOverAnInput) {
  check({"residual (515, 768) sum is a", bf16, norm_tolerance(bf16), residual_case<515, 768, true>});
  for (DType dt : {f32, bf16})
    check({"residual (33, 4096) sum is b", dt, norm_tolerance(dt), residual_case<33, 4096, false>});
}

// The same residual and norms fused or as add, then the norm: one or the
// other by kFused, on the same inputs (Io's seed, the same draws in order).
template <bool kFused>
void residual_in_parts(Io& io, DType t) {
  constexpr int64_t N = 67, C = 768;
  const Tensor a = io.normal("a", t, {N, C}, 3), b = io.normal("b", t, {N, C}, 2, 1);
  const Tensor w = io.normal("w", t, {C}), bias = io.normal("bias", t, {C});
  const Tensor sum = io.normal("sum", t, {N, C}), y = io.normal("y", t, {N, C});
  const Tensor mean = io.normal("mean", f32, {N}), rstd = io.normal("rstd", f32, {N});
  const Tensor sum2 = io.normal("sum2", t, {N, C}), y2 = io.normal("y2", t, {N, C});
  const Tensor rstd2 = io.normal("rstd2", f32, {N});
  if (kFused) {
    add_layernorm_forward(sum, y, mean, rstd, a, b, w, bias, 1e-5f);
    add_rmsnorm_forward(sum2, y2, rstd2, a, b, w, 1e-6f);
  } else {
    add(sum, a, b);
    layernorm_forward(y, mean, rstd, sum, w, bias, 1e-5f);
    add(sum2, a, b);
    rmsnorm_forward(y2, rstd2, sum2, w, 1e-6f);
  }
}

// ops.h: the fused residual norms give add's sum and the norm's outputs bit
// for bit, on the GPU as on the CPU (test_norms).
TEST(CudaEdges, FusedResidualNormsAreAddThenTheNormBitForBit) {
  for (DType dt : {f32, bf16, f16}) {
    SCOPED_TRACE(dtype_name(dt));
    Io fused(Device::cuda(0), 7), parts(Device::cuda(0), 7);
    residual_in_parts<true>(fused, dt);
    fused.download();
    residual_in_parts<false>(parts, dt);
    parts.download();
    expect_same_bits(fused, parts);
  }
}

// ---- sum_squares_blocks ---------------------------------------------------------

// sum_squares_blocks of tensors, each of its sums the bits of sum_squares
// of that slice alone (ops.h), both on the device. Mismatches are counted,
// not reported one by one (70001 slices).
void expect_blocks_are_slice_sums(const std::vector<Tensor>& tensors, int64_t block) {
  int64_t n_sums = 0;
  for (const Tensor& t : tensors) n_sums += (t.numel() + block - 1) / block;
  std::vector<double> sums(static_cast<size_t>(n_sums));
  sum_squares_blocks(sums, tensors, block);
  int64_t at = 0, mismatches = 0, first = -1;
  double first_want = 0;
  for (const Tensor& t : tensors) {
    const Tensor flat = t.flatten();
    for (int64_t begin = 0; begin < flat.numel(); begin += block, ++at) {
      const double want = sum_squares(flat.slice(0, begin, std::min(block, flat.numel() - begin)));
      if (std::bit_cast<uint64_t>(want) == std::bit_cast<uint64_t>(sums[static_cast<size_t>(at)])) continue;
      if (mismatches++ == 0) first = at, first_want = want;
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << n_sums << " sums in blocks of " << block << "; the first, sum " << first
                           << ": " << (first >= 0 ? sums[static_cast<size_t>(first)] : 0.0)
                           << " where sum_squares gives " << first_want;
}

TEST(CudaEdges, SumSquaresBlocksAreTheSumSquaresOfEachSlice) {
  Io io(Device::cuda(0), 17);
  // Slices of 5000 in 3 parts each (optim.cu's sum_blocks), a tensor's last
  // one shorter and in fewer parts; a 2-D tensor; a tensor under one block.
  expect_blocks_are_slice_sums({io.normal("a", bf16, {12000}), io.normal("b", f16, {33, 200}),
                                io.normal("c", f32, {5})},
                               5000);
  // More slices than a grid's y extent (65535): 70001 of 8 elements (the
  // last of 3), then a tensor whose sums follow them; 70001 of 1 element.
  expect_blocks_are_slice_sums({io.normal("d", f32, {70000 * 8 + 3}), io.normal("e", bf16, {2, 300})}, 8);
  expect_blocks_are_slice_sums({io.normal("g", bf16, {70001})}, 1);
}

// ---- the compute stream ----------------------------------------------------------

// A capture of `stream` ended however the test leaves (an op that throws
// mid-capture must not leave the process's one compute stream capturing).
class Capture {
 public:
  explicit Capture(cudaStream_t stream) : stream_(stream) {
    EXPECT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  }
  Capture(const Capture&) = delete;
  Capture& operator=(const Capture&) = delete;
  ~Capture() {
    if (!open_) return;
    cudaGraph_t graph = nullptr;
    if (cudaStreamEndCapture(stream_, &graph) == cudaSuccess && graph) cudaGraphDestroy(graph);
  }
  cudaError_t end(cudaGraph_t* graph) {
    open_ = false;
    return cudaStreamEndCapture(stream_, graph);
  }

 private:
  cudaStream_t stream_;
  bool open_ = true;
};

// Captured from the compute stream into a graph, an op runs only when the
// graph is launched: it was enqueued there, not on the legacy default
// stream (which cannot be captured, and whose use would end the capture).
TEST(CudaEdges, OpsAreEnqueuedOnTheComputeStreamAndCanBeCaptured) {
  const Stream s = cuda_stream();
  ASSERT_EQ(s, device_stream(Device::cuda(0)));
  ASSERT_NE(s.handle, nullptr);
  const auto cs = static_cast<cudaStream_t>(s.handle);
  constexpr int64_t n = 100003;
  Pools pools(Device::cuda(0));
  Pool& pool = pools[MemTag::activations];
  OwnedTensor a = pool.empty(f32, {n}), b = pool.empty(f32, {n}), y = pool.zeros(f32, {n});
  fill(a, 1.0f);
  fill(b, 2.0f);
  cudaGraph_t graph = nullptr;
  {
    Capture capture(cs);
    add(y, a, b);
    ASSERT_EQ(capture.end(&graph), cudaSuccess) << "an op left the compute stream during the capture";
  }
  size_t nodes = 0;
  ASSERT_EQ(cudaGraphGetNodes(graph, nullptr, &nodes), cudaSuccess);
  EXPECT_GE(nodes, 1u);
  std::vector<float> host(static_cast<size_t>(n), -1.0f);
  const Tensor on_host(host.data(), f32, {n});
  copy_between_host_and_device(on_host, y);
  EXPECT_EQ(host.front(), 0.0f) << "the captured add ran before its graph was launched";
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, cs), cudaSuccess);
  copy_between_host_and_device(on_host, y);  // on the stream, after the graph
  EXPECT_EQ(std::count(host.begin(), host.end(), 3.0f), n);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

}  // namespace
}  // namespace loom::kernels
