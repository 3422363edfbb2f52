#include "core/tensor.h"

#include <sstream>

#include "core/error.h"

namespace loom {

std::string device_name(Device d) { return d.is_cpu() ? "cpu" : concat("cuda:", d.index); }

Shape::Shape(std::initializer_list<int64_t> dims) {
  LOOM_REQUIRE(dims.size() <= kMaxDims, "a tensor has at most ", kMaxDims, " dims, got ", dims.size());
  for (int64_t d : dims) dims_[ndim_++] = d;
}

Shape Shape::of(int ndim, const int64_t* dims) {
  LOOM_REQUIRE(ndim >= 0 && ndim <= kMaxDims, "a tensor has at most ", kMaxDims, " dims, got ", ndim);
  Shape s;
  s.ndim_ = ndim;
  for (int i = 0; i < ndim; ++i) s.dims_[i] = dims[i];
  return s;
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim_; ++i) n *= dims_[i];
  return n;
}

void Shape::validate() const {
  int64_t n = 1;
  for (int i = 0; i < ndim_; ++i) {
    LOOM_REQUIRE(dims_[i] >= 0, "negative extent in shape ", str());
    LOOM_REQUIRE(!__builtin_mul_overflow(n, dims_[i], &n), "shape ", str(), " has more than 2^63 elements");
  }
}

std::string Shape::str() const {
  std::ostringstream os;
  os << "(";
  for (int i = 0; i < ndim_; ++i) os << (i ? ", " : "") << dims_[i];
  os << (ndim_ == 1 ? ",)" : ")");
  return os.str();
}

bool operator==(const Shape& a, const Shape& b) {
  if (a.ndim_ != b.ndim_) return false;
  for (int i = 0; i < a.ndim_; ++i)
    if (a.dims_[i] != b.dims_[i]) return false;
  return true;
}

Tensor::Tensor(void* data, DType dtype, Shape shape, Device device)
    : data_(data), dtype_(dtype), device_(device), shape_(shape) {
  shape.validate();
  int64_t stride = 1;
  for (int i = shape.ndim() - 1; i >= 0; --i) {
    strides_[i] = stride;
    stride *= shape[i];
  }
}

int Tensor::normalise_dim(int dim, const char* what) const {
  const int d = dim < 0 ? dim + ndim() : dim;
  LOOM_REQUIRE(d >= 0 && d < ndim(), what, ": dim ", dim, " out of range for ", str());
  return d;
}

int64_t Tensor::size(int dim) const { return shape_[normalise_dim(dim, "size")]; }
int64_t Tensor::stride(int dim) const { return strides_[normalise_dim(dim, "stride")]; }

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (int i = ndim() - 1; i >= 0; --i) {
    if (shape_[i] != 1 && strides_[i] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

std::string Tensor::str() const { return concat(dtype_name(dtype_), shape_.str()); }

Tensor Tensor::slice(int dim, int64_t start, int64_t length) const {
  const int d = normalise_dim(dim, "slice");
  LOOM_REQUIRE(start >= 0 && length >= 0 && start + length <= shape_[d], "slice [", start, ", ",
               start + length, ") out of range for dim ", d, " of ", str());
  Tensor out = *this;
  out.shape_[d] = length;
  out.data_ = static_cast<char*>(data_) + start * strides_[d] * static_cast<int64_t>(dtype_size(dtype_));
  return out;
}

Tensor Tensor::reshape(Shape shape) const {
  LOOM_REQUIRE(is_contiguous(), "reshape of a non-contiguous view ", str());
  int infer = -1;
  int64_t known = 1;
  for (int i = 0; i < shape.ndim(); ++i) {
    if (shape[i] == -1) {
      LOOM_REQUIRE(infer < 0, "reshape to ", shape.str(), ": at most one extent may be -1");
      infer = i;
    } else {
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    LOOM_REQUIRE(known > 0 && numel() % known == 0, "cannot reshape ", str(), " to ", shape.str());
    shape[infer] = numel() / known;
  }
  LOOM_REQUIRE(shape.numel() == numel(), "cannot reshape ", str(), " (", numel(), " elements) to ",
               shape.str(), " (", shape.numel(), " elements)");
  return Tensor(data_, dtype_, shape, device_);
}

}  // namespace loom
