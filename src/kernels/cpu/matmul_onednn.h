// The GEMM backend of the CPU matmul and linear (matmul.cpp): oneDNN matmul
// primitives, created once per problem and cached. Internal to kernels/cpu.
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace loom::kernels::cpu {

// c[i] = alpha * op(a[i]) @ op(b[i]) + bias + beta * c[i]   for i < batch.
// Row-major, contiguous: a is (batch_a, M, K), or (batch_a, K, M) with
// trans_a; b is (batch_b, K, N), or (batch_b, N, K) with trans_b; c is
// (batch, M, N); batch_a / batch_b are batch, or 1 for an operand shared by
// every batch. bias: (N) or null. a and b have dtype ab (f32 or bf16; f16 is
// widened to f32 by matmul.cpp first); c is f32 or ab; bias is f32 or ab.
// Arguments are trusted: matmul.cpp validates.
struct Gemm {
  void* c = nullptr;
  const void* a = nullptr;
  const void* b = nullptr;
  const void* bias = nullptr;
  DType ab = DType::f32;
  DType c_dtype = DType::f32;
  DType bias_dtype = DType::f32;
  int64_t batch = 1, m = 0, n = 0, k = 0;
  bool a_batched = false, b_batched = false;
  bool trans_a = false, trans_b = false;
  float alpha = 1.f;
  float beta = 0.f;
};

// Thread-safe: may be called from several threads at once.
void gemm_run(const Gemm& g);

// Why oneDNN has no bf16 GEMM here (it needs AVX-512, and a cap below
// avx512: kernels/cpu_isa.h), or "" when it has one. Asked of oneDNN once.
const std::string& onednn_bf16_unsupported_reason();

}  // namespace loom::kernels::cpu
