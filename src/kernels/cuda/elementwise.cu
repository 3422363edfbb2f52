// add, cast, fill and the data movement ops (ops.h) on the GPU: copy of any
// dtype and layout, gather_columns, arange, find_id_outside. Every kernel is
// a grid-stride loop that reads and writes each element once, so adjacent
// threads touch adjacent elements (coalesced).
//
// Mixed float dtypes go through f32 as on the CPU (cpu/elementwise.cpp): a
// conversion or an add rounds once. Stores round with the CPU's exact
// conversions (core/dtype.h) rather than cvt.rn: the instruction turns every
// NaN into the canonical one, where the CPU keeps its sign and payload, and
// cast must agree with the CPU bit for bit.
#include <cstdint>
#include <cstring>
#include <optional>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace loom::kernels::cuda {
namespace {

constexpr int kThreads = 256;


// ---- exact conversions, as core/dtype.h and cpu/half.h --------------------

// A 16-bit load as the CPU's: bf16 is a shift (keeps a signalling NaN, as
// from_bf16); an f16 NaN comes back quiet with its payload, as F16C's
// vcvtph2ps (cvt.f32.f16 may return the canonical NaN instead).
__device__ __forceinline__ float load_exact(float x) { return x; }
__device__ __forceinline__ float load_exact(__nv_bfloat16 x) {
  return __uint_as_float(static_cast<uint32_t>(__bfloat16_as_ushort(x)) << 16);
}
__device__ __forceinline__ float load_exact(__half x) {
  const uint32_t h = __half_as_ushort(x);
  if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0)
    return __uint_as_float(((h & 0x8000u) << 16) | 0x7fc00000u | ((h & 0x3ffu) << 13));
  return __half2float(x);
}

// f32 -> T rounded to nearest even; a NaN stays NaN with its sign and the
// top of its payload, quieted (to_bf16, to_f16).
template <typename T>
__device__ T store_exact(float x);
template <>
__device__ __forceinline__ float store_exact<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 store_exact<__nv_bfloat16>(float x) {
  uint32_t u = __float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return __ushort_as_bfloat16(static_cast<unsigned short>((u >> 16) | 0x0040u));
  u += 0x7fffu + ((u >> 16) & 1u);
  return __ushort_as_bfloat16(static_cast<unsigned short>(u >> 16));
}
template <>
__device__ __forceinline__ __half store_exact<__half>(float x) {
  const uint32_t u = __float_as_uint(x), a = u & 0x7fffffffu;
  if (a > 0x7f800000u)
    return __ushort_as_half(static_cast<unsigned short>(((u >> 16) & 0x8000u) | 0x7e00u | ((a >> 13) & 0x3ffu)));
  return __float2half_rn(x);  // RNE with subnormals, >= 65520 to Inf: the CPU's bits
}

// ---- float elementwise ------------------------------------------------------

// y = a + b (Plus) or a * b (Times) in f32, rounded once; y may be a or b
// (each element is read before it is written, by the same thread).
struct Plus {
  __device__ float operator()(float u, float v) const { return u + v; }
};
struct Times {
  __device__ float operator()(float u, float v) const { return u * v; }
};
template <typename Op, typename Y, typename A, typename B>
__global__ void binary_kernel(Y* y, const A* a, const B* b, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    y[i] = store_exact<Y>(Op{}(to_float(a[i]), to_float(b[i])));
}

template <typename Op>
void binary(Tensor y, const Tensor& a, const Tensor& b) {
  const int64_t n = y.numel();
  if (n == 0) return;
  with_float_type(y.dtype(), [&]<typename Y>(Y) {
    with_float_type(a.dtype(), [&]<typename A>(A) {
      with_float_type(b.dtype(), [&]<typename B>(B) {
        binary_kernel<Op><<<grid_for(n, kThreads), kThreads, 0, stream()>>>(ptr<Y>(y), ptr<const A>(a),
                                                                           ptr<const B>(b), n);
        LOOM_CUDA_LAUNCHED();
      });
    });
  });
}

template <typename D, typename S>
__global__ void cast_kernel(D* dst, const S* src, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) dst[i] = store_exact<D>(load_exact(src[i]));
}

// Every element = bits (the value converted once, on the host).
template <typename U>
__global__ void fill_kernel(U* t, int64_t n, U bits) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) t[i] = bits;
}

// ---- data movement ------------------------------------------------------------

// An unsigned integer type of each element size: copies move bits.
template <typename F>
decltype(auto) with_bits_type(size_t bytes, F&& f) {
  switch (bytes) {
    case 1: return f(uint8_t{});
    case 2: return f(uint16_t{});
    case 4: return f(uint32_t{});
    case 8: return f(uint64_t{});
    default: break;
  }
  LOOM_CHECK(false, "no element type of ", bytes, " bytes");
  return f(uint8_t{});
}

// The shape both views share and each one's strides (elements), dims
// outermost first.
struct Strides {
  int nd;
  int64_t size[kMaxDims];
  int64_t dst[kMaxDims];
  int64_t src[kMaxDims];
};

// dst = src element by element in the row-major order of the shared shape
// (consecutive threads: consecutive elements of the innermost dim). I is
// uint32_t where every flat index and offset fits it: 64-bit division is
// several times slower.
template <typename U, typename I>
__global__ void copy_strided_kernel(U* dst, const U* src, int64_t n, Strides s) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    I rest = static_cast<I>(i), d_off = 0, s_off = 0;
    for (int d = s.nd - 1; d >= 0; --d) {
      const I extent = static_cast<I>(s.size[d]);
      const I index = rest % extent;
      rest /= extent;
      d_off += index * static_cast<I>(s.dst[d]);
      s_off += index * static_cast<I>(s.src[d]);
    }
    dst[d_off] = src[s_off];
  }
}

// The largest element offset of a view (strides are >= 0).
int64_t last_offset(const Tensor& t) {
  int64_t last = 0;
  for (int d = 0; d < t.ndim(); ++d) last += (t.size(d) - 1) * t.stride(d);
  return last;
}

// Flags every column outside [0, S).
__global__ void check_columns_kernel(const int32_t* col, int64_t J, int64_t S, unsigned long long* flag) {
  for (int64_t j = first_index(); j < J; j += grid_stride())
    if (col[j] < 0 || col[j] >= S) report_bad_id(flag, j);
}

// dst (R, J) = src (R, S) at columns (J).
template <typename U>
__global__ void gather_columns_kernel(U* dst, const U* src, const int32_t* col, int64_t R, int64_t J, int64_t S) {
  const int64_t n = R * J;
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const int64_t r = i / J, j = i - r * J;
    dst[i] = src[r * S + col[j]];
  }
}

template <typename I>
__global__ void arange_kernel(I* t, int64_t n, int64_t start) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) t[i] = static_cast<I>(start + i);
}

// Flags every id outside [0, limit) that is not the ignored one (when
// has_ignore); the flag keeps the smallest index.
__global__ void find_outside_kernel(const int32_t* ids, int64_t n, int64_t limit, bool has_ignore, int32_t ignore,
                                    unsigned long long* flag) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const int32_t id = ids[i];
    const bool allowed = (id >= 0 && id < limit) || (has_ignore && id == ignore);
    if (!allowed) report_bad_id(flag, i);
  }
}

int32_t read_id(const Tensor& ids, int64_t index) {
  int32_t v = 0;
  read_back(&v, ptr<const int32_t>(ids) + index, sizeof v);
  return v;
}

}  // namespace

void add(Tensor y, const Tensor& a, const Tensor& b) { binary<Plus>(y, a, b); }

void mul(Tensor y, const Tensor& a, const Tensor& b) { binary<Times>(y, a, b); }

void cast(Tensor dst, const Tensor& src) {
  const int64_t n = src.numel();
  if (n == 0) return;
  if (dst.dtype() == src.dtype()) {
    if (dst.data() != src.data())
      LOOM_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), src.nbytes(), cudaMemcpyDeviceToDevice, stream()));
    return;
  }
  with_float_type(dst.dtype(), [&]<typename D>(D) {
    with_float_type(src.dtype(), [&]<typename S>(S) {
      cast_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(ptr<D>(dst), ptr<const S>(src), n);
      LOOM_CUDA_LAUNCHED();
    });
  });
}

void fill(Tensor t, float value) {
  const int64_t n = t.numel();
  if (n == 0) return;
  auto launch = [&]<typename U>(U bits) {
    fill_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(ptr<U>(t), n, bits);
    LOOM_CUDA_LAUNCHED();
  };
  switch (t.dtype()) {
    case DType::f32: {
      uint32_t bits = 0;
      std::memcpy(&bits, &value, sizeof bits);
      return launch(bits);
    }
    case DType::bf16: return launch(to_bf16(value).bits);
    case DType::f16: return launch(to_f16(value).bits);
    default: break;
  }
  LOOM_CHECK(false, "fill: dtype ", dtype_name(t.dtype()), " reached a float kernel");
}

void copy(Tensor dst, const Tensor& src) {
  // The same data is the same view (ops.h refuses any other overlap).
  const int64_t n = src.numel();
  if (dst.data() == src.data() || n == 0) return;
  if (dst.is_contiguous() && src.is_contiguous()) {
    LOOM_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), src.nbytes(), cudaMemcpyDeviceToDevice, stream()));
    return;
  }
  Strides s{};
  s.nd = src.ndim();
  for (int d = 0; d < s.nd; ++d) s.size[d] = src.size(d), s.dst[d] = dst.stride(d), s.src[d] = src.stride(d);
  constexpr int64_t k32 = INT32_MAX;
  const bool narrow = n <= k32 && last_offset(dst) <= k32 && last_offset(src) <= k32;
  with_bits_type(dtype_size(src.dtype()), [&]<typename U>(U) {
    U* d = ptr<U>(dst);
    const U* x = ptr<const U>(src);
    if (narrow)
      copy_strided_kernel<U, uint32_t><<<grid_for(n, kThreads), kThreads, 0, stream()>>>(d, x, n, s);
    else
      copy_strided_kernel<U, uint64_t><<<grid_for(n, kThreads), kThreads, 0, stream()>>>(d, x, n, s);
    LOOM_CUDA_LAUNCHED();
  });
}

// Every column checked first (waiting for the GPU), so a bad one writes
// nothing.
void gather_columns(Tensor dst, const Tensor& src, const Tensor& columns) {
  const int64_t R = dst.size(0), J = dst.size(1), S = src.size(1);
  if (J == 0) return;
  const int32_t* col = ptr<const int32_t>(columns);
  {
    BadIdFlag flag;
    check_columns_kernel<<<grid_for(J, kThreads), kThreads, 0, stream()>>>(col, J, S, flag.device());
    LOOM_CUDA_LAUNCHED();
    if (const int64_t j = flag.first(); j >= 0)
      fail("gather_columns: columns[", j, "] = ", read_id(columns, j), " is outside the ", S, " columns of src ",
           src.str());
  }
  if (R == 0) return;
  with_bits_type(dtype_size(src.dtype()), [&]<typename U>(U) {
    gather_columns_kernel<<<grid_for(R * J, kThreads), kThreads, 0, stream()>>>(ptr<U>(dst), ptr<const U>(src), col,
                                                                                 R, J, S);
    LOOM_CUDA_LAUNCHED();
  });
}

void arange(Tensor t, int64_t start) {
  const int64_t n = t.numel();
  if (n == 0) return;
  if (t.dtype() == DType::i32)
    arange_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(ptr<int32_t>(t), n, start);
  else
    arange_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(ptr<int64_t>(t), n, start);
  LOOM_CUDA_LAUNCHED();
}

IdOutside find_id_outside(const Tensor& ids, int64_t limit, std::optional<int32_t> ignore_index) {
  const int64_t n = ids.numel();
  if (n == 0) return {};
  BadIdFlag flag;
  find_outside_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(
      ptr<const int32_t>(ids), n, limit, ignore_index.has_value(), ignore_index.value_or(0), flag.device());
  LOOM_CUDA_LAUNCHED();
  const int64_t index = flag.first();
  if (index < 0) return {};
  return {index, read_id(ids, index)};
}

}  // namespace loom::kernels::cuda
