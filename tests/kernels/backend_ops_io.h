// The tensors of one run of a test_backend_ops case: made from a seeded
// stream, so two runs of the same case see the same bytes, and kept so the
// runs can be compared byte for byte afterwards (outputs, and inputs too: a
// backend must not write them, nor past a view's elements).
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "common/compare.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/memory.h"
#include "core/tensor.h"

namespace loom::test {

// Which functions a run calls: ops.h's (checks, then the backend registered
// for the tensors' device) or the CPU backend's directly.
enum class Route { dispatch, cpu_direct };

// Device memory for a run on another device (core's DeviceMemory): freed
// when the Io goes.
struct DeviceBuffer {
  Device device;
  void* data = nullptr;
  DeviceBuffer(Device d, size_t bytes) : device(d) {
    if (bytes) data = device_memory(d).allocate(d.index, bytes);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : device(o.device), data(std::exchange(o.data, nullptr)) {}
  DeviceBuffer(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (data) device_memory(device).free(device.index, data);
  }
};

// Allowed |got - want| <= atol + rtol |want| for a backend other than the CPU
// one (the CPU backend itself must match bit for bit).
struct Tolerance {
  double rtol = 0, atol = 0;
};

class Io {
 public:
  Io(Route route, uint32_t seed) : route_(route), rng_(seed) {}
  // A run through ops.h on `device`: every tensor is made on the host as
  // above, uploaded before the op sees it, and downloaded by download().
  Io(Device device, uint32_t seed) : route_(Route::dispatch), device_(device), rng_(seed) {}

  // The op a case calls, by route; records its name (the harness checks that
  // a case calls the op it covers).
  template <typename F>
  F* pick(const char* op, F* dispatched, F* direct) {
    called_.push_back(op);
    return route_ == Route::dispatch ? dispatched : direct;
  }
  const std::vector<std::string>& called() const { return called_; }

  // A tensor holding values: rounded (RNE) for bf16 / f16, converted for
  // integer dtypes.
  Tensor tensor(const char* name, DType dtype, Shape shape, const std::vector<double>& values) {
    Stored& s = store(name, dtype, shape);
    LOOM_CHECK(static_cast<int64_t>(values.size()) == shape.numel(), name, ": ", values.size(), " values");
    for (size_t i = 0; i < values.size(); ++i) set(s, i, values[i]);
    return placed(s);
  }
  // scale * N(0, 1) + shift in a float dtype.
  Tensor normal(const char* name, DType dtype, Shape shape, double scale = 1, double shift = 0) {
    std::normal_distribution<double> d;
    std::vector<double> v(static_cast<size_t>(shape.numel()));
    for (double& x : v) x = static_cast<float>(d(rng_) * scale + shift);
    return tensor(name, dtype, shape, v);
  }
  // Integers uniform in [lo, hi).
  Tensor ints(const char* name, DType dtype, Shape shape, int64_t lo, int64_t hi) {
    std::uniform_int_distribution<int64_t> d(lo, hi - 1);
    std::vector<double> v(static_cast<size_t>(shape.numel()));
    for (double& x : v) x = static_cast<double>(d(rng_));
    return tensor(name, dtype, shape, v);
  }
  // Random bit patterns of any dtype (NaNs included): for pure data movement.
  Tensor bits(const char* name, DType dtype, Shape shape) {
    Stored& s = store(name, dtype, shape);
    for (std::byte& b : s.bytes) b = static_cast<std::byte>(rng_() & 0xff);
    return placed(s);
  }
  // Copies every tensor back from the device (a device run, after the ops).
  void download() {
    for (size_t i = 0; i < device_buffers_.size(); ++i) {
      Stored& s = stored_[i];
      if (!s.bytes.empty())
        device_memory(device_).to_host(device_.index, s.bytes.data(), device_buffers_[i].data, s.bytes.size());
    }
  }
  // A value an op returned.
  void result(double v) { results_.push_back(v); }

  // Every tensor and result of want equals got's bit for bit.
  friend void expect_same_bits(const Io& want, const Io& got) {
    ASSERT_EQ(want.stored_.size(), got.stored_.size());
    for (size_t i = 0; i < want.stored_.size(); ++i) {
      const Stored &w = want.stored_[i], &g = got.stored_[i];
      const size_t es = dtype_size(w.dtype);
      for (size_t k = 0; k < w.bytes.size(); k += es) {
        if (std::memcmp(&w.bytes[k], &g.bytes[k], es) != 0) {
          ADD_FAILURE() << w.name << " " << dtype_name(w.dtype) << w.shape.str() << " differs, first at element "
                        << k / es;
          break;
        }
      }
    }
    ASSERT_EQ(want.results_.size(), got.results_.size());
    for (size_t i = 0; i < want.results_.size(); ++i)
      EXPECT_EQ(std::memcmp(&want.results_[i], &got.results_[i], sizeof(double)), 0)
          << "result " << i << ": " << got.results_[i] << " vs the CPU's " << want.results_[i];
  }

  // Float tensors and results within tol of want's, the rest bit for bit.
  friend void expect_close(const Io& want, const Io& got, Tolerance tol) {
    ASSERT_EQ(want.stored_.size(), got.stored_.size());
    for (size_t i = 0; i < want.stored_.size(); ++i) {
      const Stored &w = want.stored_[i], &g = got.stored_[i];
      if (!dtype_is_float(w.dtype)) {
        EXPECT_TRUE(w.bytes == g.bytes) << w.name << " differs";
        continue;
      }
      EXPECT_TRUE(all_close(g.floats(), w.floats(), tol.rtol, tol.atol)) << w.name;
    }
    ASSERT_EQ(want.results_.size(), got.results_.size());
    for (size_t i = 0; i < want.results_.size(); ++i)
      EXPECT_LE(std::abs(got.results_[i] - want.results_[i]), tol.atol + tol.rtol * std::abs(want.results_[i]))
          << "result " << i;
  }

 private:
  struct Stored {
    std::string name;
    DType dtype;
    Shape shape;
    std::vector<std::byte> bytes;
    std::vector<float> floats() const {
      return to_floats(Tensor(const_cast<std::byte*>(bytes.data()), dtype, shape));
    }
  };

  // s's tensor where the run's ops read it: the host bytes, or a device copy.
  Tensor placed(Stored& s) {
    if (device_.is_cpu()) return Tensor(s.bytes.data(), s.dtype, s.shape);
    LOOM_CHECK(device_buffers_.size() + 1 == stored_.size(), "tensors are placed in the order they are made");
    DeviceBuffer& b = device_buffers_.emplace_back(device_, s.bytes.size());
    if (!s.bytes.empty()) device_memory(device_).to_device(device_.index, b.data, s.bytes.data(), s.bytes.size());
    return Tensor(b.data, s.dtype, s.shape, device_);
  }

  Stored& store(const char* name, DType dtype, Shape shape) {
    stored_.push_back({name, dtype, shape, std::vector<std::byte>(static_cast<size_t>(shape.numel()) * dtype_size(dtype))});
    return stored_.back();
  }

  static void set(Stored& s, size_t i, double x) {
    std::byte* p = s.bytes.data() + i * dtype_size(s.dtype);
    const auto put = [p](auto v) { std::memcpy(p, &v, sizeof v); };
    switch (s.dtype) {
      case DType::f32: put(static_cast<float>(x)); break;
      case DType::bf16: put(to_bf16(static_cast<float>(x))); break;
      case DType::f16: put(to_f16(static_cast<float>(x))); break;
      case DType::i32: put(static_cast<int32_t>(x)); break;
      case DType::i64: put(static_cast<int64_t>(x)); break;
      case DType::u8: put(static_cast<uint8_t>(x)); break;
    }
  }

  Route route_;
  Device device_ = Device::cpu();
  std::mt19937 rng_;
  std::vector<DeviceBuffer> device_buffers_;  // device_buffers_[i] holds stored_[i] (a device run)
  std::vector<Stored> stored_;  // a Stored's bytes stay put when the vector grows (moved, not copied)
  std::vector<double> results_;
  std::vector<std::string> called_;
};

}  // namespace loom::test
