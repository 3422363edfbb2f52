// test_backend_ops, after llama.cpp's tests/test-backend-ops.cpp: every op of
// the kernel backend table (src/kernels/backend.h), forward and backward, in
// f32, bf16 and f16 where the op takes them, run by every registered backend
// through ops.h on shared random inputs and compared with the CPU backend's
// functions called directly (the running level's table, cpu_isa.h: no
// checks in between).
//
// For the CPU backend the two must agree bit for bit: ops.h passes the
// arguments through unchanged. For another backend the tolerances of
// docs/numerics.md apply. The case table must cover exactly the backend
// table's ops, and the backend table exactly the ops ops.h declares.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include "common/tensors.h"
#include "kernels/backend.h"
#include "kernels/backend_ops_io.h"
#include "kernels/cpu_isa.h"
#include "kernels/ops.h"
#include "kernels/quant.h"

namespace loom::kernels {
namespace {

using test::Io;
using test::Route;
using test::Tolerance;

// The function of op `name` for this run: ops.h's or the CPU backend's.
#define OP(name) io.pick(#name, &::loom::kernels::name, cpu_backend(cpu_isa()).name)

constexpr DType f32 = DType::f32, i32 = DType::i32;
constexpr double kInf = std::numeric_limits<double>::infinity();

struct OpCase {
  const char* op;             // the backend-table entry it covers
  std::vector<DType> dtypes;  // the float dtype a run uses; {f32} where the op has no float choice
  Tolerance f32_tol, half_tol;  // for a backend other than the CPU one (docs/numerics.md)
  void (*run)(Io& io, DType dt);
};

const std::vector<DType> kFloats = {DType::f32, DType::bf16, DType::f16};
const std::vector<DType> kOnlyF32 = {DType::f32};

// bf16 GEMMs only where this CPU has them (oneDNN 2.6 needs AVX-512).
std::vector<DType> gemm_dtypes() {
  if (bf16_matmul_unsupported_reason().empty()) return kFloats;
  return {DType::f32, DType::f16};
}

// Target ids (-100: ignored) as the values of an i32 tensor.
std::vector<double> targets_of(std::initializer_list<double> ids) { return ids; }

std::vector<OpCase> gemm_cases() {
  const Tolerance f32_tol{1e-5, 1e-5}, half_tol{1.0 / 256, 1e-5};
  return {
      {"matmul", gemm_dtypes(), f32_tol, half_tol,
       [](Io& io, DType dt) {  // c (2, 5, 3) += 0.5 a @ b^T; b (3, 7) shared by both batches
         const Tensor a = io.normal("a", dt, {2, 5, 7}), b = io.normal("b", dt, {3, 7});
         OP(matmul)(io.normal("c", dt, {2, 5, 3}), a, b, {false, true, 0.5f, 1.f});
         // No products (K = 0): c = beta c for any beta.
         OP(matmul)(io.normal("c_k0", dt, {2, 5, 3}), io.normal("a_k0", dt, {2, 5, 0}), io.normal("b_k0", dt, {3, 0}),
                    {false, true, 1.f, 0.5f});
       }},
      {"matmul_backward", gemm_dtypes(), f32_tol, half_tol,
       [](Io& io, DType dt) {  // trans_a, trans_b; db (shared by the batches) sums them in f32
         const Tensor a = io.normal("a", dt, {2, 7, 5}), b = io.normal("b", dt, {3, 7});
         const Tensor dc = io.normal("dc", dt, {2, 5, 3});
         OP(matmul_backward)(io.normal("da", dt, {2, 7, 5}), io.normal("db", f32, {3, 7}), dc, a, b,
                             {true, true, 0.5f, 0.f});
       }},
      {"linear_forward", gemm_dtypes(), f32_tol, half_tol,
       [](Io& io, DType dt) {
         const Tensor x = io.normal("x", dt, {2, 3, 5}), w = io.normal("w", dt, {4, 5});
         OP(linear_forward)(io.normal("y", dt, {2, 3, 4}), x, w, io.normal("bias", f32, {4}));
         // A bias of y's dtype one element into its buffer (a packed parameter
         // view): under the 16-byte alignment a GPU's epilogue reads.
         const Tensor bias_at_1 = io.normal("bias_buffer", dt, {5}).slice(0, 1, 4);
         OP(linear_forward)(io.normal("y_bias_at_1", dt, {2, 3, 4}), x, w, bias_at_1);
       }},
      // cuBLASLt's GELU_AUX_BIAS epilogue (CUDA, bf16 / f16) rounds x w^T to
      // the 16-bit type before it adds the bias (docs/numerics.md): pre is off
      // by up to half an ulp of |x w^T|, whatever |pre| is. x at scale 1/2
      // keeps |x w^T| < 4 here (2.2 in bf16, 3.1 in f16), so that bound is
      // 2^-7 for pre and 1.13 times that for y (GELU's slope): atol 2^-6
      // leaves about as much again for the two results' own roundings.
      {"linear_gelu_forward", gemm_dtypes(), f32_tol, Tolerance{1.0 / 256, 1.0 / 64},
       [](Io& io, DType dt) {  // 8 outputs: the width a GPU's epilogue needs
         const Tensor x = io.normal("x", dt, {2, 3, 5}, 0.5), w = io.normal("w", dt, {8, 5});
         OP(linear_gelu_forward)(io.normal("y", dt, {2, 3, 8}), io.normal("pre", dt, {2, 3, 8}), x, w,
                                 io.normal("bias", dt, {8}));
       }},
      {"linear_forward_invariant", kFloats, f32_tol, half_tol,
       [](Io& io, DType dt) {  // K = 37: whole steps and a masked tail
         const Tensor x = io.normal("x", dt, {2, 3, 37}), w = io.normal("w", dt, {5, 37});
         OP(linear_forward_invariant)(io.normal("y", dt, {2, 3, 5}), x, w, io.normal("bias", dt, {5}));
       }},
      {"linear_backward", gemm_dtypes(), f32_tol, half_tol,
       [](Io& io, DType dt) {
         const Tensor x = io.normal("x", dt, {6, 5}), w = io.normal("w", dt, {4, 5}), dy = io.normal("dy", dt, {6, 4});
         OP(linear_backward)(io.normal("dx", dt, {6, 5}), io.normal("dw", f32, {4, 5}), io.normal("dbias", f32, {4}),
                             dy, x, w);
         if (dt == f32) return;
         // An f32 gradient with 16-bit weights and 16-bit gradients out: f16
         // is widened to f32 for it, whose products are then rounded to f16.
         OP(linear_backward)(io.normal("dx_of_f32", dt, {6, 5}), io.normal("dw_of_f32", dt, {4, 5}), Tensor(),
                             io.normal("dy_f32", f32, {6, 4}), x, w);
       }},
  };
}

// A weight of type t quantized from fixed values (an input like any other,
// as u8 bytes): OC rows of IC values.
Tensor quantized_weight(Io& io, QuantType t, int64_t OC, int64_t IC) {
  const std::string name(quant_name(t));
  const size_t row = quant_row_bytes(t, IC);
  std::vector<float> values(static_cast<size_t>(OC * IC));
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.1f * std::sin(0.37f * static_cast<float>(i) + 1.f);
  std::vector<uint8_t> bytes(row * OC);
  if (quant_can_write(t)) {
    for (int64_t n = 0; n < OC; ++n) quantize_row(t, values.data() + n * IC, bytes.data() + row * n, IC);
  } else {  // q3_K (loom reads it only): fixed bytes, each block's f16 d (its last 2 bytes) 1/256
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 37 + 11);
    const size_t block = quant_row_bytes(t, quant_block_size(t));
    for (size_t b = block; b <= bytes.size(); b += block) bytes[b - 2] = 0x00, bytes[b - 1] = 0x1c;
  }
  return io.tensor(("w_" + name).c_str(), DType::u8, {OC, static_cast<int64_t>(row)},
                   std::vector<double>(bytes.begin(), bytes.end()));
}

// The types the CUDA backend multiplies in their blocks; it dequantizes all
// of kReadTypes.
constexpr QuantType kWeightTypes[] = {QuantType::q8_0, QuantType::q4_0, QuantType::q4_K, QuantType::q6_K};
constexpr QuantType kReadTypes[] = {QuantType::q8_0, QuantType::q4_0, QuantType::q4_1, QuantType::q5_0,
                                    QuantType::q5_1, QuantType::q2_K, QuantType::q3_K, QuantType::q4_K,
                                    QuantType::q5_K, QuantType::q6_K};

// x (2, 3, 256): every row quantized, 5 outputs.
void run_linear_quantized(Io& io) {
  constexpr int64_t IC = 256, OC = 5;
  for (QuantType t : kWeightTypes) {
    const std::string name(quant_name(t));
    const Tensor w = quantized_weight(io, t, OC, IC);
    const Tensor x = io.normal(("x_" + name).c_str(), f32, {2, 3, IC});
    const Tensor bias = t == QuantType::q4_0 ? Tensor() : io.normal(("bias_" + name).c_str(), f32, {OC});
    OP(linear_forward_quantized)(io.normal(("y_" + name).c_str(), f32, {2, 3, OC}), x, w, t, bias);
  }
}

// Rows 1 to 3 of a 5-row weight of each type.
void run_dequantize_rows(Io& io) {
  constexpr int64_t IC = 256, OC = 5;
  for (QuantType t : kReadTypes) {
    const std::string name(quant_name(t));
    OP(dequantize_rows)(io.normal(("out_" + name).c_str(), f32, {3, IC}), quantized_weight(io, t, OC, IC), t, 1);
  }
}

std::vector<OpCase> quant_cases() {
  return {{"linear_forward_quantized", kOnlyF32, {1e-5, 1e-5}, {}, [](Io& io, DType) { run_linear_quantized(io); }},
          {"dequantize_rows", kOnlyF32, {1e-6, 1e-6}, {}, [](Io& io, DType) { run_dequantize_rows(io); }}};
}

std::vector<OpCase> norm_cases() {
  const Tolerance f32_tol{1e-4, 1e-4}, half_tol{1e-2, 1e-2};
  return {
      {"layernorm_forward", kFloats, f32_tol, half_tol,
       [](Io& io, DType dt) {
         const Tensor x = io.normal("x", dt, {6, 10}, 2, 1), w = io.normal("w", dt, {10}), b = io.normal("b", dt, {10});
         OP(layernorm_forward)(io.normal("y", dt, {6, 10}), io.normal("mean", f32, {6}), io.normal("rstd", f32, {6}),
                               x, w, b, 1e-5f);
       }},
      {"layernorm_backward", kFloats, f32_tol, half_tol,
       [](Io& io, DType dt) {  // the statistics from a forward
         const Tensor x = io.normal("x", dt, {6, 10}, 2, 1), w = io.normal("w", dt, {10}), b = io.normal("b", dt, {10});
         const Tensor mean = io.normal("mean", f32, {6}), rstd = io.normal("rstd", f32, {6});
         OP(layernorm_forward)(io.normal("y", dt, {6, 10}), mean, rstd, x, w, b, 1e-5f);
         OP(layernorm_backward)(io.normal("dx", dt, {6, 10}), io.normal("dw", f32, {10}), io.normal("db", dt, {10}),
                                io.normal("dy", dt, {6, 10}), x, w, mean, rstd);
       }},
      {"rmsnorm_forward", kFloats, f32_tol, half_tol,
       [](Io& io, DType dt) {
         const Tensor x = io.normal("x", dt, {6, 10}), w = io.normal("w", dt, {10});
         OP(rmsnorm_forward)(io.normal("y", dt, {6, 10}), io.normal("rstd", f32, {6}), x, w, 1e-6f);
       }},
      {"add_layernorm_forward", kFloats, f32_tol, half_tol,
       [](Io& io, DType dt) {  // sum in place of a, as a block's residual
         const Tensor a = io.normal("a", dt, {6, 10}, 2, 1), w = io.normal("w", dt, {10}), b = io.normal("b", dt, {10});
         OP(add_layernorm_forward)(a, io.normal("y", dt, {6, 10}), io.normal("mean", f32, {6}),
                                   io.normal("rstd", f32, {6}), a, io.normal("r", dt, {6, 10}), w, b, 1e-5f);
       }},
      {"add_rmsnorm_forward", kFloats, f32_tol, half_tol,
       [](Io& io, DType dt) {
         const Tensor w = io.normal("w", dt, {10});
         OP(add_rmsnorm_forward)(io.normal("sum", dt, {6, 10}), io.normal("y", dt, {6, 10}), io.normal("rstd", f32, {6}),
                                 io.normal("a", dt, {6, 10}), io.normal("r", dt, {6, 10}), w, 1e-6f);
       }},
      {"rmsnorm_backward", kFloats, f32_tol, half_tol,
       [](Io& io, DType dt) {
         const Tensor x = io.normal("x", dt, {6, 10}), w = io.normal("w", dt, {10}), rstd = io.normal("rstd", f32, {6});
         OP(rmsnorm_forward)(io.normal("y", dt, {6, 10}), rstd, x, w, 1e-6f);
         OP(rmsnorm_backward)(io.normal("dx", f32, {6, 10}), io.normal("dw", dt, {10}), io.normal("dy", dt, {6, 10}),
                              x, w, rstd);
       }},
  };
}

std::vector<OpCase> pointwise_cases() {
  const Tolerance f32_tol{1e-5, 1e-6}, half_tol{1.0 / 256, 1e-6};
  return {
      {"gelu_forward", kFloats, f32_tol, half_tol,
       [](Io& io, DType dt) { OP(gelu_forward)(io.normal("y", dt, {7, 9}), io.normal("x", dt, {7, 9}, 3)); }},
      {"gelu_backward", kFloats, f32_tol, half_tol,
       [](Io& io, DType dt) {
         const Tensor dy = io.normal("dy", dt, {7, 9}), x = io.normal("x", dt, {7, 9}, 3);
         OP(gelu_backward)(io.normal("dx", f32, {7, 9}), dy, x);
       }},
      {"silu_forward", kFloats, f32_tol, half_tol,
       [](Io& io, DType dt) {  // in place
         const Tensor x = io.normal("x", dt, {7, 9}, 3);
         OP(silu_forward)(x, x);
       }},
      {"silu_backward", kFloats, f32_tol, half_tol,
       [](Io& io, DType dt) {
         const Tensor dy = io.normal("dy", dt, {7, 9}), x = io.normal("x", dt, {7, 9}, 3);
         OP(silu_backward)(io.normal("dx", dt, {7, 9}), dy, x);
       }},
      {"swiglu_forward", kFloats, f32_tol, half_tol,
       [](Io& io, DType dt) {
         const Tensor gate = io.normal("gate", dt, {5, 11}, 2), up = io.normal("up", dt, {5, 11});
         OP(swiglu_forward)(io.normal("y", dt, {5, 11}), gate, up);
       }},
      {"swiglu_backward", kFloats, f32_tol, half_tol,
       [](Io& io, DType dt) {
         const Tensor dy = io.normal("dy", dt, {5, 11}), gate = io.normal("gate", dt, {5, 11}, 2);
         const Tensor up = io.normal("up", dt, {5, 11});
         OP(swiglu_backward)(io.normal("dgate", f32, {5, 11}), io.normal("dup", dt, {5, 11}), dy, gate, up);
       }},
      {"rope_forward", kFloats, f32_tol, half_tol,
       [](Io& io, DType dt) {  // in place, one position row per sequence
         const Tensor x = io.normal("x", dt, {2, 5, 3, 8});
         OP(rope_forward)(x, x, io.ints("pos", i32, {2, 5}, 0, 4096), 10000.f);
       }},
      {"rope_backward", kFloats, f32_tol, half_tol,
       [](Io& io, DType dt) {
         const Tensor dy = io.normal("dy", dt, {2, 5, 3, 8}), pos = io.ints("pos", i32, {5}, 0, 64);
         OP(rope_backward)(io.normal("dx", f32, {2, 5, 3, 8}), dy, pos, 500000.f);
       }},
      {"softmax_forward", kFloats, f32_tol, half_tol,
       [](Io& io, DType dt) { OP(softmax_forward)(io.normal("y", dt, {4, 33}), io.normal("x", dt, {4, 33}, 3)); }},
      {"softmax_backward", kFloats, f32_tol, {1e-2, 1e-3},
       [](Io& io, DType dt) {
         const Tensor y = io.normal("y", dt, {4, 33});
         OP(softmax_forward)(y, io.normal("x", dt, {4, 33}, 3));
         OP(softmax_backward)(io.normal("dx", f32, {4, 33}), io.normal("dy", dt, {4, 33}), y);
       }},
  };
}

std::vector<OpCase> embedding_cases() {
  const Tolerance f32_tol{1e-5, 1e-6}, half_tol{1e-2, 1e-2};
  return {
      {"embedding_forward", kFloats, f32_tol, half_tol,
       [](Io& io, DType dt) {
         const Tensor tokens = io.ints("tokens", i32, {2, 5}, 0, 11);
         const Tensor wte = io.normal("wte", dt, {11, 8}), wpe = io.normal("wpe", dt, {9, 8});
         OP(embedding_forward)(io.normal("y", dt, {2, 5, 8}), tokens, wte, wpe, 2);
       }},
      {"embedding_forward_at", kFloats, f32_tol, half_tol,
       [](Io& io, DType dt) {  // positions out of order and repeated
         const Tensor tokens = io.ints("tokens", i32, {2, 5}, 0, 11), positions = io.ints("positions", i32, {2, 5}, 0, 9);
         const Tensor wte = io.normal("wte", dt, {11, 8}), wpe = io.normal("wpe", dt, {9, 8});
         OP(embedding_forward_at)(io.normal("y", dt, {2, 5, 8}), tokens, wte, wpe, positions);
       }},
      {"embedding_backward", kFloats, f32_tol, half_tol,
       [](Io& io, DType dt) {  // few distinct tokens: the scatter-add sums repeats
         const Tensor tokens = io.ints("tokens", i32, {2, 5}, 0, 4), dy = io.normal("dy", dt, {2, 5, 8});
         OP(embedding_backward)(io.normal("dwte", f32, {11, 8}), io.normal("dwpe", dt, {9, 8}), dy, tokens, 3);
       }},
      {"embedding_backward_at", kFloats, f32_tol, half_tol,
       [](Io& io, DType dt) {  // positions repeated within and across sequences: the scatter-add sums them
         const Tensor tokens = io.ints("tokens", i32, {2, 5}, 0, 4);
         const Tensor positions = io.ints("positions", i32, {2, 5}, 0, 3);
         OP(embedding_backward_at)(io.normal("dwte", dt, {11, 8}), io.normal("dwpe", f32, {9, 8}),
                                   io.normal("dy", dt, {2, 5, 8}), tokens, positions);
       }},
      {"embedding_shard_forward", kFloats, f32_tol, half_tol,
       [](Io& io, DType dt) {  // rows [4, 9) of an 11-token table, no position table
         const Tensor tokens = io.ints("tokens", i32, {2, 5}, 0, 11), wte = io.normal("wte", dt, {5, 8});
         OP(embedding_shard_forward)(io.normal("y", dt, {2, 5, 8}), tokens, wte, 4, Tensor(), 0);
       }},
      {"embedding_shard_backward", kFloats, f32_tol, half_tol,
       [](Io& io, DType dt) {
         const Tensor tokens = io.ints("tokens", i32, {2, 5}, 0, 11), dy = io.normal("dy", dt, {2, 5, 8});
         OP(embedding_shard_backward)(io.normal("dwte", dt, {5, 8}), io.normal("dwpe", f32, {9, 8}), dy, tokens, 4, 1);
       }},
      {"embedding_shard_forward_at", kFloats, f32_tol, half_tol,
       [](Io& io, DType dt) {  // rows [4, 9) of an 11-token table, positions out of order
         const Tensor tokens = io.ints("tokens", i32, {2, 5}, 0, 11);
         const Tensor positions = io.ints("positions", i32, {2, 5}, 0, 9);
         const Tensor wte = io.normal("wte", dt, {5, 8}), wpe = io.normal("wpe", dt, {9, 8});
         OP(embedding_shard_forward_at)(io.normal("y", dt, {2, 5, 8}), tokens, wte, 4, wpe, positions);
       }},
      {"embedding_shard_backward_at", kFloats, f32_tol, half_tol,
       [](Io& io, DType dt) {
         const Tensor tokens = io.ints("tokens", i32, {2, 5}, 0, 11);
         const Tensor positions = io.ints("positions", i32, {2, 5}, 0, 3);
         OP(embedding_shard_backward_at)(io.normal("dwte", f32, {5, 8}), io.normal("dwpe", dt, {9, 8}),
                                         io.normal("dy", dt, {2, 5, 8}), tokens, 4, positions);
       }},
  };
}

// q (2, 6, 4, 8); k, v (2, 9, 2, 8) views into a 12-position cache (strided
// along B): GQA, 6 queries at the end of 9 keys.
struct Qkv {
  Tensor q, k, v;
};
Qkv attention_inputs(Io& io, DType dt) {
  const Tensor q = io.normal("q", dt, {2, 6, 4, 8});
  const Tensor k = io.normal("k_cache", dt, {2, 12, 2, 8}).slice(1, 0, 9);
  const Tensor v = io.normal("v_cache", dt, {2, 12, 2, 8}).slice(1, 0, 9);
  return {q, k, v};
}

std::vector<OpCase> attention_cases() {
  return {
      {"attention_forward", kFloats, {1e-4, 1e-5}, {1e-2, 1e-2},
       [](Io& io, DType dt) {
         const Qkv a = attention_inputs(io, dt);
         OP(attention_forward)(io.normal("out", dt, {2, 6, 4, 8}), io.normal("lse", f32, {2, 4, 6}), a.q, a.k, a.v,
                               kernels::kQueriesLast);
       }},
      {"attention_merge", kOnlyF32, {1e-5, 1e-6}, {},
       [](Io& io, DType) {  // a running result and one block, then a block into an empty result
         const Tensor lse = io.normal("lse", f32, {2, 4, 6});
         OP(attention_merge)(io.normal("acc", f32, {2, 6, 4, 8}), io.normal("acc_lse", f32, {2, 4, 6}),
                             io.normal("out", f32, {2, 6, 4, 8}), lse);
         const Tensor empty = io.normal("empty_lse", f32, {2, 4, 6});
         kernels::fill(empty, -INFINITY);
         OP(attention_merge)(io.normal("acc2", f32, {2, 6, 4, 8}), empty, io.normal("out2", f32, {2, 6, 4, 8}), lse);
       }},
      {"attention_backward", kFloats, {1e-4, 1e-5}, {2e-2, 2e-2},
       [](Io& io, DType dt) {  // out and lse from a forward; queries at positions 4.. (a ring block)
         const Qkv a = attention_inputs(io, dt);
         const Tensor out = io.normal("out", dt, {2, 6, 4, 8}), lse = io.normal("lse", f32, {2, 4, 6});
         OP(attention_forward)(out, lse, a.q, a.k, a.v, 4);
         OP(attention_backward)(io.normal("dq", dt, {2, 6, 4, 8}), io.normal("dk", f32, {2, 9, 2, 8}),
                                io.normal("dv", dt, {2, 9, 2, 8}), io.normal("dout", dt, {2, 6, 4, 8}), a.q, a.k, a.v,
                                out, lse, 4);
       }},
      {"kv_cache_write", kFloats, {}, {},
       [](Io& io, DType dt) {  // 4 blocks of 4 slots; a padding row (-1); k, v cast to the other dtype's caches
         const DType cache = dt == f32 ? DType::bf16 : f32;
         const Tensor k = io.normal("k", dt, {5, 2, 8}), v = io.normal("v", dt, {5, 2, 8});
         const Tensor slots = io.tensor("slots", DType::i64, {5}, {5, -1, 0, 15, 9});
         OP(kv_cache_write)(io.normal("k_cache", cache, {4, 4, 2, 8}), io.normal("v_cache", cache, {4, 4, 2, 8}), k, v,
                            slots);
       }},
      {"paged_attention_forward", kFloats, {1e-4, 1e-5}, {1e-2, 1e-2},
       [](Io& io, DType dt) {  // GQA; 2 sequences of 7 and 3 tokens in shuffled blocks, 3 and 2 query rows
         const Tensor q = io.normal("q", dt, {5, 4, 8});
         const Tensor k_cache = io.normal("k_cache", dt, {4, 4, 2, 8});
         const Tensor v_cache = io.normal("v_cache", dt, {4, 4, 2, 8});
         const Tensor tables = io.tensor("block_tables", i32, {2, 3}, {2, 0, -1, 3, -1, -1});
         const Tensor seq_lens = io.tensor("seq_lens", i32, {2}, {7, 3});
         const Tensor query_start = io.tensor("query_start", i32, {3}, {0, 3, 5});
         OP(paged_attention_forward)(io.normal("out", dt, {5, 4, 8}), q, k_cache, v_cache, tables, seq_lens,
                                     query_start);
       }},
  };
}

std::vector<OpCase> loss_cases() {
  const Tolerance f32_tol{1e-5, 1e-6}, half_tol{4e-3, 1e-6};
  return {
      {"cross_entropy_forward_backward", kFloats, f32_tol, half_tol,
       [](Io& io, DType dt) {
         const Tensor logits = io.normal("logits", dt, {6, 13}, 2);
         const Tensor targets = io.tensor("targets", i32, {6}, targets_of({3, -100, 12, 0, 7, 7}));
         io.result(OP(cross_entropy_forward_backward)(io.normal("dlogits", f32, {6, 13}), io.normal("losses", f32, {6}),
                                                      logits, targets, -100, 0.7f));
       }},
      {"cross_entropy_shard_stats", kFloats, f32_tol, half_tol,
       [](Io& io, DType dt) {  // columns [8, 16) of a 13-token vocabulary: 5 real, 3 padding
         const Tensor logits = io.normal("logits", dt, {6, 8}, 2);
         const Tensor targets = io.tensor("targets", i32, {6}, targets_of({3, -100, 12, 9, 8, 11}));
         OP(cross_entropy_shard_stats)(io.normal("lse", f32, {6}), io.normal("target_logit", f32, {6}), logits,
                                       targets, 8, 5, -100);
       }},
      {"cross_entropy_shard_backward", kFloats, f32_tol, half_tol,
       [](Io& io, DType dt) {  // in place
         const Tensor logits = io.normal("logits", dt, {6, 8}, 2), lse = io.normal("lse", f32, {6}, 0.5, 3);
         const Tensor targets = io.tensor("targets", i32, {6}, targets_of({3, -100, 12, 9, 8, 11}));
         OP(cross_entropy_shard_backward)(logits, logits, lse, targets, 8, 5, 0.125f, -100);
       }},
      {"cross_entropy_shard_combine", kOnlyF32, f32_tol, f32_tol,
       [](Io& io, DType) {  // 3 ranks, 6 rows; rank 2 all padding (-inf), and row 1 padding on every rank
         std::vector<double> stats(3 * 2 * 6);
         for (size_t i = 0; i < stats.size(); ++i) stats[i] = std::sin(static_cast<double>(i)) * 3;
         for (int n = 0; n < 6; ++n) stats[2 * 2 * 6 + n] = -kInf;
         for (int r = 0; r < 3; ++r) stats[r * 2 * 6 + 1] = -kInf;
         OP(cross_entropy_shard_combine)(io.normal("lse", f32, {6}), io.normal("target_logit", f32, {6}),
                                         io.tensor("stats", f32, {3, 2, 6}, stats));
       }},
      {"cross_entropy_shard_loss", kOnlyF32, f32_tol, f32_tol,
       [](Io& io, DType) {
         const Tensor lse = io.normal("lse", f32, {6}, 1, 3), target_logit = io.normal("target_logit", f32, {6});
         const Tensor targets = io.tensor("targets", i32, {6}, targets_of({1, -100, 4, -100, 0, 9}));
         io.result(OP(cross_entropy_shard_loss)(lse, target_logit, targets, -100));
         io.result(OP(cross_entropy_shard_loss)(lse, target_logit, io.tensor("none", i32, {6}, std::vector<double>(6, -100)), -100));
       }},
      {"cross_entropy_count_valid", kOnlyF32, f32_tol, f32_tol,
       [](Io& io, DType) {
         io.result(OP(cross_entropy_count_valid)(
             io.tensor("targets", i32, {2, 3}, targets_of({1, -100, 4, -100, 0, -1})), -100));
       }},
  };
}

std::vector<OpCase> optim_cases() {
  const Tolerance f32_tol{1e-6, 1e-6}, sum_tol{1e-10, 0};
  return {
      {"adamw_step", kFloats, f32_tol, f32_tol,
       [](Io& io, DType dt) {
         std::vector<double> v2(37);
         for (size_t i = 0; i < v2.size(); ++i) v2[i] = 0.01 * static_cast<double>((i * 7) % 11);
         const Tensor param = io.normal("param", f32, {37}), m = io.normal("m", f32, {37}, 0.1);
         const Tensor v = io.tensor("v", f32, {37}, v2), grad = io.normal("grad", dt, {37});
         const AdamWConfig cfg{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, 0.5f};
         OP(adamw_step)(param, m, v, grad, io.normal("param_copy", dt, {37}), cfg);
       }},
      {"sum_squares", kFloats, sum_tol, sum_tol,
       [](Io& io, DType dt) { io.result(OP(sum_squares)(io.normal("t", dt, {50}))); }},
      {"sum_squares_blocks", kFloats, sum_tol, sum_tol,
       [](Io& io, DType dt) {
         std::vector<double> sums(4 + 1);
         const std::vector<Tensor> ts = {io.normal("t", dt, {50}), io.normal("u", dt, {3})};
         OP(sum_squares_blocks)(sums, ts, 16);
         for (const double v : sums) io.result(v);
       }},
      {"global_norm", kFloats, sum_tol, sum_tol,
       [](Io& io, DType dt) {
         const std::vector<Tensor> tensors = {io.normal("a", dt, {7}), io.normal("b", dt, {3, 4})};
         io.result(OP(global_norm)(tensors));
       }},
      {"all_finite", kFloats, {}, {},
       [](Io& io, DType dt) {
         io.result(OP(all_finite)(io.normal("finite", dt, {20})));
         io.result(OP(all_finite)(io.tensor("inf", dt, {3}, {1, kInf, 2})));
         io.result(OP(all_finite)(io.tensor("nan", dt, {3}, {1, 2, std::nan("")})));
       }},
      {"scale", kFloats, {}, {}, [](Io& io, DType dt) { OP(scale)(io.normal("t", dt, {23}), 0.3f); }},
  };
}

std::vector<OpCase> elementwise_cases() {
  return {
      {"add", kFloats, {}, {},
       [](Io& io, DType dt) {  // mixed dtypes, then in place
         const Tensor a = io.normal("a", f32, {3, 7}), b = io.normal("b", dt, {3, 7});
         OP(add)(io.normal("y", dt, {3, 7}), a, b);
         OP(add)(b, b, a);
       }},
      {"mul", kFloats, {}, {},
       [](Io& io, DType dt) {  // mixed dtypes, then in place
         const Tensor a = io.normal("a", f32, {3, 7}), b = io.normal("b", dt, {3, 7});
         OP(mul)(io.normal("y", dt, {3, 7}), a, b);
         OP(mul)(b, b, a);
       }},
      {"cast", kFloats, {}, {},
       [](Io& io, DType dt) {
         OP(cast)(io.normal("dst", dt, {3, 7}), io.normal("src", dt == f32 ? DType::bf16 : f32, {3, 7}));
       }},
      {"fill", kFloats, {}, {}, [](Io& io, DType dt) { OP(fill)(io.normal("t", dt, {3, 7}), 1.25f); }},
      {"copy", {DType::f32, DType::bf16, DType::f16, DType::i32, DType::i64, DType::u8}, {}, {},
       [](Io& io, DType dt) {  // strided views both ways, then contiguous
         const Tensor src = io.bits("src", dt, {4, 6}), dst = io.bits("dst", dt, {5, 4});
         OP(copy)(dst.slice(0, 1, 4).slice(1, 1, 3), src.slice(1, 2, 3));
         OP(copy)(io.bits("dst2", dt, {4, 6}), src);
       }},
      {"gather_columns", {DType::f32, DType::bf16, DType::i32}, {}, {},
       [](Io& io, DType dt) {  // a cp rank's zig-zag columns: 0, 1, 6, 7 of 8
         OP(gather_columns)(io.bits("dst", dt, {3, 4}), io.bits("src", dt, {3, 8}),
                            io.tensor("columns", i32, {4}, {0, 1, 6, 7}));
       }},
      {"arange", kOnlyF32, {}, {},
       [](Io& io, DType) {
         OP(arange)(io.bits("t32", i32, {9}), -4);
         OP(arange)(io.bits("t64", DType::i64, {5}), int64_t{1} << 40);
       }},
      {"find_id_outside", kOnlyF32, {}, {},
       [](Io& io, DType) {
         const Tensor ids = io.tensor("ids", i32, {3, 5}, {0, 1, 2, -100, 4, 5, 6, 12, 8, 9, 0, 1, 2, 3, 4});
         for (const auto ignore : {std::optional<int32_t>(-100), std::optional<int32_t>()}) {
           const IdOutside r = OP(find_id_outside)(ids, 10, ignore);
           io.result(static_cast<double>(r.index));
           io.result(r.id);
         }
         io.result(static_cast<double>(OP(find_id_outside)(ids, 13, -100).index));
       }},
  };
}

// A (4, 2) row table over a 9-row buffer: each row used once, two choices dropped.
const std::vector<double> kMoeRows = {3, 0, -1, 5, 7, 1, 2, -1};

// Six tokens' two choices of three experts and the scores: in routing
// groups of three, expert 0's three choices of group 0 tie at 0.5 (tokens
// 0 and 1) and expert 2's of group 1 at 0.6 (tokens 3 and 5). kMoeKeep: a
// capacity of 2 per group keeps the earlier of each tie.
const std::vector<double> kMoeSel = {0, 1, 0, 2, 0, 1, 2, 1, 2, 0, 2, 1};
const std::vector<double> kMoeScores = {0.5, 0.3, 0.2, 0.5, 0.1, 0.4, 0.6, 0.3, 0.1,
                                        0.1, 0.3, 0.6, 0.2, 0.1, 0.7, 0.1, 0.3, 0.6};
const std::vector<double> kMoeKeep = {1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1};

std::vector<OpCase> moe_cases() {
  const Tolerance f32_tol{1e-5, 1e-6}, half_tol{1.0 / 256, 1e-5};
  return {
      {"moe_top_k", kOnlyF32, {}, {},
       [](Io& io, DType) {  // ties among the scores; with and without the bias, normalised or not
         const Tensor scores = io.tensor("scores", f32, {3, 4}, {0.1, 0.4, 0.4, 0.1, 0.25, 0.25, 0.25, 0.25, 0.7, 0.1, 0.15, 0.05});
         OP(moe_top_k)(io.bits("sel", i32, {3, 2}), io.normal("weight", f32, {3, 2}), scores, Tensor(), true);
         OP(moe_top_k)(io.bits("sel_b", i32, {3, 2}), io.normal("weight_b", f32, {3, 2}), scores,
                       io.tensor("bias", f32, {4}, {0.0, -0.5, 0.0, 0.3}), false);
       }},
      {"moe_router_scores", kOnlyF32, f32_tol, {},
       [](Io& io, DType) {  // softmax and sigmoid scores of the same logits
         const Tensor logits = io.normal("logits", f32, {5, 6}, 2.0);
         OP(moe_router_scores)(io.bits("scores", f32, {5, 6}), io.bits("lse", f32, {5}), logits, false);
         OP(moe_router_scores)(io.bits("sig", f32, {5, 6}), io.bits("sig_lse", f32, {5}), logits, true);
       }},
      {"moe_capacity", kOnlyF32, {}, {},
       [](Io& io, DType) {  // ties broken by the earlier choice; two groups, one, and no capacity
         const Tensor sel = io.tensor("sel", i32, {6, 2}, kMoeSel);
         const Tensor scores = io.tensor("scores", f32, {6, 3}, kMoeScores);
         OP(moe_capacity)(io.bits("keep", i32, {6, 2}), sel, scores, 3, 2);
         OP(moe_capacity)(io.bits("keep_one", i32, {6, 2}), sel, scores, 6, 1);
         OP(moe_capacity)(io.bits("keep_all", i32, {6, 2}), sel, scores, 3, -1);
       }},
      {"moe_assign_rows", kOnlyF32, {}, {},
       [](Io& io, DType) {
         OP(moe_assign_rows)(io.tensor("rows", i32, {6, 2}, kMoeKeep), io.bits("counts", DType::i64, {3}),
                             io.tensor("sel", i32, {6, 2}, kMoeSel));
       }},
      {"moe_group_stats", kOnlyF32, {1e-6, 1e-7}, {},
       [](Io& io, DType) {
         const Tensor sel = io.tensor("sel", i32, {6, 2}, kMoeSel);
         const Tensor scores = io.tensor("scores", f32, {6, 3}, kMoeScores);
         OP(moe_group_stats)(io.bits("count", f32, {2, 3}), io.bits("score_sum", f32, {2, 3}), sel, scores, 3, false);
         OP(moe_group_stats)(io.bits("sig_count", f32, {3, 3}), io.bits("sig_sum", f32, {3, 3}), sel, scores, 2, true);
       }},
      {"moe_router_backward", kOnlyF32, {1e-5, 1e-6}, {},
       [](Io& io, DType) {  // softmax, normalised, aux + z; sigmoid, aux of groups split over two ranks (cp)
         MoeRouterGrad g{io.normal("logits", f32, {6, 3}), io.normal("scores", f32, {6, 3}, 0.1, 0.4),
                         io.normal("lse", f32, {6}, 0.5, 1.0), io.tensor("sel", i32, {6, 2}, kMoeSel),
                         io.normal("weight", f32, {6, 2}, 0.1, 0.5), io.normal("dweight", f32, {6, 2}),
                         io.tensor("count", f32, {2, 3}, {2, 3, 1, 0, 2, 4})};
         g.group_tokens = 3, g.local_tokens = 3, g.aux_scale = 0.5, g.z_scale = 0.25, g.normalise = true;
         OP(moe_router_backward)(io.bits("dlogits", f32, {6, 3}), g);
         g.group_tokens = 6, g.sigmoid = true, g.normalise = false, g.z_scale = 0;
         OP(moe_router_backward)(io.bits("sig_dlogits", f32, {6, 3}), g);
         g.aux_scale = 0, g.count = Tensor(), g.z_scale = 0.1;
         OP(moe_router_backward)(io.bits("no_aux_dlogits", f32, {6, 3}), g);
       }},
      {"moe_dispatch", kFloats, f32_tol, half_tol,
       [](Io& io, DType dt) {
         OP(moe_dispatch)(io.normal("xs", dt, {9, 6}), io.normal("x", dt, {4, 6}),
                          io.tensor("rows", i32, {4, 2}, kMoeRows));
       }},
      {"moe_dispatch_backward", kOnlyF32, f32_tol, half_tol,
       [](Io& io, DType) {
         OP(moe_dispatch_backward)(io.normal("dx", f32, {4, 6}), io.normal("dxs", f32, {9, 6}),
                                   io.tensor("rows", i32, {4, 2}, kMoeRows));
       }},
      {"moe_combine", kFloats, f32_tol, half_tol,
       [](Io& io, DType dt) {
         OP(moe_combine)(io.normal("y", dt, {4, 6}), io.normal("ys", dt, {9, 6}),
                         io.tensor("rows", i32, {4, 2}, kMoeRows), io.normal("weight", f32, {4, 2}));
       }},
      {"moe_combine_backward", kFloats, f32_tol, half_tol,
       [](Io& io, DType dt) {
         OP(moe_combine_backward)(io.normal("dys", f32, {9, 6}), io.normal("dweight", f32, {4, 2}),
                                  io.normal("dy", f32, {4, 6}), io.normal("ys", dt, {9, 6}),
                                  io.tensor("rows", i32, {4, 2}, kMoeRows), io.normal("weight", f32, {4, 2}));
       }},
      {"grouped_linear_forward", gemm_dtypes(), f32_tol, half_tol,
       [](Io& io, DType dt) {  // three groups, the middle one empty, a row past the last offset left alone
         const Tensor w[] = {io.normal("w0", dt, {4, 5}), io.normal("w1", dt, {4, 5}), io.normal("w2", dt, {4, 5})};
         const int64_t offsets[] = {0, 3, 3, 6};
         OP(grouped_linear_forward)(io.normal("y", dt, {7, 4}), io.normal("x", dt, {7, 5}), std::span<const Tensor>(w),
                                    std::span<const int64_t>(offsets), false);
       }},
      {"grouped_linear_backward", gemm_dtypes(), f32_tol, half_tol,
       [](Io& io, DType dt) {
         const Tensor w[] = {io.normal("w0", dt, {4, 5}), io.normal("w1", dt, {4, 5})};
         const Tensor dw[] = {io.normal("dw0", f32, {4, 5}), io.normal("dw1", f32, {4, 5})};
         const int64_t offsets[] = {0, 2, 6};
         OP(grouped_linear_backward)(io.normal("dx", f32, {6, 5}), std::span<const Tensor>(dw),
                                     io.normal("dy", f32, {6, 4}), io.normal("x", dt, {6, 5}),
                                     std::span<const Tensor>(w), std::span<const int64_t>(offsets));
       }},
  };
}

std::vector<OpCase> all_cases() {
  std::vector<OpCase> all;
  for (auto part : {gemm_cases, quant_cases, norm_cases, pointwise_cases, embedding_cases, attention_cases, loss_cases,
                    optim_cases, elementwise_cases, moe_cases}) {
    for (OpCase& c : part()) all.push_back(std::move(c));
  }
  return all;
}

uint32_t seed_of(const OpCase& c, DType dt) {
  return static_cast<uint32_t>(std::hash<std::string>{}(std::string(c.op) + "/" + std::string(dtype_name(dt))));
}

TEST(BackendOps, CasesCoverExactlyTheBackendTablesOps) {
  std::set<std::string> cased, table;
  std::string covered;
  for (const OpCase& c : all_cases()) {
    EXPECT_TRUE(cased.insert(c.op).second) << c.op << " has two cases";
    covered += (covered.empty() ? "" : ", ") + std::string(c.op);
  }
  for (const char* op : backend_op_names()) table.insert(op);
  EXPECT_EQ(cased, table);
  std::printf("test_backend_ops covers %zu ops: %s\n", cased.size(), covered.c_str());
}

// Every function ops.h declares at namespace scope (a line starting with its
// return type) is a backend-table entry, but the one query that computes
// nothing.
TEST(BackendOps, EveryOpDeclaredInOpsHIsInTheBackendTable) {
  const auto path = std::filesystem::path(__FILE__).parent_path() / "../../src/kernels/ops.h";
  std::ifstream in(path);
  ASSERT_TRUE(in) << "cannot read " << path;
  const std::regex declaration(R"(^(?:[A-Za-z_][A-Za-z0-9_:<>]*\s+)+([a-z_][a-z0-9_]*)\()");
  const std::set<std::string> queries = {"bf16_matmul_unsupported_reason"};
  std::set<std::string> declared, table;
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (std::regex_search(line, m, declaration) && !queries.contains(m[1])) declared.insert(m[1]);
  }
  for (const char* op : backend_op_names()) table.insert(op);
  EXPECT_EQ(declared, table);
}

TEST(BackendOps, EachCaseCallsTheOpItCovers) {
  for (const OpCase& c : all_cases()) {
    Io io(Route::cpu_direct, seed_of(c, c.dtypes[0]));
    c.run(io, c.dtypes[0]);
    EXPECT_NE(std::find(io.called().begin(), io.called().end(), c.op), io.called().end()) << c.op;
  }
}

// The CPU backend through ops.h against its functions called directly, bit
// for bit; a backend of another device kind (CUDA: this file is also built
// as test_backend_ops_cuda, tests/gpu.cmake) on the same inputs placed on
// its device, within each case's tolerance (docs/numerics.md).
TEST(BackendOps, EveryRegisteredBackendMatchesTheCpuFunctionsOnEveryOp) {
  const std::vector<const Backend*> backends = registered_backends();
  ASSERT_FALSE(backends.empty());
  for (const Backend* b : backends) {
    const bool device = b->kind != Device::Kind::cpu;
    int runs = 0;
    for (const OpCase& c : all_cases()) {
      for (DType dt : c.dtypes) {
        SCOPED_TRACE(std::string(b->name) + " " + c.op + " " + std::string(dtype_name(dt)));
        Io want(Route::cpu_direct, seed_of(c, dt));
        c.run(want, dt);
        if (device) {
          Io got(Device{b->kind, 0}, seed_of(c, dt));
          try {
            c.run(got, dt);
            got.download();
          } catch (const std::exception& e) {
            ADD_FAILURE() << "threw: " << e.what();
            continue;
          }
          expect_close(want, got, dt == DType::f32 ? c.f32_tol : c.half_tol);
        } else {
          Io got(Route::dispatch, seed_of(c, dt));
          c.run(got, dt);
          expect_same_bits(want, got);
        }
        ++runs;
      }
    }
    std::printf("test_backend_ops: backend %s: %d op runs compared\n", b->name, runs);
  }
}

// The comparison a device backend gets: float tensors within the tolerance,
// the rest exact.
TEST(BackendOps, ToleranceComparisonAcceptsSmallAndReportsLargeDifferences) {
  Io want(Route::cpu_direct, 1), near(Route::cpu_direct, 1), far(Route::cpu_direct, 1);
  want.tensor("x", f32, {2}, {1.0, 2.0});
  near.tensor("x", f32, {2}, {1.0 + 1e-6, 2.0});
  far.tensor("x", f32, {2}, {1.1, 2.0});
  expect_close(want, near, {1e-5, 0});
  EXPECT_NONFATAL_FAILURE(expect_close(want, far, {1e-5, 0}), "x");
}

}  // namespace
}  // namespace loom::kernels
