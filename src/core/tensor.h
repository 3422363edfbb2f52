// Tensor: a non-owning view (data, dtype, shape, strides, device) over memory
// owned by a pool (core/memory.h). Cheap to copy; copying never copies data.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/dtype.h"

namespace loom {

struct Device {
  enum class Kind : uint8_t { cpu, cuda };
  Kind kind = Kind::cpu;
  int index = 0;

  static Device cpu() { return {}; }
  static Device cuda(int i) { return {Kind::cuda, i}; }
  bool is_cpu() const { return kind == Kind::cpu; }
  friend bool operator==(const Device&, const Device&) = default;
};
std::string device_name(Device d);

inline constexpr int kMaxDims = 5;

// Extents of up to kMaxDims dims, outermost first.
class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  static Shape of(int ndim, const int64_t* dims);

  int ndim() const { return ndim_; }
  int64_t operator[](int i) const { return dims_[i]; }
  int64_t& operator[](int i) { return dims_[i]; }
  int64_t numel() const;  // of a validated shape
  // Every extent >= 0 and the element count fits int64; else loom::Error.
  void validate() const;
  const int64_t* data() const { return dims_.data(); }
  std::string str() const;  // "(2, 3, 4)"
  friend bool operator==(const Shape& a, const Shape& b);

 private:
  int ndim_ = 0;
  std::array<int64_t, kMaxDims> dims_{};
};

class Tensor {
 public:
  Tensor() = default;  // undefined: an absent optional operand
  // A contiguous (row-major) view of `shape` starting at `data`.
  Tensor(void* data, DType dtype, Shape shape, Device device = Device::cpu());

  bool defined() const { return data_ != nullptr || shape_.ndim() > 0; }
  void* data() const { return data_; }
  template <typename T>
  T* data_as() const { return static_cast<T*>(data_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  const Shape& shape() const { return shape_; }
  int ndim() const { return shape_.ndim(); }
  // size(-1) is the last dim, as in PyTorch.
  int64_t size(int dim) const;
  int64_t stride(int dim) const;  // in elements
  int64_t numel() const { return shape_.numel(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  bool is_contiguous() const;
  std::string str() const;  // "bf16(2, 3, 4)"

  // [start, start + length) along `dim`; shares memory. Contiguous only if
  // dim is the outermost dim with extent > 1, or the slice is whole.
  Tensor slice(int dim, int64_t start, int64_t length) const;
  // Same elements, new shape; the view must be contiguous. One extent may be -1.
  Tensor reshape(Shape shape) const;
  // A contiguous view's elements as one dim.
  Tensor flatten() const { return reshape({numel()}); }

 private:
  int normalise_dim(int dim, const char* what) const;

  void* data_ = nullptr;
  DType dtype_ = DType::f32;
  Device device_{};
  Shape shape_{};
  std::array<int64_t, kMaxDims> strides_{};
};

}  // namespace loom
