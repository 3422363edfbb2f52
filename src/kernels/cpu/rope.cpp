// Rotary position embedding, Hugging Face Llama convention (rotate_half):
//   y = x * cos + rotate_half(x) * sin,  rotate_half(x) = cat(-x[h:], x[:h]),
//   h = HS / 2, angle of pair (i, i + h) = pos * theta^(-2i / HS).
// For a pair (x1, x2) = (x[i], x[i + h]) this is the rotation
//   y1 = x1 cos - x2 sin,   y2 = x2 cos + x1 sin,
// and backward applies its transpose (the rotation by -angle).
//
// Angles are formed and reduced in double: pos * inv_freq reaches thousands of
// radians at long contexts, where an f32 angle (HF's float32 path) is off by
// up to ~5e-4 rad at pos 8192 (and ~5e-2 at pos 1e6), an output error of the
// same size. Here cos/sin are correct to f32 rounding at any position, so
// results match a float64 reference to f32 accuracy (tests/kernels/test_rope.cpp).
#include <cmath>
#include <cstdint>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/scratch.h"
#include "kernels/validate.h"

namespace loom::kernels::cpu::LOOM_ISA {
namespace {

// x: (B, T, NH, HS) viewed as B*T rows of NH heads of HS.
struct RopeShape {
  int64_t B, T, NH, HS;
  bool pos_per_batch;  // pos is (B, T) rather than (T)
};

// The shape of `in` (x or dy) and pos.
RopeShape rope_shape(const Tensor& in, const Tensor& pos) {
  return {in.size(0), in.size(1), in.size(2), in.size(3), pos.ndim() == 2};
}

// Direction of the rotation and what happens to the output.
enum class RopeMode { forward_write, backward_accumulate };

// One head: out = R(±angle) in, written or accumulated. in_f/out_f are
// HS-float buffers, so the rotation runs on contiguous floats even in place.
template <RopeMode kMode>
void rotate_head(float* __restrict out_f, const float* __restrict in_f, const float* __restrict cos_f,
                 const float* __restrict sin_f, int64_t h) {
  // Backward: R^T = R(-angle), i.e. sin -> -sin.
  const float sign = kMode == RopeMode::forward_write ? 1.f : -1.f;
  for (int64_t i = 0; i < h; ++i) {
    const float x1 = in_f[i], x2 = in_f[i + h], c = cos_f[i], sn = sign * sin_f[i];
    out_f[i] = x1 * c - x2 * sn;
    out_f[i + h] = x2 * c + x1 * sn;
  }
}

// One head of HS elements at `off`: out = R in, through f32 buffers.
template <RopeMode kMode, typename TIn, typename TOut>
void rope_head(TOut* dst, const TIn* src, int64_t off, float* in_f, float* out_f, const float* cos_f,
               const float* sin_f, int64_t HS) {
  span_to_f32(in_f, src + off, HS);
  rotate_head<kMode>(out_f, in_f, cos_f, sin_f, HS / 2);
  if constexpr (kMode == RopeMode::forward_write) span_from_f32(dst + off, out_f, HS);
  else span_add_f32(dst + off, out_f, HS);
}

// cos/sin are computed once per distinct position row ("angle row"): per (b, t)
// when pos is (B, T), per t (shared by every b) when pos is (T); trig in
// double dominates the cost otherwise.
template <RopeMode kMode, typename TIn, typename TOut>
void rope_apply(const Tensor& out, const Tensor& in, const Tensor& pos, float theta, const RopeShape& s) {
  const int64_t h = s.HS / 2;
  // inv_freq[i] = theta^(-2i / HS)
  double* inv_freq = thread_scratch<double>(ScratchSlot::a, static_cast<size_t>(h));  // read by every thread
  for (int64_t i = 0; i < h; ++i) inv_freq[i] = std::pow(static_cast<double>(theta), -2.0 * i / s.HS);
  const int32_t* p = pos.data_as<int32_t>();
  const TIn* src = in.data_as<TIn>();
  TOut* dst = out.data_as<TOut>();
  const int64_t angle_rows = s.pos_per_batch ? s.B * s.T : s.T;
  const int64_t rows_per_angle = s.pos_per_batch ? 1 : s.B;
  // Per thread: cos, sin (h each), one input and one output head.
  const ThreadSlices<float> bufs(ScratchSlot::b, static_cast<size_t>(2 * h + 2 * s.HS));
#pragma omp parallel if (s.B * s.T * s.NH * s.HS >= (1 << 15))
  {
    float* cos_f = bufs.mine();
    float* sin_f = cos_f + h;
    float* in_f = sin_f + h;
    float* out_f = in_f + s.HS;
#pragma omp for schedule(static)
    for (int64_t a = 0; a < angle_rows; ++a) {
      const double position = p[a];
      for (int64_t i = 0; i < h; ++i) {
        const double angle = position * inv_freq[i];
        cos_f[i] = static_cast<float>(std::cos(angle));
        sin_f[i] = static_cast<float>(std::sin(angle));
      }
      for (int64_t k = 0; k < rows_per_angle; ++k) {
        const int64_t row = s.pos_per_batch ? a : k * s.T + a;  // row = b * T + t
        for (int64_t head = 0; head < s.NH; ++head)
          rope_head<kMode>(dst, src, (row * s.NH + head) * s.HS, in_f, out_f, cos_f, sin_f, s.HS);
      }
    }
  }
}

}  // namespace

void rope_forward(Tensor y, const Tensor& x, const Tensor& pos, float theta) {
  const RopeShape s = rope_shape(x, pos);
  dispatch_float(x.dtype(), [&]<typename T>() { rope_apply<RopeMode::forward_write, T, T>(y, x, pos, theta, s); });
}

void rope_backward(Tensor dx, const Tensor& dy, const Tensor& pos, float theta) {
  if (!dx.defined()) return;
  const RopeShape s = rope_shape(dy, pos);
  dispatch_float(dy.dtype(), [&]<typename TIn>() {
    dispatch_float(dx.dtype(), [&]<typename TOut>() {
      rope_apply<RopeMode::backward_accumulate, TIn, TOut>(dx, dy, pos, theta, s);
    });
  });
}

}  // namespace loom::kernels::cpu::LOOM_ISA
