#include "common/tensors.h"

#include <gtest/gtest.h>

#include "common/compare.h"
#include "core/error.h"

namespace loom::test {

Buffer::Buffer(DType type, Shape dims, const Floats& values)
    : dtype(type), shape(dims), bytes(static_cast<size_t>(dims.numel()) * dtype_size(type)) {
  LOOM_CHECK(values.empty() || static_cast<int64_t>(values.size()) == shape.numel(), "Buffer of shape ",
             shape.str(), " given ", values.size(), " values");
  for (size_t i = 0; i < values.size(); ++i) set(static_cast<int64_t>(i), values[i]);
}

void Buffer::set(int64_t i, float x) {
  switch (dtype) {
    case DType::f32: reinterpret_cast<float*>(bytes.data())[i] = x; break;
    case DType::bf16: reinterpret_cast<bf16*>(bytes.data())[i] = to_bf16(x); break;
    case DType::f16: reinterpret_cast<f16*>(bytes.data())[i] = to_f16(x); break;
    default: FAIL() << "Buffer::set on " << dtype_name(dtype);
  }
}

Floats Buffer::floats() const {
  return to_floats(Tensor(const_cast<unsigned char*>(bytes.data()), dtype, shape));
}

std::vector<bf16> to_bf16_vec(const Floats& v) {
  std::vector<bf16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = to_bf16(v[i]);
  return out;
}

Floats from_bf16_vec(const std::vector<bf16>& v) {
  Floats out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = from_bf16(v[i]);
  return out;
}

Floats rounded_to_bf16(Floats v) {
  for (float& f : v) f = from_bf16(to_bf16(f));
  return v;
}

Floats plus(Floats a, const Floats& b) {
  for (size_t i = 0; i < a.size(); ++i) a[i] += b[i];
  return a;
}

Floats prefill(size_t n) {
  Floats v(n);
  for (size_t i = 0; i < n; ++i) v[i] = 0.25f * static_cast<float>(i % 7) - 0.75f;
  return v;
}

Floats random_floats(size_t n, std::mt19937& rng, float scale, float shift) {
  std::normal_distribution<float> d;
  Floats v(n);
  for (float& f : v) f = d(rng) * scale + shift;
  return v;
}

Floats random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  return random_floats(n, rng);
}

void expect_error(const std::function<void()>& f, std::initializer_list<std::string> fragments,
                  std::source_location at) {
  const ::testing::ScopedTrace trace(at.file_name(), static_cast<int>(at.line()), "expect_error");
  try {
    f();
    ADD_FAILURE() << "no loom::Error thrown";
  } catch (const Error& e) {
    const std::string what = e.what();
    for (const std::string& part : fragments)
      EXPECT_NE(what.find(part), std::string::npos) << "no \"" << part << "\" in: " << what;
  }
}

}  // namespace loom::test
