// The harness of the GPU op tests (tests/gpu/cuda_ops_large.cpp,
// cuda_ops_edges.cpp): a case runs on the CPU (through ops.h) and twice on
// the GPU; the GPU within the case's tolerance of the CPU (docs/numerics.md),
// and its two runs bit for bit equal (ops.h: results are reproducible).
#pragma once

#include <string>

#include <gtest/gtest.h>

#include "core/dtype.h"
#include "core/tensor.h"
#include "kernels/backend_ops_io.h"

namespace loom::kernels::gpu_test {

using test::Io;
using test::Route;
using test::Tolerance;

inline constexpr DType f32 = DType::f32, bf16 = DType::bf16, f16 = DType::f16, i32 = DType::i32;

struct LargeCase {
  std::string name;
  DType dt;
  Tolerance tol;
  void (*run)(Io& io, DType dt);
};

inline void check(const LargeCase& c) {
  SCOPED_TRACE(c.name + " " + std::string(dtype_name(c.dt)));
  Io cpu(Route::dispatch, 7), gpu1(Device::cuda(0), 7), gpu2(Device::cuda(0), 7);
  c.run(cpu, c.dt);
  c.run(gpu1, c.dt);
  gpu1.download();
  c.run(gpu2, c.dt);
  gpu2.download();
  expect_close(cpu, gpu1, c.tol);
  expect_same_bits(gpu1, gpu2);
}

// Sums over K = 768..3072 terms of N(0, 1) products: |c| ~ 30-60, and two
// f32 summation orders differ by ~1e-5 of that.
inline constexpr Tolerance kGemmF32{1e-4, 1e-3}, kGemmBf16{1.0 / 128, 2e-2};

// f16 keeps 3 more significand bits than bf16 (docs/numerics.md).
inline Tolerance attention_tolerance(DType dt) {
  return dt == f32 ? Tolerance{1e-3, 1e-4} : dt == bf16 ? Tolerance{3e-2, 3e-2} : Tolerance{1e-2, 1e-2};
}

}  // namespace loom::kernels::gpu_test
