// Host data shared by the kernel tests: owned buffers filled from floats,
// views of vectors, bf16 rounding, gradient prefills, random values, and the
// misuse check (a loom::Error naming the op and shapes).
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <random>
#include <source_location>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace loom::test {

using Floats = std::vector<float>;

// Owned host storage of one dtype and a contiguous view of it. values (empty
// for zeros, else shape.numel() of them) are stored rounded to nearest even
// for bf16 and f16; an integer dtype can only be zero-filled.
struct Buffer {
  DType dtype;
  Shape shape;
  std::vector<unsigned char> bytes;

  Buffer(DType type, Shape dims, const Floats& values = {});
  Tensor view() { return Tensor(bytes.data(), dtype, shape); }
  void set(int64_t i, float x);  // element i = x, rounded to dtype
  Floats floats() const;         // f32/bf16/f16 data as float
};

// Views of a vector's elements with shape s (s.numel() == v.size()).
inline Tensor f32_view(Floats& v, Shape s) { return Tensor(v.data(), DType::f32, s); }
inline Tensor bf16_view(std::vector<bf16>& v, Shape s) { return Tensor(v.data(), DType::bf16, s); }
inline Tensor i32_view(std::vector<int32_t>& v, Shape s) { return Tensor(v.data(), DType::i32, s); }

// bf16 (RNE) and back: to_bf16_vec, from_bf16_vec elementwise;
// rounded_to_bf16(v) == from_bf16_vec(to_bf16_vec(v)).
std::vector<bf16> to_bf16_vec(const Floats& v);
Floats from_bf16_vec(const std::vector<bf16>& v);
Floats rounded_to_bf16(Floats v);

// a + b elementwise: the expected gradient after a backward adds b onto a.
Floats plus(Floats a, const Floats& b);

// Known, non-zero gradient contents (0.25 (i mod 7) - 0.75), to check that a
// backward adds (+=) onto them.
Floats prefill(size_t n);

// n draws of scale * N(0, 1) + shift from rng (a fresh distribution per call).
Floats random_floats(size_t n, std::mt19937& rng, float scale = 1.f, float shift = 0.f);
// n draws of N(0, 1) from a generator seeded with seed.
Floats random_floats(size_t n, uint32_t seed);

// Runs f and expects a loom::Error whose message contains every fragment
// (the op, the operand, its shape); failures are reported at the caller.
void expect_error(const std::function<void()>& f, std::initializer_list<std::string> fragments,
                  std::source_location at = std::source_location::current());

}  // namespace loom::test
